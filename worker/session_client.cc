// SessionClient (see session_client.h). The run thread loops: register if needed → open a
// stream → read until it ends → back off → again. While a stream is open a writer thread sends
// the queue and a heartbeat every interval; gRPC allows one reader and one writer at a time.
#include "worker/session_client.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <optional>

#include "proto/duration.h"
#include "rpc/backoff.h"
#include "rpc/grpc_status.h"

namespace meshrun {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Messages that must reach the coordinator even across a reconnect.
bool IsCritical(const v1::WorkerSessionRequest& m) {
  return m.has_rank_started() || m.has_rank_exited() || m.has_checkpoint_saved();
}

}  // namespace

SessionClient::SessionClient(std::shared_ptr<v1::CoordinatorService::StubInterface> stub,
                             SessionOptions options, SessionHandler* handler)
    : stub_(std::move(stub)), options_(std::move(options)), handler_(handler) {}

SessionClient::~SessionClient() {
  Stop();
}

void SessionClient::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (thread_.joinable() || stopping_) return;
  thread_ = std::thread([this] { Run(); });
}

void SessionClient::Send(v1::WorkerSessionRequest message) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    const size_t bytes = message.ByteSizeLong();
    if ((queue_.size() >= options_.max_queued ||
         queued_bytes_ + bytes > options_.max_queued_bytes) &&
        !IsCritical(message)) {
      if (dropped_++ % 1000 == 0) {
        spdlog::warn("session: {} reports ({} bytes) queued; dropping metrics and log lines",
                     queue_.size(), queued_bytes_);
      }
      return;
    }
    queued_bytes_ += bytes;
    queue_.push_back(std::move(message));
  }
  cv_.notify_all();
}

bool SessionClient::Flush(milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return queue_.empty() && writing_ == 0; });
}

void SessionClient::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    if (active_ctx_ != nullptr) active_ctx_->TryCancel();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool SessionClient::connected() const {
  std::lock_guard<std::mutex> lock(mu_);
  return connected_;
}

std::string SessionClient::worker_id() const {
  std::lock_guard<std::mutex> lock(mu_);
  return worker_id_;
}

int SessionClient::sessions_opened() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sessions_opened_;
}

int SessionClient::registrations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return registrations_;
}

int SessionClient::heartbeats_carried() const {
  std::lock_guard<std::mutex> lock(mu_);
  return heartbeats_carried_;
}

bool SessionClient::SleepFor(milliseconds d) {
  std::unique_lock<std::mutex> lock(mu_);
  return !cv_.wait_for(lock, d, [&] { return stopping_; });
}

Status SessionClient::Register() {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + options_.call_timeout);
  v1::RegisterWorkerResponse response;
  const grpc::Status s = stub_->RegisterWorker(&ctx, options_.registration, &response);
  if (!s.ok()) return FromGrpcStatus(s);
  std::lock_guard<std::mutex> lock(mu_);
  worker_id_ = response.worker_id();
  session_token_ = response.session_token();
  lease_ = DurationToMillis(response.lease_ttl());
  heartbeat_ = DurationToMillis(response.heartbeat_interval());
  ++registrations_;
  spdlog::info("registered as {} (worker id {}, lease {} ms)", options_.registration.name(),
               worker_id_, lease_.count());
  return OkStatus();
}

void SessionClient::Run() {
  Backoff backoff(options_.backoff_initial, options_.backoff_max);
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
    }
    if (worker_id().empty()) {
      const Status s = Register();
      if (!s.ok()) {
        // A malformed registration, or one the coordinator's TLS identity check refuses (a
        // certificate naming another worker), fails the same way every time.
        // So does a name a live worker holds (ALREADY_EXISTS): retrying would only take the
        // registration back and forth.
        if (s.code() == StatusCode::kInvalidArgument || s.code() == StatusCode::kPermissionDenied ||
            s.code() == StatusCode::kUnauthenticated || s.code() == StatusCode::kAlreadyExists) {
          spdlog::error("registration refused: {}", s.message());
          handler_->OnFatal(s);
          return;
        }
        spdlog::warn("cannot register with the coordinator ({}); retrying", s.ToString());
        if (!SleepFor(backoff.Next())) return;
        continue;
      }
    }
    const int opened_before = sessions_opened();
    const Status ended = RunSession();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      // A session that was accepted proves the coordinator works: start the backoff over.
      if (sessions_opened_ > opened_before) backoff.Reset();
    }
    switch (ended.code()) {
      case StatusCode::kNotFound:
      case StatusCode::kUnauthenticated: {
        spdlog::warn("coordinator no longer knows this worker ({}); registering again",
                     ended.message());
        std::lock_guard<std::mutex> lock(mu_);
        worker_id_.clear();
        session_token_.clear();
        break;
      }
      default: spdlog::warn("session ended ({}); reconnecting", ended.ToString());
    }
    if (!SleepFor(backoff.Next())) return;
  }
}

