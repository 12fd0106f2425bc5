// FakeWorld: collectives as rendezvous rounds over one mutex-protected table, point-to-point as
// numbered messages per (src, dst). Simple and slow on purpose: it exists to check semantics.
#include "engine/comm/fake_backend.h"

#include <condition_variable>
#include <cstring>
#include <map>
#include <thread>
#include <tuple>

namespace meshrun {
namespace {

using Clock = std::chrono::steady_clock;

// One collective call, as seen by all members.
struct Round {
  CommOp op = CommOp::kBarrier;
  size_t bytes = 0;
  int root = -1;
  int first_rank = -1;                   // whose call defined op/bytes/root
  std::vector<std::vector<float>> data;  // each rank's contribution (bytes padded to floats)
  std::vector<bool> present;
  int arrived = 0;
  int left = 0;
  std::string mismatch;  // set when a member's call differs from first_rank's
};

// The k-th message from one rank to another: posted by either end first, delivered (copied into
// the receive buffer) when the later end posts, removed once both ends have waited for it.
struct Message {
  bool sent = false;  // the send was posted (its bytes are in `data` until delivered)
  std::string data;
  void* recv_buf = nullptr;  // the posted receive's buffer; null: not posted (or withdrawn)
  size_t recv_bytes = 0;
  bool delivered = false;
  std::string error;  // a size mismatch, reported to the receiver
  bool send_waited = false, recv_waited = false;
};
using MessageKey = std::tuple<int, int, uint64_t>;  // (src, dst, k)

std::string CallText(CommOp op, size_t bytes, int root) {
  std::string s = std::string(CommOpName(op)) + " of " + std::to_string(bytes) + " bytes";
  if (op == CommOp::kBroadcast) s += " from root " + std::to_string(root);
  return s;
}

}  // namespace

struct FakeWorld::Impl {
  std::mutex mu;
  std::condition_variable cv;
  std::map<uint64_t, Round> rounds;  // by call sequence number
  std::map<MessageKey, Message> mail;
  std::map<std::pair<int, int64_t>, FakeFault> faults;  // (rank, call)
};

namespace {

class FakeCommunicator final : public Communicator {
 public:
  FakeCommunicator(CommConfig config, std::shared_ptr<FakeWorld> world, FakeWorld::Impl* impl)
      : Communicator(std::move(config)), world_(std::move(world)), impl_(impl) {}

 protected:
  Status DoAllReduce(float* data, size_t count, Duration timeout) override {
    MESHRUN_RETURN_IF_ERROR(MaybeFault(timeout));
    return Exchange(CommOp::kAllReduce, count * sizeof(float), -1, data, count * sizeof(float),
                    timeout, [&](const std::vector<std::vector<float>>& in) {
                      for (size_t i = 0; i < count; ++i) {
                        float acc = in[0][i];
                        for (int r = 1; r < size(); ++r) acc += in[r][i];
                        data[i] = acc;
                      }
                    });
  }

  Status DoReduceScatter(const float* input, float* output, size_t count,
                         Duration timeout) override {
    MESHRUN_RETURN_IF_ERROR(MaybeFault(timeout));
    const size_t bytes = count * size() * sizeof(float);
    return Exchange(CommOp::kReduceScatter, bytes, -1, input, bytes, timeout,
                    [&](const std::vector<std::vector<float>>& in) {
                      const size_t offset = static_cast<size_t>(rank()) * count;
                      for (size_t i = 0; i < count; ++i) {
                        float acc = in[0][offset + i];
                        for (int r = 1; r < size(); ++r) acc += in[r][offset + i];
                        output[i] = acc;
                      }
                    });
  }

  Status DoAllGather(const void* input, void* output, size_t bytes, Duration timeout) override {
    MESHRUN_RETURN_IF_ERROR(MaybeFault(timeout));
    return Exchange(CommOp::kAllGather, bytes, -1, input, bytes, timeout,
                    [&](const std::vector<std::vector<float>>& in) {
                      for (int r = 0; r < size(); ++r) {
                        std::memcpy(static_cast<char*>(output) + r * bytes, in[r].data(), bytes);
                      }
                    });
  }

