// Saving and resuming the trainer's state (CONVENTIONS §4): parameters and AdamW moments as
// named tensors, the step in the metadata's trainer object. Single-rank here: this rank's
// shard holds every tensor whole; the parallel plans write slices of the same names.
#include <nlohmann/json.hpp>

#include "engine/io/checkpoint.h"
#include "engine/train/trainer.h"

namespace meshrun {

namespace {

// Tensor names in a checkpoint: "model/<param>", "optim/exp_avg/<param>",
// "optim/exp_avg_sq/<param>".
std::string ModelKey(const ParamInfo& p) { return "model/" + p.name; }
std::string MomentKey(const char* which, const ParamInfo& p) {
  return std::string("optim/") + which + "/" + p.name;
}

}  // namespace

Status Trainer::SaveCheckpoint() {
  const std::string step_dir = StepDir(spec_.checkpoint.dir, step_);
  std::vector<SliceRef> slices;
  const float* params = model_->params_data();
  const float* m = adam_m_.data<float>();
  const float* v = adam_v_.data<float>();
  for (const ParamInfo& p : model_->params()) {
    const std::vector<int64_t> zero(p.shape.size(), 0);
    slices.push_back({ModelKey(p), p.shape, zero, p.shape, params + p.offset});
    slices.push_back({MomentKey("exp_avg", p), p.shape, zero, p.shape, m + p.offset});
    slices.push_back({MomentKey("exp_avg_sq", p), p.shape, zero, p.shape, v + p.offset});
  }
  MESHRUN_RETURN_IF_ERROR(WriteShard(step_dir, /*rank=*/0, slices));
  CheckpointMetadata meta;
  meta.step = step_;
  meta.world_size = 1;
  meta.job_spec_yaml = options_.spec_yaml;
  nlohmann::json trainer = {{"step", step_}, {"optimizer_step", step_}};
  meta.trainer_json = trainer.dump();
  MESHRUN_RETURN_IF_ERROR(WriteMetadata(step_dir, meta));
  last_checkpoint_ = step_dir;
  return PruneCheckpoints(spec_.checkpoint.dir, std::max(1, spec_.checkpoint.keep));
}

Status Trainer::LoadCheckpoint(const std::string& step_dir) {
  MESHRUN_ASSIGN_OR_RETURN(CheckpointReader reader, CheckpointReader::Open(step_dir));
  float* params = model_->params_data();
  float* m = adam_m_.data<float>();
  float* v = adam_v_.data<float>();
  for (const ParamInfo& p : model_->params()) {
    MESHRUN_ASSIGN_OR_RETURN(std::vector<int64_t> shape, reader.GlobalShape(ModelKey(p)));
    if (shape != p.shape) {
      return FailedPreconditionError("checkpoint " + step_dir + ": tensor " + p.name +
                                     " does not fit this model's config (hint: resume with the "
                                     "model section the checkpoint was written with)");
    }
    MESHRUN_RETURN_IF_ERROR(reader.ReadTensor(ModelKey(p), params + p.offset));
    // A checkpoint without optimizer state (e.g. an exported model) starts fresh moments.
    if (reader.HasTensor(MomentKey("exp_avg", p))) {
      MESHRUN_RETURN_IF_ERROR(reader.ReadTensor(MomentKey("exp_avg", p), m + p.offset));
      MESHRUN_RETURN_IF_ERROR(reader.ReadTensor(MomentKey("exp_avg_sq", p), v + p.offset));
    }
  }
  nlohmann::json trainer =
      nlohmann::json::parse(reader.metadata().trainer_json, nullptr, /*allow_exceptions=*/false);
  if (trainer.is_discarded() || !trainer.contains("step") || !trainer["step"].is_number_integer()) {
    return DataLossError("checkpoint " + step_dir + ": metadata has no trainer step");
  }
  step_ = trainer["step"].get<int64_t>();
  last_checkpoint_ = step_dir;
  return OkStatus();
}

Status Trainer::LoadLatestCheckpoint(TrainObserver* observer) {
  std::vector<std::string> warnings;
  StatusOr<LatestCheckpoint> latest = FindLatestComplete(spec_.checkpoint.dir, &warnings);
  for (const std::string& w : warnings) observer->OnLog("warning: " + w);
  if (!latest.ok()) return latest.status();
  MESHRUN_RETURN_IF_ERROR(LoadCheckpoint(latest->step_dir));
  observer->OnLog("resumed from " + latest->step_dir + " at step " + std::to_string(step_));
  return OkStatus();
}

}  // namespace meshrun
