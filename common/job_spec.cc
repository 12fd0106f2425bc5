// ValidateJobSpec: per-field ranges and enums in spec order, then the cross-field mesh rules of
// docs/job-spec.md. Every error names the field, the values and a fix.
#include "common/job_spec.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <type_traits>

#include "common/escape.h"

namespace meshrun {
namespace {

Status Invalid(const std::string& path, const std::string& what, const std::string& hint) {
  return InvalidArgumentError(path + ": " + what + " (hint: " + hint + ")");
}

template <typename T>
requires std::is_integral_v<T> std::string Str(T v) {
  return std::to_string(v);
}

// The shortest form that reads back as the same double.
std::string Str(double v) {
  char buf[64];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

// "a", "a or b", "a, b or c".
std::string JoinOr(const std::vector<std::string>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += (i + 1 == items.size()) ? " or " : ", ";
    out += items[i];
  }
  return out;
}

std::string JoinOr(const std::vector<int64_t>& values) {
  std::vector<std::string> items;
  for (int64_t v : values) items.push_back(Str(v));
  return JoinOr(items);
}

// Up to `count` candidates closest to `target` (ties go to the smaller), `target` itself left
// out, returned ascending. Used to suggest valid sizes in hints.
std::vector<int64_t> Closest(std::vector<int64_t> candidates, int64_t target, size_t count = 2) {
  std::erase(candidates, target);
  std::sort(candidates.begin(), candidates.end(), [target](int64_t a, int64_t b) {
    const int64_t da = std::llabs(a - target), db = std::llabs(b - target);
    return da != db ? da < db : a < b;
  });
  if (candidates.size() > count) candidates.resize(count);
  std::sort(candidates.begin(), candidates.end());
  return candidates;
}

std::vector<int64_t> Divisors(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t d = 1; d * d <= n; ++d) {
    if (n % d != 0) continue;
    out.push_back(d);
    if (d != n / d) out.push_back(n / d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The multiples of `step` just below (when positive) and just above `value`.
std::vector<int64_t> NearbyMultiples(int64_t value, int64_t step) {
  std::vector<int64_t> out;
  const int64_t below = value / step * step;
  if (below > 0) out.push_back(below);
  out.push_back(below + step);
  return out;
}

bool IsValidUtf8WithoutControls(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) return false;
    if (c < 0x80) {
      ++i;
      continue;
    }
    int extra = 0;
    uint32_t cp = 0;
    if ((c & 0xe0) == 0xc0) {
      extra = 1, cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      extra = 2, cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      extra = 3, cp = c & 0x07;
    } else {
      return false;
    }
    if (i + extra >= s.size()) return false;
    for (int k = 1; k <= extra; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    static constexpr uint32_t kMinForLength[4] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMinForLength[extra] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    if (cp >= 0x80 && cp < 0xa0) return false;  // C1 controls
    if (IsBidiControl(cp)) return false;        // they reorder what a terminal shows
    // Noncharacters (U+FFFE, U+FFFF in every plane, U+FDD0..U+FDEF): yaml-cpp reads them back as
    // U+FFFD, so a spec holding one would not survive the YAML it is written as (found by
    // fuzz/set_override: an override value starting with a NUL byte is decoded as UTF-16).
    if ((cp & 0xfffe) == 0xfffe || (cp >= 0xfdd0 && cp <= 0xfdef)) return false;
    i += extra + 1;
  }
  return true;
}

Status CheckName(const std::string& name) {
  const bool chars_ok = std::all_of(name.begin(), name.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_' || ch == '.';
  });
  if (name.empty() || name.size() > 128 || !chars_ok) {
    return Invalid("name", QuoteForMessage(name) + " is not a valid job name",
                   "use 1 to 128 letters, digits, '-', '_' or '.', e.g. tiny-demo");
  }
  return OkStatus();
}

// Every string field: printable UTF-8 of sane length; enum fields: one of their values.
Status CheckStrings(const JobSpec& spec) {
  Status status;
  ForEachJobSpecField(spec, [&](std::string_view section, std::string_view key, const auto& value) {
    using T = std::decay_t<decltype(value)>;
    if constexpr (std::is_same_v<T, std::string>) {
      if (!status.ok() || section.empty()) return;
      const std::string path = std::string(section) + "." + std::string(key);
      // A template spelled out in the spec (data.template) may hold newlines and tabs.
      std::string plain = value;
      if (path == "data.template")
        std::replace_if(
            plain.begin(), plain.end(), [](char c) { return c == '\n' || c == '\t'; }, ' ');
      if (value.size() > 4096 || !IsValidUtf8WithoutControls(plain)) {
        status = Invalid(path, "contains control characters, invalid UTF-8 or over 4096 bytes",
                         "write a plain path or word");
        return;
      }
      const std::vector<std::string> allowed = AllowedValues(section, key);
      if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), value) == allowed.end()) {
        std::vector<std::string> quoted;
        for (const auto& a : allowed) quoted.push_back("'" + a + "'");
        status = Invalid(path, QuoteForMessage(value) + " is not one of " + JoinOr(quoted),
                         "use " + JoinOr(quoted));
      }
    }
  });
  return status;
}

Status AtLeast(const std::string& path, int64_t value, int64_t min, const std::string& hint) {
  if (value >= min) return OkStatus();
  return Invalid(path, "must be at least " + Str(min) + ", got " + Str(value), hint);
}

// Finite and in [min, max) or [min, max] (max_inclusive), or > min when min_exclusive.
Status InRange(const std::string& path, double value, double min, bool min_exclusive, double max,
               bool max_inclusive, const std::string& hint) {
  const bool ok = std::isfinite(value) && (min_exclusive ? value > min : value >= min) &&
                  (max_inclusive ? value <= max : value < max);
  if (ok) return OkStatus();
  std::string range = std::string(min_exclusive ? "(" : "[") + Str(min) + ", " +
                      (std::isinf(max) ? "inf" : Str(max)) + (max_inclusive ? "]" : ")");
  return Invalid(path, "must be a finite number in " + range + ", got " + Str(value), hint);
}

