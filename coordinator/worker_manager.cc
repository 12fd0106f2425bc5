// WorkerManager: registration, leases, session attachment and the per-worker outbox.
#include "coordinator/worker_manager.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <random>

#include "common/escape.h"
#include "common/job_spec.h"
#include "coordinator/proto_time.h"

namespace meshrun::coordinator {
namespace {

std::string NewToken() {
  std::random_device rd;
  std::string out;
  char buf[9];
  for (int i = 0; i < 4; ++i) {
    std::snprintf(buf, sizeof(buf), "%08x", rd());
    out += buf;
  }
  return out;
}

bool ValidName(const std::string& name) {
  return !name.empty() && name.size() <= 128 && std::all_of(name.begin(), name.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_' || ch == '.';
  });
}

Status Invalid(const std::string& field, const std::string& what, const std::string& hint) {
  return InvalidArgumentError(field + ": " + what + " (hint: " + hint + ")");
}

Status ValidateRegistration(const v1::RegisterWorkerRequest& r) {
  if (!ValidName(r.name())) {
    return Invalid("name", QuoteForMessage(r.name()) + " is not a valid worker name",
                   "use 1 to 128 letters, digits, '-', '_' or '.'");
  }
  if (r.slots() < 1 || r.slots() > 4096) {
    return Invalid("slots", "must be in [1, 4096], got " + std::to_string(r.slots()),
                   "start the worker with --slots N, N ≥ 1");
  }
  if (r.device() != "cpu" && r.device() != "cuda") {
    return Invalid("device", QuoteForMessage(r.device()) + " is not one of 'cpu' or 'cuda'",
                   "start the worker with --device cpu or --device cuda");
  }
  for (const auto& [field, value] :
       {std::pair<const char*, const std::string*>{"address", &r.address()},
        {"metrics_address", &r.metrics_address()},
        {"device_name", &r.device_name()},
        {"version", &r.version()}}) {
    if (value->size() > 256) {
      return Invalid(field, "is over 256 bytes (" + std::to_string(value->size()) + ")",
                     "send a plain host name, address or word");
    }
    // `meshrun workers` and the coordinator's log show them: printable UTF-8 only.
    if (!IsPlainText(*value)) {
      return Invalid(field,
                     QuoteForMessage(*value) +
                         " holds control characters (C0, DEL, C1, bidirectional) or invalid "
                         "UTF-8",
                     "send a plain host name, address or word");
    }
  }
  return OkStatus();
}

}  // namespace

WorkerManager::WorkerManager(StateDb* db, const Clock& clock, WorkerManagerConfig config)
    : db_(db), clock_(clock), config_(config) {}

WorkerManager::~WorkerManager() = default;

std::chrono::milliseconds WorkerManager::heartbeat_interval() const {
  return std::max(std::chrono::milliseconds(50), config_.lease_ttl / 3);
}

Status WorkerManager::Load() {
  if (db_ == nullptr) return OkStatus();
  MESHRUN_ASSIGN_OR_RETURN(std::vector<WorkerRow> rows, db_->LoadWorkers());
  std::lock_guard<std::mutex> lock(mu_);
  for (WorkerRow& row : rows) {
    Worker w;
    w.row = std::move(row);
    // The figures the worker measured at registration: `plan --coordinator` and auto
    // submissions plan with them before (and whether or not) the worker registers again.
    if (!w.row.calibration.empty() && !w.calibration.ParseFromString(w.row.calibration)) {
      w.calibration.Clear();
    }
    w.SetDeadline(clock_.Monotonic() + config_.lease_ttl + config_.restart_grace);
    w.SetHeartbeat(FromMillis(w.row.last_heartbeat_ms));
    w.lease->lost = w.row.lost;
    const std::string id = w.row.worker_id;
    if (id.rfind("wkr-", 0) == 0) {
      next_worker_number_ = std::max<int64_t>(next_worker_number_, std::atoll(id.c_str() + 4) + 1);
    }
    by_name_[w.row.name] = id;
    workers_[id] = std::move(w);
  }
  roster_generation_.fetch_add(1);
  return OkStatus();
}

void WorkerManager::RenewLocked(Worker& w) {
  w.SetDeadline(clock_.Monotonic() + config_.lease_ttl);
  w.SetHeartbeat(clock_.Now());
}

