// Saving and resuming the trainer's state under any mesh (docs/checkpoints.md). Tensors are saved
// by their global names as boxes of the global tensor: "model/<param>" and, for every state the
// optimizer names, "optim/<state>/<param>" (AdamW: exp_avg and exp_avg_sq; Lion: exp_avg); the
// metadata's trainer record names the optimizer ("optimizer"; absent before it was recorded:
// adamw). Every rank of replica 0 writes the boxes of its own shard (no rank gathers anything);
// loading reads the boxes of this rank's shard from whatever mesh wrote them (resharding).
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>

#include "engine/comm/communicator.h"
#include "engine/io/checkpoint.h"
#include "engine/model/hf_checkpoint.h"
#include "engine/train/trainer.h"

namespace meshrun {

namespace {

std::string ModelKey(const ParamInfo& p) {
  return "model/" + p.name;
}
std::string StateKey(const std::string& state, const ParamInfo& p) {
  return "optim/" + state + "/" + p.name;
}

// The optimizer a checkpoint's state belongs to (its trainer record's "optimizer"; checkpoints
// written before it was recorded hold AdamW's). A resume continues with the same optimizer:
// another one's state does not carry over (Lion's exp_avg is not AdamW's), so a different
// train.optimizer is refused, naming the way to start it from the checkpoint's weights.
Status CheckResumeOptimizer(const nlohmann::json& trainer, const JobSpec& spec,
                            const std::string& step_dir) {
  std::string saved = OptimizerName(OptimizerKind::kAdamW);
  if (trainer.is_object()) {
    const auto it = trainer.find("optimizer");
    if (it != trainer.end()) {
      if (!it->is_string()) {
        return DataLossError("checkpoint " + step_dir + ": metadata's optimizer is not a name");
      }
      saved = it->get<std::string>();
    }
  }
  const std::string want = OptimizerName(OptimizerOf(spec.train));
  if (saved == want) return OkStatus();
  const std::string hint = "resume with train.optimizer: " + EscapeForMessage(saved) +
                           ", or export the checkpoint's weights (meshrun export " + step_dir +
                           " -o DIR) and start " + want +
                           " from them in another folder: model.init_from: DIR, "
                           "--set checkpoint.dir=ANOTHER_DIR";
  return InvalidArgumentError(
      "train.optimizer: the checkpoint " + step_dir + " holds the state of '" +
      EscapeForMessage(saved) + "', this spec asks for '" + want +
      "'; one optimizer's state does not carry over to another (hint: " + hint + ")");
}

// The data position of a checkpoint (docs/checkpoints.md): the sources of data.train with
// their weights and integer quotas, and per source the windows of its stream, the windows taken
// before `step` and the epoch the next one is in. The position is a function of the step (the
// order of docs/data.md); it is stored to check a resume against.
nlohmann::json DataRecord(const JobSpec& spec, const MixtureSampler& sampler, int64_t step) {
  const std::vector<DataSource> sources = TrainSources(spec.data);
  const std::vector<int64_t> taken = sampler.CountsBefore(step);
  nlohmann::json list = nlohmann::json::array();
  for (size_t i = 0; i < sources.size() && i < taken.size(); ++i) {
    const int j = static_cast<int>(i);
    list.push_back({{"path", sources[i].path},
                    {"weight", sources[i].weight},
                    {"quota", sampler.quotas()[i]},
                    {"windows", sampler.num_windows(j)},
                    {"taken", taken[i]},
                    {"epoch", sampler.EpochOf(j, taken[i])}});
  }
  return {{"mixture", !spec.data.train_sources.empty()},
          {"order", spec.data.order},
          {"shuffle", ShuffleRuleName(sampler.shuffle())},
          {"slot", step * sampler.global_batch()},
          {"sources", std::move(list)}};
}

std::string SourcesText(const std::vector<std::pair<std::string, double>>& sources) {
  std::string out;
  for (const auto& [path, weight] : sources) {
    char w[32];
    std::snprintf(w, sizeof(w), "%g", weight);
    out += (out.empty() ? "" : ", ") + path + " " + w;
  }
  return "[" + out + "]";
}

// A resume continues the stream the checkpoint was written reading: when either the checkpoint
// or `spec` reads a mixture (data.train as a list), both must list the same paths in the same
// order with the same normalized weights (the same integer quotas). A single path resumed with
// a single path is not checked (as before mixtures: the file may have moved).
Status CheckResumeData(const nlohmann::json& trainer, const JobSpec& spec,
                       const std::string& step_dir) {
  const bool mixture = !spec.data.train_sources.empty();
  const auto it = trainer.is_object() ? trainer.find("data") : trainer.end();
  const bool recorded = trainer.is_object() && it != trainer.end() && it->is_object();
  const bool saved_mixture =
      recorded && it->contains("mixture") && (*it)["mixture"].is_boolean() && (*it)["mixture"];
  if (!mixture && !saved_mixture) return OkStatus();
  std::vector<std::pair<std::string, double>> saved, want;
  if (recorded && it->contains("sources") && (*it)["sources"].is_array()) {
    for (const auto& s : (*it)["sources"]) {
      if (!s.is_object() || !s.contains("path") || !s["path"].is_string() ||
          !s.contains("weight") || !s["weight"].is_number()) {
        return DataLossError("checkpoint " + step_dir + ": metadata's data sources are malformed");
      }
      saved.emplace_back(s["path"].get<std::string>(), s["weight"].get<double>());
    }
  }
  for (const DataSource& s : TrainSources(spec.data)) want.emplace_back(s.path, s.weight);
  bool same = saved_mixture && mixture && saved.size() == want.size();
  if (same) {
    std::vector<double> a, b;
    for (size_t i = 0; i < saved.size(); ++i) {
      same = same && saved[i].first == want[i].first;
      a.push_back(saved[i].second);
      b.push_back(want[i].second);
    }
    StatusOr<std::vector<int64_t>> qa = MixtureQuotas(a), qb = MixtureQuotas(b);
    same = same && qa.ok() && qb.ok() && *qa == *qb;
  }
  if (same) return OkStatus();
  const std::string was = !saved_mixture ? "one data.train path (no mixture)" : SourcesText(saved);
  const std::string now = !mixture ? "one data.train path (no mixture)" : SourcesText(want);
  return InvalidArgumentError(
      "data.train: the checkpoint " + step_dir + " was written reading " + was +
      ", this spec reads " + now +
      "; resuming would not continue the same stream of windows (hint: resume with the "
      "data.train the checkpoint was written with, or train this mixture in another folder: "
      "--set checkpoint.dir=ANOTHER_DIR)");
}

}  // namespace

Status Trainer::WaitForAllRanks(const std::string& key) {
  if (ctx_.store == nullptr || dims_->world_size() == 1) return OkStatus();
  MESHRUN_RETURN_IF_ERROR(ctx_.store->Set(key + "/" + std::to_string(ctx_.rank), "1"));
  std::vector<std::string> keys;
  for (int r = 0; r < dims_->world_size(); ++r) keys.push_back(key + "/" + std::to_string(r));
  return ctx_.store->Wait(keys, std::chrono::seconds(spec_.parallelism.comm_timeout_seconds));
}

Status Trainer::SaveCheckpoint() {
  const std::string step_dir = StepDir(spec_.checkpoint.dir, step_);
  // Each rank writes the slices it holds, straight from its shard: a replica (dp_replicate > 0)
  // holds a copy of replica 0's and writes an empty file; tp-replicated tensors come from tp
  // rank 0 only.
  std::vector<SliceRef> slices;
  ShardedState::HostState host;  // host copies when the shard lives on a device
  Optimizer::HostState state;
  const std::vector<std::string>& names = optimizer_->state_names();
  if (coords_.dp_replicate == 0) {
    MESHRUN_RETURN_IF_ERROR(shards_->ToHost(&host));
    MESHRUN_RETURN_IF_ERROR(optimizer_->ToHost(&state));
    const float* params = host.params;
    for (const ShardSegment& s : shards_->segments()) {
      const ParamInfo& p = model_->params()[s.param];
      if (!p.tp_sharded && coords_.tp != 0) continue;
      // A tied last pipeline stage's embedding unit is a copy of the first stage's.
      if (p.unit == 0 && !model_->config().stage_first) continue;
      for (const ParamPiece& piece : PiecesOf(p, s.param_first, s.count)) {
        const int64_t at = s.shard_offset + (piece.local_first - s.param_first);
        slices.push_back({ModelKey(p), p.global_shape, piece.offset, piece.shape, params + at});
        for (size_t i = 0; i < names.size(); ++i) {
          slices.push_back({StateKey(names[i], p), p.global_shape, piece.offset, piece.shape,
                            state.states[i] + at});
        }
      }
    }
  }
  MESHRUN_RETURN_IF_ERROR(
      WriteShard(step_dir, ctx_.rank, slices, nullptr, options_.checkpoint_owner));
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
  nlohmann::json trainer = {{"step", step_},
                            {"optimizer_step", step_},
                            {"optimizer", OptimizerName(optimizer_->kind())},
                            {"losses", loss_history_}};
  trainer["data"] = DataRecord(spec_, *sampler_, step_);
  // What the model trained from says of itself (its type, dtype and special token ids), so
  // `meshrun export` keeps it even when the folder is gone.
  if (!spec_.model.init_from.empty()) {
    nlohmann::json source = ReadHuggingFaceIdentity(spec_.model.init_from);
    if (source.empty() && !resumed_source_.empty()) source = nlohmann::json::parse(resumed_source_);
    if (!source.empty()) trainer["source"] = std::move(source);
  }
  meta.trainer_json = trainer.dump();
  meta.owner = options_.checkpoint_owner;
  MESHRUN_RETURN_IF_ERROR(WriteMetadata(step_dir, meta));
  // Only this run's own folders: another job's in a shared checkpoint.dir stay.
  return PruneCheckpoints(spec_.checkpoint.dir, std::max(1, spec_.checkpoint.keep), nullptr,
                          options_.checkpoint_owner);
}

namespace {

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string out;
  for (int64_t d : shape) out += (out.empty() ? "" : ", ") + std::to_string(d);
  return "(" + out + ")";
}

// Every model tensor of `params` is in the checkpoint with its global shape.
Status CheckCheckpointFits(const CheckpointReader& reader, const std::vector<ParamInfo>& params,
                           const std::string& step_dir, const std::string& checkpoint_dir) {
  for (const ParamInfo& p : params) {
    StatusOr<std::vector<int64_t>> shape = reader.GlobalShape(ModelKey(p));
    if (shape.ok() && *shape == p.global_shape) continue;
    const std::string what = shape.ok() ? "has shape " + ShapeText(*shape) + ", this model's is " +
                                              ShapeText(p.global_shape)
                                        : "is not in it, this model has it";
    return InvalidArgumentError(
        "checkpoint.dir: " + step_dir + ": tensor " + p.name + " " + what +
        ", so the checkpoint does not fit this model's config (hint: resume with the "
        "model section the checkpoint was written with, or train this model in another "
        "folder: --set checkpoint.dir=ANOTHER_DIR, or remove " +
        (checkpoint_dir.empty() ? step_dir : checkpoint_dir) +
        "; checkpoint.resume=never would start from step 0 but write into the old run's "
        "folder)");
  }
  return OkStatus();
}

}  // namespace

