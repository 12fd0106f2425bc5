#include "engine/comm/counting_backend.h"

#include <cstring>
#include <utility>

#include "engine/core/counted_address.h"

namespace meshrun {
namespace {

bool OnHost(const void* p) {
  return p != nullptr && !IsCountedAddress(p);
}

class CountingCommunicator final : public Communicator {
 public:
  CountingCommunicator(CommConfig config, bool overlaps)
      : Communicator(std::move(config)), overlaps_(overlaps) {}

  bool overlaps() const override { return overlaps_; }

 protected:
  Status DoAllReduce(float*, size_t, Duration) override { return OkStatus(); }
  Status DoReduceScatter(const float* input, float* output, size_t count, Duration) override {
    if (OnHost(input) && OnHost(output)) {
      std::memmove(output, input + static_cast<size_t>(rank()) * count, sizeof(float) * count);
    }
    return OkStatus();
  }
  Status DoAllGather(const void* input, void* output, size_t bytes, Duration) override {
    if (OnHost(input) && OnHost(output)) {
      for (int r = 0; r < size(); ++r) {
        char* slot = static_cast<char*>(output) + static_cast<size_t>(r) * bytes;
        if (slot != input) std::memmove(slot, input, bytes);
      }
    }
    return OkStatus();
  }
  Status DoBroadcast(void*, size_t, int, Duration) override { return OkStatus(); }
  Status DoSendRecv(const void*, size_t, int, void*, size_t, int, Duration) override {
    return OkStatus();
  }
  Status DoBarrier(Duration) override { return OkStatus(); }

  StatusOr<int64_t> DoStart(AsyncOp op, const void* input, void* output, size_t count,
                            Duration timeout) override {
    switch (op) {
      case AsyncOp::kAllReduce: break;
      case AsyncOp::kReduceScatter:
        MESHRUN_RETURN_IF_ERROR(DoReduceScatter(static_cast<const float*>(input),
                                                static_cast<float*>(output), count, timeout));
        break;
      case AsyncOp::kAllGather:
        MESHRUN_RETURN_IF_ERROR(DoAllGather(input, output, sizeof(float) * count, timeout));
        break;
      case AsyncOp::kAllGatherBytes:
        MESHRUN_RETURN_IF_ERROR(DoAllGather(input, output, count, timeout));
        break;
    }
    return next_ticket_++;
  }
  Status DoWait(int64_t, Duration, double* busy_seconds) override {
    if (busy_seconds != nullptr) *busy_seconds = 0;
    return OkStatus();
  }
  StatusOr<int64_t> DoStartSend(const void*, size_t, int, Duration) override {
    return next_ticket_++;
  }
  StatusOr<int64_t> DoStartRecv(void*, size_t, int, Duration) override { return next_ticket_++; }
  void CopyLocal(void* dst, const void* src, size_t bytes) override {
    if (OnHost(dst) && OnHost(src) && dst != src) std::memmove(dst, src, bytes);
  }

 private:
  const bool overlaps_;
  int64_t next_ticket_ = 1;
};

}  // namespace

StatusOr<std::unique_ptr<Communicator>> CountingBackend::Connect(const CommConfig& config,
                                                                 std::shared_ptr<Store>) {
  return std::unique_ptr<Communicator>(std::make_unique<CountingCommunicator>(config, overlaps_));
}

std::unique_ptr<Communicator> CountingBackend::MakeSolo(CommConfig config) {
  return std::make_unique<CountingCommunicator>(std::move(config), overlaps_);
}

}  // namespace meshrun
