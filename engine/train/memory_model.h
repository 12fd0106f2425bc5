// The memory model: the peak bytes of each kind (parameters, gradients, optimizer, activations,
// communication, other) that one rank of a job holds, predicted from the spec alone. It walks
// the same buffers the engine allocates (the model's activations, ShardedState's shards and its
// pool of gathered units, context parallel's exchange buffers, a pipeline stage's received
// activations and gradients), in the order a step allocates them, so it is exact up to what the
// allocator does not see (Gloo's own buffers, the data stream, code). bench/memory prints it
// beside the measured figures; the planner and the start-of-run checks stand on it. Pure: a
// spec in, numbers out.
#pragma once

#include <cstdint>
#include <vector>

#include "common/job_spec.h"
#include "engine/core/tensor.h"

namespace meshrun {

struct MemoryPrediction {
  int64_t bytes[kNumMemoryKinds] = {};  // peak of each MemoryKind on the rank
  int64_t peak_bytes = 0;               // of all kinds together (the sum: an upper bound)
  int64_t of(MemoryKind kind) const { return bytes[static_cast<int>(kind)]; }
};

// A rank of pipeline stage `pp_stage` (0 ≤ pp_stage < pp_size) of `spec`, at mesh coordinates
// (pp_stage, 0, 0, 0, 0): every rank of a stage holds the same sizes up to FSDP's padding and
// the last tp rank's vocabulary rows. The stage holds its own layers, the embedding on the first
// stage (and on a tied last one, decision 0054), the final norm and head on the last; its
// activations are one micro-batch's of its layers plus the pipeline's receive buffers it holds
// at once (PipelineBuffersAtPeak) and, under zero_bubble, its pending weight-gradient stashes
// (PipelineWeightStashesAtPeak). The spec must be valid (ValidateJobSpec).
MemoryPrediction PredictRankMemory(const JobSpec& spec, int pp_stage);

// The largest rank of `spec`: each kind's peak is the largest over the pipeline's stages (what
// RunSummary::memory reports: each kind's maximum over the job's ranks), and peak_bytes the
// largest stage's peak_bytes (what one rank must have room for). Without pp: the one stage.
MemoryPrediction PredictRankMemory(const JobSpec& spec);

// Every stage's PredictRankMemory(spec, p), p = 0 … pp_size − 1 (one timetable for all).
std::vector<MemoryPrediction> PredictStagesMemory(const JobSpec& spec);

// Pipeline parallelism: the most receive buffers stage `pp_stage` holds at once, each one
// micro-batch's activation (micro_batch_size · seq_len/cp · d_model floats): the input of a
// micro-batch (per model chunk) from its receive until its backward through the chunk ran, and
// the gradient of its output from its receive until that backward. Counted on the schedule's
// timetable (engine/train/pipeline.h) as the trainer's free list hands them out, and independent
// of the micro-batch count once it is at least 2·P. 1F1B: 1 on the first stage (an output
// gradient: it reads tokens, not inputs), P − p + 2 on a middle stage p (the inputs of its P − p
// micro-batches in flight, the next one's already received, and an output gradient), 1 on the
// last; interleaved: see docs/parallelism.md. 0 without pp.
int PipelineBuffersAtPeak(const JobSpec& spec, int pp_stage);

// Zero-bubble (decision 0059): the most weight-gradient stashes stage `pp_stage` holds at once
// (micro-batches whose B ran and whose W has not: MaxPendingWeightGrads of its schedule,
// min(p + 1, M) under ZB-H1), and the floats of one (GPT2::WeightStashNumel of the stage: per
// layer n·(4d + qkv/T + d/T + fc/T + ff/T) + 4d, 2d under llama, n = micro_batch_size·seq_len/cp,
// qkv = (n_head + 2·n_kv_head)·head_dim, fc = ff under GPT-2 and 2·ff under llama). Each is an
// activation from the start of its B to the end of its W. The count is 0 under other schedules
// (the size is what one would be); both are 0 without pp.
int PipelineWeightStashesAtPeak(const JobSpec& spec, int pp_stage);
int64_t PipelineWeightStashNumel(const JobSpec& spec, int pp_stage);

}  // namespace meshrun