constexpr double kInf = INFINITY;

Status CheckModel(const ModelSpec& m) {
  MESHRUN_RETURN_IF_ERROR(AtLeast("model.n_layer", m.n_layer, 1, "use 1 or more layers"));
  MESHRUN_RETURN_IF_ERROR(AtLeast("model.n_head", m.n_head, 1, "use 1 or more heads"));
  MESHRUN_RETURN_IF_ERROR(AtLeast("model.d_model", m.d_model, 1, "use a positive width, e.g. 64"));
  MESHRUN_RETURN_IF_ERROR(
      AtLeast("model.seq_len", m.seq_len, 1, "use a positive context length, e.g. 64"));
  MESHRUN_RETURN_IF_ERROR(AtLeast("model.vocab_size", m.vocab_size, 1,
                                  "use 256 for byte-level text, 50257 for GPT-2 tokens"));
  MESHRUN_RETURN_IF_ERROR(
      AtLeast("model.n_kv_head", m.n_kv_head, 0, "use 0 (= n_head) or a divisor of n_head"));
  MESHRUN_RETURN_IF_ERROR(AtLeast("model.d_ff", m.d_ff, 0, "use 0 (= 4·d_model) or a width"));
  MESHRUN_RETURN_IF_ERROR(InRange("model.norm_eps", m.norm_eps, 0, true, 1, false,
                                  "use a small positive value such as 1e-5"));
  MESHRUN_RETURN_IF_ERROR(InRange("model.rope_theta", m.rope_theta, 1, false, kInf, false,
                                  "use 10000 (Llama 2) or 500000 (Llama 3)"));
  MESHRUN_RETURN_IF_ERROR(AtLeast("model.sliding_window", m.sliding_window, 0,
                                  "use 0 (no window) or the keys each query sees, e.g. 4096"));
  // A window the family's Hugging Face class cannot hold would train a model that init_from and
  // export cannot carry (Architecture::sliding_window).
  if (m.sliding_window > 0 && FindArchitecture(m.arch) != nullptr &&
      !FindArchitecture(m.arch)->sliding_window) {
    std::vector<std::string> with;
    for (const Architecture& a : Architectures()) {
      if (a.sliding_window) with.push_back(std::string(a.name));
    }
    return Invalid("model.sliding_window",
                   Str(m.sliding_window) + " with arch " + m.arch + ", whose Hugging Face class (" +
                       std::string(FindArchitecture(m.arch)->hf_class) +
                       ") has no sliding window: an exported model would attend to every key",
                   "remove model.sliding_window, or use arch " + JoinOr(with));
  }
  const bool gpt2 = m.arch == "gpt2";
  if (gpt2) {
    // Fields of the Llama family only: a gpt2 spec that sets them means another architecture.
    auto llama_only = [&](const char* field, bool set, const std::string& value) -> Status {
      if (!set) return OkStatus();
      return Invalid(std::string("model.") + field,
                     value + " applies to arch llama only (gpt2 has " +
                         (std::string(field) == "d_ff" ? "4·d_model" : "no such setting") + ")",
                     std::string("remove model.") + field + ", or set model.arch: llama");
    };
    MESHRUN_RETURN_IF_ERROR(
        llama_only("n_kv_head", m.n_kv_head != 0 && m.n_kv_head != m.n_head, Str(m.n_kv_head)));
    MESHRUN_RETURN_IF_ERROR(
        llama_only("d_ff", m.d_ff != 0 && m.d_ff != 4 * m.d_model, Str(m.d_ff)));
    MESHRUN_RETURN_IF_ERROR(llama_only("rope_scaling.type", m.rope_scaling_type != "none",
                                       QuoteForMessage(m.rope_scaling_type)));
    MESHRUN_RETURN_IF_ERROR(llama_only("attention_bias", m.attention_bias, "true"));
  }
  if (m.n_head % m.kv_heads() != 0) {
    return Invalid("model.n_kv_head",
                   "model.n_head(" + Str(m.n_head) + ") is not divisible by n_kv_head(" +
                       Str(m.kv_heads()) + ")",
                   "use an n_kv_head that divides " + Str(m.n_head) + ", such as " +
                       JoinOr(Closest(Divisors(m.n_head), m.kv_heads())));
  }
  MESHRUN_RETURN_IF_ERROR(AtLeast("model.head_dim", m.head_dim, 0,
                                  "use 0 (= d_model/n_head) or the width of one head"));
  if (m.head_dim != 0 && !m.family().free_head_dim && m.head_dim != m.d_model / m.n_head) {
    return Invalid("model.head_dim",
                   Str(m.head_dim) + " is not d_model/n_head = " + Str(m.d_model / m.n_head) +
                       " (arch " + m.arch + " has heads of d_model/n_head)",
                   "remove model.head_dim, or use an arch whose head width is free");
  }
  if (m.head_dim != 0 && m.head_dim % 2 != 0) {
    return Invalid("model.head_dim", Str(m.head_dim) + " is odd (rotary embeddings rotate pairs)",
                   "use an even head width, e.g. " + Str(m.head_dim + 1));
  }
  if (m.head_dim == 0 && !gpt2 && (m.d_model / m.n_head) % 2 != 0) {
    return Invalid("model.d_model",
                   "the head width d_model/n_head = " + Str(m.d_model / m.n_head) +
                       " is odd (rotary embeddings rotate pairs)",
                   "use an even head width, e.g. d_model " + Str(2 * m.d_model));
  }
  if (m.rope_scaling_type == "llama3") {
    MESHRUN_RETURN_IF_ERROR(InRange("model.rope_scaling.factor", m.rope_scaling_factor, 0, true,
                                    kInf, false, "use the checkpoint's factor, e.g. 8"));
    MESHRUN_RETURN_IF_ERROR(InRange("model.rope_scaling.low_freq_factor",
                                    m.rope_scaling_low_freq_factor, 0, true, kInf, false,
                                    "use e.g. 1"));
    if (!(m.rope_scaling_high_freq_factor > m.rope_scaling_low_freq_factor)) {
      return Invalid("model.rope_scaling.high_freq_factor",
                     Str(m.rope_scaling_high_freq_factor) +
                         " must be larger than low_freq_factor(" +
                         Str(m.rope_scaling_low_freq_factor) + ")",
                     "use e.g. low 1, high 4");
    }
    MESHRUN_RETURN_IF_ERROR(AtLeast("model.rope_scaling.original_max_position_embeddings",
                                    m.rope_scaling_original_max_position_embeddings, 1,
                                    "use the checkpoint's value, e.g. 8192"));
  }
  return OkStatus();
}

