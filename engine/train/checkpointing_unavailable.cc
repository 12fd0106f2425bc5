// Stand-ins for builds without meshrun_io (engine-only builds on machines without
// nlohmann-json, such as the GPU machine): training works, checkpoints and Hugging Face
// weights are refused with a clear error instead of failing the whole build.
#include "engine/train/trainer.h"

namespace meshrun {

namespace {
Status Unavailable(const char* what) {
  return UnimplementedError(std::string(what) +
                            ": this engine was built without meshrun_io (nlohmann-json not "
                            "found) (hint: install nlohmann-json3-dev and rebuild)");
}
}  // namespace

Status Trainer::WaitForAllRanks(const std::string&) {
  return OkStatus();
}
Status Trainer::SaveCheckpoint() {
  return Unavailable("checkpoint.dir");
}
Status Trainer::ResumeFrom(const std::string&, TrainObserver*) {
  return Unavailable("checkpoint resume");
}
Status Trainer::LoadCheckpoint(const std::string&) {
  return Unavailable("checkpoint");
}
Status Trainer::LoadLatestCheckpoint(TrainObserver*) {
  return NotFoundError("no checkpoints");
}
Status LoadHuggingFaceShard(const std::string&, const GPT2Config&, ShardedState*) {
  return Unavailable("model.init_from");
}
int32_t HuggingFaceEosId(const std::string&) {
  return -1;
}
Status CheckResumeFits(const std::string&, const JobSpec&) {
  return Unavailable("checkpoint resume");
}

}  // namespace meshrun
