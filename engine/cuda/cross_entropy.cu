// Fused softmax cross-entropy: one block per row, an online max/sum pass, then (with a gradient)
// a pass that writes grad_scale·(softmax − onehot) over the logits.
#include "engine/cuda/check.h"
#include "engine/cuda/common.cuh"
#include "engine/cuda/kernels.h"

namespace meshrun::gpu {
namespace {

using internal::BlockMax;
using internal::BlockSum;
using internal::FromFloat;
using internal::ToFloat;

constexpr int kThreads = 512;

template <typename T>
__global__ void __launch_bounds__(kThreads)
    CrossEntropyKernel(float* losses, T* dlogits, const T* logits, const int32_t* targets,
                       int64_t V, int64_t ld, float grad_scale) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const T* x = logits + row * ld;
  const int64_t target = targets[row];
  if (target < 0) {
    // An ignored target (kIgnoreTarget, as transformers' -100): no loss and no gradient.
    if (threadIdx.x == 0) losses[row] = 0.0f;
    if (dlogits != nullptr) {
      T* d = dlogits + row * ld;
      for (int64_t j = threadIdx.x; j < ld; j += blockDim.x) d[j] = FromFloat<T>(0.0f);
    }
    return;
  }
  // Read before any thread can overwrite it (dlogits may alias logits).
  const float x_target = ToFloat(x[target]);

  float m = -INFINITY, s = 0.0f;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    const float v = ToFloat(x[j]);
    if (v > m) {
      s = s * expf(m - v) + 1.0f;
      m = v;
    } else {
      s += expf(v - m);
    }
  }
  const float mx = BlockMax(m, shared);
  const float sum = BlockSum(m == -INFINITY ? 0.0f : s * expf(m - mx), shared);
  if (threadIdx.x == 0) losses[row] = logf(sum) + mx - x_target;
  if (dlogits == nullptr) return;
  T* d = dlogits + row * ld;
  const float scale = grad_scale / sum;
  for (int64_t j = threadIdx.x; j < ld; j += blockDim.x) {
    float g = 0.0f;
    if (j < V) {
      g = expf(ToFloat(x[j]) - mx) * scale;
      if (j == target) g -= grad_scale;
    }
    d[j] = FromFloat<T>(g);
  }
}

}  // namespace

template <typename T>
Status SoftmaxCrossEntropy(CudaContext& ctx, float* losses, T* dlogits, const T* logits,
                           const int32_t* targets, int64_t N, int64_t V, float grad_scale,
                           int64_t ld) {
  if (N <= 0) return OkStatus();
  if (ld == 0) ld = V;
  CrossEntropyKernel<T><<<static_cast<unsigned>(N), kThreads, 0, ctx.stream()>>>(
      losses, dlogits, logits, targets, V, ld, grad_scale);
  MESHRUN_GPU_TRY_LAUNCH();
  return OkStatus();
}

template Status SoftmaxCrossEntropy<float>(CudaContext&, float*, float*, const float*,
                                           const int32_t*, int64_t, int64_t, float, int64_t);
template Status SoftmaxCrossEntropy<bf16>(CudaContext&, float*, bf16*, const bf16*, const int32_t*,
                                          int64_t, int64_t, float, int64_t);

}  // namespace meshrun::gpu
