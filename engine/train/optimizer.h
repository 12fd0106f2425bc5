// The update that ends every step: global grad-norm clipping (torch clip_grad_norm_) and AdamW
// (torch.optim.AdamW) with the learning-rate schedule of CONVENTIONS §3.
#pragma once

#include <cstdint>

#include "common/job_spec.h"
#include "engine/model/gpt2.h"

namespace meshrun {

struct UpdateResult {
  double grad_norm = 0;  // before clipping
  double lr = 0;
};

// Clips model->grads by the global L2 norm (factor clip/(norm + 1e-6) when norm > clip), then
// applies AdamW for update `step` (0-based) with weight decay on 2+-dim parameters only.
// exp_avg and exp_avg_sq have the model's flat layout.
UpdateResult ClipAndAdamW(GPT2<float>* model, float* exp_avg, float* exp_avg_sq,
                          const TrainSpec& train, int64_t step);

}  // namespace meshrun
