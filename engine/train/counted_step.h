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
};

// Rank `rank` of `spec` (valid), counted on this thread. Its figures do not depend on the
// host: a cuda job counts as it would run on its GPU (with NCCL's asynchronous calls).
StatusOr<CountedRank> CountRank(const JobSpec& spec, int rank);

}  // namespace meshrun