Status CheckResumeFits(const std::string& step_dir, const JobSpec& spec) {
  MESHRUN_ASSIGN_OR_RETURN(CheckpointReader reader, CheckpointReader::Open(step_dir));
  MESHRUN_RETURN_IF_ERROR(CheckCheckpointFits(reader, GPT2ParamLayout(GPT2ConfigOf(spec.model)),
                                              step_dir, spec.checkpoint.dir));
  const nlohmann::json trainer =
      nlohmann::json::parse(reader.metadata().trainer_json, nullptr, /*allow_exceptions=*/false);
  MESHRUN_RETURN_IF_ERROR(CheckResumeOptimizer(trainer, spec, step_dir));
  return CheckResumeData(trainer, spec, step_dir);
}

Status Trainer::LoadCheckpoint(const std::string& step_dir) {
  MESHRUN_ASSIGN_OR_RETURN(CheckpointReader reader, CheckpointReader::Open(step_dir));
  MESHRUN_RETURN_IF_ERROR(
      CheckCheckpointFits(reader, model_->params(), step_dir, spec_.checkpoint.dir));
  nlohmann::json trainer =
      nlohmann::json::parse(reader.metadata().trainer_json, nullptr, /*allow_exceptions=*/false);
  if (trainer.is_discarded() || !trainer.contains("step") || !trainer["step"].is_number_integer()) {
    return DataLossError("checkpoint " + step_dir + ": metadata has no trainer step");
  }
  MESHRUN_RETURN_IF_ERROR(CheckResumeOptimizer(trainer, spec_, step_dir));
  // Only the byte ranges of this rank's shard are read, whatever mesh wrote them.
  ShardedState::HostState host;  // read on the host, then copied to the shard's device
  Optimizer::HostState state;
  MESHRUN_RETURN_IF_ERROR(shards_->ToHost(&host));
  MESHRUN_RETURN_IF_ERROR(optimizer_->ToHost(&state));
  const std::vector<std::string>& names = optimizer_->state_names();
  float* params = host.params;
  for (const ShardSegment& s : shards_->segments()) {
    const ParamInfo& p = model_->params()[s.param];
    for (const ParamPiece& piece : PiecesOf(p, s.param_first, s.count)) {
      const int64_t at = s.shard_offset + (piece.local_first - s.param_first);
      MESHRUN_RETURN_IF_ERROR(
          reader.ReadSlice(ModelKey(p), piece.offset, piece.shape, params + at));
      int64_t n = 1;
      for (int64_t d : piece.shape) n *= d;
      for (size_t i = 0; i < names.size(); ++i) {
        // A checkpoint without optimizer state (e.g. converted weights) starts it at zero.
        if (reader.HasTensor(StateKey(names[i], p))) {
          MESHRUN_RETURN_IF_ERROR(reader.ReadSlice(StateKey(names[i], p), piece.offset, piece.shape,
                                                   state.states[i] + at));
        } else {
          std::fill(state.states[i] + at, state.states[i] + at + n, 0.f);
        }
      }
    }
  }
  MESHRUN_RETURN_IF_ERROR(shards_->FromHost(host));
  MESHRUN_RETURN_IF_ERROR(optimizer_->FromHost(state));
  step_ = trainer["step"].get<int64_t>();
  MESHRUN_RETURN_IF_ERROR(CheckResumeData(trainer, spec_, step_dir));
  // The shuffled rule the checkpoint was written under (decision 0042): a data record without
  // "shuffle" predates the Feistel order, and its run continues with the stored Fisher–Yates
  // permutation it was reading.
  {
    ShuffleRule rule = ShuffleRule::kFisherYates;
    const auto it = trainer.find("data");
    if (it != trainer.end() && it->is_object() && it->contains("shuffle")) {
      const nlohmann::json& name = (*it)["shuffle"];
      StatusOr<ShuffleRule> parsed = name.is_string() ? ParseShuffleRule(name.get<std::string>())
                                                      : InvalidArgumentError("not a string");
      if (!parsed.ok()) {
        return DataLossError("checkpoint " + step_dir + ": data.shuffle " + name.dump() +
                             " is not a shuffled order this meshrun knows (feistel, fisher-yates) "
                             "(hint: resume with the meshrun version that wrote it)");
      }
      rule = *parsed;
    }
    sampler_->set_shuffle(rule);
  }
  // The per-source counters the checkpoint recorded are the ones the order gives at this step
  // (when the global batch is the one it was written with: the slot is then the same).
  if (const auto it = trainer.find("data");
      it != trainer.end() && it->is_object() &&
      it->value("slot", nlohmann::json()) == nlohmann::json(step_ * sampler_->global_batch())) {
    const std::vector<int64_t> counts = sampler_->CountsBefore(step_);
    const nlohmann::json sources = it->value("sources", nlohmann::json::array());
    for (size_t i = 0; sources.is_array() && i < sources.size() && i < counts.size(); ++i) {
      const nlohmann::json taken =
          sources[i].is_object() ? sources[i].value("taken", nlohmann::json()) : nlohmann::json();
      if (taken.is_number_integer() && taken.get<int64_t>() != counts[i]) {
        return DataLossError("checkpoint " + step_dir + ": source " + std::to_string(i) +
                             " of data.train had given " + std::to_string(taken.get<int64_t>()) +
                             " windows at step " + std::to_string(step_) +
                             ", the order of docs/data.md gives " + std::to_string(counts[i]) +
                             " (hint: resume with the meshrun version that wrote it)");
      }
    }
  }
  resumed_source_.clear();
  if (const auto it = trainer.find("source"); it != trainer.end() && it->is_object()) {
    resumed_source_ = it->dump();
  }
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
  // Rank 0 decides; the others learn the step (rank 0's value summed over tp, then dp_cp: the
  // whole world). Its code: step + 1 when found, 0 when there is none, −1 when it failed.
  double code = 0;
  Status failed;
  if (ctx_.rank == 0) {
    std::vector<std::string> warnings;
    StatusOr<LatestCheckpoint> latest = FindLatestComplete(spec_.checkpoint.dir, &warnings);
    for (const std::string& w : warnings) observer->OnLog("warning: " + w);
    if (latest.ok()) {
      code = static_cast<double>(latest->step) + 1;
    } else if (latest.status().code() != StatusCode::kNotFound) {
      failed = latest.status();
      code = -1;
    }
  }
  MESHRUN_ASSIGN_OR_RETURN(code, SumOverWorld(code, CommCharge::Control()));
  if (code < 0) {
    if (!failed.ok()) return failed;
    return FailedPreconditionError("checkpoint.dir: rank 0 could not choose a checkpoint in " +
                                   spec_.checkpoint.dir + " (hint: see rank 0's log)");
  }
  if (code == 0) {
    return NotFoundError("checkpoint.dir: no complete checkpoint in " + spec_.checkpoint.dir);
  }
  const int64_t step = static_cast<int64_t>(code) - 1;
  const std::string step_dir = StepDir(spec_.checkpoint.dir, step);
  MESHRUN_RETURN_IF_ERROR(ResumeFrom(step_dir, observer));
  observer->OnResumed(step, step_dir);
  return OkStatus();
}