  Status DoBroadcast(void* data, size_t bytes, int root, Duration timeout) override {
    MESHRUN_RETURN_IF_ERROR(MaybeFault(timeout));
    const bool is_root = rank() == root;
    return Exchange(CommOp::kBroadcast, bytes, root, is_root ? data : nullptr, is_root ? bytes : 0,
                    timeout, [&](const std::vector<std::vector<float>>& in) {
                      if (!is_root) std::memcpy(data, in[root].data(), bytes);
                    });
  }

  Status DoBarrier(Duration timeout) override {
    MESHRUN_RETURN_IF_ERROR(MaybeFault(timeout));
    return Exchange(CommOp::kBarrier, 0, -1, nullptr, 0, timeout,
                    [](const std::vector<std::vector<float>>&) {});
  }

  Status DoSendRecv(const void* send_data, size_t send_bytes, int dst, void* recv_data,
                    size_t recv_bytes, int src, Duration timeout) override {
    MESHRUN_RETURN_IF_ERROR(MaybeFault(timeout));
    const auto deadline = Clock::now() + timeout;
    std::unique_lock<std::mutex> lock(impl_->mu);
    MessageKey sent{-1, -1, 0}, received{-1, -1, 0};
    if (dst >= 0) sent = PostSend(send_data, send_bytes, dst);
    if (src >= 0) {
      received = PostRecv(recv_data, recv_bytes, src);
      Status s = WaitMessage(lock, received, /*send=*/false, deadline);
      if (!s.ok()) {
        if (dst >= 0) Withdraw(sent, /*send=*/true);
        return s;
      }
    }
    if (dst >= 0) return WaitMessage(lock, sent, /*send=*/true, deadline);
    return OkStatus();
  }

  // Asynchronous point-to-point: the same messages, waited for in DoWait.
  StatusOr<int64_t> DoStartSend(const void* data, size_t bytes, int peer,
                                Duration timeout) override {
    MESHRUN_RETURN_IF_ERROR(MaybeFault(timeout));
    std::unique_lock<std::mutex> lock(impl_->mu);
    return Track(PostSend(data, bytes, peer), /*send=*/true, timeout);
  }
  StatusOr<int64_t> DoStartRecv(void* data, size_t bytes, int peer, Duration timeout) override {
    MESHRUN_RETURN_IF_ERROR(MaybeFault(timeout));
    std::unique_lock<std::mutex> lock(impl_->mu);
    return Track(PostRecv(data, bytes, peer), /*send=*/false, timeout);
  }
  Status DoWait(int64_t ticket, Duration, double*) override {
    auto it = posted_.find(ticket);
    if (it == posted_.end()) return InternalError("fake: unknown ticket");
    const Posted p = it->second;
    posted_.erase(it);
    std::unique_lock<std::mutex> lock(impl_->mu);
    return WaitMessage(lock, p.key, p.send, p.deadline);
  }

 private:
  struct Posted {
    MessageKey key;
    bool send = false;
    Clock::time_point deadline;
  };

  int64_t Track(const MessageKey& key, bool send, Duration timeout) {
    const int64_t ticket = next_ticket_++;
    posted_[ticket] = Posted{key, send, Clock::now() + timeout};
    return ticket;
  }

  // Copies a message whose both ends are posted into the receive buffer (under the lock).
  static void Deliver(Message& m) {
    if (m.data.size() != m.recv_bytes) {
      m.error = " sent " + std::to_string(m.data.size()) + " bytes but this rank expected " +
                std::to_string(m.recv_bytes) +
                " (hint: the two sides disagree on the message size)";
    } else if (m.recv_bytes > 0) {
      std::memcpy(m.recv_buf, m.data.data(), m.recv_bytes);
    }
    m.delivered = true;
    m.recv_buf = nullptr;
    m.data.clear();
  }

