// Gang placement: hierarchical best fit over the mesh's nested units (see placement.h).
#include "coordinator/placement.h"

#include <algorithm>
#include <set>
#include <utility>

namespace meshrun::coordinator {
namespace {

std::string Str(long long v) {
  return std::to_string(v);
}

}  // namespace

PlaceabilityVerdict CheckPlaceable(const ParallelDims& mesh, const std::vector<int>& worker_slots) {
  const int tp = mesh.tp();
  const long long world = mesh.world_size();
  if (worker_slots.empty()) {
    return {Placeability::kTooFewSlots,
            "needs " + Str(world) + " slots; no worker is registered yet"};
  }
  const int largest = *std::max_element(worker_slots.begin(), worker_slots.end());
  if (tp > largest) {
    return {
        Placeability::kTpGroupTooLarge,
        "parallelism.tp_size: a tp group of " + Str(tp) +
            " ranks must run on one worker but the largest worker has " + Str(largest) + " slots" +
            (mesh.pp() > 1 ? " (a pipeline's stages spread across workers; a tp group never does)"
                           : std::string()) +
            " (hint: use a tp_size of at most " + Str(largest) +
            ", or start a worker with --slots " + Str(tp) + " or more)"};
  }
  long long usable = 0;  // slots usable in whole tp groups
  for (int slots : worker_slots) usable += static_cast<long long>(slots / tp) * tp;
  if (usable < world) {
    return {Placeability::kTooFewSlots,
            "needs " + Str(world) + " slots in tp groups of " + Str(tp) + "; the " +
                Str(static_cast<long long>(worker_slots.size())) + " workers hold " + Str(usable) +
                "; waiting for more workers",
            usable};
  }
  return {Placeability::kPlaceable, "", usable};
}

StatusOr<Placement> PlaceJob(const ParallelDims& mesh,
                             const std::vector<PlacementWorker>& workers) {
  const int tp = mesh.tp();
  const int groups = mesh.world_size() / tp;  // tp groups, in global-rank order
  // Capacity of each worker in whole tp groups.
  std::vector<int> cap(workers.size());
  long long total_groups = 0, free_slots = 0;
  for (size_t w = 0; w < workers.size(); ++w) {
    cap[w] = std::max(0, workers[w].free_slots) / tp;
    total_groups += cap[w];
    free_slots += std::max(0, workers[w].free_slots);
  }
  if (total_groups < groups) {
    return Status(StatusCode::kResourceExhausted,
                  "needs " + Str(mesh.world_size()) + " slots in whole tp groups of " + Str(tp) +
                      ", " + Str(free_slots) + " free on " +
                      Str(static_cast<long long>(workers.size())) + " workers");
  }

  // Unit sizes in tp groups, outermost first; each divides the one before it.
  const int cp_unit = mesh.cp();
  const int replica_unit = mesh.dp_shard() * mesh.cp();
  const int stage_unit = mesh.dp_replicate() * replica_unit;
  std::vector<int> levels = {groups, stage_unit, replica_unit, cp_unit, 1};
  levels.erase(std::unique(levels.begin(), levels.end()), levels.end());

  // Best fit: the (capacity, index) pairs ordered, so the smallest capacity ≥ size is a
  // lower_bound away.
  std::set<std::pair<int, int>> by_cap;
  for (size_t w = 0; w < workers.size(); ++w) {
    if (cap[w] > 0) by_cap.insert({cap[w], static_cast<int>(w)});
  }
  std::vector<int> worker_of_group(groups, -1);
  // Ranges [begin, begin + size) of groups still to place; start with the whole job.
  std::vector<int> pending = {0};
  int pending_size = groups;
  for (int size : levels) {
    // Split what is left into units of this level (sizes nest, so ranges stay aligned).
    std::vector<int> units;
    for (int begin : pending) {
      for (int b = begin; b < begin + pending_size; b += size) units.push_back(b);
    }
    std::vector<int> left;
    for (int begin : units) {
      auto it = by_cap.lower_bound({size, -1});
      if (it == by_cap.end()) {
        left.push_back(begin);
        continue;
      }
      const auto [c, w] = *it;
      by_cap.erase(it);
      if (c - size > 0) by_cap.insert({c - size, w});
      std::fill(worker_of_group.begin() + begin, worker_of_group.begin() + begin + size, w);
    }
    pending = std::move(left);
    pending_size = size;
    if (pending.empty()) break;
  }
  // Unreachable with enough capacity: at size 1 every remaining group finds a worker.
  if (!pending.empty()) return InternalError("placement left tp groups unplaced");

  Placement out;
  out.ranks.resize(mesh.world_size());
  out.local_world_size.assign(workers.size(), 0);
  for (int rank = 0; rank < mesh.world_size(); ++rank) {
    const int w = worker_of_group[rank / tp];
    out.ranks[rank] = {w, out.local_world_size[w]++};
  }
  for (int n : out.local_world_size) out.workers_used += n > 0 ? 1 : 0;
  return out;
}

}  // namespace meshrun::coordinator