Status WorkerManager::PersistLocked(const Worker& w, Durability durability) {
  if (db_ == nullptr) return OkStatus();
  WriteBatch batch;
  batch.workers.push_back(w.row);
  batch.workers.back().last_heartbeat_ms = ToMillis(w.heartbeat());
  return db_->Commit(batch, durability);
}

StatusOr<WorkerManager::Registered> WorkerManager::Register(const v1::RegisterWorkerRequest& r) {
  MESHRUN_RETURN_IF_ERROR(ValidateRegistration(r));
  std::lock_guard<std::mutex> lock(mu_);
  if (shut_down_) return UnavailableError("the coordinator is stopping (hint: retry with backoff)");
  Registered out;
  auto by_name = by_name_.find(r.name());
  Worker* w = nullptr;
  Worker fresh;
  if (by_name != by_name_.end()) {
    w = &workers_.at(by_name->second);
    // A live holder (a session open, or registered a moment ago and about to open one, from
    // another address) keeps the name: two processes under one name would take the
    // registration from each other forever. A restarted worker whose predecessor is gone (its
    // session closed, or its lease ran out) takes over.
    const bool lease_live = !w->row.lost && w->deadline() > clock_.Monotonic();
    const bool holder_live = lease_live && (w->stream != nullptr ||
                                            (w->awaiting_session && w->row.address != r.address()));
    if (holder_live) {
      const auto seen =
          std::chrono::duration_cast<std::chrono::milliseconds>(clock_.Now() - w->heartbeat());
      char ago[32];
      std::snprintf(ago, sizeof(ago), "%.1f s ago", std::max<int64_t>(0, seen.count()) / 1000.0);
      return Status(StatusCode::kAlreadyExists,
                    "--name: worker '" + r.name() + "' is already registered from " +
                        w->row.address + ", last seen " + ago + " (" +
                        (w->stream ? "its session is open" : "it is opening its session") +
                        ") (hint: choose another --name, or stop that worker; a restarted worker "
                        "takes over once the old one's session has closed or its heartbeat has "
                        "expired)");
    }
    out.replaced_live = !w->row.lost;
    spdlog::info(
        "worker '{}' registered again from {}: it takes over from the previous registration "
        "(from {}; {})",
        r.name(), r.address(), w->row.address,
        w->row.lost           ? "it was marked LOST"
        : !lease_live         ? "its heartbeat expired"
        : w->awaiting_session ? "it had not opened its session yet"
                              : "its session had closed");
  } else {
    size_t live = 0;
    for (const auto& [id, other] : workers_) live += other.row.lost ? 0 : 1;
    if (live >= config_.max_workers) {
      return ResourceExhaustedError("workers: " + std::to_string(live) +
                                    " live workers already, the coordinator's limit");
    }
    fresh.row.worker_id = "wkr-" + std::to_string(next_worker_number_);
    fresh.row.registered_ms = ToMillis(clock_.Now());
    w = &fresh;
  }
  Worker updated;
  updated.row = w->row;
  updated.awaiting_session = true;
  updated.row.name = r.name();
  updated.row.session_token = NewToken();
  updated.row.slots = r.slots();
  updated.row.device = r.device();
  updated.row.address = r.address();
  updated.row.metrics_address = r.metrics_address();
  updated.row.device_name = r.device_name();
  updated.row.version = r.version();
  updated.row.lost = false;
  updated.row.registered_ms = ToMillis(clock_.Now());
  updated.calibration = r.calibration();
  updated.row.calibration = r.calibration().SerializeAsString();
  RenewLocked(updated);
  // Written before anyone learns of the registration.
  MESHRUN_RETURN_IF_ERROR(PersistLocked(updated, Durability::kDurable));

  if (w != &fresh) {
    // The worker restarted: its old session and undelivered orders belong to the old process.
    if (w->stream) {
      std::lock_guard<std::mutex> sessions(sessions_mu_);
      streams_.erase(w->stream.get());
      w->stream->Finish(
          AbortedError("a newer registration of worker '" + r.name() + "' replaced this session"));
    }
    w->row = updated.row;
    w->calibration = updated.calibration;
    w->SetDeadline(updated.deadline());
    w->SetHeartbeat(updated.heartbeat());
    w->lease->lost = false;
    w->stream.reset();
    w->outbox.clear();
    w->awaiting_session = true;
  } else {
    ++next_worker_number_;
    by_name_[r.name()] = updated.row.worker_id;
    workers_[updated.row.worker_id] = std::move(updated);
    w = &workers_.at(by_name_[r.name()]);
  }
  roster_generation_.fetch_add(1);  // a new worker, or one back (perhaps from LOST)
  out.response.set_worker_id(w->row.worker_id);
  out.response.set_session_token(w->row.session_token);
  SetDuration(config_.lease_ttl, out.response.mutable_lease_ttl());
  SetDuration(heartbeat_interval(), out.response.mutable_heartbeat_interval());
  return out;
}

