// The data-parallel half of the parallel plans, applied after tensor and context parallel:
// FSDP (ZeRO-3 over the dp_shard_cp group: parameters gathered per unit before forward and
// again before backward, gradients reduce-scattered, the grad norm on shards) and replication
// over dp_replicate (all-reduce; HSDP together with FSDP). On one rank everything here
// degenerates to the model's own buffers and no communication. The optimizer's state lives in
// the Optimizer (engine/train/optimizer.h), over the same shard: this file knows no optimizer.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "common/job_spec.h"
#include "common/status.h"
#include "engine/comm/comm_stats.h"
#include "engine/comm/communicator.h"
#include "engine/core/tensor.h"
#include "engine/model/gpt2.h"

namespace meshrun {

// A run of one parameter's elements inside this rank's shard.
struct ShardSegment {
  int64_t shard_offset = 0;  // in the shard buffers
  int64_t count = 0;
  int param = 0;               // index into the model's params()
  int64_t param_first = 0;     // the parameter's (tp-local) element at shard_offset
  bool decay = false;          // weight decay applies (2+-dim parameters)
  bool counts_in_norm = true;  // false for tp-replicated parameters on tp ranks > 0
};

// Owns this rank's shard of parameters and gradients, and implements the FSDP
// unit hooks the model calls (docs/parallelism.md "What a rank holds"). Sharded (a dp_shard_cp
// group of n > 1), the model owns no full buffers: each unit's parameters are all-gathered
// into a transient buffer when the model needs them and freed after (after a block's forward,
// or after its backward with fsdp_reshard_after_forward false), and its full gradients live
// from its backward until they are reduce-scattered into the shard. The transient buffers come
// from a small free list, so a step allocates nothing once the first one has run. With n = 1
// the shard is the model's own flat buffers. Not thread-safe; one per rank, owned by the
// Trainer.
//
// Overlap (decision 0027), on every device (CPU backends complete a started call inside Start,
// so there it only moves the calls earlier):
//  - the gather of the next unit starts when the model asks for the current one (forward: unit
//    u+1 at BeforeForward(u); backward: the block before, at BeforeBackward), and is waited for
//    when the model needs it: at most two blocks are gathered at once, beside the embedding and
//    head units that stay gathered from their forward to their backward;
//  - a unit's reduce-scatter starts at its AfterBackward and is waited for at the next unit's
//    AfterBackward (or the next BeforeBackward of the same unit, or FinishGradients): one in
//    flight, so at most two blocks' full gradients exist at once;
//  - over dp_replicate, the gradient shard is all-reduced in buckets of consecutive units
//    (kReplicateBucketBytes), each started during the last micro-batch's backward as soon as
//    its units' gradients are final, and waited for in FinishGradients.
// Buffers for units other than the embedding unit are at least the largest block, so a freed
// block buffer serves any unit.
class ShardedState final : public UnitHooks {
 public:
  // The dp_replicate all-reduce's bucket: consecutive units (in backward order) are grouped
  // until a bucket holds at least this many bytes of the shard's gradients (PyTorch DDP's 25 MiB).
  static constexpr int64_t kReplicateBucketBytes = int64_t{25} << 20;

  // fsdp: the dp_shard_cp communicator (size S·C), replicate: dp_replicate, tp: the tp group
  // (only for the grad norm). Any may be null or of size 1. A sharded model must have been
  // built without its own storage.
  ShardedState(GPT2<float>* model, Communicator* fsdp, Communicator* replicate, Communicator* tp,
               bool reshard_after_forward = true);

  bool sharded() const { return n_ > 1; }
  // Whether the model must call the hooks: sharded, or replicated (the bucketed all-reduce
  // follows the backward).
  bool wants_hooks() const;
  // The device of the model and of every buffer here (parameters, gradients).
  Device device() const { return model_->config().device; }
  int64_t size() const { return size_; }
  // On device(); checkpoints copy them to the host (ops::CopyToHost).
  float* params() { return sharded() ? params_.data<float>() : model_->params_data(); }
  float* grads() { return sharded() ? grads_.data<float>() : model_->grads_data(); }
  const std::vector<ShardSegment>& segments() const { return segments_; }

