// FSDP and replication of the parameters and gradients of one rank.
#include "engine/train/sharding.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/comm/communicator.h"
#include "engine/ops/ops.h"

namespace meshrun {

namespace {
bool Active(const Communicator* c) {
  return c != nullptr && c->size() > 1;
}
}  // namespace

std::vector<ParamPiece> PiecesOf(const ParamInfo& p, int64_t first, int64_t count) {
  std::vector<ParamPiece> out;
  int64_t box_first = 0;  // local element where the current box starts
  for (const Box& box : p.boxes) {
    int64_t box_numel = 1;
    for (int64_t d : box.shape) box_numel *= d;
    const int64_t lo = std::max(first, box_first),
                  hi = std::min(first + count, box_first + box_numel);
    if (lo < hi) {
      const int64_t a = lo - box_first, b = hi - box_first;  // within the box
      if (box.shape.size() == 1) {
        out.push_back({{box.offset[0] + a}, {b - a}, lo});
      } else {
        const int64_t width = box.shape[1];
        int64_t row = a / width, col = a % width;
        const int64_t end_row = b / width, end_col = b % width;
        auto add = [&](int64_t r, int64_t c, int64_t rows, int64_t cols) {
          out.push_back(
              {{box.offset[0] + r, box.offset[1] + c}, {rows, cols}, box_first + r * width + c});
        };
        if (row == end_row) {
          add(row, col, 1, end_col - col);
        } else {
          if (col > 0) {
            add(row, col, 1, width - col);
            ++row;
          }
          if (end_row > row) add(row, 0, end_row - row, width);
          if (end_col > 0) add(end_row, 0, 1, end_col);
        }
      }
    }
    box_first += box_numel;
  }
  return out;
}

StatusOr<double> SumOverGroup(Communicator* comm, double value, CommCharge charge) {
  if (!Active(comm)) return value;
  std::vector<double> all(comm->size());
  MESHRUN_RETURN_IF_ERROR(
      comm->AllGatherBytes(&value, all.data(), sizeof(double), CallOptions::Charged(charge)));
  double sum = 0;
  for (double x : all) sum += x;
  return sum;
}

ShardedState::ShardedState(GPT2<float>* model, Communicator* fsdp, Communicator* replicate,
                           Communicator* tp, bool reshard_after_forward)
    : model_(model),
      fsdp_(fsdp),
      replicate_(replicate),
      tp_(tp),
      reshard_after_forward_(reshard_after_forward) {
  n_ = Active(fsdp) ? fsdp->size() : 1;
  idx_ = Active(fsdp) ? fsdp->rank() : 0;
  const std::vector<UnitInfo>& units = model_->units();
  int64_t offset = 0, largest = 0;
  for (const UnitInfo& u : units) {
    unit_shard_offset_.push_back(offset);
    offset += u.padded / n_;
    largest = std::max(largest, u.padded / n_);
  }
  size_ = offset;
  for (size_t u = 1; u + 1 < units.size(); ++u)
    block_numel_ = std::max(block_numel_, units[u].padded);
  const int tp_rank = tp != nullptr ? tp->rank() : 0;
  // Each parameter's elements that fall into this rank's slice of its unit.
  const std::vector<ParamInfo>& layout = model_->params();
  for (size_t i = 0; i < layout.size(); ++i) {
    const ParamInfo& p = layout[i];
    const UnitInfo& u = units[p.unit];
    const int64_t count = u.padded / n_;
    const int64_t lo = std::max(p.offset - u.offset, idx_ * count);
    const int64_t hi = std::min(p.offset - u.offset + p.numel, (idx_ + 1) * count);
    if (lo >= hi) continue;
    ShardSegment s;
    s.shard_offset = ShardOffset(p.unit) + (lo - idx_ * count);
    s.count = hi - lo;
    s.param = static_cast<int>(i);
    s.param_first = lo - (p.offset - u.offset);
    s.decay = p.decay;
    s.counts_in_norm = p.tp_sharded || tp_rank == 0;
    segments_.push_back(s);
  }
  if (sharded()) {
    {
      MemoryKindScope kind(MemoryKind::kParameters);
      params_ = Tensor::Zeros({size_}, ScalarType::kFloat32, device());
    }
    {
      MemoryKindScope kind(MemoryKind::kGradients);
      grads_ = Tensor::Zeros({size_}, ScalarType::kFloat32, device());
    }
    MemoryKindScope kind(MemoryKind::kCommunication);
    scratch_ = Tensor::Zeros({largest}, ScalarType::kFloat32, device());
    gathered_.resize(units.size());
    unit_grads_.resize(units.size());
    staging_.resize(units.size());
    gather_work_.resize(units.size());
  }
  set_replicate_bucket_bytes(kReplicateBucketBytes);
}

void ShardedState::set_replicate_bucket_bytes(int64_t bucket_bytes) {
  buckets_.clear();
  bucket_of_unit_.clear();
  if (!Active(replicate_)) return;
  // Buckets of consecutive units in backward order (L+1, L, …, 0), each of at least
  // bucket_bytes of shard gradients (the last one whatever remains).
  const int units = static_cast<int>(model_->units().size());
  bucket_of_unit_.assign(static_cast<size_t>(units), 0);
  int last = units - 1;
  int64_t bytes = 0;
  for (int u = last; u >= 0; --u) {
    bytes += ShardCount(u) * static_cast<int64_t>(sizeof(float));
    if (bytes >= bucket_bytes || u == 0) {
      Bucket b;
      b.first = u;
      b.last = last;
      b.offset = ShardOffset(u);
      b.count = ShardOffset(last) + ShardCount(last) - b.offset;
      for (int v = u; v <= last; ++v) bucket_of_unit_[v] = static_cast<int>(buckets_.size());
      buckets_.push_back(std::move(b));
      last = u - 1;
      bytes = 0;
    }
  }
}

bool ShardedState::wants_hooks() const {
  return sharded() || Active(replicate_);
}

std::vector<std::pair<int, int>> ShardedState::replicate_buckets() const {
  std::vector<std::pair<int, int>> out;
  for (const Bucket& b : buckets_) out.emplace_back(b.first, b.last);
  return out;
}

int64_t ShardedState::BufferNumel(int unit) const {
  const int64_t padded = model_->units()[unit].padded;
  return unit == 0 ? padded : std::max(padded, block_numel_);
}

void ShardedState::InitDeterministic(uint64_t seed) {
  bf16_stale_ = true;
  if (!sharded()) {
    model_->InitDeterministic(seed);
    return;
  }
  if (device().type == DeviceType::kCount) return;  // no values there to set
  // Computed on the host, then copied to the shard's device (a failure there is sticky and
  // surfaces at the next op).
  const bool on_host = device().type == DeviceType::kCpu;
  std::vector<float> host(on_host ? 0 : static_cast<size_t>(size_));
  float* dst = on_host ? params() : host.data();
  for (const ShardSegment& s : segments_) {
    const ParamInfo& p = model_->params()[s.param];
    if (p.init_std == 0.0) {
      std::fill(dst + s.shard_offset, dst + s.shard_offset + s.count,
                static_cast<float>(p.init_value));
      continue;
    }
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < s.count; ++i) {
      dst[s.shard_offset + i] = static_cast<float>(
          p.init_std * InitNormal(seed, p.name, GlobalIndex(p, s.param_first + i)));
    }
  }
  if (!on_host) (void)ops::CopyFromHost(device(), params(), dst, sizeof(float) * size_);
}

