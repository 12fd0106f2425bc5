// The counting backend: communicators that complete every call at once without moving data, so
// that one rank's step runs on the counting device (DeviceType::kCount, engine/core/tensor.h)
// without its peers. Every call is still made, checked, counted (CommStats) and waited for, in
// the order the step makes it: what a counted step reports as its communication is what the
// real step sends. Host buffers given to it (the step boundary's stop agreement, a norm summed
// on the host) get what a world of identical ranks would hold: a gather repeats this rank's
// input, a reduce-scatter keeps its own slice, reductions, broadcasts and receives leave the
// buffer as it is. Buffers of the counting device are never touched.
#pragma once

#include <memory>
#include <string>

#include "engine/comm/communicator.h"

namespace meshrun {

class CountingBackend final : public CommBackend {
 public:
  // overlaps: whether the backend it stands for runs calls asynchronously (NCCL) or completes
  // them inside Start (Gloo): FSDP keeps a second unit gathered only for the former.
  explicit CountingBackend(bool overlaps) : overlaps_(overlaps) {}

  std::string name() const override { return "counting"; }
  StatusOr<std::unique_ptr<Communicator>> Connect(const CommConfig& config,
                                                  std::shared_ptr<Store> store) override;
  std::unique_ptr<Communicator> MakeSolo(CommConfig config) override;

 private:
  const bool overlaps_;
};

}  // namespace meshrun
