// NcclBackend and NcclCommunicator: store bootstrap, ncclCommSplit, non-blocking init and
// collectives with deadline polling and ncclCommAbort.
#include "engine/comm/nccl_communicator.h"

#include <nccl.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <thread>
#include <vector>

#include "engine/core/cuda_allocator.h"
#include "engine/cuda/check.h"

namespace meshrun::gpu {

// The NCCL overload of the one checking macro (check.h). ncclInProgress is not an error: a
// non-blocking communicator returns it for work that is still being issued, which the callers
// then wait for with WaitReady.
Status ToStatus(ncclResult_t result, const char* expr, const char* file, int line) {
  if (result == ncclSuccess || result == ncclInProgress) return OkStatus();
  StatusCode code = StatusCode::kInternal;
  switch (result) {
    case ncclSystemError:
    case ncclRemoteError: code = StatusCode::kUnavailable; break;
    case ncclInvalidArgument:
    case ncclInvalidUsage: code = StatusCode::kInvalidArgument; break;
    default: break;
  }
  const char* last = ncclGetLastError(nullptr);
  Status s(code, std::string(expr) + " failed at " + file + ":" + std::to_string(line) + ": " +
                     ncclGetErrorString(result) +
                     (last != nullptr && last[0] != '\0' ? std::string(" (") + last + ")" : ""));
  RecordGpuError(s);
  return s;
}

namespace {

using Clock = std::chrono::steady_clock;

// Waits until `comm` has no operation in progress. On an asynchronous error or at `deadline`
// the communicator is aborted (so no rank hangs in it) and *aborted is set.
Status WaitReady(ncclComm_t comm, Clock::time_point deadline, std::chrono::microseconds poll,
                 const std::string& what, bool* aborted) {
  while (true) {
    ncclResult_t state = ncclSuccess;
    MESHRUN_GPU_TRY(ncclCommGetAsyncError(comm, &state));
    if (state == ncclSuccess) return OkStatus();
    if (state != ncclInProgress) {
      Status s = ToStatus(state, what.c_str(), __FILE__, __LINE__);
      (void)ncclCommAbort(comm);
      *aborted = true;
      return s;
    }
    if (Clock::now() >= deadline) {
      (void)ncclCommAbort(comm);
      *aborted = true;
      Status s = DeadlineExceededError(what +
                                       ": NCCL did not finish in time; communicator "
                                       "aborted (hint: a peer is hung, dead or never "
                                       "joined; check every rank's log)");
      RecordGpuError(s);
      return s;
    }
    std::this_thread::sleep_for(poll);
  }
}

Clock::time_point DeadlineAfter(std::chrono::milliseconds timeout) {
  return Clock::now() + timeout;
}

ncclConfig_t NonBlockingConfig() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

// Bootstraps a communicator of `size` ranks on a fresh ncclUniqueId published under `key`.
Status InitFromStore(Store& store, const std::string& key, int rank, int size,
                     std::chrono::milliseconds timeout, std::chrono::microseconds poll,
                     ncclComm_t* out) {
  const Clock::time_point deadline = DeadlineAfter(timeout);
  ncclUniqueId id;
  if (rank == 0) {
    MESHRUN_GPU_TRY(ncclGetUniqueId(&id));
    MESHRUN_RETURN_IF_ERROR(store.Set(key, std::string(id.internal, sizeof(id.internal))));
  } else {
    MESHRUN_ASSIGN_OR_RETURN(std::string bytes, store.Get(key, timeout));
    if (bytes.size() != sizeof(id.internal)) {
      return DataLossError("store key " + key + " holds " + std::to_string(bytes.size()) +
                           " bytes, not an ncclUniqueId (" + std::to_string(sizeof(id.internal)) +
                           ") (hint: a stale store from another NCCL version or job?)");
    }
    std::memcpy(id.internal, bytes.data(), sizeof(id.internal));
  }
  ncclConfig_t config = NonBlockingConfig();
  ncclComm_t comm = nullptr;
  MESHRUN_GPU_TRY(ncclCommInitRankConfig(&comm, size, id, rank, &config));
  bool aborted = false;
  Status s = WaitReady(comm, deadline, poll,
                       "ncclCommInitRankConfig(rank " + std::to_string(rank) + " of " +
                           std::to_string(size) + ", key " + key + ")",
                       &aborted);
  if (!s.ok()) return s;
  *out = comm;
  return OkStatus();
}

// One rank's handle on one NCCL group. Owns the ncclComm_t, a communication stream, two events
// and a one-float barrier buffer. Single-threaded like every Communicator.
class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(CommConfig config, ncclComm_t comm, const NcclOptions& options)
      : Communicator(std::move(config)), comm_(comm), options_(options) {}

