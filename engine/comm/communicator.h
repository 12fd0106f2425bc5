// The one interface every collective in meshrun goes through: a Communicator
// for one process group (one mesh axis group), and the CommBackend that builds communicators
// from a Store. Backends: fake_backend.h (threads in one process, for tests) and
// gloo_backend.h (TCP, CPU). The training step never names a backend.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "common/parallel_dims.h"
#include "common/status.h"
#include "engine/comm/comm_stats.h"
#include "engine/comm/store.h"

namespace meshrun {

// What a communicator is built with. Backends receive it in CommBackend::Connect.
struct CommConfig {
  // The axis whose group this is (kTp, kDpShardCp, …): name() and the default charge of calls.
  MeshAxis axis = MeshAxis::kDpReplicate;
  // Identifies the group within the job in error messages, e.g. "comm/tp/1". Unique per group.
  std::string group_id;
  int rank = 0;  // this process's index within the group, in [0, size)
  int size = 1;
  // Bootstrap timeout and the default per-call timeout. Every wait is bounded by it.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  // Where calls are counted; null: not counted.
  std::shared_ptr<CommStats> stats;
};

// Per-call options: `{}`, `{milliseconds(500)}`, CallOptions::Axis(MeshAxis::kDpShard) or
// CallOptions::Charged(CommCharge::Metrics()).
struct CallOptions {
  CallOptions() = default;
  CallOptions(std::chrono::milliseconds timeout,  // NOLINT: implicit
              std::optional<CommCharge> charge = std::nullopt)
      : timeout(timeout), charge(charge) {}
  static CallOptions Axis(MeshAxis axis) {
    return {std::chrono::milliseconds(0), CommCharge::Axis(axis)};
  }
  static CallOptions Charged(CommCharge charge) { return {std::chrono::milliseconds(0), charge}; }

  // 0: the communicator's default (CommConfig::timeout).
  std::chrono::milliseconds timeout{0};
  // What the call is charged to in CommStats; empty: the communicator's axis. docs/parallelism.md
  // charges traffic to the parallelism that caused it, e.g. FSDP's gathers over the dp_shard_cp
  // group are charged to dp_shard, and the trainer's own reductions to their kind.
  std::optional<CommCharge> charge;
};

class Communicator;

// A started call (Communicator::Start*). Move-only; finish it with Communicator::Wait.
class CommWork {
 public:
  CommWork() = default;
  // A moved-from CommWork is no longer pending (only one copy may be waited for).
  CommWork(CommWork&& o) noexcept { *this = std::move(o); }
  CommWork& operator=(CommWork&& o) noexcept {
    pending_ = std::exchange(o.pending_, false);
    op_ = o.op_;
    bytes_ = o.bytes_;
    charge_ = o.charge_;
    timeout_ = o.timeout_;
    start_ = o.start_;
    exposed_seconds_ = o.exposed_seconds_;
    ticket_ = std::exchange(o.ticket_, -1);
    return *this;
  }
  // True from a successful Start until Wait.
  bool pending() const { return pending_; }

