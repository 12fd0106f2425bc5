// Gang placement of one job's ranks on workers' free slots (docs/parallelism.md "Placement").
// Pure functions of values: no clocks, no I/O, no threads; deterministic for equal inputs.
//
// The unit is the tp group (T consecutive global ranks), which never spans workers. Groups are
// placed hierarchically along the mesh's own nesting, largest unit first:
//   1. the whole job on one worker, if one has room;
//   2. else each pipeline stage (R·S·C·T consecutive ranks: everything but pp) whole on a
//      worker: only pp crosses workers, whose traffic is one activation per micro-batch;
//   3. stages that fit nowhere whole are split into dp_replicate replicas (S·C·T consecutive
//      ranks: its dp_shard and cp groups), so dp_replicate crosses workers next (HSDP);
//   4. replicas that fit nowhere whole are split into cp groups (C·T consecutive ranks), so cp
//      stays inside a worker and dp_shard crosses;
//   5. cp groups that fit nowhere whole are split into tp groups.
// So tp, then cp, stay inside a worker, and a pipeline's stages spread across workers.
// At every level a unit goes to the worker with the least free room that still holds it
// (best fit), ties to the earlier worker, which keeps large holes for large units.
#pragma once

#include <string>
#include <vector>

#include "common/parallel_dims.h"
#include "common/status.h"

namespace meshrun::coordinator {

// A worker as placement sees it: how many slots it has in all and how many are free now.
struct PlacementWorker {
  std::string worker_id;
  int slots = 0;
  int free_slots = 0;
};

// Where one global rank runs.
struct RankPlacement {
  int worker = -1;      // index into the workers given to PlaceJob
  int local_rank = -1;  // index among the job's ranks on that worker, in global-rank order
};

struct Placement {
  std::vector<RankPlacement> ranks;   // by global rank
  std::vector<int> local_world_size;  // per worker index (0 for unused workers)
  int workers_used = 0;
};

// Whether a mesh can ever run on workers with these total slot counts.
enum class Placeability {
  kPlaceable,        // fits the total capacity (it may still wait for slots to free up)
  kTpGroupTooLarge,  // tp_size exceeds every worker's slots: it can never run here
  kTooFewSlots,      // more ranks than the workers hold in whole tp groups: wait for workers
};

struct PlaceabilityVerdict {
  Placeability verdict = Placeability::kPlaceable;
  // For anything but kPlaceable: one line naming the numbers, e.g.
  // "parallelism.tp_size: a tp group of 8 ranks must run on one worker but the largest has 4
  //  slots (hint: ...)".
  std::string message;
  // Slots of the workers usable in whole tp groups (what a mesh can use at most).
  long long usable_slots = 0;
};

// Judges `mesh` against the total slots of every candidate worker (free or not). With no
// workers at all the verdict is kTooFewSlots (a job waits for its first worker).
PlaceabilityVerdict CheckPlaceable(const ParallelDims& mesh, const std::vector<int>& worker_slots);

// Places every rank of `mesh` on the free slots of `workers` (all or nothing). Fails with
// RESOURCE_EXHAUSTED ("needs 8 slots in whole tp groups of 2, 6 free on 3 workers") when the
// free slots, counted in whole tp groups, are too few.
StatusOr<Placement> PlaceJob(const ParallelDims& mesh, const std::vector<PlacementWorker>& workers);

}  // namespace meshrun::coordinator
