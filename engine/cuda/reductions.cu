// Deterministic reductions: column sums (bias gradients), Σx² (the global gradient norm) and Σx
// (the loss). Partials go to the context's scratch and are added in a fixed order.
#include <cuda_runtime.h>

#include <algorithm>

#include "engine/cuda/check.h"
#include "engine/cuda/common.cuh"
#include "engine/cuda/kernels.h"

namespace meshrun::gpu {
namespace {

using internal::BlockSum;
using internal::CeilDiv;
using internal::ToFloat;

constexpr int kRowsPerChunk = 64;
constexpr int kReduceThreads = 256;
constexpr int64_t kMaxReduceBlocks = 1024;

template <typename T>
__global__ void ColumnPartialKernel(float* partial, const T* x, int64_t N, int64_t C, int64_t ld) {
  __shared__ float s[8][33];
  const int64_t c = blockIdx.x * int64_t{32} + threadIdx.x;
  const int64_t chunk = blockIdx.y;
  const int64_t r_end = min(N, (chunk + 1) * kRowsPerChunk);
  float acc = 0;
  if (c < C) {
    for (int64_t r = chunk * kRowsPerChunk + threadIdx.y; r < r_end; r += 8) {
      acc += ToFloat(x[r * ld + c]);
    }
  }
  s[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float t = 0;
    for (int y = 0; y < 8; ++y) t += s[y][threadIdx.x];
    partial[chunk * C + c] = t;
  }
}

__global__ void ColumnFinalKernel(float* out, const float* partial, int64_t chunks, int64_t C) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= C) return;
  float acc = 0;
  for (int64_t k = 0; k < chunks; ++k) acc += partial[k * C + c];
  out[c] += acc;
}

// partial[block] = Σ over the block's grid-stride elements of f(x), in double.
template <bool kSquare>
__global__ void SumPartialKernel(double* partial, const float* x, int64_t n) {
  __shared__ double shared[32];
  double acc = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const double v = x[i];
    acc += kSquare ? v * v : v;
  }
  acc = BlockSum(acc, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

__global__ void SumFinalKernel(double* result, const double* partial, int64_t blocks) {
  __shared__ double shared[32];
  double acc = 0;
  for (int64_t i = threadIdx.x; i < blocks; i += blockDim.x) acc += partial[i];
  acc = BlockSum(acc, shared);
  if (threadIdx.x == 0) *result = acc;
}

template <bool kSquare>
StatusOr<double> ReduceToHost(CudaContext& ctx, const float* x, int64_t n) {
  if (n <= 0) return 0.0;
  const int64_t blocks = std::min(kMaxReduceBlocks, CeilDiv(n, kReduceThreads * 8));
  MESHRUN_ASSIGN_OR_RETURN(void* scratch, ctx.Scratch(sizeof(double) * (blocks + 1)));
  double* partial = static_cast<double*>(scratch);
  double* result = partial + blocks;
  SumPartialKernel<kSquare>
      <<<static_cast<unsigned>(blocks), kReduceThreads, 0, ctx.stream()>>>(partial, x, n);
  MESHRUN_GPU_TRY_LAUNCH();
  SumFinalKernel<<<1, kReduceThreads, 0, ctx.stream()>>>(result, partial, blocks);
  MESHRUN_GPU_TRY_LAUNCH();
  double host = 0;
  MESHRUN_GPU_TRY(
      cudaMemcpyAsync(&host, result, sizeof(double), cudaMemcpyDeviceToHost, ctx.stream()));
  MESHRUN_GPU_TRY(cudaStreamSynchronize(ctx.stream()));
  return host;
}

}  // namespace

template <typename T>
Status ColumnSum(CudaContext& ctx, float* out, const T* x, int64_t N, int64_t C, int64_t ld) {
  if (N <= 0 || C <= 0) return OkStatus();
  const int64_t chunks = CeilDiv(N, kRowsPerChunk);
  MESHRUN_ASSIGN_OR_RETURN(void* scratch, ctx.Scratch(sizeof(float) * chunks * C));
  float* partial = static_cast<float*>(scratch);
  const dim3 grid(static_cast<unsigned>(CeilDiv(C, 32)), static_cast<unsigned>(chunks));
  ColumnPartialKernel<<<grid, dim3(32, 8), 0, ctx.stream()>>>(partial, x, N, C, ld);
  MESHRUN_GPU_TRY_LAUNCH();
  ColumnFinalKernel<<<static_cast<unsigned>(CeilDiv(C, 256)), 256, 0, ctx.stream()>>>(out, partial,
                                                                                      chunks, C);
  MESHRUN_GPU_TRY_LAUNCH();
  return OkStatus();
}

StatusOr<double> SumOfSquares(CudaContext& ctx, const float* x, int64_t n) {
  return ReduceToHost<true>(ctx, x, n);
}

StatusOr<double> Sum(CudaContext& ctx, const float* x, int64_t n) {
  return ReduceToHost<false>(ctx, x, n);
}

template Status ColumnSum<float>(CudaContext&, float*, const float*, int64_t, int64_t, int64_t);
template Status ColumnSum<bf16>(CudaContext&, float*, const bf16*, int64_t, int64_t, int64_t);

}  // namespace meshrun::gpu
