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

// One operation of a rank's schedule: the forward (F) or the backward (B) of one micro-batch
// through one of the rank's model chunks (`chunk` k is the pipeline's chunk k·P + p of rank p;
// always 0 without virtual stages). The last chunk of the pipeline has no forward operation: its
// backward runs its forward first (decision 0054). Zero-bubble splits the backward (decision
// 0059): its B computes the input gradients only and keeps what the weight gradients need, and
// a third kind, W, computes the blocks' weight gradients from that later; W depends only on the
// same rank's B of the same micro-batch and chunk, and sends nothing.
enum class PipeOpKind { kForward, kBackward, kWeight };
struct PipeOp {
  PipeOpKind kind = PipeOpKind::kForward;
  int micro = 0;
  int chunk = 0;
  bool operator==(const PipeOp&) const = default;
};

// 1F1B (PipeDream-flush, Megatron's default): stage p of P runs min(P − p − 1, M) forwards, then
// alternates one forward and one backward, then the remaining backwards, so at most P − p
// micro-batches are in flight on stage p. Lists the last stage's forwards too (the trainer drops
// them: PipelineOps).
std::vector<PipeOp> OneFOneBSchedule(int stages, int stage, int micro_batches);

// Interleaved 1F1B (Megatron's virtual pipeline): each rank holds `virtual_stages` chunks;
// forwards go through chunk 0 for P micro-batches, then chunk 1 for the same P, …, then the next
// P micro-batches; backwards the same with the chunks reversed. Warm-up of
// (P − p − 1)·2 + (v − 1)·P forwards (capped at M·v). M must be a multiple of P.
std::vector<PipeOp> InterleavedSchedule(int stages, int stage, int micro_batches,
                                        int virtual_stages);

// ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", 2023; decision 0059): 1F1B's order of
// forwards and backwards, each backward a B, and each B followed by the W of the micro-batch
// `stage` backwards before it, so stage p defers p W passes: warm-up of min(P − p − 1, M)
// forwards, then F B W triples, then B W pairs, then the p deferred W passes, which fill the
// cool-down bubble. At most P micro-batches are between their F and their W on any stage (1F1B's
// count on stage 0), and at most p + 1 between their B and their W (the weight-gradient stashes).
// Lists the last stage's forwards too (the trainer drops them: PipelineOps).
std::vector<PipeOp> ZeroBubbleSchedule(int stages, int stage, int micro_batches);

// The most micro-batches of `ops` whose B has run and whose W has not, at once: the
// weight-gradient stashes a rank keeps (0 for schedules without W).
int MaxPendingWeightGrads(const std::vector<PipeOp>& ops);

// Whether a pipeline's chunks keep each micro-batch's activations from its forward to its
// backward (decision 0066): with pp and without activation checkpointing. Otherwise a chunk
// keeps only its input, and the backward runs the forward again (decision 0054).
bool PipelineKeepsActivations(const JobSpec& spec);

// Per chunk of `ops` (a rank's operations, chunks 0 … virtual_stages − 1): the most of its
// micro-batches whose forward has run and whose backward has not, at once (the forwards it
// keeps; the pipeline's last chunk has no forward operation and keeps none).
std::vector<int> MaxKeptForwards(const std::vector<PipeOp>& ops, int virtual_stages);
// The most forwards of `ops` kept at once over all chunks together.
int MaxKeptForwardsAtOnce(const std::vector<PipeOp>& ops);

// The operations rank `stage` runs under `schedule`, without the pipeline's last chunk's
// forwards (its backward runs it).
std::vector<PipeOp> PipelineOps(PpSchedule schedule, int stages, int stage, int micro_batches,
                                int virtual_stages);