Status CheckTrain(const TrainSpec& t) {
  MESHRUN_RETURN_IF_ERROR(AtLeast("train.steps", t.steps, 1, "train for 1 or more steps"));
  MESHRUN_RETURN_IF_ERROR(AtLeast("train.global_batch_size", t.global_batch_size, 1,
                                  "use 1 or more sequences per step"));
  MESHRUN_RETURN_IF_ERROR(AtLeast("train.micro_batch_size", t.micro_batch_size, 1,
                                  "use 1 or more sequences per micro-batch"));
  MESHRUN_RETURN_IF_ERROR(
      InRange("train.lr", t.lr, 0, false, kInf, false, "use a learning rate such as 3e-4"));
  MESHRUN_RETURN_IF_ERROR(InRange("train.min_lr", t.min_lr, 0, false, kInf, false,
                                  "use a final learning rate such as lr/10"));
  if (t.min_lr > t.lr) {
    return Invalid("train.min_lr", Str(t.min_lr) + " is larger than train.lr(" + Str(t.lr) + ")",
                   "use a min_lr no larger than lr, such as " + Str(t.lr / 10));
  }
  MESHRUN_RETURN_IF_ERROR(
      AtLeast("train.warmup_steps", t.warmup_steps, 0, "use 0 for no warmup, or a few steps"));
  if (t.warmup_steps > t.steps) {
    return Invalid("train.warmup_steps",
                   Str(t.warmup_steps) + " is more than train.steps(" + Str(t.steps) + ")",
                   "use a warmup_steps of at most " + Str(t.steps));
  }
  MESHRUN_RETURN_IF_ERROR(InRange("train.weight_decay", t.weight_decay, 0, false, kInf, false,
                                  "use 0 for none, or e.g. 0.1"));
  MESHRUN_RETURN_IF_ERROR(InRange("train.grad_clip", t.grad_clip, 0, false, kInf, false,
                                  "use 0 to disable clipping, or e.g. 1.0"));
  MESHRUN_RETURN_IF_ERROR(
      InRange("train.beta1", t.beta1, 0, false, 1, false, "use a value in [0, 1) such as 0.9"));
  MESHRUN_RETURN_IF_ERROR(
      InRange("train.beta2", t.beta2, 0, false, 1, false, "use a value in [0, 1) such as 0.95"));
  MESHRUN_RETURN_IF_ERROR(
      InRange("train.eps", t.eps, 0, true, kInf, false, "use a small positive value such as 1e-8"));
  MESHRUN_RETURN_IF_ERROR(InRange("train.lion.beta1", t.lion_beta1, 0, false, 1, false,
                                  "use a value in [0, 1) such as 0.9"));
  MESHRUN_RETURN_IF_ERROR(InRange("train.lion.beta2", t.lion_beta2, 0, false, 1, false,
                                  "use a value in [0, 1) such as 0.99"));
  return AtLeast("train.seed", t.seed, 0, "use a non-negative seed such as 1337");
}

// data.train as a list: a weighted mixture (docs/data.md "Mixtures").
Status CheckTrainSources(const DataSpec& d) {
  if (!d.train.empty()) {
    return Invalid("data.train", "holds both a path and a list of sources",
                   "give either one path or a list [{path: PATH, weight: W}, ...]");
  }
  if (d.train_sources.size() > static_cast<size_t>(kMaxDataSources)) {
    return Invalid("data.train",
                   "lists " + Str(d.train_sources.size()) + " sources, over the limit of " +
                       Str(kMaxDataSources),
                   "merge sources into fewer files or folders");
  }
  double sum = 0;
  for (size_t i = 0; i < d.train_sources.size(); ++i) {
    const DataSource& s = d.train_sources[i];
    const std::string field = "data.train[" + Str(i) + "]";
    if (s.path.empty()) {
      return Invalid(field + ".path", "required field is missing",
                     "give each source a path: {path: PATH, weight: W}");
    }
    if (s.path.size() > 4096 || !IsValidUtf8WithoutControls(s.path)) {
      return Invalid(field + ".path",
                     "contains control characters, invalid UTF-8 or over 4096 bytes",
                     "write a plain path");
    }
    MESHRUN_RETURN_IF_ERROR(InRange(field + ".weight", s.weight, 0, true, kInf, false,
                                    "use a positive weight such as 0.3; weights are normalized"));
    sum += s.weight;
  }
  if (!std::isfinite(sum)) {
    return Invalid("data.train", "the weights add up to more than a double holds",
                   "use weights such as 0.7 and 0.3 (they are normalized)");
  }
  for (size_t i = 0; i < d.train_sources.size(); ++i) {
    if (d.train_sources[i].weight < kMinSourceShare * sum) {
      return Invalid(
          "data.train[" + Str(i) + "].weight",
          Str(d.train_sources[i].weight) + " is less than 1e-6 of the weights' sum " + Str(sum),
          "raise the weight or leave the source out");
    }
  }
  return OkStatus();
}