Status ShardedState::LoadPieces(
    const std::function<Status(const ParamInfo&, const Box&, float*)>& read) {
  bf16_stale_ = true;
  // Read on the host; a shard on a device receives one copy at the end.
  const bool on_host = device().type == DeviceType::kCpu;
  std::vector<float> host(on_host ? 0 : static_cast<size_t>(size_));
  if (!on_host)
    MESHRUN_RETURN_IF_ERROR(
        ops::CopyToHost(device(), host.data(), params(), sizeof(float) * size_));
  float* dst = on_host ? params() : host.data();
  for (const ShardSegment& s : segments_) {
    const ParamInfo& p = model_->params()[s.param];
    for (const ParamPiece& piece : PiecesOf(p, s.param_first, s.count)) {
      const int64_t at = s.shard_offset + (piece.local_first - s.param_first);
      MESHRUN_RETURN_IF_ERROR(read(p, Box{piece.offset, piece.shape}, dst + at));
    }
  }
  if (on_host) return OkStatus();
  return ops::CopyFromHost(device(), params(), host.data(), sizeof(float) * size_);
}

Status ShardedState::ToHost(HostState* host) {
  bf16_stale_ = true;  // the caller may write the shard through host
  if (device().type == DeviceType::kCpu) {
    host->params = params();
    return OkStatus();
  }
  const size_t n = static_cast<size_t>(size_);
  host->copy.resize(n);
  host->params = host->copy.data();
  return ops::CopyToHost(device(), host->params, params(), sizeof(float) * n);
}

