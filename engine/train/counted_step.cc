#include "engine/train/counted_step.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "common/memory_estimate.h"
#include "engine/comm/comm_stats.h"
#include "engine/comm/counting_backend.h"
#include "engine/comm/mesh_comms.h"
#include "engine/comm/store.h"
#include "engine/train/trainer.h"

namespace meshrun {

StatusOr<CountedRank> CountRank(const JobSpec& spec, int rank, const CountOptions& count) {
  MESHRUN_ASSIGN_OR_RETURN(ParallelDims dims, MeshOf(spec));
  if (rank < 0 || rank >= dims.world_size()) {
    return InvalidArgumentError("CountRank: rank " + std::to_string(rank) +
                                " is outside the mesh's " + std::to_string(dims.world_size()));
  }
  JobSpec run = spec;
  // Two steps (the pools grow in the first; the second reuses them) with an evaluation after
  // each when there is validation data; nothing read, resumed or written.
  run.train.steps = 2;
  run.train.warmup_steps = 1;
  if (!run.data.val.empty()) run.data.eval_every = 1;
  if (!count.every_micro_batch) {
    const int64_t micro = MicroBatchesPerStep(spec);
    const int64_t enough = dims.pp() > 1 ? 2 * int64_t{dims.pp()} : 2;
    if (micro > enough) {
      run.train.global_batch_size =
          static_cast<int>(enough * spec.parallelism.dp_replicate_size *
                           spec.parallelism.dp_shard_size * spec.train.micro_batch_size);
    }
  }
  run.checkpoint.dir.clear();
  run.checkpoint.resume = "never";

  MemoryAccountScope account;  // this thread's counts only
  auto stats = std::make_shared<CommStats>();
  RankContext ctx;
  ctx.rank = rank;
  if (dims.world_size() > 1) {
    CountingBackend backend(/*overlaps=*/DeviceOf(spec.resources) == ComputeDevice::kCuda);
    MESHRUN_ASSIGN_OR_RETURN(
        std::unique_ptr<MeshComms> comms,
        MeshComms::Create(dims, rank, std::make_shared<InMemoryStore>(), backend, stats));
    ctx.comms = std::move(comms);
  }
  TrainOptions options;
  options.counting = true;
  MESHRUN_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                           Trainer::Create(run, options, std::move(ctx)));
  MESHRUN_ASSIGN_OR_RETURN(RunSummary summary, trainer->Run(nullptr));
  CountedRank out;
  out.memory = MemoryBreakdownOf(DeviceType::kCount);
  if (summary.steps > 0) {
    for (MeshAxis axis : kAllMeshAxes) {
      const double bytes = stats->AxisTotal(axis).bytes;
      if (bytes > 0) out.comm_bytes[axis] = bytes / static_cast<double>(summary.steps);
    }
  }
  return out;
}

StatusOr<int64_t> CountPeakBytes(const JobSpec& spec, bool with_other) {
  MESHRUN_ASSIGN_OR_RETURN(ParallelDims dims, MeshOf(spec));
  int64_t most = 0;
  for (int stage = 0; stage < dims.pp(); ++stage) {
    MeshCoords first;
    first.pp = stage;
    const MeshCoords last{.dp_replicate = dims.dp_replicate() - 1,
                          .dp_shard = dims.dp_shard() - 1,
                          .cp = dims.cp() - 1,
                          .tp = dims.tp() - 1,
                          .pp = stage};
    for (const MeshCoords& c : {first, last}) {
      MESHRUN_ASSIGN_OR_RETURN(CountedRank counted, CountRank(spec, dims.RankOf(c)));
      most = std::max(most, counted.Total(with_other));
      if (first == last) break;
    }
  }
  return most;
}

StatusOr<double> CountedRankBytes(const JobSpec& spec, int rank) {
  MESHRUN_ASSIGN_OR_RETURN(ParallelDims mesh, MeshOf(spec));
  if (EstimateRankMemory(spec, mesh).total() >= 1e15) return 0.0;
  if (rank < 0) {
    MESHRUN_ASSIGN_OR_RETURN(const int64_t most, CountPeakBytes(spec));
    return static_cast<double>(most);
  }
  MESHRUN_ASSIGN_OR_RETURN(CountedRank counted, CountRank(spec, rank));
  return static_cast<double>(counted.Total());
}

}  // namespace meshrun
