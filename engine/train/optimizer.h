// What the update that ends every step reports: global grad-norm clipping (torch
// clip_grad_norm_) and AdamW (torch.optim.AdamW) with the learning-rate schedule of
// docs/model.md. The update is ShardedState::ClipAndStep (engine/train/sharding.h), on cpu or
// cuda buffers alike (engine/ops).
#pragma once

#include <cstdint>

#include "common/job_spec.h"

namespace meshrun {

struct UpdateResult {
  double grad_norm = 0;  // before clipping
  double lr = 0;
};

}  // namespace meshrun