Status ShardedState::FromHost(const HostState& host) {
  bf16_stale_ = true;
  if (device().type == DeviceType::kCpu) return OkStatus();
  const size_t bytes = sizeof(float) * static_cast<size_t>(size_);
  return ops::CopyFromHost(device(), params(), host.params, bytes);
}

void ShardedState::ZeroGrad() {
  (void)Drain();  // nothing may still write the gradients (a failure resurfaces at the next call)
  model_->ZeroGrad();
  if (sharded()) (void)ops::Zero(device(), grads(), sizeof(float) * size_);
}

Tensor ShardedState::Acquire(std::vector<Tensor>& pool, int64_t numel, MemoryKind kind) {
  // The smallest free buffer that fits; a new one only when none does.
  size_t best = pool.size();
  for (size_t i = 0; i < pool.size(); ++i) {
    if (pool[i].numel() >= numel && (best == pool.size() || pool[i].numel() < pool[best].numel())) {
      best = i;
    }
  }
  if (best == pool.size()) {
    MemoryKindScope scope(kind);
    return Tensor::Empty({numel}, ScalarType::kFloat32, device());
  }
  Tensor t = pool[best];
  pool.erase(pool.begin() + static_cast<std::ptrdiff_t>(best));
  return t;
}

void ShardedState::Release(std::vector<Tensor>& pool, Tensor& buffer) {
  if (!buffer.defined()) return;
  pool.push_back(buffer);
  buffer = Tensor();
}

void ShardedState::ReleaseParams(int unit) {
  Release(free_params_, gathered_[unit]);
  model_->BindUnit(unit, nullptr,
                   unit_grads_[unit].defined() ? unit_grads_[unit].data<float>() : nullptr);
}

void ShardedState::ReleaseAll() {
  (void)Drain();  // a failure stays in the communicator and surfaces at its next call
  if (!sharded()) return;
  for (size_t u = 0; u < gathered_.size(); ++u) {
    Release(free_params_, gathered_[u]);
    Release(free_grads_, unit_grads_[u]);
    model_->BindUnit(static_cast<int>(u), nullptr, nullptr);
  }
}

size_t ShardedState::parameter_buffers() const {
  size_t n = free_params_.size();
  for (const Tensor& t : gathered_) n += t.defined() ? 1 : 0;
  return n;
}

size_t ShardedState::gradient_buffers() const {
  size_t n = free_grads_.size();
  for (const Tensor& t : unit_grads_) n += t.defined() ? 1 : 0;
  return n;
}