Status CheckData(const JobSpec& spec) {
  const DataSpec& d = spec.data;
  if (!d.train_sources.empty()) {
    MESHRUN_RETURN_IF_ERROR(CheckTrainSources(d));
  } else if (d.train.empty()) {
    return Invalid("data.train", "required field is missing",
                   "set data.train to a text file, a folder of text files or a .bin token file");
  }
  MESHRUN_RETURN_IF_ERROR(
      AtLeast("data.eval_every", d.eval_every, 0, "use 0 to never evaluate, or a number of steps"));
  if (d.eval_every > 0 && d.val.empty()) {
    return Invalid("data.eval_every",
                   Str(d.eval_every) + " asks for evaluation but data.val is empty",
                   "set data.val to a held-out file, or eval_every: 0");
  }
  if (d.format == "text" && spec.model.vocab_size < 256) {
    return Invalid(
        "model.vocab_size",
        Str(spec.model.vocab_size) + " is smaller than the 256 byte tokens of data.format text",
        "use vocab_size: 256 for text data");
  }
  return OkStatus();
}

Status CheckOthers(const JobSpec& spec) {
  MESHRUN_RETURN_IF_ERROR(AtLeast("checkpoint.every", spec.checkpoint.every, 0,
                                  "use 0 to checkpoint only after the last step"));
  MESHRUN_RETURN_IF_ERROR(
      AtLeast("checkpoint.keep", spec.checkpoint.keep, 1, "keep 1 or more checkpoints"));
  MESHRUN_RETURN_IF_ERROR(AtLeast("resources.threads", spec.resources.threads, 0,
                                  "use 0 for OMP_NUM_THREADS or all cores"));
  if (spec.resources.threads > kMaxThreads) {
    return Invalid("resources.threads",
                   Str(spec.resources.threads) + " is over the limit of " + Str(kMaxThreads),
                   "use 0 to take the worker's share of cores; a worker never runs a rank with "
                   "more threads than its --cores");
  }
  MESHRUN_RETURN_IF_ERROR(AtLeast("restart.max_restarts", spec.restart.max_restarts, 0,
                                  "use 0 for no automatic restarts"));
  if (spec.restart.max_restarts > kMaxRestarts) {
    return Invalid("restart.max_restarts",
                   Str(spec.restart.max_restarts) + " is over the limit of " + Str(kMaxRestarts),
                   "use at most " + Str(kMaxRestarts) +
                       "; restarts wait longer each time (up to the coordinator's "
                       "--restart-backoff-max), so a job that keeps failing needs a fix");
  }
  return OkStatus();
}

// parallelism.auto: the planner chooses the sizes, so none may be given.
Status CheckAutoMesh(const ParallelismSpec& p) {
  if (!p.auto_mesh) return OkStatus();
  std::vector<std::string> given;
  const std::pair<const char*, int> sizes[] = {{"pp_size", p.pp_size},
                                               {"dp_replicate_size", p.dp_replicate_size},
                                               {"dp_shard_size", p.dp_shard_size},
                                               {"cp_size", p.cp_size},
                                               {"tp_size", p.tp_size}};
  for (const auto& [key, value] : sizes) {
    if (value != 1) given.push_back(std::string(key) + "(" + Str(value) + ")");
  }
  if (given.empty()) return OkStatus();
  std::string list;
  for (const std::string& g : given) list += (list.empty() ? "" : ", ") + g;
  return Invalid("parallelism." + given.front().substr(0, given.front().find('(')),
                 list + " given with parallelism.auto: true, which chooses the sizes",
                 "leave the sizes out with auto: true, or set parallelism.auto: false");
}

// The divisibility rules of docs/job-spec.md, in the order a user fixes them: tensor parallel
// splits heads and the MLP, heads split the width, cp splits the sequence, dp the batch.
Status CheckMeshRules(const JobSpec& spec, const ParallelDims& mesh, int nproc) {
  const ModelSpec& m = spec.model;
  const int64_t tp = mesh.tp(), cp = mesh.cp();
  const int64_t mlp = m.ff(), kv = m.kv_heads();
  std::vector<int64_t> tp_ok;  // tp sizes that satisfy every tp rule
  for (int64_t d : Divisors(std::gcd(std::gcd(int64_t{m.n_head}, mlp), kv))) tp_ok.push_back(d);
  if (m.n_head % tp != 0) {
    return Invalid(
        "parallelism.tp_size",
        "model.n_head(" + Str(m.n_head) + ") is not divisible by tp_size(" + Str(tp) + ")",
        "use a tp_size that divides " + Str(m.n_head) + ", such as " + JoinOr(Closest(tp_ok, tp)));
  }
  if (kv % tp != 0) {
    return Invalid("parallelism.tp_size",
                   "model.n_kv_head(" + Str(kv) + ") is not divisible by tp_size(" + Str(tp) +
                       ") (each tp rank holds whole key/value heads)",
                   "use a tp_size that divides both n_head(" + Str(m.n_head) + ") and n_kv_head(" +
                       Str(kv) + "), such as " + JoinOr(Closest(tp_ok, tp)));
  }
  if (mlp % tp != 0) {
    return Invalid(
        "parallelism.tp_size",
        std::string(m.family().grouped_query && m.d_ff > 0 ? "model.d_ff(" : "4·model.d_model(") +
            Str(mlp) + ") is not divisible by tp_size(" + Str(tp) + ")",
        "use a tp_size that divides both n_head(" + Str(m.n_head) + ") and " + Str(mlp) +
            ", such as " + JoinOr(Closest(tp_ok, tp)));
  }
  if (m.head_dim == 0 && m.d_model % m.n_head != 0) {
    return Invalid("model.d_model",
                   Str(m.d_model) + " is not divisible by model.n_head(" + Str(m.n_head) + ")",
                   "use a d_model that is a multiple of " + Str(m.n_head) + ", such as " +
                       JoinOr(NearbyMultiples(m.d_model, m.n_head)));
  }
  if (cp > 1 && m.seq_len % (2 * cp) != 0) {
    std::vector<int64_t> cp_ok;
    for (int64_t d : Divisors(m.seq_len)) {
      if (d % 2 == 0 && d / 2 > 1) cp_ok.push_back(d / 2);
    }
    std::string hint = "use a seq_len that is a multiple of 2·cp_size = " + Str(2 * cp) +
                       ", such as " + JoinOr(NearbyMultiples(m.seq_len, 2 * cp));
    hint += cp_ok.empty() ? ", or cp_size: 1"
                          : ", or a cp_size c with 2·c dividing " + Str(m.seq_len) + ", such as " +
                                JoinOr(Closest(cp_ok, cp));
    return Invalid("model.seq_len",
                   Str(m.seq_len) + " is not divisible by 2·cp_size(" + Str(cp) +
                       ") = " + Str(2 * cp) + " (each sequence is split into 2·cp_size chunks)",
                   hint);
  }
  const TrainSpec& t = spec.train;
  const int64_t dp = mesh.AxisSize(MeshAxis::kDp);
  const int64_t per_step = dp * t.micro_batch_size;
  if (t.global_batch_size % per_step != 0) {
    std::string hint = "use a global_batch_size that is a multiple of " + Str(per_step) +
                       ", such as " + JoinOr(NearbyMultiples(t.global_batch_size, per_step));
    if (t.global_batch_size % dp == 0) {
      hint += ", or a micro_batch_size that divides " + Str(t.global_batch_size / dp) +
              ", such as " +
              JoinOr(Closest(Divisors(t.global_batch_size / dp), t.micro_batch_size));
    }
    return Invalid("train.global_batch_size",
                   Str(t.global_batch_size) + " is not divisible by dp_replicate_size(" +
                       Str(mesh.dp_replicate()) + ")·dp_shard_size(" + Str(mesh.dp_shard()) +
                       ")·micro_batch_size(" + Str(t.micro_batch_size) + ") = " + Str(per_step),
                   hint);
  }
  // With auto the sizes are chosen later for the ranks available (the planner).
  if (nproc > 0 && !spec.parallelism.auto_mesh && mesh.world_size() != nproc) {
    return Invalid("parallelism",
                   (mesh.pp() > 1 ? "pp_size(" + Str(mesh.pp()) + ")·" : std::string()) +
                       "dp_replicate_size(" + Str(mesh.dp_replicate()) + ")·dp_shard_size(" +
                       Str(mesh.dp_shard()) + ")·cp_size(" + Str(cp) + ")·tp_size(" + Str(tp) +
                       ") = world size " + Str(mesh.world_size()) + " but --nproc is " + Str(nproc),
                   "pass --nproc " + Str(mesh.world_size()) +
                       ", or choose sizes whose product is " + Str(nproc));
  }
  return OkStatus();
}