Status SessionClient::RunSession() {
  grpc::ClientContext ctx;
  v1::WorkerSessionRequest open;
  milliseconds interval;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return CancelledError("stopping");
    active_ctx_ = &ctx;
    open.mutable_open()->set_worker_id(worker_id_);
    open.mutable_open()->set_session_token(session_token_);
    interval = heartbeat_;
  }
  for (v1::RunningRank& r : handler_->RunningRanks()) *open.mutable_open()->add_running() = r;
  auto stream = stub_->WorkerSession(&ctx);
  auto finish = [&]() -> Status {
    const grpc::Status s = stream->Finish();
    std::lock_guard<std::mutex> lock(mu_);
    active_ctx_ = nullptr;
    if (s.ok()) return UnavailableError("the coordinator closed the session");
    return FromGrpcStatus(s);
  };
  v1::WorkerSessionResponse first;
  if (!stream->Write(open) || !stream->Read(&first)) return finish();
  if (!first.has_accepted()) {
    ctx.TryCancel();
    (void)finish();
    std::lock_guard<std::mutex> lock(mu_);
    active_ctx_ = nullptr;
    return FailedPreconditionError("the coordinator's first session message was not `accepted`");
  }
  const milliseconds accepted_interval = DurationToMillis(first.accepted().heartbeat_interval());
  const milliseconds accepted_lease = DurationToMillis(first.accepted().lease_ttl());
  if (accepted_interval.count() > 0) interval = accepted_interval;
  if (interval.count() <= 0) interval = options_.heartbeat;
  if (accepted_lease.count() > 0) interval = std::min(interval, accepted_lease / 3);
  // More often than asked is harmless and keeps a short lease safe.
  interval = std::min(interval, options_.heartbeat);
  interval = std::max(interval, milliseconds(50));
  {
    std::lock_guard<std::mutex> lock(mu_);
    metrics_batches_ = first.accepted().metrics_batches() && options_.max_metrics_batch > 1;
    heartbeat_with_metrics_ = metrics_batches_ && first.accepted().heartbeat_with_metrics();
    session_up_ = true;
    connected_ = true;
    ++sessions_opened_;
  }
  spdlog::info("session open (heartbeat every {} ms, {} ranks running)", interval.count(),
               open.open().running_size());
  handler_->OnConnected(true);
  std::thread writer([&] { WriterLoop(stream.get(), interval); });
  v1::WorkerSessionResponse message;
  while (stream->Read(&message)) {
    if (message.has_assign()) {
      handler_->OnAssign(message.assign());
    } else if (message.has_stop()) {
      handler_->OnStop(message.stop());
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    session_up_ = false;
    connected_ = false;
  }
  // The call is over (or Stop() cancelled it), so a writer inside Write returns at once; not
  // cancelling here keeps the coordinator's status for Finish.
  cv_.notify_all();
  writer.join();
  handler_->OnConnected(false);
  return finish();
}

