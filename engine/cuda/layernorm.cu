// LayerNorm forward and backward. One warp per row for the row math; the weight and bias
// gradients are column sums over rows, done in two deterministic passes (per-chunk partials in
// the context's scratch, then the chunks in order).
#include <algorithm>

#include "engine/cuda/check.h"
#include "engine/cuda/common.cuh"
#include "engine/cuda/kernels.h"

namespace meshrun::gpu {
namespace {

using internal::CeilDiv;
using internal::FromFloat;
using internal::ToFloat;
using internal::WarpSum;

constexpr int kWarpsPerBlock = 8;
constexpr int kRowsPerChunk = 64;  // rows per partial of the column sums

template <typename T>
__global__ void LayerNormForwardKernel(T* out, float* mean, float* rstd, const T* inp,
                                       const T* weight, const T* bias, int64_t N, int64_t C,
                                       float eps) {
  const int64_t row = blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const T* x = inp + row * C;
  float sum = 0;
  for (int64_t c = lane; c < C; c += 32) sum += ToFloat(x[c]);
  const float m = WarpSum(sum) / static_cast<float>(C);
  // Two passes (mean, then centred squares), as on CPU: no cancellation when |mean| >> std.
  float sq = 0;
  for (int64_t c = lane; c < C; c += 32) {
    const float d = ToFloat(x[c]) - m;
    sq += d * d;
  }
  const float s = rsqrtf(WarpSum(sq) / static_cast<float>(C) + eps);
  T* o = out + row * C;
  for (int64_t c = lane; c < C; c += 32) {
    const float n = (ToFloat(x[c]) - m) * s;
    o[c] = FromFloat<T>(n * ToFloat(weight[c]) + ToFloat(bias[c]));
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

// dx = s·(dnorm − mean(dnorm) − norm·mean(dnorm·norm)), dnorm = dy·w.
template <typename T>
__global__ void LayerNormBackwardInputKernel(T* dinp, const T* dout, const T* inp, const T* weight,
                                             const float* mean, const float* rstd, int64_t N,
                                             int64_t C, bool accumulate) {
  const int64_t row = blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const T* x = inp + row * C;
  const T* dy = dout + row * C;
  const float m = mean[row], s = rstd[row];
  float sum_dnorm = 0, sum_dnorm_norm = 0;
  for (int64_t c = lane; c < C; c += 32) {
    const float norm = (ToFloat(x[c]) - m) * s;
    const float dnorm = ToFloat(dy[c]) * ToFloat(weight[c]);
    sum_dnorm += dnorm;
    sum_dnorm_norm += dnorm * norm;
  }
  const float mean_dnorm = WarpSum(sum_dnorm) / static_cast<float>(C);
  const float mean_dnorm_norm = WarpSum(sum_dnorm_norm) / static_cast<float>(C);
  T* dx = dinp + row * C;
  for (int64_t c = lane; c < C; c += 32) {
    const float norm = (ToFloat(x[c]) - m) * s;
    const float dnorm = ToFloat(dy[c]) * ToFloat(weight[c]);
    const float d = (dnorm - mean_dnorm - norm * mean_dnorm_norm) * s;
    dx[c] = FromFloat<T>(accumulate ? ToFloat(dx[c]) + d : d);
  }
}

// Block (32, 8) covers 32 columns of one chunk of rows; partial[chunk] = [Σ dy·norm (C) | Σ dy
// (C)].
template <typename T>
__global__ void LayerNormParamPartialKernel(float* partial, const T* dout, const T* inp,
                                            const float* mean, const float* rstd, int64_t N,
                                            int64_t C) {
  __shared__ float sw[8][33];
  __shared__ float sb[8][33];
  const int64_t c = blockIdx.x * int64_t{32} + threadIdx.x;
  const int64_t chunk = blockIdx.y;
  const int64_t r_end = min(N, (chunk + 1) * kRowsPerChunk);
  float pw = 0, pb = 0;
  if (c < C) {
    for (int64_t r = chunk * kRowsPerChunk + threadIdx.y; r < r_end; r += 8) {
      const float dy = ToFloat(dout[r * C + c]);
      pw += dy * (ToFloat(inp[r * C + c]) - mean[r]) * rstd[r];
      pb += dy;
    }
  }
  sw[threadIdx.y][threadIdx.x] = pw;
  sb[threadIdx.y][threadIdx.x] = pb;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float tw = 0, tb = 0;
    for (int y = 0; y < 8; ++y) {
      tw += sw[y][threadIdx.x];
      tb += sb[y][threadIdx.x];
    }
    partial[chunk * 2 * C + c] = tw;
    partial[chunk * 2 * C + C + c] = tb;
  }
}

__global__ void LayerNormParamFinalKernel(float* dweight, float* dbias, const float* partial,
                                          int64_t chunks, int64_t C) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= 2 * C) return;
  float acc = 0;
  for (int64_t k = 0; k < chunks; ++k) acc += partial[k * 2 * C + c];
  if (c < C) {
    dweight[c] += acc;
  } else {
    dbias[c - C] += acc;
  }
}

}  // namespace