std::string JoinInts(const std::vector<int>& values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + Str(values[i]);
  return out + "]";
}

// The pipeline rules of docs/parallelism.md "Pipeline parallelism", after the batch rule (the
// micro-batch count needs it).
Status CheckPipeline(const JobSpec& spec, const ParallelDims& mesh) {
  const ParallelismSpec& p = spec.parallelism;
  const int n_layer = spec.model.n_layer;
  const int64_t pp = mesh.pp();
  MESHRUN_RETURN_IF_ERROR(AtLeast("parallelism.pp_virtual_stages", p.pp_virtual_stages, 1,
                                  "use 1, or 2 or more with pp_schedule: interleaved_1f1b"));
  const PpSchedule schedule = PpScheduleOf(p);
  const int64_t chunks = pp * p.pp_virtual_stages;  // model chunks along the pipeline
  if (pp > n_layer) {
    return Invalid("parallelism.pp_size",
                   "pp_size(" + Str(pp) + ") is more than model.n_layer(" + Str(n_layer) +
                       "); every stage needs at least one transformer layer",
                   "use a pp_size of at most " + Str(n_layer));
  }
  if (p.pp_virtual_stages > 1 && schedule != PpSchedule::kInterleaved1F1B) {
    return Invalid("parallelism.pp_virtual_stages",
                   Str(p.pp_virtual_stages) + " virtual stages with pp_schedule '" +
                       PpScheduleName(schedule) + "'; only interleaved_1f1b runs virtual stages",
                   "set pp_schedule: interleaved_1f1b, or pp_virtual_stages: 1");
  }
  if (schedule == PpSchedule::kInterleaved1F1B && p.pp_virtual_stages < 2) {
    return Invalid("parallelism.pp_virtual_stages",
                   Str(p.pp_virtual_stages) +
                       " with pp_schedule 'interleaved_1f1b', which gives each rank 2 or more "
                       "model chunks",
                   "set pp_virtual_stages: 2 (or more), or pp_schedule: 1f1b");
  }
  if (chunks > n_layer) {
    return Invalid("parallelism.pp_virtual_stages",
                   "pp_size(" + Str(pp) + ")·pp_virtual_stages(" + Str(p.pp_virtual_stages) +
                       ") = " + Str(chunks) + " model chunks but model.n_layer is " + Str(n_layer) +
                       "; every chunk needs at least one layer",
                   "use pp_size·pp_virtual_stages of at most " + Str(n_layer));
  }
  if (!p.pp_layers.empty()) {
    int64_t sum = 0;
    for (size_t i = 0; i < p.pp_layers.size(); ++i) {
      if (p.pp_layers[i] < 1) {
        return Invalid("parallelism.pp_layers",
                       JoinInts(p.pp_layers) + " gives chunk " + Str(i) + " " +
                           Str(p.pp_layers[i]) + " layers; every stage holds at least one",
                       "give every entry 1 or more, or leave pp_layers out (null) to split "
                       "by cost");
      }
      sum += p.pp_layers[i];
    }
    if (static_cast<int64_t>(p.pp_layers.size()) != chunks) {
      return Invalid("parallelism.pp_layers",
                     JoinInts(p.pp_layers) + " has " + Str(p.pp_layers.size()) +
                         " entries but pp_size(" + Str(pp) + ")·pp_virtual_stages(" +
                         Str(p.pp_virtual_stages) + ") = " + Str(chunks) + " chunks",
                     "give one layer count per chunk (" + Str(chunks) +
                         " entries), or leave pp_layers out (null) to split by cost");
    }
    if (sum != n_layer) {
      return Invalid(
          "parallelism.pp_layers",
          JoinInts(p.pp_layers) + " sums to " + Str(sum) + " but model.n_layer is " + Str(n_layer),
          "make the entries sum to " + Str(n_layer) +
              ", or leave pp_layers out (null) to split by cost");
    }
  }
  if (pp == 1) return OkStatus();
  const int64_t micro = MicroBatchesPerStep(spec);
  const std::string rule =
      "global_batch_size(" + Str(spec.train.global_batch_size) + ") / (dp_replicate_size(" +
      Str(mesh.dp_replicate()) + ")·dp_shard_size(" + Str(mesh.dp_shard()) + ")·micro_batch_size(" +
      Str(spec.train.micro_batch_size) + ")) = " + Str(micro) + " micro-batches per step";
  if (micro < pp) {
    return Invalid(
        "train.global_batch_size",
        rule + ", fewer than pp_size(" + Str(pp) + "): the pipeline never fills, stages would idle",
        "use a global_batch_size of at least " +
            Str(pp * mesh.dp_replicate() * mesh.dp_shard() * spec.train.micro_batch_size) +
            ", or a smaller micro_batch_size or pp_size");
  }
  if (schedule == PpSchedule::kInterleaved1F1B && micro % pp != 0) {
    return Invalid("train.global_batch_size",
                   rule + ", not a multiple of pp_size(" + Str(pp) +
                       ") as interleaved_1f1b needs (micro-batches go round the stages in "
                       "groups of pp_size)",
                   "use a global_batch_size that gives a multiple of " + Str(pp) +
                       " micro-batches, or pp_schedule: 1f1b");
  }
  return OkStatus();
}