  Status Init() {
    MESHRUN_GPU_TRY(cudaSetDevice(options_.device));
    MESHRUN_GPU_TRY(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    MESHRUN_GPU_TRY(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    MESHRUN_GPU_TRY(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    MESHRUN_ASSIGN_OR_RETURN(barrier_,
                             DeviceBuffer::Allocate(CudaAllocator(options_.device), sizeof(float)));
    MESHRUN_GPU_TRY(cudaMemset(barrier_.get(), 0, sizeof(float)));
    return OkStatus();
  }

  bool overlaps() const override { return true; }
  void SetComputeStream(void* stream) override {
    options_.compute_stream = static_cast<cudaStream_t>(stream);
  }

  ~NcclCommunicator() override {
    for (auto& [ticket, p] : pending_) ReleaseEvents(p);
    for (cudaEvent_t e : free_events_) (void)cudaEventDestroy(e);
    if (comm_ != nullptr) {
      if (aborted_) {
        // ncclCommAbort already released it.
      } else if (!health().ok()) {
        (void)ncclCommAbort(comm_);
      } else {
        // Flush, then destroy; bounded like everything else.
        bool aborted = false;
        (void)ncclCommFinalize(comm_);
        (void)WaitReady(comm_, DeadlineAfter(default_timeout()), options_.poll_interval,
                        "ncclCommFinalize", &aborted);
        if (!aborted) (void)ncclCommDestroy(comm_);
      }
    }
    barrier_.Reset();
    staging_.Reset();
    if (done_ != nullptr) (void)cudaEventDestroy(done_);
    if (ready_ != nullptr) (void)cudaEventDestroy(ready_);
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  }

 protected:
  Status DoAllReduce(float* data, size_t count, Duration timeout) override {
    const size_t bytes = count * sizeof(float);
    MESHRUN_ASSIGN_OR_RETURN(char* staged, StageIn(data, bytes, bytes));
    float* on_device = staged != nullptr ? reinterpret_cast<float*>(staged) : data;
    MESHRUN_RETURN_IF_ERROR(Launch(timeout, "ncclAllReduce", [&] {
      return ncclAllReduce(on_device, on_device, count, ncclFloat32, ncclSum, comm_, stream_);
    }));
    return StageOut(staged, data, bytes);
  }

  Status DoReduceScatter(const float* input, float* output, size_t count,
                         Duration timeout) override {
    return Launch(timeout, "ncclReduceScatter", [&] {
      return ncclReduceScatter(input, output, count, ncclFloat32, ncclSum, comm_, stream_);
    });
  }

  Status DoAllGather(const void* input, void* output, size_t bytes, Duration timeout) override {
    const size_t out_bytes = bytes * static_cast<size_t>(size());
    if (OnDevice(input) && OnDevice(output)) {
      return Launch(timeout, "ncclAllGather",
                    [&] { return ncclAllGather(input, output, bytes, ncclInt8, comm_, stream_); });
    }
    // Host buffers (the trainer's scalars: loss sums, norms, stop votes, run totals).
    MESHRUN_ASSIGN_OR_RETURN(char* staged, Staging(bytes + out_bytes));
    MESHRUN_GPU_TRY(cudaMemcpyAsync(staged, input, bytes, cudaMemcpyDefault, stream_));
    MESHRUN_RETURN_IF_ERROR(Launch(timeout, "ncclAllGather", [&] {
      return ncclAllGather(staged, staged + bytes, bytes, ncclInt8, comm_, stream_);
    }));
    return StageOut(staged + bytes, output, out_bytes);
  }

  Status DoBroadcast(void* data, size_t bytes, int root, Duration timeout) override {
    MESHRUN_ASSIGN_OR_RETURN(char* staged, StageIn(data, bytes, bytes));
    void* on_device = staged != nullptr ? staged : data;
    MESHRUN_RETURN_IF_ERROR(Launch(timeout, "ncclBroadcast", [&] {
      return ncclBroadcast(on_device, on_device, bytes, ncclInt8, root, comm_, stream_);
    }));
    return StageOut(staged, data, bytes);
  }

  Status DoSendRecv(const void* send_data, size_t send_bytes, int dst, void* recv_data,
                    size_t recv_bytes, int src, Duration timeout) override {
    return Launch(timeout, "ncclSend/ncclRecv", [&]() -> ncclResult_t {
      ncclResult_t r = ncclGroupStart();
      if (r != ncclSuccess) return r;
      if (dst >= 0) {
        r = ncclSend(send_data, send_bytes, ncclInt8, dst, comm_, stream_);
        if (r != ncclSuccess && r != ncclInProgress) {
          (void)ncclGroupEnd();
          return r;
        }
      }
      if (src >= 0) {
        r = ncclRecv(recv_data, recv_bytes, ncclInt8, src, comm_, stream_);
        if (r != ncclSuccess && r != ncclInProgress) {
          (void)ncclGroupEnd();
          return r;
        }
      }
      return ncclGroupEnd();
    });
  }

  Status DoBarrier(Duration timeout) override {
    float* one = barrier_.as<float>();
    return Launch(timeout, "barrier (ncclAllReduce of one float)",
                  [&] { return ncclAllReduce(one, one, 1, ncclFloat32, ncclSum, comm_, stream_); });
  }

  // Asynchronous calls: issued on stream_ after the compute stream's work (an event), bracketed
  // by two timing events; DoWait polls the done event (and the communicator's asynchronous
  // error) against the deadline taken at start, then makes the compute stream wait for it.
  StatusOr<int64_t> DoStart(AsyncOp op, const void* input, void* output, size_t count,
                            Duration timeout) override {
    const char* what = op == AsyncOp::kAllReduce       ? "ncclAllReduce"
                       : op == AsyncOp::kReduceScatter ? "ncclReduceScatter"
                                                       : "ncclAllGather";
    return StartOnStream(what, timeout, [&]() -> ncclResult_t {
      switch (op) {
        case AsyncOp::kAllReduce:
          return ncclAllReduce(output, output, count, ncclFloat32, ncclSum, comm_, stream_);
        case AsyncOp::kReduceScatter:
          return ncclReduceScatter(input, output, count, ncclFloat32, ncclSum, comm_, stream_);
        case AsyncOp::kAllGather:
          return ncclAllGather(input, output, count, ncclFloat32, comm_, stream_);
        case AsyncOp::kAllGatherBytes:
          return ncclAllGather(input, output, count, ncclInt8, comm_, stream_);
      }
      return ncclInvalidArgument;
    });
  }

  // Asynchronous point-to-point (decision 0064): ncclSend / ncclRecv issued on stream_ like the
  // asynchronous collectives, so they complete in issue order (communicator.h).
  StatusOr<int64_t> DoStartSend(const void* data, size_t bytes, int peer,
                                Duration timeout) override {
    return StartOnStream("ncclSend", timeout,
                         [&] { return ncclSend(data, bytes, ncclInt8, peer, comm_, stream_); });
  }
  StatusOr<int64_t> DoStartRecv(void* data, size_t bytes, int peer, Duration timeout) override {
    return StartOnStream("ncclRecv", timeout,
                         [&] { return ncclRecv(data, bytes, ncclInt8, peer, comm_, stream_); });
  }

  Status DoWait(int64_t ticket, Duration, double* busy_seconds) override {
    auto it = pending_.find(ticket);
    if (it == pending_.end()) return InternalError("NCCL: unknown ticket");
    Pending p = std::move(it->second);
    pending_.erase(it);
    Status s = WaitEvent(p.done, p.deadline, p.what.c_str());
    if (s.ok()) {
      float ms = 0;
      if (cudaEventElapsedTime(&ms, p.start, p.done) == cudaSuccess) *busy_seconds = ms / 1e3;
      s = ToStatus(cudaStreamWaitEvent(options_.compute_stream, p.done, 0),
                   "cudaStreamWaitEvent(compute, collective done)", __FILE__, __LINE__);
    }
    ReleaseEvents(p);
    return s;
  }

  // Size-1 shortcuts of a device group never reach here (the backend's MakeSolo), but a
  // self-exchange of SendRecv does: copy on the device, in the compute stream's order.
  void CopyLocal(void* dst, const void* src, size_t bytes) override {
    (void)ToStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, options_.compute_stream),
                   "cudaMemcpyAsync(self-exchange)", __FILE__, __LINE__);
  }

 private:
  // Issues `issue` on stream_ after the compute stream's work (an event), bracketed by two timing
  // events, and returns the ticket DoWait completes.
  StatusOr<int64_t> StartOnStream(const char* what, Duration timeout,
                                  const std::function<ncclResult_t()>& issue) {
    if (aborted_) return FailedPreconditionError("the NCCL communicator was aborted");
    Pending p;
    p.deadline = DeadlineAfter(timeout);
    p.what = what;
    MESHRUN_GPU_TRY(cudaSetDevice(options_.device));
    MESHRUN_ASSIGN_OR_RETURN(p.start, TakeEvent());
    StatusOr<cudaEvent_t> done = TakeEvent();
    if (!done.ok()) {
      free_events_.push_back(p.start);
      return done.status();
    }
    p.done = *done;
    Status s = [&]() -> Status {
      MESHRUN_GPU_TRY(cudaEventRecord(ready_, options_.compute_stream));
      MESHRUN_GPU_TRY(cudaStreamWaitEvent(stream_, ready_, 0));
      MESHRUN_GPU_TRY(cudaEventRecord(p.start, stream_));
      Status issued = ToStatus(issue(), p.what.c_str(), __FILE__, __LINE__);
      if (!issued.ok()) {
        (void)ncclCommAbort(comm_);
        aborted_ = true;
        return issued;
      }
      MESHRUN_RETURN_IF_ERROR(
          WaitReady(comm_, p.deadline, options_.poll_interval, p.what, &aborted_));
      MESHRUN_GPU_TRY(cudaEventRecord(p.done, stream_));
      return OkStatus();
    }();
    if (!s.ok()) {
      ReleaseEvents(p);
      return s;
    }
    const int64_t ticket = next_ticket_++;
    pending_.emplace(ticket, std::move(p));
    return ticket;
  }

  // NCCL reads and writes device memory only; the engine's tensors are there, but the trainer's
  // few scalars (loss sums, norms, stop votes, run totals) are host variables. Those go through
  // a staging buffer on the device: in before the collective, out once it has completed (never
  // a blocking copy behind a collective that may hang: the deadline would not hold).
  static bool OnDevice(const void* p) {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      (void)cudaGetLastError();  // an unknown pointer is host memory
      return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
  }
  // A device buffer of at least `bytes`, kept for the next call.
  StatusOr<char*> Staging(size_t bytes) {
    MESHRUN_GPU_TRY(cudaSetDevice(options_.device));
    if (staging_.bytes() < bytes) {
      staging_.Reset();
      MESHRUN_ASSIGN_OR_RETURN(staging_,
                               DeviceBuffer::Allocate(CudaAllocator(options_.device), bytes));
    }
    return staging_.as<char>();
  }
  // nullptr when `data` is on the device; else the staging buffer holding its first `in_bytes`.
  StatusOr<char*> StageIn(const void* data, size_t in_bytes, size_t buffer_bytes) {
    if (OnDevice(data)) return static_cast<char*>(nullptr);
    MESHRUN_ASSIGN_OR_RETURN(char* staged, Staging(buffer_bytes));
    MESHRUN_GPU_TRY(cudaMemcpyAsync(staged, data, in_bytes, cudaMemcpyDefault, stream_));
    return staged;
  }
  // After a completed collective: copies the staged result to the host (nothing when unstaged).
  Status StageOut(const char* staged, void* host, size_t bytes) {
    if (staged == nullptr) return OkStatus();
    MESHRUN_GPU_TRY(cudaMemcpyAsync(host, staged, bytes, cudaMemcpyDefault, stream_));
    MESHRUN_GPU_TRY(cudaStreamSynchronize(stream_));
    return OkStatus();
  }

  // Orders the collective after the compute stream's work, issues it on stream_, and waits for
  // it with the deadline: issue (ncclInProgress until enqueued), then the done event, checking
  // the communicator's asynchronous error while it runs. Aborts on error or timeout.
  Status Launch(Duration timeout, const char* what, const std::function<ncclResult_t()>& issue) {
    if (aborted_) return FailedPreconditionError("the NCCL communicator was aborted");
    const Clock::time_point deadline = DeadlineAfter(timeout);
    MESHRUN_GPU_TRY(cudaSetDevice(options_.device));
    MESHRUN_GPU_TRY(cudaEventRecord(ready_, options_.compute_stream));
    MESHRUN_GPU_TRY(cudaStreamWaitEvent(stream_, ready_, 0));
    Status issued = ToStatus(issue(), what, __FILE__, __LINE__);
    if (!issued.ok()) {
      (void)ncclCommAbort(comm_);
      aborted_ = true;
      return issued;
    }
    MESHRUN_RETURN_IF_ERROR(WaitReady(comm_, deadline, options_.poll_interval, what, &aborted_));
    MESHRUN_GPU_TRY(cudaEventRecord(done_, stream_));
    return WaitEvent(done_, deadline, what);
  }

  // Polls `done` until it fired, checking the communicator's asynchronous error meanwhile;
  // aborts on error or at the deadline.
  Status WaitEvent(cudaEvent_t done, Clock::time_point deadline, const char* what) {
    while (true) {
      const cudaError_t q = cudaEventQuery(done);
      if (q == cudaSuccess) return OkStatus();
      if (q != cudaErrorNotReady) {
        (void)ncclCommAbort(comm_);
        aborted_ = true;
        return ToStatus(q, "cudaEventQuery(collective done)", __FILE__, __LINE__);
      }
      ncclResult_t state = ncclSuccess;
      (void)ncclCommGetAsyncError(comm_, &state);
      if (state != ncclSuccess && state != ncclInProgress) {
        Status s = ToStatus(state, what, __FILE__, __LINE__);
        (void)ncclCommAbort(comm_);
        aborted_ = true;
        return s;
      }
      if (Clock::now() >= deadline) {
        (void)ncclCommAbort(comm_);
        aborted_ = true;
        Status s = DeadlineExceededError(std::string(what) +
                                         " did not complete in time; communicator aborted "
                                         "(hint: a peer is hung or dead; check every rank's log)");
        RecordGpuError(s);
        return s;
      }
      std::this_thread::sleep_for(options_.poll_interval);
    }
  }

  struct Pending {
    cudaEvent_t start = nullptr, done = nullptr;
    Clock::time_point deadline;
    std::string what;
  };

  StatusOr<cudaEvent_t> TakeEvent() {
    if (!free_events_.empty()) {
      cudaEvent_t e = free_events_.back();
      free_events_.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    MESHRUN_GPU_TRY(cudaEventCreate(&e));  // timing enabled: DoWait measures the call
    return e;
  }
  void ReleaseEvents(Pending& p) {
    if (p.start != nullptr) free_events_.push_back(p.start);
    if (p.done != nullptr) free_events_.push_back(p.done);
    p.start = p.done = nullptr;
  }

  ncclComm_t comm_ = nullptr;
  NcclOptions options_;
  bool aborted_ = false;
  std::map<int64_t, Pending> pending_;
  std::vector<cudaEvent_t> free_events_;
  int64_t next_ticket_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr, done_ = nullptr;
  DeviceBuffer barrier_;
  DeviceBuffer staging_;  // host buffers' way through NCCL (see OnDevice)
};

// The size-1 communicator of a device group: the base class answers every call; its copies run
// on the device.
class DeviceSoloCommunicator final : public Communicator {
 public:
  DeviceSoloCommunicator(CommConfig config, const NcclOptions& options)
      : Communicator(std::move(config)), options_(options) {}
  void SetComputeStream(void* stream) override {
    options_.compute_stream = static_cast<cudaStream_t>(stream);
  }

 protected:
  Status DoAllReduce(float*, size_t, Duration) override { return Unreachable(); }
  Status DoReduceScatter(const float*, float*, size_t, Duration) override { return Unreachable(); }
  Status DoAllGather(const void*, void*, size_t, Duration) override { return Unreachable(); }
  Status DoBroadcast(void*, size_t, int, Duration) override { return Unreachable(); }
  Status DoSendRecv(const void*, size_t, int, void*, size_t, int, Duration) override {
    return Unreachable();
  }
  Status DoBarrier(Duration) override { return Unreachable(); }
  void CopyLocal(void* dst, const void* src, size_t bytes) override {
    (void)ToStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, options_.compute_stream),
                   "cudaMemcpyAsync(size-1 group)", __FILE__, __LINE__);
  }

