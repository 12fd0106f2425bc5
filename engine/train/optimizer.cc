// The optimizers of train.optimizer and the state they own (engine/train/optimizer.h).
#include "engine/train/optimizer.h"

#include "engine/ops/ops.h"

namespace meshrun {

namespace {

// torch.optim.AdamW (docs/model.md): decoupled weight decay, bias-corrected moments.
class AdamWOptimizer final : public Optimizer {
 public:
  AdamWOptimizer(int64_t size, Device device) : Optimizer(OptimizerKind::kAdamW, size, device) {}

  Status Step(float* p, const float* g, const std::vector<OptimizerSpan>& spans,
              const TrainSpec& tr, double lr, int64_t step) override {
    float* m = state(0);
    float* v = state(1);
    for (const OptimizerSpan& s : spans) {
      MESHRUN_RETURN_IF_ERROR(ops::AdamW(device(), p + s.offset, g + s.offset, m + s.offset,
                                         v + s.offset, s.count, lr, tr.beta1, tr.beta2, tr.eps,
                                         s.decay ? tr.weight_decay : 0.0, step + 1));
    }
    return OkStatus();
  }
};

// Lion: p ← p·(1 − lr·wd); p ← p − lr·sign(β1·m + (1 − β1)·g); m ← β2·m + (1 − β2)·g.
class LionOptimizer final : public Optimizer {
 public:
  LionOptimizer(int64_t size, Device device) : Optimizer(OptimizerKind::kLion, size, device) {}

  Status Step(float* p, const float* g, const std::vector<OptimizerSpan>& spans,
              const TrainSpec& tr, double lr, int64_t) override {
    float* m = state(0);
    for (const OptimizerSpan& s : spans) {
      MESHRUN_RETURN_IF_ERROR(ops::Lion(device(), p + s.offset, g + s.offset, m + s.offset, s.count,
                                        lr, tr.lion_beta1, tr.lion_beta2,
                                        s.decay ? tr.weight_decay : 0.0));
    }
    return OkStatus();
  }
};

}  // namespace

Optimizer::Optimizer(OptimizerKind kind, int64_t size, Device device)
    : kind_(kind), names_(OptimizerStateNames(kind)), size_(size), device_(device) {
  MemoryKindScope scope(MemoryKind::kOptimizer);
  for (size_t i = 0; i < names_.size(); ++i) {
    state_.push_back(Tensor::Zeros({size_}, ScalarType::kFloat32, device_));
  }
}

Status Optimizer::ToHost(HostState* host) {
  host->states.assign(names_.size(), nullptr);
  if (device_.type == DeviceType::kCpu) {
    for (int i = 0; i < num_states(); ++i) host->states[i] = state(i);
    return OkStatus();
  }
  const size_t n = static_cast<size_t>(size_);
  host->copy.resize(names_.size() * n);
  for (int i = 0; i < num_states(); ++i) {
    host->states[i] = host->copy.data() + i * n;
    MESHRUN_RETURN_IF_ERROR(ops::CopyToHost(device_, host->states[i], state(i), sizeof(float) * n));
  }
  return OkStatus();
}

Status Optimizer::FromHost(const HostState& host) {
  if (device_.type == DeviceType::kCpu) return OkStatus();
  const size_t bytes = sizeof(float) * static_cast<size_t>(size_);
  for (int i = 0; i < num_states(); ++i) {
    MESHRUN_RETURN_IF_ERROR(ops::CopyFromHost(device_, state(i), host.states[i], bytes));
  }
  return OkStatus();
}

std::unique_ptr<Optimizer> MakeOptimizer(OptimizerKind kind, int64_t size, Device device) {
  switch (kind) {
    case OptimizerKind::kAdamW: return std::make_unique<AdamWOptimizer>(size, device);
    case OptimizerKind::kLion: return std::make_unique<LionOptimizer>(size, device);
  }
  return nullptr;
}

}  // namespace meshrun