// A mesh of `world` ranks the planner could choose for an auto spec: any tp and cp that divide it.
bool AnyMeshOfWorld(const JobSpec& spec, int world) {
  for (int tp = 1; tp <= world; ++tp) {
    if (world % tp != 0) continue;
    for (int cp = 1; cp * tp <= world; ++cp) {
      if ((world / tp) % cp != 0) continue;
      JobSpec s = spec;
      s.parallelism.auto_mesh = false;
      s.parallelism.tp_size = tp;
      s.parallelism.cp_size = cp;
      if (ElasticDataAxesMesh(s, world).has_value()) return true;
    }
  }
  return false;
}

// resources.elastic (decision 0056).
Status CheckElastic(const JobSpec& spec) {
  const ResourcesSpec& r = spec.resources;
  if (!r.elastic()) {
    if (r.elastic_wait_seconds != 60) {
      return Invalid("resources.elastic.wait_seconds",
                     Str(r.elastic_wait_seconds) + " is given without min_ranks and max_ranks",
                     "write resources.elastic: {min_ranks: N, max_ranks: M, wait_seconds: " +
                         Str(r.elastic_wait_seconds) + "}, or leave elastic out");
    }
    return OkStatus();
  }
  MESHRUN_RETURN_IF_ERROR(AtLeast("resources.elastic.min_ranks", r.elastic_min_ranks, 1,
                                  "give the fewest ranks the job may run on, 1 or more"));
  MESHRUN_RETURN_IF_ERROR(AtLeast("resources.elastic.max_ranks", r.elastic_max_ranks, 1,
                                  "give the most ranks the job may run on, 1 or more"));
  if (r.elastic_max_ranks > ParallelDims::kMaxWorldSize) {
    return Invalid(
        "resources.elastic.max_ranks",
        Str(r.elastic_max_ranks) + " is over the limit of " + Str(ParallelDims::kMaxWorldSize),
        "use at most " + Str(ParallelDims::kMaxWorldSize));
  }
  if (r.elastic_min_ranks > r.elastic_max_ranks) {
    return Invalid(
        "resources.elastic.min_ranks",
        Str(r.elastic_min_ranks) + " is over max_ranks(" + Str(r.elastic_max_ranks) + ")",
        "use min_ranks <= max_ranks, e.g. min_ranks: " + Str(r.elastic_max_ranks));
  }
  if (r.elastic_wait_seconds < 0 || r.elastic_wait_seconds > 86400) {
    return Invalid("resources.elastic.wait_seconds",
                   "must be in [0, 86400], got " + Str(r.elastic_wait_seconds),
                   "use the seconds to wait for a lost worker's replacement, such as 60");
  }
  if (spec.checkpoint.dir.empty() || ResumeOf(spec.checkpoint) != ResumeMode::kAuto) {
    return Invalid("resources.elastic",
                   "an elastic job needs checkpoint.dir with checkpoint.resume: auto (each new "
                   "mesh resumes from the newest complete checkpoint)",
                   "set checkpoint.dir, or leave resources.elastic out");
  }
  if (spec.parallelism.pp_size > 1) {
    return Invalid("resources.elastic",
                   "an elastic job with parallelism.pp_size(" + Str(spec.parallelism.pp_size) +
                       ") > 1: re-meshing keeps tp and cp and changes the data axes, and does not "
                       "yet re-plan pipeline stages",
                   "leave resources.elastic out, or use pp_size: 1");
  }
  const int world = spec.parallelism.dp_replicate_size * spec.parallelism.dp_shard_size *
                    spec.parallelism.cp_size * spec.parallelism.tp_size;
  if (!spec.parallelism.auto_mesh && (world < r.elastic_min_ranks || world > r.elastic_max_ranks)) {
    return Invalid("resources.elastic.min_ranks",
                   "the mesh's world size " + Str(world) + " is outside [min_ranks(" +
                       Str(r.elastic_min_ranks) + "), max_ranks(" + Str(r.elastic_max_ranks) + ")]",
                   "choose min_ranks <= " + Str(world) + " <= max_ranks");
  }
  for (const auto& [key, n] : {std::pair<const char*, int>{"min_ranks", r.elastic_min_ranks},
                               std::pair<const char*, int>{"max_ranks", r.elastic_max_ranks}}) {
    const bool ok = spec.parallelism.auto_mesh ? AnyMeshOfWorld(spec, n)
                                               : ElasticDataAxesMesh(spec, n).has_value();
    if (ok) continue;
    std::vector<int64_t> valid;
    for (int w = 1; w <= std::max(2 * r.elastic_max_ranks, 8) && w <= 4096; ++w) {
      if (spec.parallelism.auto_mesh ? AnyMeshOfWorld(spec, w)
                                     : ElasticDataAxesMesh(spec, w).has_value()) {
        valid.push_back(w);
      }
    }
    const std::string keeping = spec.parallelism.auto_mesh
                                    ? std::string()
                                    : " keeping tp_size(" + Str(spec.parallelism.tp_size) +
                                          ") and cp_size(" + Str(spec.parallelism.cp_size) + ")";
    return Invalid("resources.elastic." + std::string(key),
                   "no valid mesh has " + Str(n) + " ranks" + keeping +
                       " (the model, micro_batch_size and global_batch_size(" +
                       Str(spec.train.global_batch_size) + ") must divide)",
                   valid.empty() ? std::string("change global_batch_size or micro_batch_size")
                                 : "use a world size with a valid mesh, such as " +
                                       JoinOr(Closest(valid, n, 3)));
  }
  return OkStatus();
}

}  // namespace