  // Mixed precision (train.precision: bf16): the all-gathers carry bf16 (a bf16 copy of the
  // float32 shard, refreshed after every update; half the bytes); the gathered unit is widened
  // back to float32 for the model. Master weights, gradients, reduce-scatters and all-reduces
  // stay float32. Set before the first gather.
  void set_gather_bf16(bool on) { gather_bf16_ = on; }
  bool gather_bf16() const { return gather_bf16_; }
  // Whether the coming micro-batch is the step's last (its gradients are then final unit by
  // unit and the dp_replicate buckets start during its backward). The Trainer sets it; left
  // false, every bucket starts in FinishGradients.
  void set_last_micro_batch(bool last) { last_micro_batch_ = last; }

  // The shard's parameters where the host can read and write them (checkpoints): on cpu the
  // buffer itself, on a device a copy (size() floats).
  struct HostState {
    float* params = nullptr;
    std::vector<float> copy;  // device only
  };
  Status ToHost(HostState* host);
  // After writing into a HostState: copies it back to the device (no-op on cpu).
  Status FromHost(const HostState& host);

  // Element i of every parameter from InitNormal(seed, name, global index of i), computed for
  // this rank's shard only.
  void InitDeterministic(uint64_t seed);
  // Fills this rank's shard piece by piece: read(p, box, out) writes box (global coordinates
  // of parameter p) row-major to out (e.g. from Hugging Face weights, reading only this shard).
  Status LoadPieces(const std::function<Status(const ParamInfo&, const Box&, float*)>& read);
  // Start of a step.
  void ZeroGrad();
  // After the last micro-batch: the last reduce-scatter waited for, replica gradients
  // all-reduced (summed) over dp_replicate (the buckets not yet started start now; all are
  // waited for).
  Status FinishGradients();
  // ‖g‖² over the whole model: shards summed over dp_shard_cp and tp (and over the pipeline's
  // stages after SetPipeline).
  StatusOr<double> GlobalGradNormSquared();
  // Pipeline parallelism: the norm also sums over `pp` (charged to pp); with
  // count_embedding_unit false this stage's embedding unit (unit 0) is left out of it, because
  // the stage holds a copy of the first stage's (a tied last stage, decision 0054).
  void SetPipeline(Communicator* pp, bool count_embedding_unit) {
    pp_ = pp;
    count_embedding_unit_ = count_embedding_unit;
  }
  // Unit u's [offset, offset + count) in the shard buffers (params() and grads()).
  std::pair<int64_t, int64_t> UnitShard(int unit) const {
    return {ShardOffset(unit), ShardCount(unit)};
  }
  // Before an update of the shard (engine/train/update.h): every call in flight waited for and
  // every gathered unit freed (it would be stale after the update).
  Status BeginUpdate();
  // After the shard's parameters were updated: the bf16 copy the gathers send is stale.
  void ParamsUpdated() { bf16_stale_ = true; }
  // Frees every gathered unit (after forwards without a backward, e.g. an evaluation), waiting
  // for any call still in flight.
  void ReleaseAll();
  // Transient buffers ever allocated (live or free) for gathered parameters and for full
  // gradients: what the free lists grew to, i.e. the most units materialised at once.
  size_t parameter_buffers() const;
  size_t gradient_buffers() const;
  // Regroups the dp_replicate buckets (default kReplicateBucketBytes); between steps only.
  void set_replicate_bucket_bytes(int64_t bytes);
  // The dp_replicate buckets as [first unit, last unit] (empty without replication).
  std::vector<std::pair<int, int>> replicate_buckets() const;

  // UnitHooks.
  Status BeforeForward(int unit) override;
  Status AfterForward(int unit) override;
  Status BeforeBackward(int unit) override;
  Status AfterBackward(int unit) override;
  // Zero-bubble's split backward (decision 0059): B gathers the unit (prefetching the block
  // before it, as BeforeBackward) and frees it after; W takes its full gradient buffer and, at
  // AfterWeightGrad, reduce-scatters it as AfterBackward does (and its last micro-batch makes
  // the unit final for the dp_replicate buckets).
  Status BeforeInputGrad(int unit) override;
  Status AfterInputGrad(int unit) override;
  Status BeforeWeightGrad(int unit) override;
  Status AfterWeightGrad(int unit) override;