  // Posts this rank's next message to `dst` (under the lock).
  MessageKey PostSend(const void* data, size_t bytes, int dst) {
    const MessageKey key{rank(), dst, send_seq_[dst]++};
    Message& m = impl_->mail[key];
    m.sent = true;
    m.data.assign(static_cast<const char*>(data), bytes);
    if (m.recv_buf != nullptr) Deliver(m);
    impl_->cv.notify_all();
    return key;
  }

  // Posts this rank's receive of its next message from `src` (under the lock).
  MessageKey PostRecv(void* data, size_t bytes, int src) {
    const MessageKey key{src, rank(), recv_seq_[src]++};
    Message& m = impl_->mail[key];
    m.recv_buf = data;
    m.recv_bytes = bytes;
    if (m.sent) Deliver(m);
    impl_->cv.notify_all();
    return key;
  }

  // Takes this end's post back after a failure, so that the peer never touches its buffer.
  void Withdraw(const MessageKey& key, bool send) {
    auto it = impl_->mail.find(key);
    if (it == impl_->mail.end() || it->second.delivered) return;
    if (send) {
      impl_->mail.erase(it);
    } else {
      it->second.recv_buf = nullptr;
    }
  }

  // Waits (bounded) until the message was delivered; the receiver gets its error, if any. The
  // message is forgotten once both ends have waited.
  Status WaitMessage(std::unique_lock<std::mutex>& lock, const MessageKey& key, bool send,
                     Clock::time_point deadline) {
    auto delivered = [&] {
      auto it = impl_->mail.find(key);
      return it != impl_->mail.end() && it->second.delivered;
    };
    if (!impl_->cv.wait_until(lock, deadline, delivered)) {
      Withdraw(key, send);
      const int peer = send ? std::get<1>(key) : std::get<0>(key);
      return DeadlineExceededError(
          send ? "rank " + std::to_string(peer) + " did not receive the message in time"
               : "no message from rank " + std::to_string(peer) + " arrived in time");
    }
    auto it = impl_->mail.find(key);
    Message& m = it->second;
    (send ? m.send_waited : m.recv_waited) = true;
    const std::string error = send ? std::string() : m.error;
    if (m.send_waited && m.recv_waited) impl_->mail.erase(it);
    if (!error.empty()) {
      return InternalError("rank " + std::to_string(std::get<0>(key)) + error);
    }
    return OkStatus();
  }

  Status MaybeFault(Duration timeout) {
    const int64_t call = calls_++;
    FakeFault fault;
    {
      std::lock_guard<std::mutex> lock(impl_->mu);
      auto it = impl_->faults.find({rank(), call});
      if (it == impl_->faults.end()) return OkStatus();
      fault = it->second;
    }
    if (fault == FakeFault::kFail) {
      return UnavailableError("injected failure at call " + std::to_string(call));
    }
    std::this_thread::sleep_for(timeout);
    return DeadlineExceededError("injected hang at call " + std::to_string(call));
  }

  // Contributes `bytes_in` bytes of `contribution` to this call's round, waits for every
  // member, then runs `consume` on all contributions (under the world's lock).
  template <typename Consume>
  Status Exchange(CommOp op, size_t bytes, int root, const void* contribution, size_t bytes_in,
                  Duration timeout, Consume consume) {
    const auto deadline = Clock::now() + timeout;
    const int n = size();
    std::unique_lock<std::mutex> lock(impl_->mu);
    const uint64_t seq = seq_++;
    Round& round = impl_->rounds[seq];  // std::map references stay valid until erase
    if (round.first_rank < 0) {
      round.op = op;
      round.bytes = bytes;
      round.root = root;
      round.first_rank = rank();
      round.data.resize(n);
      round.present.assign(n, false);
    } else if (round.mismatch.empty() &&
               (round.op != op || round.bytes != bytes || round.root != root)) {
      round.mismatch = "collective mismatch at call #" + std::to_string(seq) + ": rank " +
                       std::to_string(round.first_rank) + " called " +
                       CallText(round.op, round.bytes, round.root) + " but rank " +
                       std::to_string(rank()) + " called " + CallText(op, bytes, root) +
                       " (hint: every member must issue the same collectives in the same order)";
    }
    std::vector<float>& mine = round.data[rank()];
    mine.resize((bytes_in + sizeof(float) - 1) / sizeof(float));
    if (bytes_in > 0) std::memcpy(mine.data(), contribution, bytes_in);
    round.present[rank()] = true;
    ++round.arrived;
    impl_->cv.notify_all();
    const bool done = impl_->cv.wait_until(
        lock, deadline, [&] { return round.arrived == n || !round.mismatch.empty(); });
    if (!round.mismatch.empty()) return InternalError(round.mismatch);
    if (!done) {
      std::string missing;
      for (int r = 0; r < n; ++r) {
        if (!round.present[r]) missing += (missing.empty() ? "" : ",") + std::to_string(r);
      }
      return DeadlineExceededError("call #" + std::to_string(seq) + ": rank(s) " + missing +
                                   " did not join in time");
    }
    consume(round.data);
    if (++round.left == n) impl_->rounds.erase(seq);
    return OkStatus();
  }

