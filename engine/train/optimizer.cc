// Clipping and AdamW over the flat parameter buffer.
#include "engine/train/optimizer.h"

#include <cmath>

#include "engine/kernels/cpu/kernels.h"
#include "engine/train/schedule.h"

namespace meshrun {

UpdateResult ClipAndAdamW(GPT2<float>* model, float* exp_avg, float* exp_avg_sq,
                          const TrainSpec& tr, int64_t step) {
  UpdateResult r;
  float* grads = model->grads_data();
  const int64_t n = model->num_params();
  r.grad_norm = std::sqrt(cpu::SumOfSquares(grads, n));
  if (tr.grad_clip > 0 && r.grad_norm > tr.grad_clip) {
    cpu::Scale(grads, n, tr.grad_clip / (r.grad_norm + 1e-6));
  }
  r.lr = LearningRate(tr.lr, tr.min_lr, tr.warmup_steps, tr.steps, step);
  float* params = model->params_data();
  for (const ParamInfo& p : model->params()) {
    cpu::AdamW(params + p.offset, grads + p.offset, exp_avg + p.offset, exp_avg_sq + p.offset,
               p.numel, r.lr, tr.beta1, tr.beta2, tr.eps, p.decay ? tr.weight_decay : 0.0,
               step + 1);
  }
  return r;
}

}  // namespace meshrun
