// Pipeline parallelism as data (docs/parallelism.md "Pipeline parallelism", decision 0054): how
// the layers split into stages, and each stage's schedule as a list of operations the trainer
// executes in order. Pure functions: no I/O, no communication (the planner may call them).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/job_spec.h"
#include "common/status.h"
#include "engine/model/gpt2.h"

namespace meshrun {

// The cost a stage is charged for each part of the model, per token: 6 × the parameters it
// holds (the training FLOPs of their multiply-adds, or for the tables the weight of their
// parameters, gradients and optimizer state), plus 12·d_model·seq_len for each layer's
// attention scores. The embedding is charged to the first chunk, the final norm and the head
// to the last (a tied head counts its table again: it multiplies by it).
struct PipelineCosts {
  double embedding = 0;
  double layer = 0;  // every transformer layer costs the same
  double head = 0;
};
PipelineCosts PipelineCostsOf(const GPT2Config& whole, int seq_len);

// Layers of each of `chunks` contiguous chunks (each ≥ 1, summing to n_layer) that minimise the
// largest chunk's cost; among equal splits, the one whose earlier chunks hold more layers.
// chunks ≤ n_layer (the spec's validation).
std::vector<int> SplitLayersByCost(const GPT2Config& whole, int seq_len, int chunks);

// The layers of each pipeline chunk of a validated spec: parallelism.pp_layers when given, else
// SplitLayersByCost over pp_size·pp_virtual_stages chunks.
std::vector<int> PipelineLayers(const JobSpec& spec);

// One operation of a stage's schedule: the forward or the backward of one micro-batch. The
// trainer derives the communication from it (decision 0054): a forward receives the previous
// stage's output first (not on stage 0) and sends its own after (not on the last stage); a
// backward receives the gradient of its output first (not on the last stage) and sends the
// gradient of its input after (not on stage 0). A send is fused with the next operation's
// receive into one SendRecv.
enum class PipeOpKind { kForward, kBackward };
struct PipeOp {
  PipeOpKind kind = PipeOpKind::kForward;
  int micro = 0;
  bool operator==(const PipeOp&) const = default;
};

// 1F1B (PipeDream-flush, Megatron's default): stage p of P runs min(P − p − 1, M) forwards, then
// alternates one forward and one backward, then the remaining backwards, so at most P − p
// micro-batches are in flight on stage p.
std::vector<PipeOp> OneFOneBSchedule(int stages, int stage, int micro_batches);

// "F0 F1 B0 F2 B1 B2": a schedule as text (tests, logs).
std::string ScheduleText(const std::vector<PipeOp>& ops);

}  // namespace meshrun