 private:
  static Status Unreachable() { return InternalError("size-1 communicator reached its backend"); }
  NcclOptions options_;
};

}  // namespace

std::unique_ptr<Communicator> NcclBackend::MakeSolo(CommConfig config) {
  config.size = 1;
  config.rank = 0;
  return std::make_unique<DeviceSoloCommunicator>(std::move(config), options_);
}

struct NcclBackend::State {
  ncclComm_t world = nullptr;
  int world_rank = -1;
  int world_size = 0;
  bool world_aborted = false;
};

NcclBackend::NcclBackend(const NcclOptions& options)
    : options_(options), state_(std::make_unique<State>()) {}

NcclBackend::~NcclBackend() {
  if (state_->world != nullptr && !state_->world_aborted) {
    // Communicators split from the world are independent of it once created.
    bool aborted = false;
    (void)ncclCommFinalize(state_->world);
    (void)WaitReady(state_->world, DeadlineAfter(std::chrono::seconds(30)), options_.poll_interval,
                    "ncclCommFinalize(world)", &aborted);
    if (!aborted) (void)ncclCommDestroy(state_->world);
  }
}

StatusOr<std::shared_ptr<NcclBackend>> NcclBackend::Create(const NcclOptions& options) {
  const int n = DeviceCount();
  if (options.device < 0 || options.device >= n) {
    return UnavailableError("NCCL backend: cuda:" + std::to_string(options.device) +
                            " does not exist (" + std::to_string(n) +
                            " devices visible; hint: check CUDA_VISIBLE_DEVICES)");
  }
  return std::shared_ptr<NcclBackend>(new NcclBackend(options));
}

