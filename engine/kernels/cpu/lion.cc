// Lion (Chen et al. 2023; the update of lion-pytorch, op for op): decoupled weight decay, the
// sign of the interpolated momentum as the step, then the momentum's update.
#include <cstdint>

#include "engine/kernels/cpu/kernel_internal.h"
#include "engine/kernels/cpu/kernels.h"

namespace meshrun::cpu {

void Lion(float* param, const float* grad, float* m, int64_t n, double lr, double beta1,
          double beta2, double weight_decay) {
  // Scalars are formed in double, as Python does for torch, then used in float.
  const float decay = static_cast<float>(1.0 - lr * weight_decay);
  const float b1 = static_cast<float>(beta1), w1 = static_cast<float>(1.0 - beta1);
  const float b2 = static_cast<float>(beta2), w2 = static_cast<float>(1.0 - beta2);
  const float neg_lr = static_cast<float>(-lr);
  const bool apply_decay = weight_decay != 0.0;
#pragma omp parallel for simd schedule(static) if (internal::WorthParallel(n))
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i];
    float p = param[i];
    if (apply_decay) p *= decay;
    const float mi = m[i];
    const float c = mi * b1 + w1 * g;
    const float sign = static_cast<float>((c > 0.0f) - (c < 0.0f));  // torch.sign: 0 at 0
    param[i] = p + neg_lr * sign;
    m[i] = mi * b2 + w2 * g;
  }
}

}  // namespace meshrun::cpu
