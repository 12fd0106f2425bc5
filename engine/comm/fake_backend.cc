// FakeWorld: collectives as rendezvous rounds over one mutex-protected table, point-to-point as
// per-(src, dst) mailboxes. Simple and slow on purpose: it exists to check semantics.
#include "engine/comm/fake_backend.h"

#include <condition_variable>
#include <cstring>
#include <deque>
#include <thread>

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

struct Message {
  std::string data;
  bool taken = false;
};

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
  std::map<std::pair<int, int>, std::deque<std::shared_ptr<Message>>> mail;  // (src, dst)
  std::map<std::pair<int, int64_t>, FakeFault> faults;                       // (rank, call)
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
    std::shared_ptr<Message> sent;
    if (dst >= 0) {
      sent = std::make_shared<Message>();
      sent->data.assign(static_cast<const char*>(send_data), send_bytes);
      impl_->mail[{rank(), dst}].push_back(sent);
      impl_->cv.notify_all();
    }
    auto withdraw = [&] {
      if (!sent) return;
      auto& box = impl_->mail[{rank(), dst}];
      for (auto it = box.begin(); it != box.end(); ++it) {
        if (*it == sent) {
          box.erase(it);
          break;
        }
      }
    };
    if (src >= 0) {
      auto& box = impl_->mail[{src, rank()}];
      if (!impl_->cv.wait_until(lock, deadline, [&] { return !box.empty(); })) {
        withdraw();
        return DeadlineExceededError("no message from rank " + std::to_string(src) +
                                     " arrived in time");
      }
      std::shared_ptr<Message> msg = box.front();
      box.pop_front();
      msg->taken = true;
      impl_->cv.notify_all();
      if (msg->data.size() != recv_bytes) {
        withdraw();
        return InternalError("rank " + std::to_string(src) + " sent " +
                             std::to_string(msg->data.size()) + " bytes but this rank expected " +
                             std::to_string(recv_bytes) +
                             " (hint: the two sides disagree on the message size)");
      }
      std::memcpy(recv_data, msg->data.data(), recv_bytes);
    }
    if (sent && !impl_->cv.wait_until(lock, deadline, [&] { return sent->taken; })) {
      withdraw();
      return DeadlineExceededError("rank " + std::to_string(dst) +
                                   " did not receive the message in time");
    }
    return OkStatus();
  }

 private:
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
  uint64_t seq_ = 0;   // collectives issued (the round key)
  int64_t calls_ = 0;  // every backend call (the fault key)
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
