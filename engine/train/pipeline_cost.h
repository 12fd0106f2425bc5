// The planner's pipeline-parallel terms (docs/planning.md "Pipeline parallelism"): how many
// micro-batches' activations a stage holds at its peak under each schedule, the bubble each
// schedule leaves, the point-to-point bytes between stages, and the split of the layers into
// stages by cost. Pure functions of numbers: no spec, no model, no device.
#pragma once

#include <cstdint>
#include <vector>

#include "common/job_spec.h"

namespace meshrun {

// One pipeline as the cost terms see it: P stages (pp_size), v model chunks per stage
// (pp_virtual_stages, interleaved only; 1 otherwise) and m micro-batches per step per stage.
struct PipelineShape {
  PpSchedule schedule = PpSchedule::k1F1B;
  int stages = 1;
  int virtual_stages = 1;
  int micro_batches = 1;
};

// The micro-batches stage `stage` (0-based) has in flight at its peak (forward run, backward
// not yet), in micro-batches of the whole stage (a chunk is 1/v of one): what a Megatron-style
// stage keeps for them (each one's activations) is that many times one's (the engine keeps
// inputs instead, counted exactly on the timetable by the memory model: PipelineBuffersAtPeak):
//   1F1B and zero-bubble (ZB-H1):  min(P − p, m)   (ZB-H1 keeps 1F1B's in-flight count; its
//                                                    deferred weight gradients fill the bubble)
//   interleaved 1F1B:              min((v − 1)·P + 2·(P − p − 1) + 1, m·v) / v
// (Megatron-LM's interleaved warm-up, one chunk = 1/v of the stage's layers). At P = 1: 1.
double PipelineActivationsInFlight(const PipelineShape& shape, int stage);

// The time of one micro-batch on one stage, split as zero-bubble schedules split the backward:
// the forward (F), the backward for the inputs' gradients (B) and for the weights' (W).
struct MicroBatchTimes {
  double forward = 0, backward_input = 0, backward_weight = 0;
  double total() const { return forward + backward_input + backward_weight; }
};

// The idle time of a stage in one step (the pipeline's fill and drain):
//   1F1B:         (P − 1)·(F + B + W)
//   interleaved:  (P − 1)·(F + B + W) / v
//   zero-bubble:  (P − 1)·(F + B − W)   (ZB-H1; never below 0)
// 0 at P = 1.
double PipelineBubbleSeconds(const PipelineShape& shape, const MicroBatchTimes& t);
// The bubble as a fraction of the step's compute time: bubble / (m·(F + B + W) + bubble). With
// F = B = W: (P − 1)/(m + P − 1), (P − 1)/(v·m + P − 1), (P − 1)/(3·m + P − 1).
double PipelineBubbleFraction(const PipelineShape& shape, const MicroBatchTimes& t);

// Bytes of one activation (or its gradient) sent from a stage to the next for one micro-batch:
// micro_batch_size · tokens per sequence on the rank (seq_len / cp) · d_model · bytes per value.
double PipelineP2pBytesPerMicroBatch(int micro_batch_size, int tokens_per_sequence, int d_model,
                                     double bytes_per_value);
// What one rank sends over the pp axis in one step (bus bytes of a send: its size): the
// activation forward and its gradient backward for every micro-batch at each of its v chunk
// boundaries, 2·m·v·message. 0 at P = 1.
double PipelineP2pBytesPerStep(const PipelineShape& shape, double message_bytes);
// Sends per rank per step (the latency term): 2·m·v, 0 at P = 1.
double PipelineP2pCallsPerStep(const PipelineShape& shape);

// Layers of each of `chunks` consecutive model chunks (P·v; chunk k runs on stage k mod P),
// balanced by cost: a layer costs `layer_cost`, the first chunk also `first_extra` (the
// embedding), the last `last_extra` (the final norm and the head). The split minimises the
// largest chunk's cost, every chunk holding at least one layer. Needs 1 ≤ chunks ≤ n_layer.
std::vector<int> BalancedLayerSplit(int n_layer, int chunks, double layer_cost, double first_extra,
                                    double last_extra);

// The cost of each stage (the sum of its chunks': stage p holds chunks p, p + P, …) of a split.
std::vector<double> StageCosts(const std::vector<int>& chunk_layers, int stages, double layer_cost,
                               double first_extra, double last_extra);

}  // namespace meshrun