Status ShardedState::StartGather(int unit) {
  if (!sharded() || gathered_[unit].defined()) return OkStatus();
  const int64_t count = ShardCount(unit);
  Tensor buffer = Acquire(free_params_, BufferNumel(unit), MemoryKind::kParameters);
  StatusOr<CommWork> work = [&]() -> StatusOr<CommWork> {
    if (!gather_bf16_) {
      return fsdp_->StartAllGather(params() + ShardOffset(unit), buffer.data<float>(),
                                   static_cast<size_t>(count),
                                   CallOptions::Axis(MeshAxis::kDpShard));
    }
    if (!params_bf16_.defined()) {
      MemoryKindScope kind(MemoryKind::kParameters);
      params_bf16_ = Tensor::Empty({size_}, ScalarType::kBFloat16, device());
    }
    auto* shard16 = static_cast<uint16_t*>(params_bf16_.raw());
    if (bf16_stale_) {
      MESHRUN_RETURN_IF_ERROR(ops::CastToBf16(device(), shard16, params(), size_));
      bf16_stale_ = false;
    }
    // bf16 staging of the whole unit, in a float buffer of half as many elements; always of
    // the largest unit, so one buffer serves every gather.
    int64_t largest = 0;
    for (size_t u = 0; u < model_->units().size(); ++u) {
      largest = std::max(largest, BufferNumel(static_cast<int>(u)));
    }
    const int64_t staging_numel = (largest + 1) / 2;
    staging_[unit] = Acquire(free_staging_, staging_numel, MemoryKind::kCommunication);
    return fsdp_->StartAllGatherBytes(shard16 + ShardOffset(unit), staging_[unit].raw(),
                                      sizeof(uint16_t) * static_cast<size_t>(count),
                                      CallOptions::Axis(MeshAxis::kDpShard));
  }();
  if (!work.ok()) {
    Release(free_params_, buffer);
    Release(free_staging_, staging_[unit]);
    return work.status();
  }
  gathered_[unit] = buffer;
  gather_work_[unit] = std::move(*work);
  return OkStatus();
}

Status ShardedState::WaitGather(int unit) {
  if (!gather_work_[unit].pending()) return OkStatus();
  MESHRUN_RETURN_IF_ERROR(fsdp_->Wait(gather_work_[unit]));
  ops::ParametersChanged(device());  // the collective wrote the unit's parameters
  if (staging_[unit].defined()) {
    MESHRUN_RETURN_IF_ERROR(ops::CastFromBf16(device(), gathered_[unit].data<float>(),
                                              static_cast<const uint16_t*>(staging_[unit].raw()),
                                              model_->units()[unit].padded));
    Release(free_staging_, staging_[unit]);
  }
  return OkStatus();
}

Status ShardedState::Gather(int unit) {
  if (!sharded()) return OkStatus();
  MESHRUN_RETURN_IF_ERROR(StartGather(unit));
  MESHRUN_RETURN_IF_ERROR(WaitGather(unit));
  model_->BindUnit(unit, gathered_[unit].data<float>(),
                   unit_grads_[unit].defined() ? unit_grads_[unit].data<float>() : nullptr);
  return OkStatus();
}

Status ShardedState::BeforeForward(int unit) {
  if (!sharded()) return OkStatus();
  MESHRUN_RETURN_IF_ERROR(Gather(unit));
  // Prefetch: the next unit's gather runs while this one computes. Only where the backend
  // overlaps (NCCL): a CPU backend completes the gather inside Start, so a prefetch would only
  // hold a second gathered block for nothing (decision 0052).
  if (fsdp_->overlaps() && unit + 1 < static_cast<int>(model_->units().size())) {
    MESHRUN_RETURN_IF_ERROR(StartGather(unit + 1));
  }
  return OkStatus();
}

Status ShardedState::AfterForward(int unit) {
  if (sharded() && reshard_after_forward_) ReleaseParams(unit);
  return OkStatus();
}

