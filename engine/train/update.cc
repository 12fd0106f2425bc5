// Clip and update (engine/train/update.h).
#include "engine/train/update.h"

#include <cmath>

#include "engine/ops/ops.h"
#include "engine/train/schedule.h"

namespace meshrun {

std::vector<OptimizerSpan> OptimizerSpans(const ShardedState& shards) {
  std::vector<OptimizerSpan> spans;
  spans.reserve(shards.segments().size());
  for (const ShardSegment& s : shards.segments())
    spans.push_back({s.shard_offset, s.count, s.decay});
  return spans;
}

StatusOr<UpdateResult> ClipAndStep(ShardedState& shards, Optimizer& optimizer, const TrainSpec& tr,
                                   int64_t step) {
  MESHRUN_RETURN_IF_ERROR(shards.BeginUpdate());
  UpdateResult r;
  MESHRUN_ASSIGN_OR_RETURN(double norm_sq, shards.GlobalGradNormSquared());
  r.grad_norm = std::sqrt(norm_sq);
  float* g = shards.grads();
  // torch clip_grad_norm_: scale by max_norm / (norm + 1e-6) when the norm exceeds it.
  if (tr.grad_clip > 0 && r.grad_norm > tr.grad_clip) {
    MESHRUN_RETURN_IF_ERROR(
        ops::Scale(shards.device(), g, shards.size(), tr.grad_clip / (r.grad_norm + 1e-6)));
  }
  r.lr = LearningRate(tr.lr, tr.min_lr, tr.warmup_steps, tr.steps, step);
  MESHRUN_RETURN_IF_ERROR(
      optimizer.Step(shards.params(), g, OptimizerSpans(shards), tr, r.lr, step));
  shards.ParamsUpdated();
  return r;
}

}  // namespace meshrun