  std::shared_ptr<FakeWorld> world_;  // keeps impl_ alive
  FakeWorld::Impl* impl_;
  uint64_t seq_ = 0;                             // collectives issued (the round key)
  int64_t calls_ = 0;                            // every backend call (the fault key)
  std::map<int, uint64_t> send_seq_, recv_seq_;  // messages posted to / from each peer
  std::map<int64_t, Posted> posted_;             // started sends and receives, by ticket
  int64_t next_ticket_ = 0;
};

}  // namespace

FakeWorld::FakeWorld(int size, std::string group_id)
    : size_(size), group_id_(std::move(group_id)), impl_(std::make_unique<Impl>()) {}

FakeWorld::~FakeWorld() = default;

std::shared_ptr<FakeWorld> FakeWorld::Create(int size, std::string group_id) {
  return std::shared_ptr<FakeWorld>(new FakeWorld(size, std::move(group_id)));
}

StatusOr<std::unique_ptr<Communicator>> FakeWorld::Connect(CommConfig config) {
  if (config.size != size_ || config.rank < 0 || config.rank >= size_) {
    return InvalidArgumentError("fake world " + group_id_ + " has " + std::to_string(size_) +
                                " ranks but rank " + std::to_string(config.rank) + " of " +
                                std::to_string(config.size) + " tried to connect");
  }
  if (config.group_id.empty()) config.group_id = group_id_;
  if (size_ == 1) return MakeSoloCommunicator(std::move(config));
  return std::unique_ptr<Communicator>(
      new FakeCommunicator(std::move(config), shared_from_this(), impl_.get()));
}

std::vector<std::unique_ptr<Communicator>> FakeWorld::ConnectAll(
    MeshAxis axis, std::shared_ptr<CommStats> stats, std::chrono::milliseconds timeout) {
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < size_; ++r) {
    CommConfig config{axis, group_id_, r, size_, timeout, stats};
    comms.push_back(std::move(Connect(std::move(config))).value());
  }
  return comms;
}

void FakeWorld::InjectFault(int rank, int64_t call_index, FakeFault fault) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->faults[{rank, call_index}] = fault;
}

std::shared_ptr<FakeWorld> FakeBackend::World(const std::string& group_id, int size) {
  std::lock_guard<std::mutex> lock(mu_);
  std::shared_ptr<FakeWorld>& world = worlds_[group_id];
  if (!world) world = FakeWorld::Create(size, group_id);
  return world;
}

StatusOr<std::unique_ptr<Communicator>> FakeBackend::Connect(const CommConfig& config,
                                                             std::shared_ptr<Store> /*store*/) {
  std::shared_ptr<FakeWorld> world = World(config.group_id, config.size);
  return world->Connect(config);
}

std::vector<std::string> FakeBackend::GroupIds() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> ids;
  for (const auto& [id, world] : worlds_) ids.push_back(id);
  return ids;
}

}  // namespace meshrun
