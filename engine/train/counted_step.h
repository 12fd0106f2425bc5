// One rank's training counted, not run: the engine's own Trainer on the counting device
// (DeviceType::kCount: buffers with sizes and no memory, ops that do nothing) over the counting
// backend (calls that complete at once and move nothing). Every buffer the real rank allocates
// is allocated here, of the same size and kind and in the same order, and every collective the
// real rank calls is called, so the figures are the engine's, not a formula's: a change to what
// the step allocates or sends changes them with it. No data is read and nothing is computed, so
// it takes milliseconds for a model of any size.
#pragma once

#include <map>

#include "common/job_spec.h"
#include "common/parallel_dims.h"
#include "common/status.h"
#include "engine/core/tensor.h"

namespace meshrun {

struct CountedRank {
  // The rank's peak bytes of each kind over two steps (an evaluation after each when the spec
  // has data.val): what the in-process meshes measure for it on the CPU.
  MemoryBreakdown memory;
  // The bus bytes (docs/parallelism.md) the rank moves per step over each axis of its mesh.
  std::map<MeshAxis, double> comm_bytes;

  // The sum of every kind's peak; without "other" (token ids and host tables mirrored on the
  // device), the kinds the memory model and the planner's rows add up.
  int64_t Total(bool with_other = true) const {
    int64_t sum = 0;
    for (int k = 0; k < kNumMemoryKinds - (with_other ? 0 : 1); ++k) sum += memory.peak[k];
    return sum;
  }
};

struct CountOptions {
  // Count every micro-batch of the step. By default a step counts as many as it takes for the
  // peaks to stop growing: 2 without pp, 2·pp_size with it (fewer when the step has fewer), as
  // the pools and the schedule's buffers are full by then; counted_step_test holds the two
  // equal. Bytes per step are the counted step's, so comm_bytes counts every micro-batch only
  // with this set.
  bool every_micro_batch = false;
};

// Rank `rank` of `spec` (valid), counted on this thread. Its figures do not depend on the
// host: a cuda job counts as it would run on its GPU (with NCCL's asynchronous calls).
StatusOr<CountedRank> CountRank(const JobSpec& spec, int rank, const CountOptions& options = {});

// The most bytes any rank of `spec` holds at once: over the pipeline's stages, the largest of
// the first rank's and the last rank's (FSDP's padding and the vocabulary's remainder rows fall
// on one or the other) CountedRank::Total(with_other).
StatusOr<int64_t> CountPeakBytes(const JobSpec& spec, bool with_other = true);

// The bytes one rank of `spec` needs: `rank`'s own step counted (CountRank, with "other"), or,
// with rank < 0, the largest rank's (CountPeakBytes). 0 where the sizes are too large for the
// engine's integer shapes (a lower bound computed in double, common/memory_estimate.h, above
// 1e15 bytes): the caller's check refuses those by that bound alone.
StatusOr<double> CountedRankBytes(const JobSpec& spec, int rank = -1);

}  // namespace meshrun