 private:
  friend class Communicator;
  bool pending_ = false;
  CommOp op_ = CommOp::kAllReduce;
  size_t bytes_ = 0;  // the S of BusBytes
  CommCharge charge_;
  std::chrono::milliseconds timeout_{0};
  std::chrono::steady_clock::time_point start_;
  double exposed_seconds_ = 0;  // blocked in Start so far
  int64_t ticket_ = -1;         // the backend's handle; -1: completed inside Start
};

// One rank's handle on one process group. Peers and roots are group ranks in [0, size()).
//
// Semantics: every collective is blocking and must be called by all members in the same order
// with the same sizes (and root). Reductions are float32 sums. On return the result is final
// and identical on every rank. Sends may block until the peer posts the matching Recv (they
// do on Gloo), so exchanges between two ranks go through SendRecv, never Send-then-Recv on
// both sides.
//
// Errors: every wait is bounded by the call's timeout; a hung peer gives DEADLINE_EXCEEDED and
// a dead one UNAVAILABLE (or DEADLINE_EXCEEDED, whichever the transport sees first), with a
// message naming the group, the op and this rank. After such an error the group's state is
// unknown: the communicator keeps the first error and fails every later call with
// FAILED_PRECONDITION (rebuild the communicators, i.e. restart the job). Invalid arguments
// give INVALID_ARGUMENT and leave the communicator usable.
//
// Accounting: each successful call of a group with size() > 1 adds its seconds and bus bytes
// (comm_stats.h) to CommStats under (charge, op). size() == 1 calls return at once (copying
// input to output where they differ) and count nothing. Zero-sized calls also return at once.
//
// Asynchronous calls (StartAllReduce, StartReduceScatter, StartAllGather, then Wait): the same
// collectives, started now and finished by Wait, so that the caller can compute meanwhile. On a
// backend that overlaps (NCCL: the collective runs on the communicator's stream after an event
// recorded on the compute stream, and Wait makes the compute stream wait for its done-event)
// the buffers must stay untouched until Wait; CPU backends (Gloo, fake) complete the call inside
// Start and Wait only returns its result. Every started call must be waited for, in any order;
// the timeout runs from Start. Accounting: a call's seconds run from Start to its completion;
// its exposed seconds are those the caller spent blocked in Start or Wait (all of them on CPU
// backends), the rest is overlapped (CommCounter::overlapped_seconds).
//
// Asynchronous point-to-point (StartSend, StartRecv, then Wait; decision 0064): a send or a
// receive posted now and finished by Wait, on every backend (host backends too: Gloo's transport
// moves the bytes in its own thread once both ends have posted, the fake backend when the later
// of the two is posted). Messages between two ranks match in the order they were posted, counting
// the blocking Send, Recv and SendRecv too: the k-th message a rank sends to a peer is the k-th
// that peer receives from it, so a rank may post several receives from one peer ahead and wait
// for them in any order. Both buffers stay untouched until Wait (a send may read its buffer until
// then; a receive's is written at any time before it). A send may complete only once the peer
// posted the matching receive. The timeout runs from Start; an error (timeout, dead peer, sizes
// that differ: the receiver gets INTERNAL) makes the communicator unusable as for blocking calls.
// Accounting: as the asynchronous collectives (send counts its bytes, recv none). On NCCL the
// calls are issued at Start on the communicator's one stream, where they complete in issue order:
// a caller there must post them in an order that cannot wait on itself (a rank's receive ahead of
// a send its peer needs first deadlocks); host backends have no such order.
//
// Not thread-safe: one thread issues a communicator's calls (different communicators of a
// rank may be used from different threads).
class Communicator {
 public:
  friend class AliasCommunicator;  // forwards its hooks to another communicator's

  using Duration = std::chrono::milliseconds;

  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return config_.rank; }
  int size() const { return config_.size; }
  MeshAxis axis() const { return config_.axis; }
  // MeshAxisName(axis()): "tp", "dp_shard_cp", …
  const char* name() const { return MeshAxisName(config_.axis); }
  const std::string& group_id() const { return config_.group_id; }
  Duration default_timeout() const { return config_.timeout; }
  // OK while healthy; afterwards the first error a call returned.
  const Status& health() const { return first_error_; }

  // In place: data[i] = Σ over ranks of data[i].
  Status AllReduce(float* data, size_t count, const CallOptions& opts = {});
  // input holds size()·count floats; output[i] = Σ over ranks of input[rank()·count + i].
  Status ReduceScatter(const float* input, float* output, size_t count,
                       const CallOptions& opts = {});
  // input holds count floats; output (size()·count) = every rank's input in rank order.
  Status AllGather(const float* input, float* output, size_t count, const CallOptions& opts = {});
  // data on `root` is copied to every rank's data.
  Status Broadcast(float* data, size_t count, int root, const CallOptions& opts = {});
  Status Send(const float* data, size_t count, int peer, const CallOptions& opts = {});
  Status Recv(float* data, size_t count, int peer, const CallOptions& opts = {});
  // Sends send_count floats to `dst` while receiving recv_count floats from `src` (a ring
  // step). dst == src == rank() copies send to recv.
  Status SendRecv(const float* send_data, size_t send_count, int dst, float* recv_data,
                  size_t recv_count, int src, const CallOptions& opts = {});
  Status Barrier(const CallOptions& opts = {});