 private:
  struct Bucket {
    int first = 0, last = 0;  // units [first, last]
    int64_t offset = 0, count = 0;
    int final_units = 0;
    bool started = false;
    CommWork work;
  };

  // Starts unit's gather (no-op when gathered or in flight); Gather also waits and binds it.
  Status StartGather(int unit);
  Status Gather(int unit);
  Status WaitGather(int unit);
  // Waits for the reduce-scatter in flight and adds it to the shard's gradients.
  Status DrainReduceScatter();
  // Everything in flight: the reduce-scatter, gathers, started buckets.
  Status Drain();
  // Starts the reduce-scatter of unit's full gradients (one in flight: the previous one is
  // waited for first) and frees them once it is done.
  Status ReduceScatterUnitGrads(int unit);
  // Unit's shard gradients are final for this step (last micro-batch): its bucket may start.
  Status UnitFinal(int unit);
  Tensor Acquire(std::vector<Tensor>& pool, int64_t numel, MemoryKind kind);
  void Release(std::vector<Tensor>& pool, Tensor& buffer);
  void ReleaseParams(int unit);
  int64_t ShardOffset(int unit) const { return unit_shard_offset_[unit]; }
  int64_t ShardCount(int unit) const { return model_->units()[unit].padded / n_; }
  // The transient buffer's size for unit: at least the largest block but for unit 0.
  int64_t BufferNumel(int unit) const;

  GPT2<float>* model_;
  Communicator* fsdp_;
  Communicator* replicate_;
  Communicator* tp_;
  Communicator* pp_ = nullptr;
  bool count_embedding_unit_ = true;
  bool reshard_after_forward_ = true;
  int n_ = 1;    // FSDP group size
  int idx_ = 0;  // this rank's index in it
  int64_t size_ = 0;
  int64_t block_numel_ = 0;  // the largest block unit (padded)
  std::vector<int64_t> unit_shard_offset_;
  std::vector<ShardSegment> segments_;
  Tensor params_, grads_, scratch_;
  // Sharded: each unit's gathered parameters and full gradients while they exist, and the
  // free buffers they return to; a gather in flight holds its CommWork (and bf16 staging).
  std::vector<Tensor> gathered_, unit_grads_, staging_;
  std::vector<CommWork> gather_work_;
  std::vector<Tensor> free_params_, free_grads_, free_staging_;
  // The reduce-scatter in flight: its unit (-1: none), full gradients, whether that
  // micro-batch was the last.
  int rs_unit_ = -1;
  bool rs_last_ = false;
  CommWork rs_work_;
  Tensor rs_grads_;
  // Mixed precision: the bf16 copy of the shard the gathers send, and whether it is stale.
  bool gather_bf16_ = false;
  bool bf16_stale_ = true;
  Tensor params_bf16_;
  bool last_micro_batch_ = false;
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_unit_;
};

// A run of a parameter's (tp-local) elements as a hyper-rectangle of its global tensor: local
// elements [local_first, local_first + product(shape)) are the box [offset, offset + shape),
// row-major. What a checkpoint stores for a shard segment.
struct ParamPiece {
  std::vector<int64_t> offset;
  std::vector<int64_t> shape;
  int64_t local_first = 0;
};

// The boxes (at most three per tp box: a partial first row, whole rows, a partial last row) of
// p's local elements [first, first + count). Parameters have one or two dimensions.
std::vector<ParamPiece> PiecesOf(const ParamInfo& p, int64_t first, int64_t count);

// Σ of one double over a group, identical and in the same order on every member, charged to
// `charge` (comm_stats.h).
StatusOr<double> SumOverGroup(Communicator* comm, double value, CommCharge charge);

}  // namespace meshrun
