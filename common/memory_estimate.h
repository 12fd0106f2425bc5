// A quick lower bound of one rank's peak memory for a job spec, from the model sizes and the
// mesh alone, in double so that no size overflows: the guard in front of the engine's own count
// (engine/train/counted_step.h, CountedRankBytes), which refuses by it alone sizes too large for
// the engine's integer shapes (d_model or d_ff 2^31−1 would otherwise wrap them), and the
// message's sizes and field. It counts what the engine allocates for GPT-2 and the Llama family
// (d_ff, grouped-query heads, an untied head) less FSDP's gathered units and communication
// buffers; a test holds it under the engine's figure. Pure: values in, a value out.
#pragma once

#include <string>

#include "common/job_spec.h"
#include "common/parallel_dims.h"
#include "common/status.h"

namespace meshrun {

struct RankMemoryEstimate {
  double parameters = 0;        // total parameters of the model (unsharded)
  double state_bytes = 0;       // this rank's float32 parameters, gradients and optimizer state
  double activation_bytes = 0;  // one micro-batch's largest activations (logits, attention)
  double total() const { return state_bytes + activation_bytes; }
};

// A lower-bound style estimate (what the engine must hold): parameters, gradients and two
// AdamW moments in float32, divided over tp·dp_shard·cp, plus one micro-batch's activations on
// this rank (every layer's, or what activation checkpointing keeps, and the head's logits).
RankMemoryEstimate EstimateRankMemory(const JobSpec& spec, const ParallelDims& mesh);

// OK when `ranks_on_host` ranks of the estimate fit in `available_bytes` (0: no check), else
// RESOURCE_EXHAUSTED naming model sizes and `flag` (the worker's --memory-bytes).
// rank_bytes > 0: one rank's need counted by the engine (CountRank) in place of the estimate.
Status CheckRankMemory(const JobSpec& spec, const ParallelDims& mesh, int ranks_on_host,
                       double available_bytes, const std::string& flag, double rank_bytes = 0);

// The check `meshrun validate` and the start of `train`/`submit` run (client/preflight.h): OK
// when `ranks_on_host` ranks of the estimate fit in `host_bytes` (0: no check), else
// INVALID_ARGUMENT (the spec asks for what this host can never hold; exit 2) naming the field
// that drives the estimate (model.d_model, model.n_layer, model.vocab_size or
// train.micro_batch_size), the sizes, the bytes and a fix. One function, so a fuller memory
// model can replace the estimate behind it.
// rank_bytes > 0: one rank's need from a fuller model (the engine's PredictRankMemory) in place
// of the lower bound.
Status CheckJobFitsHost(const JobSpec& spec, const ParallelDims& mesh, int ranks_on_host,
                        double host_bytes, double rank_bytes = 0);

}  // namespace meshrun