Status ShardedState::BeforeBackward(int unit) {
  if (!sharded()) return OkStatus();
  // The previous micro-batch's reduce-scatter of this unit frees its gradient buffer.
  if (rs_unit_ == unit) MESHRUN_RETURN_IF_ERROR(DrainReduceScatter());
  MESHRUN_RETURN_IF_ERROR(Gather(unit));
  const UnitInfo& u = model_->units()[unit];
  if (!unit_grads_[unit].defined()) {
    unit_grads_[unit] = Acquire(free_grads_, BufferNumel(unit), MemoryKind::kGradients);
    MESHRUN_RETURN_IF_ERROR(ops::Zero(device(), unit_grads_[unit].raw(),
                                      sizeof(float) * static_cast<size_t>(u.padded)));
  }
  model_->BindUnit(unit, gathered_[unit].data<float>(), unit_grads_[unit].data<float>());
  // Prefetch the block the backward reaches next (units 0 and L+1 come first and stay).
  const int head = static_cast<int>(model_->units().size()) - 1;
  const int next = unit == head ? head - 1 : unit - 1;
  if (fsdp_->overlaps() && unit != 0 && next >= 1 && next != unit) {
    MESHRUN_RETURN_IF_ERROR(StartGather(next));
  }
  return OkStatus();
}

Status ShardedState::AfterBackward(int unit) {
  if (!sharded()) return last_micro_batch_ ? UnitFinal(unit) : OkStatus();
  // One reduce-scatter in flight: the previous unit's is done (it overlapped this backward).
  MESHRUN_RETURN_IF_ERROR(DrainReduceScatter());
  Release(free_params_, gathered_[unit]);
  model_->BindUnit(unit, nullptr, nullptr);
  return ReduceScatterUnitGrads(unit);
}

Status ShardedState::BeforeInputGrad(int unit) {
  if (!sharded()) return OkStatus();
  MESHRUN_RETURN_IF_ERROR(Gather(unit));
  // Prefetch the block the backward reaches next, as BeforeBackward.
  const int head = static_cast<int>(model_->units().size()) - 1;
  const int next = unit == head ? head - 1 : unit - 1;
  if (fsdp_->overlaps() && unit != 0 && next >= 1 && next != unit) {
    MESHRUN_RETURN_IF_ERROR(StartGather(next));
  }
  return OkStatus();
}

Status ShardedState::AfterInputGrad(int unit) {
  if (sharded()) ReleaseParams(unit);
  return OkStatus();
}

Status ShardedState::BeforeWeightGrad(int unit) {
  if (!sharded()) return OkStatus();
  // The previous micro-batch's reduce-scatter of this unit frees its gradient buffer.
  if (rs_unit_ == unit) MESHRUN_RETURN_IF_ERROR(DrainReduceScatter());
  if (!unit_grads_[unit].defined()) {
    unit_grads_[unit] = Acquire(free_grads_, BufferNumel(unit), MemoryKind::kGradients);
    MESHRUN_RETURN_IF_ERROR(
        ops::Zero(device(), unit_grads_[unit].raw(),
                  sizeof(float) * static_cast<size_t>(model_->units()[unit].padded)));
  }
  model_->BindUnit(unit, gathered_[unit].defined() ? gathered_[unit].data<float>() : nullptr,
                   unit_grads_[unit].data<float>());
  return OkStatus();
}

Status ShardedState::AfterWeightGrad(int unit) {
  if (!sharded()) return last_micro_batch_ ? UnitFinal(unit) : OkStatus();
  MESHRUN_RETURN_IF_ERROR(DrainReduceScatter());
  // Parameters a later forward gathered stay (W did not read them).
  model_->BindUnit(unit, gathered_[unit].defined() ? gathered_[unit].data<float>() : nullptr,
                   nullptr);
  return ReduceScatterUnitGrads(unit);
}

Status ShardedState::ReduceScatterUnitGrads(int unit) {
  rs_grads_ = unit_grads_[unit];
  unit_grads_[unit] = Tensor();
  StatusOr<CommWork> work = fsdp_->StartReduceScatter(
      rs_grads_.data<float>(), scratch_.data<float>(), static_cast<size_t>(ShardCount(unit)),
      CallOptions::Axis(MeshAxis::kDpShard));
  if (!work.ok()) {
    Release(free_grads_, rs_grads_);
    return work.status();
  }
  rs_work_ = std::move(*work);
  rs_unit_ = unit;
  rs_last_ = last_micro_batch_;
  // A backend that completes the call inside Start (Gloo, fake) has nothing to overlap: free
  // the unit's full gradients now instead of holding them through the next unit's backward.
  if (!fsdp_->overlaps()) return DrainReduceScatter();
  return OkStatus();
}

