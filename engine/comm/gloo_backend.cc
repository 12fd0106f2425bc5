// GlooBackend and GlooCommunicator: every Gloo call runs inside GlooCall, the one place where
// Gloo's exceptions are caught and turned into a Status (the NCCL-style checking point).
#include "engine/comm/gloo_backend.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>
#include <signal.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <map>
#include <vector>

namespace meshrun {
namespace {

using Clock = std::chrono::steady_clock;
using Duration = std::chrono::milliseconds;

// Slot prefixes of our own ops; Gloo's built-in ops use small prefixes (0x01…0x0f).
constexpr uint8_t kReduceScatterSlotPrefix = 0x60;
constexpr uint8_t kP2PSlotPrefix = 0x61;

// Carries a Store error through Gloo's rendezvous code back to Connect.
struct StoreError : std::exception {
  explicit StoreError(Status s) : status(std::move(s)) {}
  const char* what() const noexcept override { return "meshrun store error"; }
  Status status;
};

// gloo::rendezvous::Store over our Store. Gloo calls wait() then get() for each peer address.
class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(std::shared_ptr<meshrun::Store> store, Duration timeout)
      : store_(std::move(store)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    Check(store_->Set(key, std::string(data.begin(), data.end())));
  }
  std::vector<char> get(const std::string& key) override {
    StatusOr<std::string> v = store_->Get(key, timeout_);
    Check(v.status());
    return std::vector<char>(v->begin(), v->end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const Duration& timeout) override {
    Check(store_->Wait(keys, timeout > Duration::zero() ? timeout : timeout_));
  }

 private:
  static void Check(const Status& s) {
    if (!s.ok()) throw StoreError(s);
  }

  std::shared_ptr<meshrun::Store> store_;
  Duration timeout_;
};

// Runs `fn` and converts whatever Gloo throws into a Status. Never throws.
template <typename Fn>
Status GlooCall(Fn&& fn) noexcept {
  try {
    fn();
    return OkStatus();
  } catch (const StoreError& e) {
    return e.status;
  } catch (const gloo::IoException& e) {
    const std::string what = e.what();
    if (what.find("Timed out") != std::string::npos) {
      return DeadlineExceededError("gloo: " + what);
    }
    return UnavailableError("gloo: " + what + " (hint: a peer process probably died)");
  } catch (const gloo::EnforceNotMet& e) {
    return InternalError(std::string("gloo enforce: ") + e.what());
  } catch (const std::exception& e) {
    return InternalError(std::string("gloo: ") + e.what());
  } catch (...) {
    return InternalError("gloo: unknown exception");
  }
}

// Throws gloo::IoException like Gloo's own waits do when a wait was aborted.
void CheckWait(bool completed, const char* what) {
  if (!completed) throw gloo::IoException(std::string(what) + " was aborted");
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(CommConfig config, std::shared_ptr<gloo::Context> context,
                   std::shared_ptr<gloo::transport::Device> device)
      : Communicator(std::move(config)),
        context_(std::move(context)),
        device_(std::move(device)),
        send_seq_(size(), 0),
        recv_seq_(size(), 0) {}

  ~GlooCommunicator() override {
    p2p_.clear();      // posted buffers go before their context
    context_.reset();  // pairs go before the device they run on
    device_.reset();
  }

 protected:
  Status DoAllReduce(float* data, size_t count, Duration timeout) override {
    return GlooCall([&] {
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(data, count);
      opts.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      opts.setTag(tag_++);
      opts.setTimeout(timeout);
      gloo::allreduce(opts);
    });
  }

  // Ring reduce-scatter: at step s (0 … n−2) rank r sends its partial sum of chunk r−s−1 to
  // r+1 and adds the partial sum of chunk r−s−2 received from r−1; after n−1 steps chunk r
  // holds the full sum. Each rank sends (n−1)·count floats: the bus bytes of docs/parallelism.md.
  Status DoReduceScatter(const float* input, float* output, size_t count,
                         Duration timeout) override {
    return GlooCall([&] {
      const auto deadline = Clock::now() + timeout;
      const int n = size();
      const int r = rank();
      const size_t chunk_bytes = count * sizeof(float);
      std::vector<float> acc(input, input + count * n);
      std::vector<float> incoming(count);
      auto acc_buf = context_->createUnboundBuffer(acc.data(), acc.size() * sizeof(float));
      auto in_buf = context_->createUnboundBuffer(incoming.data(), chunk_bytes);
      const uint64_t slot = gloo::Slot::build(kReduceScatterSlotPrefix, tag_++);
      const int right = (r + 1) % n;
      const int left = (r + n - 1) % n;
      for (int s = 0; s < n - 1; ++s) {
        const int send_chunk = ((r - s - 1) % n + n) % n;
        const int recv_chunk = ((r - s - 2) % n + n) % n;
        acc_buf->send(right, slot, send_chunk * chunk_bytes, chunk_bytes);
        in_buf->recv(left, slot, 0, chunk_bytes);
        CheckWait(in_buf->waitRecv(Remaining(deadline)), "reduce_scatter recv");
        CheckWait(acc_buf->waitSend(Remaining(deadline)), "reduce_scatter send");
        float* dst = acc.data() + recv_chunk * count;
        for (size_t i = 0; i < count; ++i) dst[i] += incoming[i];
      }
      std::memcpy(output, acc.data() + r * count, chunk_bytes);
    });
  }

  Status DoAllGather(const void* input, void* output, size_t bytes, Duration timeout) override {
    return GlooCall([&] {
      gloo::AllgatherOptions opts(context_);
      opts.setInput(static_cast<uint8_t*>(const_cast<void*>(input)), bytes);
      opts.setOutput(static_cast<uint8_t*>(output), bytes * size());
      opts.setTag(tag_++);
      opts.setTimeout(timeout);
      gloo::allgather(opts);
    });
  }

  Status DoBroadcast(void* data, size_t bytes, int root, Duration timeout) override {
    return GlooCall([&] {
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(static_cast<uint8_t*>(data), bytes);
      opts.setRoot(root);
      opts.setTag(tag_++);
      opts.setTimeout(timeout);
      gloo::broadcast(opts);
    });
  }

  Status DoBarrier(Duration timeout) override {
    return GlooCall([&] {
      gloo::BarrierOptions opts(context_);
      opts.setTag(tag_++);
      opts.setTimeout(timeout);
      gloo::barrier(opts);
    });
  }

  // Point-to-point messages on the slot (prefix, k) where k counts the messages of that
  // direction, so both sides agree on it without talking.
  Status DoSendRecv(const void* send_data, size_t send_bytes, int dst, void* recv_data,
                    size_t recv_bytes, int src, Duration timeout) override {
    return GlooCall([&] {
      const auto deadline = Clock::now() + timeout;
      std::unique_ptr<gloo::transport::UnboundBuffer> send_buf, recv_buf;
      if (dst >= 0) {
        send_buf = context_->createUnboundBuffer(const_cast<void*>(send_data), send_bytes);
        send_buf->send(dst, gloo::Slot::build(kP2PSlotPrefix, send_seq_[dst]++));
      }
      if (src >= 0) {
        recv_buf = context_->createUnboundBuffer(recv_data, recv_bytes);
        recv_buf->recv(src, gloo::Slot::build(kP2PSlotPrefix, recv_seq_[src]++));
        CheckWait(recv_buf->waitRecv(Remaining(deadline)), "recv");
      }
      if (send_buf) CheckWait(send_buf->waitSend(Remaining(deadline)), "send");
    });
  }

  // Asynchronous point-to-point: the same slots as DoSendRecv (the k-th message of a direction,
  // blocking or not), on an unbound buffer kept until DoWait; Gloo's transport thread moves the
  // bytes once both ends have posted.
  StatusOr<int64_t> DoStartSend(const void* data, size_t bytes, int peer,
                                Duration timeout) override {
    return PostP2P(/*send=*/true, const_cast<void*>(data), bytes, peer, timeout);
  }
  StatusOr<int64_t> DoStartRecv(void* data, size_t bytes, int peer, Duration timeout) override {
    return PostP2P(/*send=*/false, data, bytes, peer, timeout);
  }

  Status DoWait(int64_t ticket, Duration, double*) override {
    auto it = p2p_.find(ticket);
    if (it == p2p_.end()) return InternalError("gloo: unknown ticket");
    Posted p = std::move(it->second);
    p2p_.erase(it);
    return GlooCall([&] {
      if (p.send) {
        CheckWait(p.buffer->waitSend(Remaining(p.deadline)), "send");
      } else {
        CheckWait(p.buffer->waitRecv(Remaining(p.deadline)), "recv");
      }
    });
  }

 private:
  struct Posted {
    std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
    bool send = false;
    Clock::time_point deadline;
  };

  StatusOr<int64_t> PostP2P(bool send, void* data, size_t bytes, int peer, Duration timeout) {
    Posted p;
    p.send = send;
    p.deadline = Clock::now() + timeout;
    MESHRUN_RETURN_IF_ERROR(GlooCall([&] {
      p.buffer = context_->createUnboundBuffer(data, bytes);
      if (send) {
        p.buffer->send(peer, gloo::Slot::build(kP2PSlotPrefix, send_seq_[peer]++));
      } else {
        p.buffer->recv(peer, gloo::Slot::build(kP2PSlotPrefix, recv_seq_[peer]++));
      }
    }));
    const int64_t ticket = next_ticket_++;
    p2p_.emplace(ticket, std::move(p));
    return ticket;
  }

  static Duration Remaining(Clock::time_point deadline) {
    const auto left = std::chrono::duration_cast<Duration>(deadline - Clock::now());
    return std::max(left, Duration(1));
  }

  std::shared_ptr<gloo::Context> context_;
  std::shared_ptr<gloo::transport::Device> device_;
  uint32_t tag_ = 0;                // collectives issued: the same on every member
  std::vector<uint32_t> send_seq_;  // messages sent to each peer
  std::vector<uint32_t> recv_seq_;  // messages received from each peer
  std::map<int64_t, Posted> p2p_;   // started sends and receives, by ticket
  int64_t next_ticket_ = 0;
};

}  // namespace

StatusOr<std::shared_ptr<GlooBackend>> GlooBackend::Create(const GlooOptions& options) {
  // Gloo writes to sockets without MSG_NOSIGNAL: a write to a dead peer raises SIGPIPE, whose
  // default action kills this process before Gloo can report the error. Ignore it unless the
  // program installed its own handler.
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    ::signal(SIGPIPE, SIG_IGN);
  }
  std::shared_ptr<gloo::transport::Device> device;
  Status s = GlooCall([&] {
    gloo::transport::tcp::attr attr;
    if (!options.iface.empty()) {
      attr.iface = options.iface;
    } else {
      attr.hostname = options.hostname;
    }
    device = gloo::transport::tcp::CreateDevice(attr);
  });
  if (!s.ok()) {
    return UnavailableError("gloo: cannot create a TCP device on " +
                            (options.iface.empty() ? "host '" + options.hostname + "'"
                                                   : "interface '" + options.iface + "'") +
                            ": " + s.message() +
                            " (hint: pass an address or interface of this host)");
  }
  return std::shared_ptr<GlooBackend>(new GlooBackend(std::move(device)));
}

StatusOr<std::unique_ptr<Communicator>> GlooBackend::Connect(const CommConfig& config,
                                                             std::shared_ptr<Store> store) {
  if (config.size < 1 || config.rank < 0 || config.rank >= config.size) {
    return InvalidArgumentError("gloo connect " + config.group_id + ": rank " +
                                std::to_string(config.rank) + " of " + std::to_string(config.size) +
                                " is not a valid group position");
  }
  if (config.size == 1) return MakeSoloCommunicator(config);
  auto context = std::make_shared<gloo::rendezvous::Context>(config.rank, config.size);
  Status s = GlooCall([&] {
    context->setTimeout(config.timeout);
    GlooStoreAdapter adapter(store, config.timeout);
    context->connectFullMesh(adapter, device_);
  });
  if (!s.ok()) {
    return Status(s.code(), "gloo connect " + std::string(MeshAxisName(config.axis)) + " group " +
                                config.group_id + " (rank " + std::to_string(config.rank) + " of " +
                                std::to_string(config.size) + ", timeout " +
                                std::to_string(config.timeout.count()) + " ms): " + s.message());
  }
  return std::unique_ptr<Communicator>(new GlooCommunicator(config, std::move(context), device_));
}

}  // namespace meshrun