  // Raw bytes, for data movement that is not float32 (token ids, metadata).
  Status AllGatherBytes(const void* input, void* output, size_t bytes,
                        const CallOptions& opts = {});
  Status BroadcastBytes(void* data, size_t bytes, int root, const CallOptions& opts = {});
  Status SendBytes(const void* data, size_t bytes, int peer, const CallOptions& opts = {});
  Status RecvBytes(void* data, size_t bytes, int peer, const CallOptions& opts = {});
  Status SendRecvBytes(const void* send_data, size_t send_bytes, int dst, void* recv_data,
                       size_t recv_bytes, int src, const CallOptions& opts = {});

  // Asynchronous forms of AllReduce, ReduceScatter and AllGather (see the class comment). A
  // size-1 or zero-sized call completes at once; its CommWork is still waited for.
  StatusOr<CommWork> StartAllReduce(float* data, size_t count, const CallOptions& opts = {});
  StatusOr<CommWork> StartReduceScatter(const float* input, float* output, size_t count,
                                        const CallOptions& opts = {});
  StatusOr<CommWork> StartAllGather(const float* input, float* output, size_t count,
                                    const CallOptions& opts = {});
  // Raw bytes (e.g. FSDP's bf16 gathers): input holds `bytes`, output size()·bytes.
  StatusOr<CommWork> StartAllGatherBytes(const void* input, void* output, size_t bytes,
                                         const CallOptions& opts = {});
  // Asynchronous point-to-point (see the class comment). Zero-sized calls complete at once; their
  // CommWork is still waited for. peer == rank() is INVALID_ARGUMENT.
  StatusOr<CommWork> StartSend(const float* data, size_t count, int peer,
                               const CallOptions& opts = {});
  StatusOr<CommWork> StartRecv(float* data, size_t count, int peer, const CallOptions& opts = {});
  StatusOr<CommWork> StartSendBytes(const void* data, size_t bytes, int peer,
                                    const CallOptions& opts = {});
  StatusOr<CommWork> StartRecvBytes(void* data, size_t bytes, int peer,
                                    const CallOptions& opts = {});
  // Finishes a started call: returns its error, if any (then the communicator is unusable, as
  // after a blocking call's), and counts it. Waiting for a CommWork that is not pending is
  // INVALID_ARGUMENT.
  Status Wait(CommWork& work);

  // Whether Start* overlaps with the caller (false: they complete inside Start).
  virtual bool overlaps() const { return false; }
  // Device backends: the stream (a cudaStream_t) that produces and consumes the buffers given to
  // this communicator's calls, i.e. the model's compute stream; calls are ordered after the work
  // enqueued on it and Wait orders it after the call. Host backends ignore it.
  virtual void SetComputeStream(void* /*stream*/) {}

 protected:
  explicit Communicator(CommConfig config) : config_(std::move(config)) {}

  // Backend hooks. The base class calls them only with size() > 1, arguments checked, sizes
  // nonzero (Barrier aside) and timeout > 0; it adds the group, op and rank to any error, and
  // does the timing and counting. Hooks must not throw.
  virtual Status DoAllReduce(float* data, size_t count, Duration timeout) = 0;
  virtual Status DoReduceScatter(const float* input, float* output, size_t count,
                                 Duration timeout) = 0;
  virtual Status DoAllGather(const void* input, void* output, size_t bytes, Duration timeout) = 0;
  virtual Status DoBroadcast(void* data, size_t bytes, int root, Duration timeout) = 0;
  // dst < 0: nothing to send; src < 0: nothing to receive. Never both; never this rank.
  virtual Status DoSendRecv(const void* send_data, size_t send_bytes, int dst, void* recv_data,
                            size_t recv_bytes, int src, Duration timeout) = 0;
  virtual Status DoBarrier(Duration timeout) = 0;

