// The update that ends every step: the global grad norm over the shards, clipping by it (torch
// clip_grad_norm_), the learning rate of docs/model.md's schedule, then the optimizer on this
// rank's shard. Joins the two seams: ShardedState (what the rank holds) and Optimizer (how it
// is updated), which know nothing of each other.
#pragma once

#include <cstdint>
#include <vector>

#include "common/job_spec.h"
#include "common/status.h"
#include "engine/train/optimizer.h"
#include "engine/train/sharding.h"

namespace meshrun {

// The optimizer's spans over the shard: one per shard segment, at the same offsets.
std::vector<OptimizerSpan> OptimizerSpans(const ShardedState& shards);

// Clips the shard's gradients by the global norm and applies `optimizer` (built over
// shards.size() elements on shards.device()) to the shard; step is 0-based.
StatusOr<UpdateResult> ClipAndStep(ShardedState& shards, Optimizer& optimizer,
                                   const TrainSpec& train, int64_t step);

}  // namespace meshrun
