#include "coordinator/scheduler.h"

#include <algorithm>

#include "coordinator/restart_policy.h"

namespace meshrun::coordinator {

// ---- SlotBook -----------------------------------------------------------------------------------

void SlotBook::Occupy(const std::string& worker, const RankRef& ref) {
  holders_[worker].insert(ref);
}

void SlotBook::Release(const std::string& worker, const RankRef& ref) {
  auto it = holders_.find(worker);
  if (it == holders_.end()) return;
  it->second.erase(ref);
  if (it->second.empty()) holders_.erase(it);
}

std::set<RankRef> SlotBook::Holders(const std::string& worker) const {
  auto it = holders_.find(worker);
  return it == holders_.end() ? std::set<RankRef>{} : it->second;
}

std::vector<std::string_view> SlotBook::WorkerIdsWithHolders() const {
  std::vector<std::string_view> out;
  out.reserve(holders_.size());
  for (const auto& [worker, refs] : holders_) out.push_back(worker);
  return out;
}

void SlotBook::SetForeign(const std::string& worker, int ranks) {
  if (ranks > 0) {
    foreign_[worker] = ranks;
  } else {
    foreign_.erase(worker);
  }
}

void SlotBook::ForgetHolders(const std::string& worker) {
  holders_.erase(worker);
}

int SlotBook::Used(const std::string& worker) const {
  int used = 0;
  if (auto it = holders_.find(worker); it != holders_.end()) {
    used += static_cast<int>(it->second.size());
  }
  if (auto it = foreign_.find(worker); it != foreign_.end()) used += it->second;
  return used;
}

std::unordered_map<std::string, int> SlotBook::InUse() const {
  std::unordered_map<std::string, int> out;
  for (const auto& [worker, refs] : holders_) out[worker] += static_cast<int>(refs.size());
  for (const auto& [worker, n] : foreign_) out[worker] += n;
  return out;
}

// ---- JobQueue -----------------------------------------------------------------------------------

void JobQueue::Add(int64_t seq, const std::string& job_id, const std::string& device,
                   const std::string& owner) {
  Remove(seq);
  by_seq_[seq] = {job_id, device, owner};
  ++by_owner_[owner];
}

void JobQueue::Remove(int64_t seq) {
  auto it = by_seq_.find(seq);
  if (it == by_seq_.end()) return;
  auto o = by_owner_.find(it->second.owner);
  if (o != by_owner_.end() && --o->second == 0) by_owner_.erase(o);
  by_seq_.erase(it);
}

size_t JobQueue::CountOf(const std::string& owner) const {
  auto it = by_owner_.find(owner);
  return it == by_owner_.end() ? 0 : it->second;
}

std::vector<std::string> JobQueue::InOrder() const {
  std::vector<std::string> out;
  out.reserve(by_seq_.size());
  for (const auto& [seq, e] : by_seq_) out.push_back(e.job_id);
  return out;
}

int JobQueue::CountFor(const std::string& device) const {
  int n = 0;
  for (const auto& [seq, e] : by_seq_) n += e.device == device ? 1 : 0;
  return n;
}

// ---- SchedulingRound ----------------------------------------------------------------------------

SchedulingRound::SchedulingRound(std::vector<LiveWorker> live, const SlotBook& slots) {
  for (LiveWorker& w : live) {
    Candidates& c = by_device_[w.device];
    c.placement.push_back({w.worker_id, w.slots, std::max(0, w.slots - slots.Used(w.worker_id))});
    c.slots.push_back(w.slots);
    c.live.push_back(std::move(w));
  }
}

ScheduleDecision SchedulingRound::Consider(const std::string& job_id, const std::string& device,
                                           const ParallelDims& mesh,
                                           std::chrono::milliseconds backoff) {
  ScheduleDecision d;
  Candidates& c = by_device_[device];
  if (c.live.empty()) {
    // No live worker offers this device's slots (e.g. a cuda job on a cpu-only cluster).
    d.message = "waiting for a " + device + " worker to register: no live worker offers " + device +
                " slots (hint: start meshrun-worker --device " + device +
                " on a node that has them)";
    return d;
  }
  if (backoff.count() > 0) {
    // Backing off after a failure; it does not hold up the jobs behind it.
    d.message = "waiting out the restart backoff (" + FormatSeconds(backoff) + ")";
    return d;
  }
  const PlaceabilityVerdict verdict = CheckPlaceable(mesh, c.slots);
  if (verdict.verdict == Placeability::kTpGroupTooLarge) {
    d.kind = ScheduleDecision::kFail;
    d.message = verdict.message;
    return d;
  }
  if (verdict.verdict == Placeability::kTooFewSlots) {
    // It cannot run until more workers register; it does not hold up the jobs behind it.
    d.message = verdict.message;
    return d;
  }
  if (!c.blocked_by.empty()) {
    d.message = "queued behind job " + c.blocked_by;
    return d;
  }
  StatusOr<Placement> placement = PlaceJob(mesh, c.placement);
  if (!placement.ok()) {
    d.message = placement.status().message() + "; waiting for slots to free up";
    c.blocked_by = job_id;
    return d;
  }
  for (size_t w = 0; w < c.placement.size(); ++w) {
    c.placement[w].free_slots -= placement->local_world_size[w];
  }
  d.kind = ScheduleDecision::kPlace;
  d.placement = std::move(*placement);
  d.workers = c.live;
  return d;
}

// ---- Admission and dry runs ---------------------------------------------------------------------

Status CheckAdmission(const std::vector<LiveWorker>& live, const std::string& device,
                      const ParallelDims& mesh, bool wait_for_capacity) {
  std::vector<int> slots;
  for (const LiveWorker& w : live) {
    if (w.device == device) slots.push_back(w.slots);
  }
  if (slots.empty()) return OkStatus();
  PlaceabilityVerdict verdict = CheckPlaceable(mesh, slots);
  if (verdict.verdict == Placeability::kTpGroupTooLarge) {
    return FailedPreconditionError(verdict.message);
  }
  // More ranks than every registered worker together holds: it would wait PENDING until
  // workers register, which the submitter must ask for (docs/decisions/0009).
  if (verdict.verdict == Placeability::kTooFewSlots && !wait_for_capacity) {
    long long total = 0;
    for (int n : slots) total += n;
    const std::string world = std::to_string(mesh.world_size());
    std::string held = std::to_string(total) + " slots";
    if (verdict.usable_slots != total) {
      held += " (" + std::to_string(verdict.usable_slots) + " of them in whole tp groups of " +
              std::to_string(mesh.tp()) + ")";
    }
    return FailedPreconditionError(
        "parallelism: " + mesh.ToString() + " needs " + world + " slots but the " +
        std::to_string(slots.size()) + " registered " + device +
        (slots.size() == 1 ? " worker holds " : " workers hold ") + held +
        " in all, so it could never start (hint: choose sizes whose product is at most " +
        std::to_string(verdict.usable_slots) +
        ", start more workers, or submit with --wait-for-capacity to queue it until they "
        "register)");
  }
  return OkStatus();
}

std::string DescribeDryRun(const std::vector<LiveWorker>& all, const SlotBook& slot_book,
                           const std::string& device, const ParallelDims& mesh, int queued_ahead) {
  std::vector<LiveWorker> live;
  std::vector<PlacementWorker> candidates;
  std::vector<int> slots;
  for (const LiveWorker& w : all) {
    if (w.device != device) continue;
    candidates.push_back(
        {w.worker_id, w.slots, std::max(0, w.slots - slot_book.Used(w.worker_id))});
    slots.push_back(w.slots);
    live.push_back(w);
  }
  if (live.empty()) return "would wait PENDING for a " + device + " worker to register";
  const PlaceabilityVerdict verdict = CheckPlaceable(mesh, slots);
  if (verdict.verdict != Placeability::kPlaceable) return "would wait PENDING: " + verdict.message;
  if (queued_ahead > 0) {
    return "would wait PENDING behind " + std::to_string(queued_ahead) + " queued " + device +
           " job" + (queued_ahead == 1 ? "" : "s");
  }
  StatusOr<Placement> placement = PlaceJob(mesh, candidates);
  if (!placement.ok()) {
    return "would wait PENDING: " + placement.status().message() + "; waiting for slots to free up";
  }
  // "ranks 0-1 on worker-1, ranks 2-3 on worker-2" (rank runs in global-rank order).
  std::string where;
  for (int g = 0; g < mesh.world_size();) {
    const int w = placement->ranks[g].worker;
    int end = g;
    while (end + 1 < mesh.world_size() && placement->ranks[end + 1].worker == w) ++end;
    where += where.empty() ? "" : ", ";
    where += (g == end ? "rank " + std::to_string(g)
                       : "ranks " + std::to_string(g) + "-" + std::to_string(end)) +
             " on " + live[w].name;
    g = end + 1;
  }
  return "would start now: " + where;
}

}  // namespace meshrun::coordinator
