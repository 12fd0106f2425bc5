// The pipeline cost terms of pipeline_cost.h; docs/planning.md derives each formula.
#include "engine/train/pipeline_cost.h"

#include <algorithm>
#include <cmath>

namespace meshrun {

double PipelineActivationsInFlight(const PipelineShape& shape, int stage) {
  const int P = std::max(1, shape.stages), m = std::max(1, shape.micro_batches);
  const int p = std::clamp(stage, 0, P - 1);
  if (P == 1) return 1;
  if (shape.schedule == PpSchedule::kInterleaved1F1B && shape.virtual_stages > 1) {
    const int v = shape.virtual_stages;
    // Megatron-LM's interleaved schedule: (P − p − 1)·2 + (v − 1)·P warm-up forwards of one
    // chunk each, then one more forward before the first backward; at most all m·v chunks.
    const int chunks = std::min((v - 1) * P + 2 * (P - p - 1) + 1, m * v);
    return static_cast<double>(chunks) / v;
  }
  return std::min(P - p, m);
}

double PipelineBubbleSeconds(const PipelineShape& shape, const MicroBatchTimes& t) {
  const int P = std::max(1, shape.stages);
  if (P == 1) return 0;
  switch (shape.schedule) {
    case PpSchedule::kInterleaved1F1B:
      return (P - 1) * t.total() / std::max(1, shape.virtual_stages);
    case PpSchedule::kZeroBubble:
      return (P - 1) * std::max(0.0, t.forward + t.backward_input - t.backward_weight);
    case PpSchedule::k1F1B: break;
  }
  return (P - 1) * t.total();
}

double PipelineBubbleFraction(const PipelineShape& shape, const MicroBatchTimes& t) {
  const double bubble = PipelineBubbleSeconds(shape, t);
  const double busy = std::max(1, shape.micro_batches) * t.total();
  return bubble + busy > 0 ? bubble / (bubble + busy) : 0;
}

double PipelineP2pBytesPerMicroBatch(int micro_batch_size, int tokens_per_sequence, int d_model,
                                     double bytes_per_value) {
  return static_cast<double>(micro_batch_size) * tokens_per_sequence * d_model * bytes_per_value;
}

double PipelineP2pCallsPerStep(const PipelineShape& shape) {
  if (shape.stages <= 1) return 0;
  const int v =
      shape.schedule == PpSchedule::kInterleaved1F1B ? std::max(1, shape.virtual_stages) : 1;
  return 2.0 * std::max(1, shape.micro_batches) * v;
}

double PipelineP2pBytesPerStep(const PipelineShape& shape, double message_bytes) {
  return PipelineP2pCallsPerStep(shape) * message_bytes;
}

namespace {

// Layers each chunk can hold within a cost of `limit` (0 when it cannot hold one).
std::vector<int> ChunkCapacities(int chunks, double limit, double c, double first, double last) {
  std::vector<int> cap(chunks);
  for (int k = 0; k < chunks; ++k) {
    double extra = (k == 0 ? first : 0) + (k == chunks - 1 ? last : 0);
    cap[k] = static_cast<int>(std::floor((limit - extra) / c + 1e-9));
  }
  return cap;
}

}  // namespace

std::vector<int> BalancedLayerSplit(int n_layer, int chunks, double layer_cost, double first_extra,
                                    double last_extra) {
  chunks = std::clamp(chunks, 1, std::max(1, n_layer));
  std::vector<int> out(chunks, n_layer / chunks);
  for (int k = 0; k < n_layer % chunks; ++k) ++out[k];
  if (layer_cost <= 0) return out;
  // The smallest limit on a chunk's cost at which every chunk holds a layer and together they
  // hold all: a chunk's cost is a whole number of layers plus its extras, so the limit is one
  // of those values.
  std::vector<double> limits;
  for (int k = 1; k <= n_layer; ++k) {
    for (double extra : {0.0, first_extra, last_extra, first_extra + last_extra}) {
      limits.push_back(k * layer_cost + extra);
    }
  }
  std::sort(limits.begin(), limits.end());
  for (double limit : limits) {
    std::vector<int> cap = ChunkCapacities(chunks, limit, layer_cost, first_extra, last_extra);
    long long sum = 0;
    bool every = true;
    for (int n : cap) {
      every = every && n >= 1;
      sum += n;
    }
    if (!every || sum < n_layer) continue;
    // Take the surplus away from the costliest chunks (the latest on a tie), keeping one each.
    for (long long surplus = sum - n_layer; surplus > 0; --surplus) {
      int worst = -1;
      double worst_cost = -1;
      for (int k = 0; k < chunks; ++k) {
        if (cap[k] <= 1) continue;
        const double cost =
            cap[k] * layer_cost + (k == 0 ? first_extra : 0) + (k == chunks - 1 ? last_extra : 0);
        if (cost >= worst_cost) {
          worst = k;
          worst_cost = cost;
        }
      }
      --cap[worst];
    }
    return cap;
  }
  return out;
}

std::vector<double> StageCosts(const std::vector<int>& chunk_layers, int stages, double layer_cost,
                               double first_extra, double last_extra) {
  stages = std::max(1, stages);
  std::vector<double> cost(stages, 0);
  const int chunks = static_cast<int>(chunk_layers.size());
  for (int k = 0; k < chunks; ++k) {
    cost[k % stages] += chunk_layers[k] * layer_cost + (k == 0 ? first_extra : 0) +
                        (k == chunks - 1 ? last_extra : 0);
  }
  return cost;
}

}  // namespace meshrun