std::optional<ParallelismSpec> ElasticDataAxesMesh(const JobSpec& spec, int world) {
  const ParallelismSpec& p = spec.parallelism;
  const int tc = p.tp_size * p.cp_size;
  if (world < 1 || tc < 1 || world % tc != 0) return std::nullopt;
  const int dp = world / tc;
  int replicate = std::max(1, std::min(p.dp_replicate_size, dp));
  while (dp % replicate != 0) --replicate;
  JobSpec s = spec;
  s.resources.elastic_min_ranks = s.resources.elastic_max_ranks = 0;  // no recursion
  s.resources.elastic_wait_seconds = 60;
  s.parallelism.auto_mesh = false;
  s.parallelism.dp_replicate_size = replicate;
  s.parallelism.dp_shard_size = dp / replicate;
  if (!ValidateJobSpec(s, world).ok()) return std::nullopt;
  return s.parallelism;
}

std::string EscapeForMessage(std::string_view value) {
  constexpr size_t kMaxBytes = 80;
  const bool cut = value.size() > kMaxBytes;
  if (cut) {
    value = value.substr(0, kMaxBytes);
    // Do not end inside a UTF-8 sequence.
    while (!value.empty() && (static_cast<unsigned char>(value.back()) & 0xc0) == 0x80) {
      value.remove_suffix(1);
    }
    if (!value.empty() && static_cast<unsigned char>(value.back()) >= 0xc0) value.remove_suffix(1);
  }
  const std::string out = EscapeText(value, /*keep_tab=*/false);
  return cut ? out + "..." : out;
}

std::string QuoteForMessage(std::string_view value) {
  std::string quoted = "'";
  quoted += EscapeForMessage(value);
  quoted += '\'';
  return quoted;
}

const std::vector<std::string>& JobSpecSections() {
  static const std::vector<std::string> sections = [] {
    std::vector<std::string> out;
    JobSpec spec;
    ForEachJobSpecField(spec, [&](std::string_view section, std::string_view, auto&) {
      if (!section.empty() && (out.empty() || out.back() != section)) out.emplace_back(section);
    });
    return out;
  }();
  return sections;
}

std::vector<std::string> JobSpecKeys(std::string_view section) {
  std::vector<std::string> keys;
  JobSpec spec;
  ForEachJobSpecField(spec, [&](std::string_view s, std::string_view key, auto&) {
    if (s == section) keys.emplace_back(key);
  });
  return keys;
}

std::vector<std::string> AllowedValues(std::string_view section, std::string_view key) {
  const std::string path = std::string(section) + "." + std::string(key);
  if (path == "model.arch") {
    std::vector<std::string> names;
    for (const Architecture& a : Architectures()) names.emplace_back(a.name);
    return names;
  }
  if (path == "model.rope_scaling.type") return {"none", "llama3"};
  if (path == "parallelism.cp_comm_strategy") return {"allgather", "ring"};
  if (path == "parallelism.pp_schedule") return {"1f1b", "interleaved_1f1b", "zero_bubble"};
  if (path == "train.precision") return {"fp32", "bf16"};
  if (path == "train.activation_checkpointing") return {"none", "selective", "full"};
  if (path == "train.optimizer") return {"adamw", "lion"};
  if (path == "train.loss_on") return {"all", "completion"};
  if (path == "data.format") return {"auto", "text", "llmc", "nanogpt"};
  if (path == "data.order") return {"sequential", "shuffled"};
  if (path == "data.attention") return {"causal", "document"};
  if (path == "checkpoint.resume") return {"auto", "never"};
  if (path == "resources.device") return {"cpu", "cuda"};
  return {};
}

std::optional<ComputeDevice> ParseComputeDevice(std::string_view name) {
  if (name == "cpu") return ComputeDevice::kCpu;
  if (name == "cuda") return ComputeDevice::kCuda;
  return std::nullopt;
}

std::optional<TrainPrecision> ParseTrainPrecision(std::string_view name) {
  if (name == "fp32") return TrainPrecision::kFp32;
  if (name == "bf16") return TrainPrecision::kBf16;
  return std::nullopt;
}

std::optional<Checkpointing> ParseCheckpointing(std::string_view name) {
  if (name == "none") return Checkpointing::kNone;
  if (name == "selective") return Checkpointing::kSelective;
  if (name == "full") return Checkpointing::kFull;
  return std::nullopt;
}

std::optional<DataOrder> ParseDataOrder(std::string_view name) {
  if (name == "sequential") return DataOrder::kSequential;
  if (name == "shuffled") return DataOrder::kShuffled;
  return std::nullopt;
}

std::optional<DataFormat> ParseDataFormat(std::string_view name) {
  if (name == "auto") return DataFormat::kAuto;
  if (name == "text") return DataFormat::kText;
  if (name == "llmc") return DataFormat::kLlmc;
  if (name == "nanogpt") return DataFormat::kNanogpt;
  return std::nullopt;
}

