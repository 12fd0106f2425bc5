// The data-parallel half of the parallel plans, applied after tensor and context parallel:
// FSDP (ZeRO-3 over the dp_shard_cp group: parameters gathered per unit before forward and
// again before backward, gradients reduce-scattered, AdamW state and the grad norm on shards)
// and replication over dp_replicate (all-reduce; HSDP together with FSDP). On one rank
// everything here degenerates to the model's own buffers and no communication.
#pragma once

#include <cstdint>
#include <vector>

#include "common/job_spec.h"
#include "common/status.h"
#include "engine/core/tensor.h"
#include "engine/model/gpt2.h"
#include "engine/train/optimizer.h"

namespace meshrun {

class Communicator;

// A run of one parameter's elements inside this rank's shard.
struct ShardSegment {
  int64_t shard_offset = 0;  // in the shard buffers
  int64_t count = 0;
  bool decay = false;          // AdamW weight decay (2+-dim parameters)
  bool counts_in_norm = true;  // false for tp-replicated parameters on tp ranks > 0
};

// Owns this rank's shard of parameters, gradients and AdamW moments, and implements the FSDP
// unit hooks the model calls. Not thread-safe; one per rank, owned by the Trainer.
class ShardedState final : public UnitHooks {
 public:
  // fsdp: the dp_shard_cp communicator (size S·C), replicate: dp_replicate, tp: the tp group
  // (only for the grad norm). Any may be null or of size 1.
  ShardedState(GPT2<float>* model, Communicator* fsdp, Communicator* replicate, Communicator* tp);

  bool sharded() const { return n_ > 1; }
  int64_t size() const { return size_; }
  float* params() { return sharded() ? params_.data<float>() : model_->params_data(); }
  float* grads() { return sharded() ? grads_.data<float>() : model_->grads_data(); }
  float* exp_avg() { return m_.data<float>(); }
  float* exp_avg_sq() { return v_.data<float>(); }
  const std::vector<ShardSegment>& segments() const { return segments_; }

  // Takes this rank's shard of the model's full (tp-local) parameters, e.g. after init or load.
  void TakeShardOfModel();
  void ScatterMoments(const float* full_m, const float* full_v);
  // Start of a step / of a micro-batch.
  void ZeroGrad();
  void BeginMicroBatch();
  // After the last micro-batch: replica gradients all-reduced (summed) over dp_replicate.
  Status FinishGradients();
  // ‖g‖² over the whole model: shards summed over dp_shard_cp and tp.
  StatusOr<double> GlobalGradNormSquared();
  // Clip by the global norm and apply AdamW to the shard (docs/model.md).
  StatusOr<UpdateResult> ClipAndStep(const TrainSpec& train, int64_t step);

  // Full (tp-local) parameters into the model and moments into full_m/full_v (num_params each),
  // for checkpoints; traffic charged to "checkpoint".
  Status GatherFull(float* full_m, float* full_v);

  // UnitHooks.
  Status BeforeForward(int unit) override { return Gather(unit); }
  Status BeforeBackward(int unit) override;
  Status AfterBackward(int unit) override;

 private:
  Status Gather(int unit);
  int64_t ShardOffset(int unit) const { return unit_shard_offset_[unit]; }
  int64_t ShardCount(int unit) const { return model_->units()[unit].padded / n_; }

  GPT2<float>* model_;
  Communicator* fsdp_;
  Communicator* replicate_;
  Communicator* tp_;
  int n_ = 1;    // FSDP group size
  int idx_ = 0;  // this rank's index in it
  int64_t size_ = 0;
  std::vector<int64_t> unit_shard_offset_;
  std::vector<ShardSegment> segments_;
  Tensor params_, grads_, m_, v_, scratch_;
};

// Σ of one double over a group, identical and in the same order on every member.
StatusOr<double> SumOverGroup(Communicator* comm, double value, const char* axis);

}  // namespace meshrun
