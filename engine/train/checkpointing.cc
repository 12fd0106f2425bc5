// Saving and resuming the trainer's state under any mesh (docs/checkpoints.md). Tensors are saved
// by their global names as boxes of the global tensor: "model/<param>", "optim/exp_avg/<param>",
// "optim/exp_avg_sq/<param>". One rank per tp shard writes (dp_replicate 0, dp_shard_cp index
// 0), after gathering its FSDP shards; the others write an empty shard file. Loading reads this
// rank's boxes from whatever mesh wrote them (resharding), then takes its FSDP shard.
#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "engine/comm/communicator.h"
#include "engine/io/checkpoint.h"
#include "engine/train/trainer.h"

namespace meshrun {

namespace {

std::string ModelKey(const ParamInfo& p) {
  return "model/" + p.name;
}
std::string MomentKey(const char* which, const ParamInfo& p) {
  return std::string("optim/") + which + "/" + p.name;
}

// Rows of p's local tensor before box b (boxes are concatenated along dim 0).
int64_t ElementsBefore(const ParamInfo& p, size_t b) {
  int64_t n = 0;
  for (size_t i = 0; i < b; ++i) {
    int64_t e = 1;
    for (int64_t d : p.boxes[i].shape) e *= d;
    n += e;
  }
  return n;
}

}  // namespace

Status Trainer::WaitForAllRanks(const std::string& key) {
  if (ctx_.store == nullptr || dims_->world_size() == 1) return OkStatus();
  MESHRUN_RETURN_IF_ERROR(ctx_.store->Set(key + "/" + std::to_string(ctx_.rank), "1"));
  std::vector<std::string> keys;
  for (int r = 0; r < dims_->world_size(); ++r) keys.push_back(key + "/" + std::to_string(r));
  return ctx_.store->Wait(keys, std::chrono::minutes(5));
}

Status Trainer::SaveCheckpoint() {
  const std::string step_dir = StepDir(spec_.checkpoint.dir, step_);
  const int64_t n = model_->num_params();
  std::vector<float> m(static_cast<size_t>(n)), v(static_cast<size_t>(n));
  MESHRUN_RETURN_IF_ERROR(shards_->GatherFull(m.data(), v.data()));
  const bool writer =
      coords_.dp_replicate == 0 && dims_->IndexInGroup(ctx_.rank, MeshAxis::kDpShardCp) == 0;
  std::vector<SliceRef> slices;
  if (writer) {
    const float* params = model_->params_data();
    for (const ParamInfo& p : model_->params()) {
      for (size_t b = 0; b < p.boxes.size(); ++b) {
        const int64_t at = p.offset + ElementsBefore(p, b);
        const Box& box = p.boxes[b];
        slices.push_back({ModelKey(p), p.global_shape, box.offset, box.shape, params + at});
        slices.push_back(
            {MomentKey("exp_avg", p), p.global_shape, box.offset, box.shape, m.data() + at});
        slices.push_back(
            {MomentKey("exp_avg_sq", p), p.global_shape, box.offset, box.shape, v.data() + at});
      }
    }
  }
  MESHRUN_RETURN_IF_ERROR(WriteShard(step_dir, ctx_.rank, slices));
  // metadata.json last, by rank 0, once every shard is on disk.
  MESHRUN_RETURN_IF_ERROR(WaitForAllRanks("checkpoint/" + std::to_string(step_) + "/written"));
  last_checkpoint_ = step_dir;
  if (ctx_.rank != 0) return OkStatus();
  CheckpointMetadata meta;
  meta.step = step_;
  meta.world_size = dims_->world_size();
  meta.mesh = {dims_->dp_replicate(), dims_->dp_shard(), dims_->cp(), dims_->tp()};
  meta.job_spec_yaml = options_.spec_yaml;
  // The loss history travels with the checkpoint, so a resumed (or finished) run can report
  // the real loss of its last step.
  nlohmann::json trainer = {{"step", step_}, {"optimizer_step", step_}, {"losses", loss_history_}};
  meta.trainer_json = trainer.dump();
  MESHRUN_RETURN_IF_ERROR(WriteMetadata(step_dir, meta));
  return PruneCheckpoints(spec_.checkpoint.dir, std::max(1, spec_.checkpoint.keep));
}

Status Trainer::LoadCheckpoint(const std::string& step_dir) {
  MESHRUN_ASSIGN_OR_RETURN(CheckpointReader reader, CheckpointReader::Open(step_dir));
  const int64_t n = model_->num_params();
  std::vector<float> m(static_cast<size_t>(n), 0.f), v(static_cast<size_t>(n), 0.f);
  float* params = model_->params_data();
  for (const ParamInfo& p : model_->params()) {
    MESHRUN_ASSIGN_OR_RETURN(std::vector<int64_t> shape, reader.GlobalShape(ModelKey(p)));
    if (shape != p.global_shape) {
      return FailedPreconditionError(
          "checkpoint " + step_dir + ": tensor " + p.name +
          " does not fit this model's config (hint: resume with the "
          "model section the checkpoint was written with, or train "
          "this model in another folder: --set "
          "checkpoint.dir=ANOTHER_DIR, or remove " +
          (spec_.checkpoint.dir.empty() ? step_dir : spec_.checkpoint.dir) +
          "; checkpoint.resume=never would start from step 0 but "
          "write into the old run's folder)");
    }
    // A checkpoint without optimizer state (e.g. converted weights) starts fresh moments.
    const bool has_moments = reader.HasTensor(MomentKey("exp_avg", p));
    for (size_t b = 0; b < p.boxes.size(); ++b) {
      const int64_t at = p.offset + ElementsBefore(p, b);
      const Box& box = p.boxes[b];
      MESHRUN_RETURN_IF_ERROR(reader.ReadSlice(ModelKey(p), box.offset, box.shape, params + at));
      if (has_moments) {
        MESHRUN_RETURN_IF_ERROR(
            reader.ReadSlice(MomentKey("exp_avg", p), box.offset, box.shape, m.data() + at));
        MESHRUN_RETURN_IF_ERROR(
            reader.ReadSlice(MomentKey("exp_avg_sq", p), box.offset, box.shape, v.data() + at));
      }
    }
  }
  shards_->TakeShardOfModel();
  shards_->ScatterMoments(m.data(), v.data());
  nlohmann::json trainer =
      nlohmann::json::parse(reader.metadata().trainer_json, nullptr, /*allow_exceptions=*/false);
  if (trainer.is_discarded() || !trainer.contains("step") || !trainer["step"].is_number_integer()) {
    return DataLossError("checkpoint " + step_dir + ": metadata has no trainer step");
  }
  step_ = trainer["step"].get<int64_t>();
  loss_history_.clear();
  if (const auto it = trainer.find("losses"); it != trainer.end() && it->is_array()) {
    for (const auto& x : *it) {
      if (!x.is_number()) break;
      loss_history_.push_back(x.get<double>());
    }
    // A history that does not end at this step (an older checkpoint) is not reported.
    if (loss_history_.size() != static_cast<size_t>(step_)) loss_history_.clear();
  }
  last_checkpoint_ = step_dir;
  return OkStatus();
}

Status Trainer::LoadLatestCheckpoint(TrainObserver* observer) {
  std::vector<std::string> warnings;
  StatusOr<LatestCheckpoint> latest = FindLatestComplete(spec_.checkpoint.dir, &warnings);
  for (const std::string& w : warnings) observer->OnLog("warning: " + w);
  if (!latest.ok()) return latest.status();
  MESHRUN_RETURN_IF_ERROR(LoadCheckpoint(latest->step_dir));
  const MeshSizes& saved = latest->metadata.mesh;
  observer->OnLog("resumed from " + latest->step_dir + " at step " + std::to_string(step_) +
                  " (saved under dp_replicate=" + std::to_string(saved.dp_replicate) +
                  " dp_shard=" + std::to_string(saved.dp_shard) +
                  " cp=" + std::to_string(saved.cp) + " tp=" + std::to_string(saved.tp) + ")");
  return OkStatus();
}

}  // namespace meshrun