// When every rank runs what (decision 0054): slots[t][p] is the index of rank p's operation run
// in slot t (−1: it waits). A rank runs its operations in order, each as soon as what it consumes
// was produced in an earlier slot: a forward of pipeline chunk g needs the forward of g − 1, a
// backward of g the backward of g + 1 (the last chunk's backward needs the forward of the chunk
// before it), a W the same rank's B of its micro-batch and chunk. After each slot the outputs
// move one rank on: forwards' to the next rank, backwards' input gradients to the previous one
// (a W sends nothing). Fails (INTERNAL) if the operations cannot all run.
struct PipeTimetable {
  std::vector<std::vector<int>> slots;
};
StatusOr<PipeTimetable> BuildTimetable(const std::vector<std::vector<PipeOp>>& ops, int stages,
                                       int virtual_stages, int micro_batches);

// The receives rank `stage` posts in a step under the asynchronous executor (decision 0064), in
// posting order: the order its neighbours send them (by the slot of `table` whose operation
// produces each), which is the order messages between two ranks match in. Each is posted before
// the rank's own operation `before_op` (an index into ops[stage]): as early as possible without
// ever holding more receive buffers at once than the lockstep timetable does (a buffer taken when
// its receive is posted, given back after the backward that reads it; the memory model counts
// that peak: PipelineBuffersAtPeak), and at the latest before the first operation of the rank
// after the producing slot, so never after the operation that consumes it. Posting a receive
// earlier never makes a rank wait longer, so the executor stays free of deadlock wherever the
// timetable is.
struct PipeRecv {
  bool gradient = false;  // false: a chunk's input (from the previous rank); true: the gradient
                          // of its output (from the next rank)
  int chunk = 0;          // the rank's chunk it feeds (PipeOp::chunk)
  int micro = 0;
  int before_op = 0;
};
std::vector<PipeRecv> PipelineReceives(const std::vector<std::vector<PipeOp>>& ops,
                                       const PipeTimetable& table, int stages, int virtual_stages,
                                       int stage);
// The most receive buffers `recvs` (PipelineReceives of `stage`) hold at once.
int PipelineReceiveBuffersHeld(const std::vector<PipeOp>& stage_ops,
                               const std::vector<PipeRecv>& recvs, int stages, int virtual_stages,
                               int stage);

// The asynchronous executor copies each output it sends into one of a ring of send buffers (one
// micro-batch's activation each), so that the stage runs on while the neighbour has not yet
// posted the receive; before it reuses a buffer it waits for the send that last used it. This
// many at most, and no more than the rank sends in a step (PipelineSendBuffers); the memory model
// counts them as communication memory.
inline constexpr int kPipeSendBuffers = 2;
// The send buffers rank `stage` allocates: min(kPipeSendBuffers, the messages it sends per step):
// a forward's output from every pipeline chunk but the last, a backward's input gradient from
// every chunk but the first.
int PipelineSendBuffers(const std::vector<PipeOp>& stage_ops, int stages, int virtual_stages,
                        int stage);

// The schedule's bubble in theory, with every stage the same and no communication cost:
// (P − 1)/(M + P − 1) for 1F1B and (P − 1)/(v·M + P − 1) interleaved, whatever a forward and a
// backward take (both bubble and work scale with F + B). Zero-bubble's depends on how the
// backward splits (decision 0068): ZB-H1's bubble is (P − 1)·(t_F + t_B − t_W) against a
// stage's work M·(t_F + t_B + t_W), so
//   (P − 1)(t_F + t_B − t_W) / (M (t_F + t_B + t_W) + (P − 1)(t_F + t_B − t_W)),
// which with t_F = t_B = t_W is (P − 1)/(3·M + P − 1) — the figure this overload gives.
double PipelineBubbleTheory(PpSchedule schedule, int stages, int micro_batches, int virtual_stages);
// The same at a stage's measured operation times: `forward_backward` the seconds of one forward
// plus one input-gradient backward (on the last stage its fused backward, which runs its forward
// too), `weight` one weight-gradient pass. Only zero_bubble reads them; without both (≤ 0) it is
// the equal-times figure above.
double PipelineBubbleTheory(PpSchedule schedule, int stages, int micro_batches, int virtual_stages,
                            double forward_backward, double weight);

// "F0 F1 B0 F2 B1 B2" (with chunks "F0.1"; W for weight passes): a schedule as text (tests,
// logs).
std::string ScheduleText(const std::vector<PipeOp>& ops);

}  // namespace meshrun
