// CheckBeforeTraining (see preflight.h).
#include "client/preflight.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/memory_estimate.h"
#include "coordinator/plan_submission.h"
#include "engine/data/instruction.h"
#include "engine/data/token_stream.h"
#include "engine/io/checkpoint.h"
#include "engine/model/hf_checkpoint.h"
#include "engine/train/counted_step.h"
#include "engine/train/device.h"
#include "engine/train/trainer.h"

namespace meshrun::client {
namespace {

namespace fs = std::filesystem;

// Streams up to this size are loaded in full (exactly what a rank does); larger ones are only
// opened and read from, so `validate` stays quick on a corpus of many gigabytes.
constexpr uintmax_t kFullCheckBytes = 64ull << 20;

uintmax_t BytesUnder(const fs::path& path) {
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) return fs::file_size(path, ec);
  uintmax_t total = 0;
  for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_regular_file(ec)) total += it->file_size(ec);
    if (total > kFullCheckBytes) break;
  }
  return total;
}

Status CheckStream(const char* field, const std::string& path, const JobSpec& spec,
                   const PreflightOptions& options, std::string* vocab_note) {
  const std::string prefix = std::string(field) + ": ";
  std::error_code ec;
  if (!fs::exists(path, ec) && !IsDataGlob(path)) {
    return InvalidArgumentError(prefix + path +
                                ": no such file or folder (hint: check the path; relative paths "
                                "are resolved from the working directory)");
  }
  // The vocabulary of text first: it needs no tokenizing.
  StatusOr<std::string> format = ResolveDataFormat(path, spec.data.format);
  if (format.ok() && *format == "text") {
    MESHRUN_RETURN_IF_ERROR(CheckTextVocab(spec, field, vocab_note));
  }
  const bool text = format.ok() && *format == "text";
  if (format.ok() && !text) {
    // Token files are mapped: loading reads each shard's header and size only, whatever the
    // size of the data. Their ids are read (for the vocabulary check) only up to 64 MiB.
    StatusOr<TokenStream> stream = LoadTokens(path, spec.data.format, LoadOptionsOf(spec));
    if (!stream.ok()) return InvalidArgumentError(prefix + stream.status().message());
    uint64_t bytes = 0;
    for (const TokenShard& shard : stream->mapped->shards()) bytes += shard.map_bytes;
    if (bytes <= kFullCheckBytes) {
      StatusOr<int32_t> max_id = MaxTokenId(*stream);
      if (!max_id.ok()) {
        const std::string& m = max_id.status().message();
        return InvalidArgumentError(m.rfind("model.vocab_size: ", 0) == 0 ? m : prefix + m);
      }
      stream->max_token_id = *max_id;
    }
    MESHRUN_RETURN_IF_ERROR(CheckStreamVocab(*stream, spec, field));
    MESHRUN_RETURN_IF_ERROR(CheckStreamLossMask(*stream, spec, field));
    return CheckStreamWindow(*stream, spec, field);
  }
  const bool fill = text && options.fill_token_cache && !spec.data.tokenizer.empty();
  if (!fill && BytesUnder(path) > kFullCheckBytes) {
    if (fs::is_regular_file(path, ec)) {
      std::ifstream in(path, std::ios::binary);
      char byte = 0;
      if (!in || !in.read(&byte, 1)) {
        return InvalidArgumentError(prefix + path + ": cannot be read: " + std::strerror(errno) +
                                    " (hint: check its permissions)");
      }
    }
    return OkStatus();
  }
  LoadOptions load = LoadOptionsOf(spec);
  if (!fill) load.cache_dir.clear();  // validate and submit leave nothing behind
  StatusOr<TokenStream> stream = LoadTokens(path, spec.data.format, load);
  if (!stream.ok()) {
    const std::string& m = stream.status().message();
    if (m.rfind("data.tokenizer: ", 0) == 0 || m.rfind("data.template: ", 0) == 0) {
      return stream.status();
    }
    return InvalidArgumentError(prefix + m);
  }
  if (fill && options.note) {
    options.note(std::string(field) + ": " + std::to_string(stream->size()) + " tokens " +
                 (stream->format == "jsonl"    ? "rendered and tokenized (instruction data is "
                                                 "not cached; meshrun tokenize prepares it once)"
                  : stream->cache_path.empty() ? "tokenized (no checkpoint.dir: not cached)"
                  : stream->from_cache         ? "read from the cache " + stream->cache_path
                                               : "tokenized into the cache " + stream->cache_path));
  }
  MESHRUN_RETURN_IF_ERROR(CheckStreamVocab(*stream, spec, field));
  MESHRUN_RETURN_IF_ERROR(CheckStreamLossMask(*stream, spec, field));
  return CheckStreamWindow(*stream, spec, field);
}

// model.init_from: the check every rank makes before loading its slices (engine's
// OpenHuggingFaceChecked), run once here before any data is read or tokenized.
Status CheckInitFrom(const JobSpec& spec) {
  std::error_code ec;
  const fs::path dir(spec.model.init_from);
  const char* missing = nullptr;
  if (!fs::is_directory(dir, ec)) {
    return InvalidArgumentError(
        "model.init_from: " + spec.model.init_from +
        (fs::exists(dir, ec) ? " is not a folder" : ": no such folder") +
        " (hint: point it at a Hugging Face GPT-2 or Llama folder, e.g. one `meshrun export` "
        "wrote)");
  }
  if (!fs::is_regular_file(dir / "config.json", ec)) {
    missing = "config.json";
  } else if (!fs::is_regular_file(dir / "model.safetensors", ec) &&
             !fs::is_regular_file(dir / "model.safetensors.index.json", ec)) {
    missing = "model.safetensors (or model.safetensors.index.json and its shards)";
  }
  if (missing != nullptr) {
    return InvalidArgumentError("model.init_from: " + spec.model.init_from + " has no " + missing +
                                " (hint: point it at a Hugging Face GPT-2 or Llama folder, e.g. "
                                "one `meshrun export` wrote)");
  }
  return OpenHuggingFaceChecked(spec.model.init_from, GPT2ConfigOf(spec.model)).status();
}