StatusOr<std::string> WorkerManager::OpenSession(
    const v1::OpenSession& open, const std::shared_ptr<WorkerSessionStream>& stream) {
  if (open.worker_id().empty()) {
    return Invalid("open.worker_id", "is empty", "send the worker_id RegisterWorker returned");
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (shut_down_) return UnavailableError("the coordinator is stopping (hint: reopen later)");
  auto it = workers_.find(open.worker_id());
  if (it == workers_.end() || it->second.row.lost) {
    return NotFoundError("worker " + open.worker_id() +
                         (it == workers_.end() ? " is not registered" : " was marked LOST") +
                         " (hint: call RegisterWorker again)");
  }
  Worker& w = it->second;
  if (open.session_token() != w.row.session_token) {
    return Status(StatusCode::kUnauthenticated,
                  "open.session_token does not belong to worker " + open.worker_id() +
                      " (hint: use the token of the latest RegisterWorker)");
  }
  std::lock_guard<std::mutex> sessions(sessions_mu_);
  if (w.stream && w.stream != stream) {
    streams_.erase(w.stream.get());
    w.stream->Finish(
        AbortedError("a newer session of worker '" + w.row.name + "' replaced this one"));
  }
  w.stream = stream;
  w.awaiting_session = false;
  streams_[stream.get()] = {w.row.worker_id, w.lease};
  RenewLocked(w);
  v1::WorkerSessionResponse accepted;
  SetDuration(config_.lease_ttl, accepted.mutable_accepted()->mutable_lease_ttl());
  SetDuration(heartbeat_interval(), accepted.mutable_accepted()->mutable_heartbeat_interval());
  accepted.mutable_accepted()->set_metrics_batches(true);  // RankMetrics.samples (decision 0063)
  accepted.mutable_accepted()->set_heartbeat_with_metrics(true);  // RankMetrics.heartbeat (0070)
  stream->Send(accepted);
  while (!w.outbox.empty()) {
    if (!stream->Send(w.outbox.front())) break;
    w.outbox.pop_front();
  }
  return w.row.worker_id;
}

StatusOr<std::string> WorkerManager::Touch(const WorkerSessionStream* stream) {
  // The session lock only: every session message comes through here.
  std::lock_guard<std::mutex> lock(sessions_mu_);
  auto s = streams_.find(stream);
  if (s == streams_.end()) {
    return AbortedError("this session is no longer the worker's current one");
  }
  Lease& lease = *s->second.lease;
  if (lease.lost) {
    return NotFoundError("worker " + s->second.worker_id +
                         " was marked LOST (hint: call RegisterWorker again)");
  }
  lease.deadline.store((clock_.Monotonic() + config_.lease_ttl).time_since_epoch().count());
  lease.heartbeat.store(clock_.Now().time_since_epoch().count());
  return s->second.worker_id;
}

void WorkerManager::CloseSession(const WorkerSessionStream* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  std::lock_guard<std::mutex> sessions(sessions_mu_);
  auto s = streams_.find(stream);
  if (s == streams_.end()) return;
  Worker& w = workers_.at(s->second.worker_id);
  if (w.stream.get() == stream) w.stream.reset();
  streams_.erase(s);
}

std::vector<std::string> WorkerManager::ExpireLeases() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> lost;
  const MonoTime now = clock_.Monotonic();
  WriteBatch batch;
  for (auto& [id, w] : workers_) {
    if (w.row.lost || w.deadline() > now) continue;
    w.row.lost = true;
    w.lease->lost = true;
    if (w.stream) {
      std::lock_guard<std::mutex> sessions(sessions_mu_);
      streams_.erase(w.stream.get());
      w.stream->Finish(NotFoundError("worker " + id + " missed its lease of " +
                                     std::to_string(config_.lease_ttl.count()) +
                                     " ms and was marked LOST (hint: call RegisterWorker again)"));
      w.stream.reset();
    }
    w.outbox.clear();
    batch.workers.push_back(w.row);
    batch.workers.back().last_heartbeat_ms = ToMillis(w.heartbeat());
    lost.push_back(id);
  }
  if (db_ != nullptr && !batch.empty()) (void)db_->Commit(batch, Durability::kDurable);
  if (!lost.empty()) roster_generation_.fetch_add(1);
  return lost;
}