Status ShardedState::DrainReduceScatter() {
  if (rs_unit_ < 0) return OkStatus();
  const int unit = rs_unit_;
  rs_unit_ = -1;
  Status s = fsdp_->Wait(rs_work_);
  if (s.ok()) {
    s = ops::Accumulate(device(), grads() + ShardOffset(unit), scratch_.data<float>(),
                        ShardCount(unit));
  }
  Release(free_grads_, rs_grads_);
  MESHRUN_RETURN_IF_ERROR(s);
  return rs_last_ ? UnitFinal(unit) : OkStatus();
}

Status ShardedState::UnitFinal(int unit) {
  if (buckets_.empty()) return OkStatus();
  Bucket& b = buckets_[static_cast<size_t>(bucket_of_unit_[static_cast<size_t>(unit)])];
  if (++b.final_units < b.last - b.first + 1 || b.started) return OkStatus();
  MESHRUN_ASSIGN_OR_RETURN(
      b.work, replicate_->StartAllReduce(grads() + b.offset, static_cast<size_t>(b.count),
                                         CallOptions::Axis(MeshAxis::kDpReplicate)));
  b.started = true;
  return OkStatus();
}

Status ShardedState::Drain() {
  Status first = DrainReduceScatter();
  for (size_t u = 0; u < gather_work_.size(); ++u) {
    Status s = WaitGather(static_cast<int>(u));
    if (first.ok()) first = s;
  }
  for (Bucket& b : buckets_) {
    if (b.work.pending()) {
      Status s = replicate_->Wait(b.work);
      if (first.ok()) first = s;
    }
    b.started = false;
    b.final_units = 0;
  }
  return first;
}

Status ShardedState::FinishGradients() {
  MESHRUN_RETURN_IF_ERROR(DrainReduceScatter());
  last_micro_batch_ = false;
  if (!Active(replicate_)) return OkStatus();
  // Buckets whose units did not all finish during the backward start now, in bucket order.
  for (Bucket& b : buckets_) {
    if (b.started) continue;
    MESHRUN_ASSIGN_OR_RETURN(
        b.work, replicate_->StartAllReduce(grads() + b.offset, static_cast<size_t>(b.count),
                                           CallOptions::Axis(MeshAxis::kDpReplicate)));
    b.started = true;
  }
  return Drain();
}

StatusOr<double> ShardedState::GlobalGradNormSquared() {
  MESHRUN_RETURN_IF_ERROR(Drain());
  double local = 0;
  const float* g = grads();
  for (const ShardSegment& s : segments_) {
    if (!s.counts_in_norm) continue;
    if (!count_embedding_unit_ && model_->params()[s.param].unit == 0) continue;
    MESHRUN_ASSIGN_OR_RETURN(const double sq,
                             ops::SumOfSquares(device(), g + s.shard_offset, s.count));
    local += sq;
  }
  MESHRUN_ASSIGN_OR_RETURN(double over_tp,
                           SumOverGroup(tp_, local, CommCharge::Axis(MeshAxis::kTp)));
  MESHRUN_ASSIGN_OR_RETURN(double stage, SumOverGroup(sharded() ? fsdp_ : nullptr, over_tp,
                                                      CommCharge::Axis(MeshAxis::kDpShard)));
  return SumOverGroup(pp_, stage, CommCharge::Axis(MeshAxis::kPp));
}

Status ShardedState::BeginUpdate() {
  MESHRUN_RETURN_IF_ERROR(Drain());
  ReleaseAll();  // nothing gathered may outlive the update (it would be stale)
  return OkStatus();
}

}  // namespace meshrun
