// Lion (Chen et al. 2023), op for op as the CPU kernel (engine/kernels/cpu/lion.cc) on float32
// master weights and momentum: decoupled weight decay, the sign of the interpolated momentum as
// the step, then the momentum's update.
#include "engine/cuda/check.h"
#include "engine/cuda/common.cuh"
#include "engine/cuda/kernels.h"

namespace meshrun::gpu {
namespace {

using internal::GridFor;

struct LionScalars {
  float decay, b1, w1, b2, w2, neg_lr;
  bool apply_decay;
};

__global__ void LionKernel(float* param, const float* grad, float* m, int64_t n, LionScalars c) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float g = grad[i];
    float p = param[i];
    if (c.apply_decay) p *= c.decay;
    const float mi = m[i];
    // __fmul_rn/__fadd_rn: no contraction into an fma, so the sign is the CPU kernel's.
    const float u = __fadd_rn(__fmul_rn(mi, c.b1), __fmul_rn(c.w1, g));
    const float sign = static_cast<float>((u > 0.0f) - (u < 0.0f));
    param[i] = __fadd_rn(p, __fmul_rn(c.neg_lr, sign));
    m[i] = __fadd_rn(__fmul_rn(mi, c.b2), __fmul_rn(c.w2, g));
  }
}

}  // namespace

Status Lion(CudaContext& ctx, float* param, const float* grad, float* m, int64_t n, double lr,
            double beta1, double beta2, double weight_decay) {
  if (n <= 0) return OkStatus();
  // Scalars formed in double (as Python does for torch), used in float like torch's kernels.
  LionScalars c;
  c.decay = static_cast<float>(1.0 - lr * weight_decay);
  c.b1 = static_cast<float>(beta1);
  c.w1 = static_cast<float>(1.0 - beta1);
  c.b2 = static_cast<float>(beta2);
  c.w2 = static_cast<float>(1.0 - beta2);
  c.neg_lr = static_cast<float>(-lr);
  c.apply_decay = weight_decay != 0.0;
  LionKernel<<<GridFor(n, 256), 256, 0, ctx.stream()>>>(param, grad, m, n, c);
  MESHRUN_GPU_TRY_LAUNCH();
  return OkStatus();
}

}  // namespace meshrun::gpu
