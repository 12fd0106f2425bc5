// The memory model: the peak bytes of each kind (parameters, gradients, optimizer, activations,
// communication, other) that one rank of a job holds, predicted from the spec alone. It walks
// the same buffers the engine allocates (the model's activations, ShardedState's shards and its
// pool of gathered units, context parallel's exchange buffers), in the order a step allocates
// them, so it is exact up to what the allocator does not see (Gloo's own buffers, the data
// stream, code). bench/memory prints it beside the measured figures; the planner and the
// start-of-run checks stand on it. Pure: a spec in, numbers out.
#pragma once

#include <cstdint>

#include "common/job_spec.h"
#include "engine/core/tensor.h"

namespace meshrun {

struct MemoryPrediction {
  int64_t bytes[kNumMemoryKinds] = {};  // peak of each MemoryKind on the rank
  int64_t peak_bytes = 0;               // of all kinds together (the sum: an upper bound)
  int64_t of(MemoryKind kind) const { return bytes[static_cast<int>(kind)]; }
};

// The rank with mesh coordinates (0, 0, 0, 0) of `spec` (every rank holds the same sizes up
// to FSDP's padding). The spec must be valid (ValidateJobSpec).
MemoryPrediction PredictRankMemory(const JobSpec& spec);

}  // namespace meshrun
