// Elementwise kernels: conversions, fill, residual add, accumulate, tanh-GELU forward and backward.
#include "engine/cuda/check.h"
#include "engine/cuda/common.cuh"
#include "engine/cuda/kernels.h"

namespace meshrun::gpu {
namespace {

using internal::FromFloat;
using internal::GridFor;
using internal::ToFloat;

constexpr int kThreads = 256;
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

template <typename Dst, typename Src>
__global__ void ConvertKernel(Dst* dst, const Src* src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    dst[i] = FromFloat<Dst>(ToFloat(src[i]));
  }
}

template <typename T>
__global__ void FillKernel(T* dst, float value, int64_t n) {
  const T v = FromFloat<T>(value);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    dst[i] = v;
  }
}

template <typename T>
__global__ void ResidualKernel(T* out, const T* a, const T* b, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = FromFloat<T>(ToFloat(a[i]) + ToFloat(b[i]));
  }
}

template <typename T>
__global__ void ScaleKernel(T* x, float s, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    x[i] = FromFloat<T>(ToFloat(x[i]) * s);
  }
}

__device__ __forceinline__ float TanhApprox(float u) {
  // 1 − 2/(e^{2u} + 1), as the CPU kernel: saturates to ±1 without overflow issues.
  return 1.0f - 2.0f / (expf(2.0f * u) + 1.0f);
}

template <typename T>
__global__ void GeluForwardKernel(T* out, const T* inp, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float x = ToFloat(inp[i]);
    const float t = TanhApprox(kSqrt2OverPi * (x + kCubic * x * x * x));
    out[i] = FromFloat<T>(0.5f * x * (1.0f + t));
  }
}

template <typename T>
__global__ void GeluBackwardKernel(T* dinp, const T* inp, const T* dout, int64_t n,
                                   bool accumulate) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float x = ToFloat(inp[i]);
    const float t = TanhApprox(kSqrt2OverPi * (x + kCubic * x * x * x));
    const float dudx = kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
    const float grad = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * dudx;
    const float d = grad * ToFloat(dout[i]);  // read before dinp[i] is written (may alias)
    dinp[i] = FromFloat<T>(accumulate ? ToFloat(dinp[i]) + d : d);
  }
}

}  // namespace

template <typename Dst, typename Src>
Status Convert(CudaContext& ctx, Dst* dst, const Src* src, int64_t n) {
  if (n <= 0) return OkStatus();
  ConvertKernel<<<GridFor(n, kThreads), kThreads, 0, ctx.stream()>>>(dst, src, n);
  MESHRUN_GPU_TRY_LAUNCH();
  return OkStatus();
}

template <typename T>
Status Fill(CudaContext& ctx, T* dst, float value, int64_t n) {
  if (n <= 0) return OkStatus();
  FillKernel<<<GridFor(n, kThreads), kThreads, 0, ctx.stream()>>>(dst, value, n);
  MESHRUN_GPU_TRY_LAUNCH();
  return OkStatus();
}

template <typename T>
Status ResidualForward(CudaContext& ctx, T* out, const T* a, const T* b, int64_t n) {
  if (n <= 0) return OkStatus();
  ResidualKernel<<<GridFor(n, kThreads), kThreads, 0, ctx.stream()>>>(out, a, b, n);
  MESHRUN_GPU_TRY_LAUNCH();
  return OkStatus();
}

template <typename T>
Status Accumulate(CudaContext& ctx, T* dst, const T* src, int64_t n) {
  return ResidualForward(ctx, dst, static_cast<const T*>(dst), src, n);
}

Status Scale(CudaContext& ctx, float* x, int64_t n, double s) {
  if (n <= 0) return OkStatus();
  ScaleKernel<<<GridFor(n, kThreads), kThreads, 0, ctx.stream()>>>(x, static_cast<float>(s), n);
  MESHRUN_GPU_TRY_LAUNCH();
  return OkStatus();
}

template <typename T>
Status GeluForward(CudaContext& ctx, T* out, const T* inp, int64_t n) {
  if (n <= 0) return OkStatus();
  GeluForwardKernel<<<GridFor(n, kThreads), kThreads, 0, ctx.stream()>>>(out, inp, n);
  MESHRUN_GPU_TRY_LAUNCH();
  return OkStatus();
}

template <typename T>
Status GeluBackward(CudaContext& ctx, T* dinp, const T* inp, const T* dout, int64_t n,
                    bool accumulate) {
  if (n <= 0) return OkStatus();
  GeluBackwardKernel<<<GridFor(n, kThreads), kThreads, 0, ctx.stream()>>>(dinp, inp, dout, n,
                                                                          accumulate);
  MESHRUN_GPU_TRY_LAUNCH();
  return OkStatus();
}

template Status Convert<float, bf16>(CudaContext&, float*, const bf16*, int64_t);
template Status Convert<bf16, float>(CudaContext&, bf16*, const float*, int64_t);
template Status Convert<float, float>(CudaContext&, float*, const float*, int64_t);
template Status Convert<bf16, bf16>(CudaContext&, bf16*, const bf16*, int64_t);
#define MESHRUN_INSTANTIATE(T)                                                       \
  template Status Fill<T>(CudaContext&, T*, float, int64_t);                         \
  template Status ResidualForward<T>(CudaContext&, T*, const T*, const T*, int64_t); \
  template Status Accumulate<T>(CudaContext&, T*, const T*, int64_t);                \
  template Status GeluForward<T>(CudaContext&, T*, const T*, int64_t);               \
  template Status GeluBackward<T>(CudaContext&, T*, const T*, const T*, int64_t, bool);
MESHRUN_INSTANTIATE(float)
MESHRUN_INSTANTIATE(bf16)
#undef MESHRUN_INSTANTIATE

}  // namespace meshrun::gpu