// checkpoint.resume auto: the newest complete checkpoint under checkpoint.dir (the one train
// resumes from) holds this model's tensors (the check each rank makes when it loads it).
Status CheckResume(const JobSpec& spec) {
  if (spec.checkpoint.dir.empty() || spec.checkpoint.resume != "auto") return OkStatus();
  std::error_code ec;
  if (!fs::is_directory(spec.checkpoint.dir, ec)) return OkStatus();
  std::vector<std::string> warnings;
  StatusOr<LatestCheckpoint> latest = FindLatestComplete(spec.checkpoint.dir, &warnings);
  if (!latest.ok()) return OkStatus();  // none to resume (train warns about damaged ones)
  return CheckResumeFits(latest->step_dir, spec);
}

// checkpoint.dir must be a folder this process can create entries in, or one it can create:
// probed in the folder itself, or else in its nearest existing parent.
Status CheckCheckpointDir(const std::string& dir) {
  const std::string prefix = "checkpoint.dir: " + dir;
  std::error_code ec;
  fs::path probe_in = fs::absolute(dir, ec);
  while (!fs::exists(probe_in, ec) && probe_in.has_parent_path() &&
         probe_in.parent_path() != probe_in) {
    probe_in = probe_in.parent_path();
  }
  if (!fs::is_directory(probe_in, ec)) {
    return InvalidArgumentError(prefix + ": " + probe_in.string() +
                                " is not a folder, so no checkpoint can be written there (hint: "
                                "set checkpoint.dir to a folder you can write, e.g. --set "
                                "checkpoint.dir=/tmp/ck)");
  }
  std::string pattern = (probe_in / ".meshrun-write-check-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) {
    const int err = errno;
    return InvalidArgumentError(prefix + ": cannot create anything in " + probe_in.string() + ": " +
                                std::strerror(err) +
                                " (hint: set checkpoint.dir to a folder you can write, e.g. "
                                "--set checkpoint.dir=/tmp/ck)");
  }
  fs::remove(pattern, ec);
  return OkStatus();
}

}  // namespace

std::vector<std::string> SpecNotes(const JobSpec& spec) {
  std::vector<std::string> notes;
  if (spec.checkpoint.dir.empty()) {
    notes.push_back(
        "note: checkpoint.dir is not set, so this run saves nothing: no checkpoint to resume, "
        "evaluate or export (hint: set checkpoint.dir, e.g. --set checkpoint.dir=ck)");
  }
  if (spec.train.lr == 0) {
    notes.push_back(
        "warning: train.lr: 0 leaves the weights as they start, so the loss only measures them "
        "(hint: set a learning rate such as --set train.lr=3e-4; lr 0 is for turning "
        "model.init_from weights into a checkpoint unchanged)");
  }
  return notes;
}

double HostMemoryBytes() {
  return meshrun::HostMemoryBytes();
}

Status CheckBeforeTraining(const JobSpec& spec, const ParallelDims& mesh,
                           const PreflightOptions& options) {
  if (options.check_device) MESHRUN_RETURN_IF_ERROR(CheckTrainingDevice(spec.resources.device));
  if (options.check_paths) {
    // The model first (quick, and wrong more often than the data), then where it is saved and
    // what it resumes, then the data, which may take long to tokenize.
    if (!spec.model.init_from.empty()) MESHRUN_RETURN_IF_ERROR(CheckInitFrom(spec));
    if (!spec.checkpoint.dir.empty()) {
      MESHRUN_RETURN_IF_ERROR(CheckCheckpointDir(spec.checkpoint.dir));
      MESHRUN_RETURN_IF_ERROR(CheckResume(spec));
    }
    std::string vocab_note;  // a padded vocabulary: said once, for every stream
    const std::vector<DataSource> sources = TrainSources(spec.data);
    for (size_t i = 0; i < sources.size(); ++i) {
      const std::string field = TrainSourceField(spec.data, i);
      MESHRUN_RETURN_IF_ERROR(
          CheckStream(field.c_str(), sources[i].path, spec, options, &vocab_note));
    }
    if (!spec.data.val.empty()) {
      MESHRUN_RETURN_IF_ERROR(CheckStream("data.val", spec.data.val, spec, options, &vocab_note));
    }
    if (!vocab_note.empty() && options.note) options.note(vocab_note);
  }
  if (options.host_memory_bytes >= 0) {
    const double host =
        options.host_memory_bytes > 0 ? options.host_memory_bytes : HostMemoryBytes();
    // The engine's own step, counted (engine/train/counted_step.h: the largest rank's buffers,
    // allocated on the counting device).
    MESHRUN_ASSIGN_OR_RETURN(const double rank_bytes, CountedRankBytes(spec));
    MESHRUN_RETURN_IF_ERROR(CheckJobFitsHost(spec, mesh, options.ranks_on_host, host, rank_bytes));
  }
  return OkStatus();
}

}  // namespace meshrun::client
