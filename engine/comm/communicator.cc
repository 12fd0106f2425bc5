// The backend-independent half of every Communicator call: argument checks, the size-1 and
// zero-size shortcuts, the sticky first error, timing and bus-byte counting.
#include "engine/comm/communicator.h"

#include <algorithm>
#include <cstring>

namespace meshrun {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

std::string Communicator::Describe(CommOp op) const {
  return std::string(name()) + " " + CommOpName(op) + " (group " + config_.group_id + ", rank " +
         std::to_string(config_.rank) + " of " + std::to_string(config_.size) + ")";
}

Status Communicator::CheckPeer(CommOp op, int peer, const char* what) const {
  if (peer < 0 || peer >= size()) {
    return InvalidArgumentError(Describe(op) + ": " + what + " " + std::to_string(peer) +
                                " is outside the group [0, " + std::to_string(size()) +
                                ") (hint: peers and roots are ranks within the group)");
  }
  return OkStatus();
}

void Communicator::CopyLocal(void* dst, const void* src, size_t bytes) {
  std::memmove(dst, src, bytes);
}

Status Communicator::Fail(CommOp op, Duration timeout, const Status& s) {
  first_error_ = Status(s.code(), Describe(op) + ", timeout " + std::to_string(timeout.count()) +
                                      " ms: " + s.message());
  return first_error_;
}

template <typename Body>
Status Communicator::Run(CommOp op, size_t bytes, const CallOptions& opts, Body body) {
  if (!first_error_.ok()) {
    return FailedPreconditionError(
        Describe(op) + ": the communicator is unusable after an earlier error: " +
        first_error_.ToString() + " (hint: rebuild the communicators, e.g. restart the job)");
  }
  const Duration timeout = opts.timeout.count() > 0 ? opts.timeout : config_.timeout;
  const auto start = Clock::now();
  Status s = body(timeout);
  if (!s.ok()) return Fail(op, timeout, s);
  if (config_.stats) {
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    config_.stats->Record(opts.charge.value_or(CommCharge::Axis(config_.axis)), op, seconds,
                          BusBytes(op, bytes, size()));
  }
  return OkStatus();
}

Status Communicator::AllReduce(float* data, size_t count, const CallOptions& opts) {
  if (size() == 1 || count == 0) return OkStatus();
  if (data == nullptr) return InvalidArgumentError(Describe(CommOp::kAllReduce) + ": null data");
  return Run(CommOp::kAllReduce, count * sizeof(float), opts,
             [&](Duration t) { return DoAllReduce(data, count, t); });
}

Status Communicator::ReduceScatter(const float* input, float* output, size_t count,
                                   const CallOptions& opts) {
  if (count == 0) return OkStatus();
  if (input == nullptr || output == nullptr) {
    return InvalidArgumentError(Describe(CommOp::kReduceScatter) + ": null buffer");
  }
  if (size() == 1) {
    if (input != output) CopyLocal(output, input, count * sizeof(float));
    return OkStatus();
  }
  return Run(CommOp::kReduceScatter, count * size() * sizeof(float), opts,
             [&](Duration t) { return DoReduceScatter(input, output, count, t); });
}

Status Communicator::AllGather(const float* input, float* output, size_t count,
                               const CallOptions& opts) {
  return AllGatherBytes(input, output, count * sizeof(float), opts);
}

Status Communicator::AllGatherBytes(const void* input, void* output, size_t bytes,
                                    const CallOptions& opts) {
  if (bytes == 0) return OkStatus();
  if (input == nullptr || output == nullptr) {
    return InvalidArgumentError(Describe(CommOp::kAllGather) + ": null buffer");
  }
  if (size() == 1) {
    if (input != output) CopyLocal(output, input, bytes);
    return OkStatus();
  }
  return Run(CommOp::kAllGather, bytes * size(), opts,
             [&](Duration t) { return DoAllGather(input, output, bytes, t); });
}

Status Communicator::Broadcast(float* data, size_t count, int root, const CallOptions& opts) {
  return BroadcastBytes(data, count * sizeof(float), root, opts);
}

Status Communicator::BroadcastBytes(void* data, size_t bytes, int root, const CallOptions& opts) {
  MESHRUN_RETURN_IF_ERROR(CheckPeer(CommOp::kBroadcast, root, "root"));
  if (size() == 1 || bytes == 0) return OkStatus();
  if (data == nullptr) return InvalidArgumentError(Describe(CommOp::kBroadcast) + ": null data");
  return Run(CommOp::kBroadcast, bytes, opts,
             [&](Duration t) { return DoBroadcast(data, bytes, root, t); });
}

Status Communicator::Send(const float* data, size_t count, int peer, const CallOptions& opts) {
  return SendBytes(data, count * sizeof(float), peer, opts);
}

Status Communicator::Recv(float* data, size_t count, int peer, const CallOptions& opts) {
  return RecvBytes(data, count * sizeof(float), peer, opts);
}

Status Communicator::SendBytes(const void* data, size_t bytes, int peer, const CallOptions& opts) {
  MESHRUN_RETURN_IF_ERROR(CheckPeer(CommOp::kSend, peer, "peer"));
  if (peer == rank()) {
    return InvalidArgumentError(Describe(CommOp::kSend) +
                                ": cannot send to itself (hint: use SendRecv for a self-exchange)");
  }
  if (bytes == 0) return OkStatus();
  if (data == nullptr) return InvalidArgumentError(Describe(CommOp::kSend) + ": null data");
  return Run(CommOp::kSend, bytes, opts,
             [&](Duration t) { return DoSendRecv(data, bytes, peer, nullptr, 0, -1, t); });
}

Status Communicator::RecvBytes(void* data, size_t bytes, int peer, const CallOptions& opts) {
  MESHRUN_RETURN_IF_ERROR(CheckPeer(CommOp::kRecv, peer, "peer"));
  if (peer == rank()) {
    return InvalidArgumentError(
        Describe(CommOp::kRecv) +
        ": cannot receive from itself (hint: use SendRecv for a self-exchange)");
  }
  if (bytes == 0) return OkStatus();
  if (data == nullptr) return InvalidArgumentError(Describe(CommOp::kRecv) + ": null data");
  return Run(CommOp::kRecv, bytes, opts,
             [&](Duration t) { return DoSendRecv(nullptr, 0, -1, data, bytes, peer, t); });
}

Status Communicator::SendRecv(const float* send_data, size_t send_count, int dst, float* recv_data,
                              size_t recv_count, int src, const CallOptions& opts) {
  return SendRecvBytes(send_data, send_count * sizeof(float), dst, recv_data,
                       recv_count * sizeof(float), src, opts);
}

Status Communicator::SendRecvBytes(const void* send_data, size_t send_bytes, int dst,
                                   void* recv_data, size_t recv_bytes, int src,
                                   const CallOptions& opts) {
  constexpr CommOp kOp = CommOp::kSendRecv;
  MESHRUN_RETURN_IF_ERROR(CheckPeer(kOp, dst, "dst"));
  MESHRUN_RETURN_IF_ERROR(CheckPeer(kOp, src, "src"));
  if ((send_bytes > 0 && send_data == nullptr) || (recv_bytes > 0 && recv_data == nullptr)) {
    return InvalidArgumentError(Describe(kOp) + ": null buffer");
  }
  if (dst == rank() || src == rank()) {
    if (dst != src || send_bytes != recv_bytes) {
      return InvalidArgumentError(
          Describe(kOp) + ": a self-exchange needs dst == src == rank and equal sizes, got dst " +
          std::to_string(dst) + " src " + std::to_string(src) + ", " + std::to_string(send_bytes) +
          " vs " + std::to_string(recv_bytes) + " bytes");
    }
    if (send_bytes > 0 && send_data != recv_data) CopyLocal(recv_data, send_data, send_bytes);
    return OkStatus();
  }
  if (send_bytes == 0 && recv_bytes == 0) return OkStatus();
  return Run(kOp, send_bytes, opts, [&](Duration t) {
    return DoSendRecv(send_bytes > 0 ? send_data : nullptr, send_bytes, send_bytes > 0 ? dst : -1,
                      recv_bytes > 0 ? recv_data : nullptr, recv_bytes, recv_bytes > 0 ? src : -1,
                      t);
  });
}

Status Communicator::Barrier(const CallOptions& opts) {
  if (size() == 1) return OkStatus();
  return Run(CommOp::kBarrier, 0, opts, [&](Duration t) { return DoBarrier(t); });
}

StatusOr<int64_t> Communicator::DoStart(AsyncOp, const void*, void*, size_t, Duration) {
  return UnimplementedError("this backend has no asynchronous collectives");
}

Status Communicator::DoWait(int64_t, Duration, double*) {
  return UnimplementedError("this backend has no asynchronous collectives");
}

StatusOr<int64_t> Communicator::DoStartSend(const void*, size_t, int, Duration) {
  return UnimplementedError("this backend has no asynchronous point-to-point");
}

StatusOr<int64_t> Communicator::DoStartRecv(void*, size_t, int, Duration) {
  return UnimplementedError("this backend has no asynchronous point-to-point");
}

StatusOr<CommWork> Communicator::StartP2P(CommOp op, const void* send_data, void* recv_data,
                                          size_t bytes, int peer, const CallOptions& opts) {
  const bool send = op == CommOp::kSend;
  MESHRUN_RETURN_IF_ERROR(CheckPeer(op, peer, "peer"));
  if (peer == rank()) {
    return InvalidArgumentError(
        Describe(op) + (send ? ": cannot send to itself" : ": cannot receive from itself") +
        " (hint: use SendRecv for a self-exchange)");
  }
  if (bytes > 0 && (send ? send_data == nullptr : recv_data == nullptr)) {
    return InvalidArgumentError(Describe(op) + ": null data");
  }
  CommWork work;
  work.op_ = op;
  work.bytes_ = bytes;
  work.charge_ = opts.charge.value_or(CommCharge::Axis(config_.axis));
  work.timeout_ = opts.timeout.count() > 0 ? opts.timeout : config_.timeout;
  work.start_ = Clock::now();
  if (bytes == 0) {
    work.pending_ = true;
    work.ticket_ = -1;
    return work;
  }
  if (!first_error_.ok()) {
    return FailedPreconditionError(
        Describe(op) + ": the communicator is unusable after an earlier error: " +
        first_error_.ToString() + " (hint: rebuild the communicators, e.g. restart the job)");
  }
  StatusOr<int64_t> ticket = send ? DoStartSend(send_data, bytes, peer, work.timeout_)
                                  : DoStartRecv(recv_data, bytes, peer, work.timeout_);
  if (!ticket.ok()) return Fail(op, work.timeout_, ticket.status());
  work.ticket_ = *ticket;
  work.exposed_seconds_ = std::chrono::duration<double>(Clock::now() - work.start_).count();
  work.pending_ = true;
  return work;
}

StatusOr<CommWork> Communicator::StartSend(const float* data, size_t count, int peer,
                                           const CallOptions& opts) {
  return StartSendBytes(data, count * sizeof(float), peer, opts);
}

StatusOr<CommWork> Communicator::StartRecv(float* data, size_t count, int peer,
                                           const CallOptions& opts) {
  return StartRecvBytes(data, count * sizeof(float), peer, opts);
}

StatusOr<CommWork> Communicator::StartSendBytes(const void* data, size_t bytes, int peer,
                                                const CallOptions& opts) {
  return StartP2P(CommOp::kSend, data, nullptr, bytes, peer, opts);
}

StatusOr<CommWork> Communicator::StartRecvBytes(void* data, size_t bytes, int peer,
                                                const CallOptions& opts) {
  return StartP2P(CommOp::kRecv, nullptr, data, bytes, peer, opts);
}

StatusOr<CommWork> Communicator::Start(CommOp op, AsyncOp async_op, const void* input, void* output,
                                       size_t count, size_t bytes, const CallOptions& opts) {
  CommWork work;
  work.op_ = op;
  work.bytes_ = bytes;
  work.charge_ = opts.charge.value_or(CommCharge::Axis(config_.axis));
  work.timeout_ = opts.timeout.count() > 0 ? opts.timeout : config_.timeout;
  work.start_ = Clock::now();
  if (size() == 1 || count == 0 || !overlaps()) {
    // Complete now (the blocking call counts itself; size-1 and empty calls count nothing).
    Status s;
    const CallOptions call(work.timeout_, work.charge_);
    switch (async_op) {
      case AsyncOp::kAllReduce: s = AllReduce(static_cast<float*>(output), count, call); break;
      case AsyncOp::kReduceScatter:
        s = ReduceScatter(static_cast<const float*>(input), static_cast<float*>(output), count,
                          call);
        break;
      case AsyncOp::kAllGather:
        s = AllGather(static_cast<const float*>(input), static_cast<float*>(output), count, call);
        break;
      case AsyncOp::kAllGatherBytes: s = AllGatherBytes(input, output, count, call); break;
    }
    if (!s.ok()) return s;
    work.pending_ = true;
    work.ticket_ = -1;
    return work;
  }
  if (!first_error_.ok()) {
    return FailedPreconditionError(
        Describe(op) + ": the communicator is unusable after an earlier error: " +
        first_error_.ToString() + " (hint: rebuild the communicators, e.g. restart the job)");
  }
  StatusOr<int64_t> ticket = DoStart(async_op, input, output, count, work.timeout_);
  if (!ticket.ok()) return Fail(op, work.timeout_, ticket.status());
  work.ticket_ = *ticket;
  work.exposed_seconds_ = std::chrono::duration<double>(Clock::now() - work.start_).count();
  work.pending_ = true;
  return work;
}

StatusOr<CommWork> Communicator::StartAllReduce(float* data, size_t count,
                                                const CallOptions& opts) {
  if (count > 0 && data == nullptr) {
    return InvalidArgumentError(Describe(CommOp::kAllReduce) + ": null data");
  }
  return Start(CommOp::kAllReduce, AsyncOp::kAllReduce, data, data, count, count * sizeof(float),
               opts);
}

StatusOr<CommWork> Communicator::StartReduceScatter(const float* input, float* output, size_t count,
                                                    const CallOptions& opts) {
  if (count > 0 && (input == nullptr || output == nullptr)) {
    return InvalidArgumentError(Describe(CommOp::kReduceScatter) + ": null buffer");
  }
  return Start(CommOp::kReduceScatter, AsyncOp::kReduceScatter, input, output, count,
               count * size() * sizeof(float), opts);
}

StatusOr<CommWork> Communicator::StartAllGather(const float* input, float* output, size_t count,
                                                const CallOptions& opts) {
  if (count > 0 && (input == nullptr || output == nullptr)) {
    return InvalidArgumentError(Describe(CommOp::kAllGather) + ": null buffer");
  }
  return Start(CommOp::kAllGather, AsyncOp::kAllGather, input, output, count,
               count * size() * sizeof(float), opts);
}

StatusOr<CommWork> Communicator::StartAllGatherBytes(const void* input, void* output, size_t bytes,
                                                     const CallOptions& opts) {
  if (bytes > 0 && (input == nullptr || output == nullptr)) {
    return InvalidArgumentError(Describe(CommOp::kAllGather) + ": null buffer");
  }
  return Start(CommOp::kAllGather, AsyncOp::kAllGatherBytes, input, output, bytes, bytes * size(),
               opts);
}

Status Communicator::Wait(CommWork& work) {
  if (!work.pending_) {
    return InvalidArgumentError(Describe(work.op_) +
                                ": Wait on a call that was not started or was already waited for");
  }
  work.pending_ = false;
  if (work.ticket_ < 0) return OkStatus();  // completed (and counted) inside Start
  const auto wait_start = Clock::now();
  double busy = -1;
  Status s = DoWait(work.ticket_, work.timeout_, &busy);
  if (!s.ok()) return Fail(work.op_, work.timeout_, s);
  const auto end = Clock::now();
  if (config_.stats) {
    const double wall = std::chrono::duration<double>(end - work.start_).count();
    const double exposed =
        work.exposed_seconds_ + std::chrono::duration<double>(end - wait_start).count();
    // The call's own duration when the backend measured it (device time), else Start to Wait.
    const double seconds = busy >= 0 ? std::max(busy, exposed) : wall;
    config_.stats->Record(work.charge_, work.op_, seconds, BusBytes(work.op_, work.bytes_, size()),
                          exposed);
  }
  return OkStatus();
}

namespace {

// Every hook is unreachable: the base class answers size-1 calls itself.
class SoloCommunicator final : public Communicator {
 public:
  explicit SoloCommunicator(CommConfig config) : Communicator(std::move(config)) {}

