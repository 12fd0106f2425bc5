// The loss mask of a window's targets (flags → kIgnoreTarget) and the mask files beside token
// files (docs/data.md "Loss masks"); no tokenizer needed, so engine-only builds have it too.
#include <algorithm>
#include <cctype>
#include <cstring>

#include "common/atomic_file.h"
#include "engine/data/instruction.h"
#include "engine/data/mapped_tokens.h"

namespace meshrun {

bool IsJsonlPath(const std::string& path) {
  if (path.size() < 6) return false;
  std::string ext = path.substr(path.size() - 6);
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext == ".jsonl";
}

StatusOr<int64_t> MaskTargets(const TokenStream& stream, int64_t first, int count, LossOn loss_on,
                              int32_t* targets) {
  if (!stream.has_flags()) {
    if (loss_on == LossOn::kAll) return int64_t{count};
    std::fill(targets, targets + count, kIgnoreTarget);  // refused earlier by CheckStreamLossMask
    return int64_t{0};
  }
  thread_local std::vector<uint8_t> flags;
  flags.resize(static_cast<size_t>(count));
  MESHRUN_RETURN_IF_ERROR(stream.ReadFlags(first, count, flags.data()));
  int64_t n = 0;
  for (int i = 0; i < count; ++i) {
    if (IsLossTarget(flags[static_cast<size_t>(i)], loss_on)) {
      ++n;
    } else {
      targets[i] = kIgnoreTarget;
    }
  }
  return n;
}

StatusOr<int64_t> CountTargets(const TokenStream& stream, int64_t first, int count,
                               LossOn loss_on) {
  if (!stream.has_flags()) return loss_on == LossOn::kAll ? int64_t{count} : int64_t{0};
  thread_local std::vector<uint8_t> flags;
  flags.resize(static_cast<size_t>(count));
  MESHRUN_RETURN_IF_ERROR(stream.ReadFlags(first, count, flags.data()));
  int64_t n = 0;
  for (uint8_t f : flags) n += IsLossTarget(f, loss_on) ? 1 : 0;
  return n;
}

Status CheckStreamLossMask(const TokenStream& stream, const JobSpec& spec,
                           const std::string& field) {
  if (spec.train.loss_on_mode() == LossOn::kCompletion && !stream.has_flags()) {
    return InvalidArgumentError(
        "train.loss_on: completion, but " + field + " (" + stream.path +
        ") marks no completion tokens (hint: give JSONL records with prompt/completion or "
        "messages, or token files that meshrun tokenize --template wrote with their .mask; or "
        "set loss_on: all)");
  }
  if (stream.window_seq_len > 0 && stream.window_seq_len != spec.model.seq_len) {
    return InvalidArgumentError(
        field + ": " + stream.path + " is laid out in windows of seq_len " +
        std::to_string(stream.window_seq_len) + ", but model.seq_len is " +
        std::to_string(spec.model.seq_len) + " (hint: set model.seq_len to " +
        std::to_string(stream.window_seq_len) + ", or tokenize again with --seq-len " +
        std::to_string(spec.model.seq_len) + ")");
  }
  return OkStatus();
}

Status WriteMaskFile(const std::string& path, const std::vector<uint8_t>& flags, int seq_len) {
  std::string out(static_cast<size_t>(kMaskHeaderBytes) + flags.size(), '\0');
  std::memcpy(out.data(), kMaskMagic, sizeof(kMaskMagic));
  auto put32 = [&](size_t at, uint32_t v) {
    for (int k = 0; k < 4; ++k) out[at + k] = static_cast<char>((v >> (8 * k)) & 0xFF);
  };
  put32(8, 1);
  put32(12, static_cast<uint32_t>(seq_len));
  if (!flags.empty()) std::memcpy(out.data() + kMaskHeaderBytes, flags.data(), flags.size());
  return WriteFileAtomic(path, out);
}

}  // namespace meshrun
