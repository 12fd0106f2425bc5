// FSDP and replication of the parameters, gradients and optimizer state of one rank.
#include "engine/train/sharding.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/comm/communicator.h"
#include "engine/kernels/cpu/kernels.h"
#include "engine/train/schedule.h"

namespace meshrun {

namespace {
bool Active(const Communicator* c) {
  return c != nullptr && c->size() > 1;
}
}  // namespace

StatusOr<double> SumOverGroup(Communicator* comm, double value, const char* axis) {
  if (!Active(comm)) return value;
  std::vector<double> all(comm->size());
  MESHRUN_RETURN_IF_ERROR(
      comm->AllGatherBytes(&value, all.data(), sizeof(double), CallOptions::Axis(axis)));
  double sum = 0;
  for (double x : all) sum += x;
  return sum;
}

ShardedState::ShardedState(GPT2<float>* model, Communicator* fsdp, Communicator* replicate,
                           Communicator* tp)
    : model_(model), fsdp_(fsdp), replicate_(replicate), tp_(tp) {
  n_ = Active(fsdp) ? fsdp->size() : 1;
  idx_ = Active(fsdp) ? fsdp->rank() : 0;
  const std::vector<UnitInfo>& units = model_->units();
  int64_t offset = 0;
  for (const UnitInfo& u : units) {
    unit_shard_offset_.push_back(offset);
    offset += u.padded / n_;
  }
  size_ = offset;
  const int tp_rank = tp != nullptr ? tp->rank() : 0;
  // Each parameter's elements that fall into this rank's slice of its unit.
  for (const ParamInfo& p : model_->params()) {
    const UnitInfo& u = units[p.unit];
    const int64_t count = u.padded / n_;
    const int64_t lo = std::max(p.offset - u.offset, idx_ * count);
    const int64_t hi = std::min(p.offset - u.offset + p.numel, (idx_ + 1) * count);
    if (lo >= hi) continue;
    ShardSegment s;
    s.shard_offset = ShardOffset(p.unit) + (lo - idx_ * count);
    s.count = hi - lo;
    s.decay = p.decay;
    s.counts_in_norm = p.tp_sharded || tp_rank == 0;
    segments_.push_back(s);
  }
  if (sharded()) {
    params_ = Tensor::Zeros({size_}, ScalarType::kFloat32);
    grads_ = Tensor::Zeros({size_}, ScalarType::kFloat32);
    scratch_ = Tensor::Zeros({size_}, ScalarType::kFloat32);
  }
  m_ = Tensor::Zeros({size_}, ScalarType::kFloat32);
  v_ = Tensor::Zeros({size_}, ScalarType::kFloat32);
}

void ShardedState::TakeShardOfModel() {
  if (!sharded()) return;
  for (size_t u = 0; u < model_->units().size(); ++u) {
    const UnitInfo& unit = model_->units()[u];
    const int64_t count = ShardCount(static_cast<int>(u));
    std::memcpy(params() + ShardOffset(static_cast<int>(u)),
                model_->params_data() + unit.offset + idx_ * count, sizeof(float) * count);
  }
}

void ShardedState::ScatterMoments(const float* full_m, const float* full_v) {
  for (size_t u = 0; u < model_->units().size(); ++u) {
    const UnitInfo& unit = model_->units()[u];
    const int64_t count = ShardCount(static_cast<int>(u));
    const int64_t src = unit.offset + idx_ * count, dst = ShardOffset(static_cast<int>(u));
    std::memcpy(exp_avg() + dst, full_m + src, sizeof(float) * count);
    std::memcpy(exp_avg_sq() + dst, full_v + src, sizeof(float) * count);
  }
}

void ShardedState::ZeroGrad() {
  model_->ZeroGrad();
  if (sharded()) std::memset(grads(), 0, sizeof(float) * size_);
}

void ShardedState::BeginMicroBatch() {
  // Sharded: the full gradients hold one micro-batch at a time (reduce-scattered after it).
  if (sharded()) model_->ZeroGrad();
}

Status ShardedState::Gather(int unit) {
  if (!sharded()) return OkStatus();
  const UnitInfo& u = model_->units()[unit];
  return fsdp_->AllGather(params() + ShardOffset(unit), model_->params_data() + u.offset,
                          static_cast<size_t>(ShardCount(unit)), CallOptions::Axis("dp_shard"));
}

Status ShardedState::BeforeBackward(int unit) {
  // The embedding and final-LayerNorm units stay gathered from the forward (they are used at
  // both its ends); the layers were freed and are gathered again.
  const int last = static_cast<int>(model_->units().size()) - 1;
  if (unit == 0 || unit == last) return OkStatus();
  return Gather(unit);
}

Status ShardedState::AfterBackward(int unit) {
  if (!sharded()) return OkStatus();
  const UnitInfo& u = model_->units()[unit];
  const int64_t count = ShardCount(unit);
  float* tmp = scratch_.data<float>();
  MESHRUN_RETURN_IF_ERROR(fsdp_->ReduceScatter(model_->grads_data() + u.offset, tmp,
                                               static_cast<size_t>(count),
                                               CallOptions::Axis("dp_shard")));
  cpu::Accumulate(grads() + ShardOffset(unit), tmp, count);
  return OkStatus();
}

Status ShardedState::FinishGradients() {
  if (!Active(replicate_)) return OkStatus();
  return replicate_->AllReduce(grads(), static_cast<size_t>(size_),
                               CallOptions::Axis("dp_replicate"));
}

StatusOr<double> ShardedState::GlobalGradNormSquared() {
  double local = 0;
  const float* g = grads();
  for (const ShardSegment& s : segments_) {
    if (s.counts_in_norm) local += cpu::SumOfSquares(g + s.shard_offset, s.count);
  }
  MESHRUN_ASSIGN_OR_RETURN(double over_tp, SumOverGroup(tp_, local, "tp"));
  return SumOverGroup(sharded() ? fsdp_ : nullptr, over_tp, "dp_shard");
}

StatusOr<UpdateResult> ShardedState::ClipAndStep(const TrainSpec& tr, int64_t step) {
  UpdateResult r;
  MESHRUN_ASSIGN_OR_RETURN(double norm_sq, GlobalGradNormSquared());
  r.grad_norm = std::sqrt(norm_sq);
  float* g = grads();
  // torch clip_grad_norm_: scale by max_norm / (norm + 1e-6) when the norm exceeds it.
  if (tr.grad_clip > 0 && r.grad_norm > tr.grad_clip) {
    cpu::Scale(g, size_, tr.grad_clip / (r.grad_norm + 1e-6));
  }
  r.lr = LearningRate(tr.lr, tr.min_lr, tr.warmup_steps, tr.steps, step);
  float* p = params();
  for (const ShardSegment& s : segments_) {
    cpu::AdamW(p + s.shard_offset, g + s.shard_offset, exp_avg() + s.shard_offset,
               exp_avg_sq() + s.shard_offset, s.count, r.lr, tr.beta1, tr.beta2, tr.eps,
               s.decay ? tr.weight_decay : 0.0, step + 1);
  }
  return r;
}

Status ShardedState::GatherFull(float* full_m, float* full_v) {
  const CallOptions opts = CallOptions::Axis("checkpoint");
  for (size_t u = 0; u < model_->units().size(); ++u) {
    const UnitInfo& unit = model_->units()[u];
    const int ui = static_cast<int>(u);
    const size_t count = static_cast<size_t>(ShardCount(ui));
    if (!sharded()) {
      std::memcpy(full_m + unit.offset, exp_avg() + ShardOffset(ui), sizeof(float) * count);
      std::memcpy(full_v + unit.offset, exp_avg_sq() + ShardOffset(ui), sizeof(float) * count);
      continue;
    }
    MESHRUN_RETURN_IF_ERROR(fsdp_->AllGather(params() + ShardOffset(ui),
                                             model_->params_data() + unit.offset, count, opts));
    MESHRUN_RETURN_IF_ERROR(
        fsdp_->AllGather(exp_avg() + ShardOffset(ui), full_m + unit.offset, count, opts));
    MESHRUN_RETURN_IF_ERROR(
        fsdp_->AllGather(exp_avg_sq() + ShardOffset(ui), full_v + unit.offset, count, opts));
  }
  return OkStatus();
}

}  // namespace meshrun