Status Trainer::ResumeFrom(const std::string& step_dir, TrainObserver* observer) {
  MESHRUN_ASSIGN_OR_RETURN(CheckpointMetadata metadata, ReadMetadata(step_dir));
  MESHRUN_RETURN_IF_ERROR(LoadCheckpoint(step_dir));
  const MeshSizes& saved = metadata.mesh;
  observer->OnLog("resumed from " + step_dir + " at step " + std::to_string(step_) +
                  " (saved under dp_replicate=" + std::to_string(saved.dp_replicate) +
                  " dp_shard=" + std::to_string(saved.dp_shard) +
                  " cp=" + std::to_string(saved.cp) + " tp=" + std::to_string(saved.tp) + ")");
  const StatusOr<Order> order = ParseOrder(spec_.data.order);
  if (sampler_->shuffle() == ShuffleRule::kFisherYates && order.ok() &&
      *order == Order::kShuffled) {
    observer->OnLog("note: " + step_dir +
                    " was written before the Feistel shuffled order; this run continues its "
                    "stored Fisher-Yates order (8 bytes a window per rank; docs/data.md)");
  }
  return OkStatus();
}

int32_t HuggingFaceEosId(const std::string& dir) {
  const nlohmann::json id = ReadHuggingFaceIdentity(dir);
  const auto it = id.find("eos_token_id");
  if (it == id.end()) return -1;
  const nlohmann::json& eos = it->is_array() && !it->empty() ? (*it)[0] : *it;
  return eos.is_number_integer() ? eos.get<int32_t>() : -1;
}

Status LoadHuggingFaceShard(const std::string& dir, const GPT2Config& cfg, ShardedState* shards) {
  MESHRUN_ASSIGN_OR_RETURN(HuggingFaceWeights weights, OpenHuggingFaceChecked(dir, cfg));
  return shards->LoadPieces(
      [&](const ParamInfo& p, const Box& box, float* out) { return weights.ReadBox(p, box, out); });
}

}  // namespace meshrun