 protected:
  Status DoAllReduce(float*, size_t, Duration) override { return Unreachable(); }
  Status DoReduceScatter(const float*, float*, size_t, Duration) override { return Unreachable(); }
  Status DoAllGather(const void*, void*, size_t, Duration) override { return Unreachable(); }
  Status DoBroadcast(void*, size_t, int, Duration) override { return Unreachable(); }
  Status DoSendRecv(const void*, size_t, int, void*, size_t, int, Duration) override {
    return Unreachable();
  }
  Status DoBarrier(Duration) override { return Unreachable(); }

 private:
  static Status Unreachable() { return InternalError("size-1 communicator reached its backend"); }
};

}  // namespace

// Forwards every hook to the communicator of another axis whose group has the same members,
// keeping its own name, counting and first error.
class AliasCommunicator final : public Communicator {
 public:
  AliasCommunicator(CommConfig config, std::shared_ptr<Communicator> target)
      : Communicator(std::move(config)), target_(std::move(target)) {}

 protected:
  Status DoAllReduce(float* data, size_t count, Duration timeout) override {
    return target_->DoAllReduce(data, count, timeout);
  }
  Status DoReduceScatter(const float* input, float* output, size_t count,
                         Duration timeout) override {
    return target_->DoReduceScatter(input, output, count, timeout);
  }
  Status DoAllGather(const void* input, void* output, size_t bytes, Duration timeout) override {
    return target_->DoAllGather(input, output, bytes, timeout);
  }
  Status DoBroadcast(void* data, size_t bytes, int root, Duration timeout) override {
    return target_->DoBroadcast(data, bytes, root, timeout);
  }
  Status DoSendRecv(const void* send_data, size_t send_bytes, int dst, void* recv_data,
                    size_t recv_bytes, int src, Duration timeout) override {
    return target_->DoSendRecv(send_data, send_bytes, dst, recv_data, recv_bytes, src, timeout);
  }
  Status DoBarrier(Duration timeout) override { return target_->DoBarrier(timeout); }
  bool overlaps() const override { return target_->overlaps(); }
  StatusOr<int64_t> DoStart(AsyncOp op, const void* input, void* output, size_t count,
                            Duration timeout) override {
    return target_->DoStart(op, input, output, count, timeout);
  }
  Status DoWait(int64_t ticket, Duration timeout, double* busy_seconds) override {
    return target_->DoWait(ticket, timeout, busy_seconds);
  }
  StatusOr<int64_t> DoStartSend(const void* data, size_t bytes, int peer,
                                Duration timeout) override {
    return target_->DoStartSend(data, bytes, peer, timeout);
  }
  StatusOr<int64_t> DoStartRecv(void* data, size_t bytes, int peer, Duration timeout) override {
    return target_->DoStartRecv(data, bytes, peer, timeout);
  }
  void CopyLocal(void* dst, const void* src, size_t bytes) override {
    target_->CopyLocal(dst, src, bytes);
  }

 private:
  std::shared_ptr<Communicator> target_;
};

std::unique_ptr<Communicator> MakeAliasCommunicator(CommConfig config,
                                                    std::shared_ptr<Communicator> target) {
  return std::make_unique<AliasCommunicator>(std::move(config), std::move(target));
}

std::unique_ptr<Communicator> MakeSoloCommunicator(CommConfig config) {
  config.size = 1;
  config.rank = 0;
  return std::make_unique<SoloCommunicator>(std::move(config));
}

}  // namespace meshrun