template <typename T>
Status LayerNormForward(CudaContext& ctx, T* out, float* mean, float* rstd, const T* inp,
                        const T* weight, const T* bias, int64_t N, int64_t C, double eps) {
  if (N <= 0 || C <= 0) return OkStatus();
  const unsigned blocks = static_cast<unsigned>(CeilDiv(N, kWarpsPerBlock));
  LayerNormForwardKernel<<<blocks, 32 * kWarpsPerBlock, 0, ctx.stream()>>>(
      out, mean, rstd, inp, weight, bias, N, C, static_cast<float>(eps));
  MESHRUN_GPU_TRY_LAUNCH();
  return OkStatus();
}

template <typename T>
Status LayerNormBackward(CudaContext& ctx, T* dinp, float* dweight, float* dbias, const T* dout,
                         const T* inp, const T* weight, const float* mean, const float* rstd,
                         int64_t N, int64_t C, bool accumulate) {
  if (N <= 0 || C <= 0) return OkStatus();
  const unsigned blocks = static_cast<unsigned>(CeilDiv(N, kWarpsPerBlock));
  LayerNormBackwardInputKernel<<<blocks, 32 * kWarpsPerBlock, 0, ctx.stream()>>>(
      dinp, dout, inp, weight, mean, rstd, N, C, accumulate);
  MESHRUN_GPU_TRY_LAUNCH();

  const int64_t chunks = CeilDiv(N, kRowsPerChunk);
  MESHRUN_ASSIGN_OR_RETURN(void* scratch, ctx.Scratch(sizeof(float) * chunks * 2 * C));
  float* partial = static_cast<float*>(scratch);
  const dim3 grid(static_cast<unsigned>(CeilDiv(C, 32)), static_cast<unsigned>(chunks));
  LayerNormParamPartialKernel<<<grid, dim3(32, 8), 0, ctx.stream()>>>(partial, dout, inp, mean,
                                                                      rstd, N, C);
  MESHRUN_GPU_TRY_LAUNCH();
  LayerNormParamFinalKernel<<<static_cast<unsigned>(CeilDiv(2 * C, 256)), 256, 0, ctx.stream()>>>(
      dweight, dbias, partial, chunks, C);
  MESHRUN_GPU_TRY_LAUNCH();
  return OkStatus();
}

#define MESHRUN_INSTANTIATE(T)                                                                 \
  template Status LayerNormForward<T>(CudaContext&, T*, float*, float*, const T*, const T*,    \
                                      const T*, int64_t, int64_t, double);                     \
  template Status LayerNormBackward<T>(CudaContext&, T*, float*, float*, const T*, const T*,   \
                                       const T*, const float*, const float*, int64_t, int64_t, \
                                       bool);
MESHRUN_INSTANTIATE(float)
MESHRUN_INSTANTIATE(bf16)
#undef MESHRUN_INSTANTIATE

}  // namespace meshrun::gpu