  // Asynchronous hooks, used only when overlaps() is true: issue the call and return a ticket
  // that DoWait completes (with the same deadline, `deadline`). DoWait returns the call's own
  // duration in *busy_seconds (device time from issue to completion) when it can measure it,
  // else leaves it negative. Defaults: UNIMPLEMENTED.
  // kAllGather counts float32 elements, kAllGatherBytes bytes.
  enum class AsyncOp { kAllReduce, kReduceScatter, kAllGather, kAllGatherBytes };
  virtual StatusOr<int64_t> DoStart(AsyncOp op, const void* input, void* output, size_t count,
                                    Duration timeout);
  virtual Status DoWait(int64_t ticket, Duration timeout, double* busy_seconds);

  // Asynchronous point-to-point hooks (every backend; called with size() > 1, a valid peer other
  // than this rank, bytes > 0 and timeout > 0): post the send or receive and return a ticket that
  // DoWait completes, bounded by `timeout` from now. Defaults: UNIMPLEMENTED.
  virtual StatusOr<int64_t> DoStartSend(const void* data, size_t bytes, int peer, Duration timeout);
  virtual StatusOr<int64_t> DoStartRecv(void* data, size_t bytes, int peer, Duration timeout);

  // The local copy of the size-1 and self-exchange shortcuts (memmove; a device backend copies
  // on its device).
  virtual void CopyLocal(void* dst, const void* src, size_t bytes);

 private:
  // Runs `body` (a backend hook) with the health check, timing, error wrapping and counting
  // shared by every op. `bytes` is the S of BusBytes.
  template <typename Body>
  Status Run(CommOp op, size_t bytes, const CallOptions& opts, Body body);
  StatusOr<CommWork> StartP2P(CommOp op, const void* send_data, void* recv_data, size_t bytes,
                              int peer, const CallOptions& opts);
  StatusOr<CommWork> Start(CommOp op, AsyncOp async_op, const void* input, void* output,
                           size_t count, size_t bytes, const CallOptions& opts);
  Status Fail(CommOp op, Duration timeout, const Status& s);
  Status CheckPeer(CommOp op, int peer, const char* what) const;
  std::string Describe(CommOp op) const;

  CommConfig config_;
  Status first_error_;
};

// A size-1 communicator: every call returns at once (copying input to output where needed).
// MeshComms hands these out for axes of size 1. config.size must be 1.
std::unique_ptr<Communicator> MakeSoloCommunicator(CommConfig config);

// A communicator for a group whose members equal `target`'s (e.g. dp and dp_replicate when
// dp_shard is 1): no new connections; calls go through target's transport but are named,
// counted and error-tracked under `config`. config.rank and size must match target's.
std::unique_ptr<Communicator> MakeAliasCommunicator(CommConfig config,
                                                    std::shared_ptr<Communicator> target);

// Builds communicators: a pluggable bootstrap per backend (Gloo, fake, NCCL). The trainer never
// names one: engine/comm/backend_factory.h picks it by resources.device.
class CommBackend {
 public:
  virtual ~CommBackend() = default;

  // "gloo", "fake", …
  virtual std::string name() const = 0;

  // This rank's communicator of the group described by `config` (config.size > 1). `store` is
  // private to the group: every member passes a store with the same namespace (e.g. a
  // PrefixStore "comm/tp/1"). May block until all members joined (Gloo does; the fake does
  // not), at most config.timeout (DEADLINE_EXCEEDED naming the group). Thread-safe; callers
  // connect groups in one fixed order on every rank (MeshComms does).
  virtual StatusOr<std::unique_ptr<Communicator>> Connect(const CommConfig& config,
                                                          std::shared_ptr<Store> store) = 0;

  // The size-1 communicator of an axis of size 1 (MeshComms). Default: MakeSoloCommunicator,
  // whose shortcuts copy host memory; a device backend returns one that copies on its device.
  virtual std::unique_ptr<Communicator> MakeSolo(CommConfig config) {
    return MakeSoloCommunicator(std::move(config));
  }
};

}  // namespace meshrun