std::optional<PpSchedule> ParsePpSchedule(std::string_view name) {
  if (name == "1f1b") return PpSchedule::k1F1B;
  if (name == "interleaved_1f1b") return PpSchedule::kInterleaved1F1B;
  if (name == "zero_bubble") return PpSchedule::kZeroBubble;
  return std::nullopt;
}

const char* PpScheduleName(PpSchedule schedule) {
  switch (schedule) {
    case PpSchedule::k1F1B: return "1f1b";
    case PpSchedule::kInterleaved1F1B: return "interleaved_1f1b";
    case PpSchedule::kZeroBubble: return "zero_bubble";
  }
  return "1f1b";
}

PpSchedule PpScheduleOf(const ParallelismSpec& parallelism) {
  return ParsePpSchedule(parallelism.pp_schedule).value_or(PpSchedule::k1F1B);
}

int64_t MicroBatchesPerStep(const JobSpec& spec) {
  const ParallelismSpec& p = spec.parallelism;
  const int64_t per_step =
      int64_t{p.dp_replicate_size} * p.dp_shard_size * spec.train.micro_batch_size;
  if (p.dp_replicate_size < 1 || p.dp_shard_size < 1 || spec.train.micro_batch_size < 1) return 0;
  return spec.train.global_batch_size / per_step;
}

ComputeDevice DeviceOf(const ResourcesSpec& resources) {
  return ParseComputeDevice(resources.device).value_or(ComputeDevice::kCpu);
}

TrainPrecision PrecisionOf(const TrainSpec& train) {
  return ParseTrainPrecision(train.precision).value_or(TrainPrecision::kFp32);
}

Checkpointing CheckpointingOf(const TrainSpec& train) {
  return ParseCheckpointing(train.activation_checkpointing).value_or(Checkpointing::kNone);
}

CpComm CpCommOf(const ParallelismSpec& parallelism) {
  return parallelism.cp_comm_strategy == "ring" ? CpComm::kRing : CpComm::kAllgather;
}

ModelArch ArchOf(const ModelSpec& model) {
  return model.family().arch;
}

const Architecture& ModelSpec::family() const {
  const Architecture* a = FindArchitecture(arch);
  return a != nullptr ? *a : ArchitectureOf(ModelArch::kGpt2);
}

int ModelSpec::ff() const {
  return family().grouped_query && d_ff > 0 ? d_ff : 4 * d_model;
}

int ModelSpec::head_width() const {
  return family().free_head_dim && head_dim > 0 ? head_dim : d_model / std::max(1, n_head);
}

RopeScalingType RopeScalingOf(const ModelSpec& model) {
  return model.rope_scaling_type == "llama3" ? RopeScalingType::kLlama3 : RopeScalingType::kNone;
}

ResumeMode ResumeOf(const CheckpointSpec& checkpoint) {
  return checkpoint.resume == "auto" ? ResumeMode::kAuto : ResumeMode::kNever;
}

StatusOr<LossOn> ParseLossOn(std::string_view value) {
  if (value == "all") return LossOn::kAll;
  if (value == "completion") return LossOn::kCompletion;
  return InvalidArgumentError("train.loss_on: " + QuoteForMessage(value) +
                              " is not one of all, completion (hint: loss_on: completion trains "
                              "only on completion / assistant tokens)");
}

AttentionMask AttentionMaskOf(const DataSpec& data) {
  return data.attention == "document" ? AttentionMask::kDocument : AttentionMask::kCausal;
}

OptimizerKind OptimizerOf(const TrainSpec& train) {
  return train.optimizer == "lion" ? OptimizerKind::kLion : OptimizerKind::kAdamW;
}

const char* OptimizerName(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kAdamW: return "adamw";
    case OptimizerKind::kLion: return "lion";
  }
  return "adamw";
}

std::vector<DataSource> TrainSources(const DataSpec& data) {
  if (!data.train_sources.empty()) return data.train_sources;
  return {DataSource{data.train, 1.0}};
}

std::string TrainSourceField(const DataSpec& data, size_t index) {
  return data.train_sources.empty() ? std::string("data.train")
                                    : "data.train[" + std::to_string(index) + "]";
}

StatusOr<ParallelDims> MeshOf(const JobSpec& spec) {
  const ParallelismSpec& p = spec.parallelism;
  return ParallelDims::Create(p.pp_size, p.dp_replicate_size, p.dp_shard_size, p.cp_size,
                              p.tp_size);
}

Status ValidateJobSpec(const JobSpec& spec, int nproc) {
  MESHRUN_RETURN_IF_ERROR(CheckName(spec.name));
  MESHRUN_RETURN_IF_ERROR(CheckStrings(spec));
  MESHRUN_RETURN_IF_ERROR(CheckModel(spec.model));
  MESHRUN_ASSIGN_OR_RETURN(ParallelDims mesh, MeshOf(spec));
  MESHRUN_RETURN_IF_ERROR(CheckTrain(spec.train));
  MESHRUN_RETURN_IF_ERROR(InRange("parallelism.comm_timeout_seconds",
                                  spec.parallelism.comm_timeout_seconds, 1, false, 86400, true,
                                  "use a bound such as 60 (seconds; at most a day)"));
  if (spec.train.precision == "bf16" && spec.resources.device == "cpu") {
    return Invalid("train.precision",
                   "'bf16' needs resources.device: cuda; the CPU engine computes in float32",
                   "use precision: fp32 on cpu");
  }
  MESHRUN_RETURN_IF_ERROR(CheckData(spec));
  MESHRUN_RETURN_IF_ERROR(CheckOthers(spec));
  MESHRUN_RETURN_IF_ERROR(CheckAutoMesh(spec.parallelism));
  MESHRUN_RETURN_IF_ERROR(CheckMeshRules(spec, mesh, nproc));
  MESHRUN_RETURN_IF_ERROR(CheckPipeline(spec, mesh));
  return CheckElastic(spec);
}

}  // namespace meshrun