bool NcclBackend::has_world() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_->world != nullptr;
}

Status NcclBackend::InitWorld(std::shared_ptr<Store> store, int rank, int world_size,
                              std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_->world != nullptr) return FailedPreconditionError("NCCL world already initialised");
  if (rank < 0 || rank >= world_size) {
    return InvalidArgumentError("NCCL world: rank " + std::to_string(rank) + " outside [0, " +
                                std::to_string(world_size) + ")");
  }
  MESHRUN_GPU_TRY(cudaSetDevice(options_.device));
  ncclComm_t comm = nullptr;
  Status s = InitFromStore(*store, "nccl/world/unique_id", rank, world_size, timeout,
                           options_.poll_interval, &comm);
  if (!s.ok()) {
    return Status(s.code(), "NCCL world bootstrap (rank " + std::to_string(rank) + " of " +
                                std::to_string(world_size) + "): " + s.message());
  }
  state_->world = comm;
  state_->world_rank = rank;
  state_->world_size = world_size;
  return OkStatus();
}

StatusOr<std::unique_ptr<Communicator>> NcclBackend::Connect(const CommConfig& config,
                                                             std::shared_ptr<Store> store) {
  std::lock_guard<std::mutex> lock(mu_);
  if (config.size < 1 || config.rank < 0 || config.rank >= config.size) {
    return InvalidArgumentError("NCCL group " + config.group_id + ": rank " +
                                std::to_string(config.rank) + " of size " +
                                std::to_string(config.size) + " is invalid");
  }
  MESHRUN_GPU_TRY(cudaSetDevice(options_.device));
  const Clock::time_point deadline = DeadlineAfter(config.timeout);
  ncclComm_t comm = nullptr;
  const std::string where = "NCCL group " + config.group_id + " (rank " +
                            std::to_string(config.rank) + " of " + std::to_string(config.size) +
                            ")";
  if (state_->world_aborted) {
    return FailedPreconditionError(where +
                                   ": the NCCL world communicator was aborted after an "
                                   "earlier error (hint: restart the job)");
  }
  if (state_->world != nullptr) {
    // Color: the world rank of the group's rank 0, unique among the groups of one axis.
    int color = state_->world_rank;
    if (config.rank == 0) {
      MESHRUN_RETURN_IF_ERROR(store->Set("nccl/split_color", std::to_string(color)));
    } else {
      MESHRUN_ASSIGN_OR_RETURN(std::string v, store->Get("nccl/split_color", config.timeout));
      char* end = nullptr;
      const long parsed = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || end == nullptr || *end != '\0' || parsed < 0) {
        return DataLossError(where + ": store key nccl/split_color holds \"" + v +
                             "\", not a world rank (hint: a stale store from another job?)");
      }
      color = static_cast<int>(parsed);
    }
    ncclConfig_t cfg = NonBlockingConfig();
    Status s = ToStatus(ncclCommSplit(state_->world, color, config.rank, &comm, &cfg),
                        "ncclCommSplit", __FILE__, __LINE__);
    if (s.ok()) {
      s = WaitReady(state_->world, deadline, options_.poll_interval, where + " split (world)",
                    &state_->world_aborted);
    }
    bool child_aborted = false;  // WaitReady aborts the communicator it gives up on
    if (s.ok() && comm != nullptr) {
      s = WaitReady(comm, deadline, options_.poll_interval, where + " split", &child_aborted);
    }
    if (!s.ok()) {
      // A child the split produced dies with the failure, once.
      if (comm != nullptr && !child_aborted) (void)ncclCommAbort(comm);
      return Status(s.code(), where + ": " + s.message());
    }
    if (comm == nullptr) return InternalError(where + ": ncclCommSplit returned no communicator");
  } else {
    Status s = InitFromStore(*store, "nccl/unique_id", config.rank, config.size, config.timeout,
                             options_.poll_interval, &comm);
    if (!s.ok()) return Status(s.code(), where + ": " + s.message());
  }
  auto c = std::make_unique<NcclCommunicator>(config, comm, options_);
  MESHRUN_RETURN_IF_ERROR(c->Init());
  return std::unique_ptr<Communicator>(std::move(c));
}

std::string NcclVersion() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unknown";
  // NCCL_VERSION(X,Y,Z) = X*10000 + Y*100 + Z since 2.9.
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100);
}

}  // namespace meshrun::gpu