std::vector<WorkerSnapshot> WorkerManager::List() const {
  return List(std::string(), SIZE_MAX);
}

std::vector<WorkerSnapshot> WorkerManager::List(const std::string& after, size_t limit) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<WorkerSnapshot> out;
  out.reserve(std::min(limit, workers_.size()));
  for (auto it = after.empty() ? by_name_.begin() : by_name_.upper_bound(after);
       it != by_name_.end() && out.size() < limit; ++it) {
    const Worker& w = workers_.at(it->second);
    WorkerSnapshot s;
    v1::WorkerInfo& info = s.info;
    info.set_worker_id(w.row.worker_id);
    info.set_name(w.row.name);
    info.set_state(w.row.lost ? v1::WORKER_STATE_LOST : v1::WORKER_STATE_READY);
    info.set_slots(w.row.slots);
    info.set_device(w.row.device);
    info.set_address(w.row.address);
    info.set_metrics_address(w.row.metrics_address);
    SetTimestampMillis(w.row.registered_ms, info.mutable_registered_at());
    SetTimestamp(w.heartbeat(), info.mutable_last_heartbeat_at());
    *info.mutable_calibration() = w.calibration;
    info.set_drained(w.drained);
    s.has_session = w.stream != nullptr;
    out.push_back(std::move(s));
  }
  return out;
}

StatusOr<std::string> WorkerManager::SetDrained(const std::string& name, bool drained) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_name_.find(name);
  if (it == by_name_.end()) {
    return NotFoundError("name: no worker named '" + EscapeText(CutUtf8(name, 128)) +
                         "' is registered (hint: meshrun workers lists them)");
  }
  Worker& w = workers_.at(it->second);
  if (w.drained != drained) drained_count_.fetch_add(drained ? 1 : -1);
  w.drained = drained;
  return it->second;
}

void WorkerManager::Shutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  shut_down_ = true;
  for (auto& [id, w] : workers_) {
    if (!w.stream) continue;
    w.stream->Finish(UnavailableError(
        "the coordinator is stopping (hint: reopen the session with the same token while the "
        "lease lasts)"));
    w.stream.reset();
  }
  std::lock_guard<std::mutex> sessions(sessions_mu_);
  streams_.clear();
}

std::vector<LiveWorker> WorkerManager::LiveWorkers() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<LiveWorker> out;
  for (const auto& [id, w] : workers_) {
    if (!w.row.lost) out.push_back({id, w.row.name, w.row.device, w.row.slots, w.drained});
  }
  std::sort(out.begin(), out.end(),
            [](const LiveWorker& a, const LiveWorker& b) { return a.name < b.name; });
  return out;
}

std::vector<std::string> WorkerManager::NotLive(const std::vector<std::string_view>& ids) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (std::string_view id : ids) {
    auto it = workers_.find(id);
    if (it == workers_.end() || it->second.row.lost) out.emplace_back(id);
  }
  return out;
}

std::vector<std::string> WorkerManager::DrainedWorkers() const {
  if (drained_count_.load() == 0) return {};  // the usual case: no lock, no scan
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (const auto& [id, w] : workers_) {
    if (w.drained && !w.row.lost) out.push_back(id);
  }
  return out;
}

void WorkerManager::Send(const std::string& worker_id, const v1::WorkerSessionResponse& message) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || it->second.row.lost) return;
  Worker& w = it->second;
  if (w.stream && w.outbox.empty() && w.stream->Send(message)) return;
  w.outbox.push_back(message);
  if (w.outbox.size() > config_.max_outbox) w.outbox.pop_front();
}

}  // namespace meshrun::coordinator
