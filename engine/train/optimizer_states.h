// The state each optimizer of train.optimizer owns, by name, each tensor one float32 per
// parameter element it steps: what an Optimizer allocates (engine/train/optimizer.h), what
// checkpoints store ("optim/<name>/<param>") and what both memory models count
// (engine/train/memory_model.cc and the worker's common/memory_estimate.cc). Header-only and
// pure, so the planning code and the worker, which link no kernels, read the optimizers' own
// table.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/job_spec.h"

namespace meshrun {

inline std::vector<std::string> OptimizerStateNames(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kAdamW: return {"exp_avg", "exp_avg_sq"};  // torch.optim.AdamW's names
    case OptimizerKind::kLion: return {"exp_avg"};  // lion-pytorch's name for its one momentum
  }
  return {};
}

// Bytes of a kind's state over `elements` parameter elements.
inline int64_t OptimizerStateBytes(OptimizerKind kind, int64_t elements) {
  return static_cast<int64_t>(OptimizerStateNames(kind).size()) * elements *
         static_cast<int64_t>(sizeof(float));
}

}  // namespace meshrun
