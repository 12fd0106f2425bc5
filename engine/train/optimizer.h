// The optimizer seam (docs/model.md "Adding an optimizer"): an Optimizer owns named state
// tensors, each as long as the buffers it steps (a rank's shard of parameters and gradients),
// and updates the parameters from the gradients span by span, on cpu or cuda. It sees flat
// buffers and spans of them, never the mesh: ShardedState (engine/train/sharding.h) decides what
// the buffers hold, and ClipAndStep (engine/train/update.h) clips the gradients by the global
// norm before calling Step. Checkpoints store its state generically, as
// "optim/<state name>/<parameter>" (docs/checkpoints.md).
//
// The optimizers (train.optimizer): adamw (torch.optim.AdamW; states exp_avg, exp_avg_sq) and
// lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"; state exp_avg).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/job_spec.h"
#include "common/status.h"
#include "engine/core/tensor.h"
#include "engine/train/optimizer_states.h"

namespace meshrun {

// What the update that ends every step reports: global grad-norm clipping (torch
// clip_grad_norm_) and the learning rate of docs/model.md's schedule.
struct UpdateResult {
  double grad_norm = 0;  // before clipping
  double lr = 0;
};

// A run of one parameter's elements in the buffers an optimizer steps.
struct OptimizerSpan {
  int64_t offset = 0;  // in the buffers (parameters, gradients, every state)
  int64_t count = 0;
  bool decay = false;  // decoupled weight decay applies (parameters of 2 or more dims)
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  OptimizerKind kind() const { return kind_; }
  // The names of its state tensors, in a fixed order (the checkpoint's "optim/<name>/…").
  const std::vector<std::string>& state_names() const { return names_; }
  int num_states() const { return static_cast<int>(names_.size()); }
  // State i: size() float32 elements on device().
  float* state(int i) { return state_[static_cast<size_t>(i)].data<float>(); }
  int64_t size() const { return size_; }
  Device device() const { return device_; }
  // Bytes of all its state (what the memory models count as MemoryKind::kOptimizer).
  int64_t state_bytes() const { return OptimizerStateBytes(kind_, size_); }

  // One update of params from grads (size() floats each, on device()) over every span. step is
  // the 0-based step k of docs/model.md, lr its learning rate; the hyper-parameters come from
  // train.
  virtual Status Step(float* params, const float* grads, const std::vector<OptimizerSpan>& spans,
                      const TrainSpec& train, double lr, int64_t step) = 0;

  // The state where the host can read and write it (checkpoints): on cpu the buffers
  // themselves, on a device a copy; FromHost copies a written copy back (no-op on cpu).
  struct HostState {
    std::vector<float*> states;  // one per state name
    std::vector<float> copy;     // device only
  };
  Status ToHost(HostState* host);
  Status FromHost(const HostState& host);

 protected:
  // Allocates every state, zero, on device (as MemoryKind::kOptimizer).
  Optimizer(OptimizerKind kind, int64_t size, Device device);

 private:
  OptimizerKind kind_;
  std::vector<std::string> names_;
  int64_t size_ = 0;
  Device device_;
  std::vector<Tensor> state_;
};

// train.optimizer's optimizer over `size` elements on `device`, its state zero.
std::unique_ptr<Optimizer> MakeOptimizer(OptimizerKind kind, int64_t size, Device device);

}  // namespace meshrun