void SessionClient::WriterLoop(
    grpc::ClientReaderWriterInterface<v1::WorkerSessionRequest, v1::WorkerSessionResponse>* stream,
    milliseconds interval) {
  Clock::time_point next_heartbeat = Clock::now() + interval;
  // When a batch of samples last went up, and whether the heartbeat due now already waited for
  // the next one (decision 0070).
  std::optional<Clock::time_point> last_batch;
  bool deferred = false;
  // The heartbeat as it stands now: the running ranks and the free slots (taken unlocked).
  auto heartbeat_now = [&] {
    v1::Heartbeat beat;
    for (v1::RunningRank& r : handler_->RunningRanks()) *beat.add_running() = r;
    beat.set_free_slots(handler_->FreeSlots());
    return beat;
  };
  // Writes one queued message; false when the stream broke (a critical one goes back first).
  auto write_front = [&](std::unique_lock<std::mutex>& lock) {
    // A batch of samples with the next heartbeat due within half an interval carries it, and the
    // heartbeat's timer starts again (decision 0070): one session message a step where there
    // were two. Its snapshot is taken before the batch leaves the queue, and it rides only when
    // nothing else is queued behind the batch, so a rank_exited queued before it still reaches
    // the coordinator first, as with a heartbeat of its own.
    std::optional<v1::Heartbeat> beat;
    if (heartbeat_with_metrics_ && queue_.front().has_metrics() &&
        Clock::now() + interval / 2 >= next_heartbeat) {
      lock.unlock();
      beat = heartbeat_now();
      lock.lock();
      if (queue_.empty()) return true;  // Stop() or a reconnect emptied it meanwhile
    }
    v1::WorkerSessionRequest m = std::move(queue_.front());
    queue_.pop_front();
    size_t bytes = m.ByteSizeLong();
    if (metrics_batches_ && m.has_metrics() && !queue_.empty() && queue_.front().has_metrics()) {
      // The samples queued one after another: one message (decision 0063).
      v1::RankMetrics* batch = m.mutable_metrics();
      if (batch->has_sample()) *batch->add_samples() = std::move(*batch->mutable_sample());
      batch->clear_sample();
      while (!queue_.empty() && queue_.front().has_metrics() &&
             batch->samples_size() < options_.max_metrics_batch) {
        v1::RankMetrics& next = *queue_.front().mutable_metrics();
        bytes += queue_.front().ByteSizeLong();
        if (next.has_sample()) *batch->add_samples() = std::move(*next.mutable_sample());
        for (v1::MetricsSample& s : *next.mutable_samples()) *batch->add_samples() = std::move(s);
        queue_.pop_front();
      }
    }
    if (m.has_metrics()) last_batch = Clock::now();
    if (beat && m.has_metrics() && queue_.empty()) {
      *m.mutable_metrics()->mutable_heartbeat() = std::move(*beat);
      next_heartbeat = Clock::now() + interval;
      deferred = false;
      ++heartbeats_carried_;
    }
    queued_bytes_ -= std::min(queued_bytes_, bytes);
    ++writing_;
    lock.unlock();
    const bool ok = stream->Write(m);
    lock.lock();
    --writing_;
    if (!ok && IsCritical(m)) {
      queued_bytes_ += bytes;
      queue_.push_front(std::move(m));
    }
    cv_.notify_all();
    return ok;
  };
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait_until(lock, next_heartbeat,
                   [&] { return !session_up_ || stopping_ || !queue_.empty(); });
    if (!session_up_ || stopping_) return;
    if (Clock::now() < next_heartbeat) {
      if (metrics_batches_ && options_.metrics_linger.count() > 0 && queue_.front().has_metrics()) {
        // A sample at the head: its step's other samples are moments behind. Waits until
        // something other than a sample queues (it goes at once), the batch is full, or the
        // linger passed.
        const auto until = std::min(Clock::now() + options_.metrics_linger, next_heartbeat);
        cv_.wait_until(lock, until, [&] {
          return !session_up_ || stopping_ || queue_.empty() || !queue_.back().has_metrics() ||
                 queue_.size() >= static_cast<size_t>(options_.max_metrics_batch);
        });
        if (!session_up_ || stopping_) return;
        if (queue_.empty()) continue;
      }
      if (!queue_.empty() && !write_front(lock)) return;
      continue;
    }
    // A heartbeat is due. While samples flow (a batch went up within the interval) it waits
    // half an interval more, once, for the next batch to carry it: otherwise a step that
    // always comes just after the heartbeat would never carry one. Any session message keeps
    // the lease, and half an interval more is at most a sixth of it.
    if (heartbeat_with_metrics_ && !deferred && last_batch &&
        Clock::now() - *last_batch < interval) {
      next_heartbeat = Clock::now() + interval / 2;
      deferred = true;
      continue;
    }
    // Take the running ranks first, then send what is queued: an exit the
    // snapshot no longer shows was queued before it, so it reaches the coordinator first.
    lock.unlock();
    v1::WorkerSessionRequest beat;
    *beat.mutable_heartbeat() = heartbeat_now();
    lock.lock();
    for (size_t n = queue_.size(); n > 0 && !queue_.empty(); --n) {
      if (!write_front(lock)) return;
      if (!session_up_ || stopping_) return;
    }
    if (Clock::now() < next_heartbeat) continue;  // the last batch carried it
    ++writing_;
    lock.unlock();
    const bool ok = stream->Write(beat);
    lock.lock();
    --writing_;
    cv_.notify_all();
    if (!ok) return;
    next_heartbeat = Clock::now() + interval;
    deferred = false;
  }
}

}  // namespace meshrun
