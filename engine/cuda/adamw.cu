// AdamW (torch.optim.AdamW, single-tensor path, op for op as the CPU kernel) on float32 master
// weights and state, with the clip factor folded into the gradient read and an optional
// low-precision copy of the updated weights written in the same pass.
#include <cmath>
#include <string>

#include "engine/cuda/check.h"
#include "engine/cuda/common.cuh"
#include "engine/cuda/kernels.h"

namespace meshrun::gpu {
namespace {

using internal::FromFloat;
using internal::GridFor;

struct AdamWScalars {
  float decay, w1, b2, w2, neg_step_size, bc2_sqrt, eps, grad_scale;
  bool apply_decay, lerp_from_start, scale_grad;
};

template <typename T>
__global__ void AdamWKernel(float* param, const float* grad, float* m, float* v, int64_t n,
                            AdamWScalars c, T* param_copy) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float g = c.scale_grad ? grad[i] * c.grad_scale : grad[i];
    float p = param[i];
    if (c.apply_decay) p *= c.decay;
    float mi = m[i];
    mi = c.lerp_from_start ? mi + c.w1 * (g - mi) : g - (g - mi) * (1.0f - c.w1);
    const float vi = v[i] * c.b2 + c.w2 * g * g;
    const float denom = sqrtf(vi) / c.bc2_sqrt + c.eps;
    p = p + c.neg_step_size * mi / denom;
    param[i] = p;
    m[i] = mi;
    v[i] = vi;
    if (param_copy != nullptr) param_copy[i] = FromFloat<T>(p);
  }
}

}  // namespace

template <typename T>
Status AdamW(CudaContext& ctx, float* param, const float* grad, float* m, float* v, int64_t n,
             double lr, double beta1, double beta2, double eps, double weight_decay, int64_t step,
             float grad_scale, T* param_copy) {
  if (n <= 0) return OkStatus();
  if (step < 1) return InvalidArgumentError("AdamW step is 1-based, got " + std::to_string(step));
  // Scalars formed in double (as Python does for torch), used in float like torch's kernels.
  AdamWScalars c;
  c.decay = static_cast<float>(1.0 - lr * weight_decay);
  c.w1 = static_cast<float>(1.0 - beta1);
  c.b2 = static_cast<float>(beta2);
  c.w2 = static_cast<float>(1.0 - beta2);
  const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  c.neg_step_size = static_cast<float>(-(lr / bc1));
  c.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  c.eps = static_cast<float>(eps);
  c.grad_scale = grad_scale;
  c.apply_decay = weight_decay != 0.0;
  c.lerp_from_start = c.w1 < 0.5f;
  c.scale_grad = grad_scale != 1.0f;
  AdamWKernel<T><<<GridFor(n, 256), 256, 0, ctx.stream()>>>(param, grad, m, v, n, c, param_copy);
  MESHRUN_GPU_TRY_LAUNCH();
  return OkStatus();
}

template Status AdamW<float>(CudaContext&, float*, const float*, float*, float*, int64_t, double,
                             double, double, double, double, int64_t, float, float*);
template Status AdamW<bf16>(CudaContext&, float*, const float*, float*, float*, int64_t, double,
                            double, double, double, double, int64_t, float, bf16*);

}  // namespace meshrun::gpu
