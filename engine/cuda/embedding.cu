// Token + position embedding, forward and backward (float atomics into the fp32 gradients).
#include "engine/cuda/check.h"
#include "engine/cuda/common.cuh"
#include "engine/cuda/kernels.h"

namespace meshrun::gpu {
namespace {

using internal::FromFloat;
using internal::GridFor;
using internal::ToFloat;

constexpr int kThreads = 256;

template <typename T>
__global__ void EmbeddingForwardKernel(T* out, const int32_t* tokens, const int32_t* positions,
                                       const T* wte, const T* wpe, int64_t N, int64_t C) {
  const int64_t total = N * C;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = i / C, c = i % C;
    const float w = ToFloat(wte[int64_t{tokens[row]} * C + c]);
    const float p = ToFloat(wpe[int64_t{positions[row]} * C + c]);
    out[i] = FromFloat<T>(w + p);
  }
}

template <typename T>
__global__ void EmbeddingBackwardKernel(float* dwte, float* dwpe, const T* dout,
                                        const int32_t* tokens, const int32_t* positions, int64_t N,
                                        int64_t C) {
  const int64_t total = N * C;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = i / C, c = i % C;
    const float d = ToFloat(dout[i]);
    atomicAdd(dwte + int64_t{tokens[row]} * C + c, d);
    if (dwpe != nullptr) atomicAdd(dwpe + int64_t{positions[row]} * C + c, d);
  }
}

}  // namespace

template <typename T>
Status EmbeddingForward(CudaContext& ctx, T* out, const int32_t* tokens, const int32_t* positions,
                        const T* wte, const T* wpe, int64_t N, int64_t C) {
  if (N * C <= 0) return OkStatus();
  EmbeddingForwardKernel<<<GridFor(N * C, kThreads), kThreads, 0, ctx.stream()>>>(
      out, tokens, positions, wte, wpe, N, C);
  MESHRUN_GPU_TRY_LAUNCH();
  return OkStatus();
}

template <typename T>
Status EmbeddingBackward(CudaContext& ctx, float* dwte, float* dwpe, const T* dout,
                         const int32_t* tokens, const int32_t* positions, int64_t N, int64_t C) {
  if (N * C <= 0) return OkStatus();
  EmbeddingBackwardKernel<<<GridFor(N * C, kThreads), kThreads, 0, ctx.stream()>>>(
      dwte, dwpe, dout, tokens, positions, N, C);
  MESHRUN_GPU_TRY_LAUNCH();
  return OkStatus();
}

#define MESHRUN_INSTANTIATE(T)                                                                    \
  template Status EmbeddingForward<T>(CudaContext&, T*, const int32_t*, const int32_t*, const T*, \
                                      const T*, int64_t, int64_t);                                \
  template Status EmbeddingBackward<T>(CudaContext&, float*, float*, const T*, const int32_t*,    \
                                       const int32_t*, int64_t, int64_t);
MESHRUN_INSTANTIATE(float)
MESHRUN_INSTANTIATE(bf16)
#undef MESHRUN_INSTANTIATE

}  // namespace meshrun::gpu
