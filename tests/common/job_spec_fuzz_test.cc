// Feeds thousands of randomly mutated job specs (byte flips, deleted/duplicated/swapped lines,
// random values and keys, truncation, random --set) through ParseJobSpecYaml with a fixed seed.
// Each must either parse, validate and round-trip, or fail with INVALID_ARGUMENT; never throw.
// For a longer local run: MESHRUN_FUZZ_ITERATIONS=200000 MESHRUN_FUZZ_SEED=7 (under `ulimit -v`).
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <random>

#include "common/job_spec_yaml.h"

namespace meshrun {
namespace {

int EnvOr(const char* name, int fallback) {
  const char* value = std::getenv(name);
  return value ? std::atoi(value) : fallback;
}

const char* const kSeeds[] = {
    R"(name: tiny-demo
model:       {arch: gpt2, n_layer: 2, n_head: 4, d_model: 64, seq_len: 64, vocab_size: 256}
parallelism: {dp_replicate_size: 1, dp_shard_size: 2, cp_size: 1, tp_size: 2, cp_comm_strategy: allgather}
train:       {steps: 20, global_batch_size: 8, micro_batch_size: 2, lr: 3.0e-4, min_lr: 3.0e-5,
              warmup_steps: 2, weight_decay: 0.1, grad_clip: 1.0, beta1: 0.9, beta2: 0.95,
              eps: 1.0e-8, seed: 1337, precision: fp32}
data:        {train: /data/train.txt, val: /data/val.txt, format: auto, order: sequential, eval_every: 0}
checkpoint:  {dir: /tmp/ckpt, every: 0, keep: 2, resume: auto}
resources:   {device: cpu}
restart:     {max_restarts: 0}
)",
    R"(# tiny
name: tiny
model:
  arch: gpt2
  n_layer: 2
  n_head: 4
  d_model: 64
  seq_len: 64
  vocab_size: 256
parallelism:
  dp_replicate_size: 1
  dp_shard_size: 1
  cp_size: 2
  tp_size: 2
train:
  steps: 20
  global_batch_size: 8
  micro_batch_size: 2
  lr: 1.0e-3
  min_lr: 1.0e-4
  warmup_steps: 2
data:
  train: /usr/share/games/fortunes/cookie
  val: /usr/share/games/fortunes/wisdom
  format: text
  eval_every: 5
checkpoint:
  dir: /tmp/meshrun/tiny/checkpoints
  every: 10
)",
    "data: {train: a.txt}\n",
};

const char* const kValues[] = {
    "",           "0",      "-1",          "1",        "2",
    "3",          "4",      "8",           "16",       "64",
    "256",        "1e309",  "-0",          "0.5",      "abc",
    "[1, 2]",     "{a: 1}", "99999999999", "0x10",     "~",
    "null",       ".nan",   ".inf",        "'quoted'", "\"esc\\x41\"",
    "\"\\x00\"",  "&a x",   "*a",          "!!int 3",  "!!str 5",
    "|\n  block", ">",      "- x",         "true",     "1_000",
    "+3",         "3.",     ".5",          "1e-8",     "\xc3\xa9t\xc3\xa9",
    "\xff\xfe",   "ring",   "cuda",        "bf16",     "shuffled",
    "never",      "llmc",   "nanogpt",     "text",     "{",
    "[",          "\"",     "'",           "#",        ": :",
};

const char* const kGarbage[] = {
    ":",   "{", "}", "[", "]", ",", "#", "&",  "*",  "!",   "|",   ">",  "'",
    "\"",  "%", "@", "`", "-", "?", " ", "\n", "\t", "---", "...", "\\", "\xef\xbb\xbf",
    "\x00"};

class Mutator {
 public:
  explicit Mutator(uint32_t seed) : rng_(seed) {
    JobSpec spec;
    ForEachJobSpecField(spec, [&](std::string_view section, std::string_view key, auto&) {
      keys_.emplace_back(key);
      if (!section.empty()) keys_.emplace_back(section);
      if (!section.empty()) paths_.push_back(std::string(section) + "." + std::string(key));
    });
    paths_.push_back("name");
  }

  size_t Below(size_t n) {
    return n == 0 ? 0 : std::uniform_int_distribution<size_t>(0, n - 1)(rng_);
  }

  std::string RandomValue() {
    switch (Below(4)) {
      case 0: return std::to_string(static_cast<int>(Below(300)) - 20);
      case 1: return std::to_string(std::uniform_real_distribution<double>(-1, 2)(rng_));
      default: return kValues[Below(std::size(kValues))];
    }
  }

  std::string RandomKey() {
    std::string key = keys_[Below(keys_.size())];
    switch (Below(4)) {
      case 0: key.erase(Below(key.size()), 1); break;             // typo: a letter lost
      case 1: key.insert(Below(key.size() + 1), 1, 'x'); break;   // typo: a letter added
      case 2: key = kGarbage[Below(std::size(kGarbage))]; break;  // not a word at all
      default: break;                                             // a real key, maybe misplaced
    }
    return key;
  }

  std::vector<std::string> Lines(const std::string& text) {
    std::vector<std::string> lines;
    size_t start = 0;
    while (start < text.size()) {
      size_t end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      lines.push_back(text.substr(start, end - start));
      start = end + 1;
    }
    return lines;
  }

  std::string Join(const std::vector<std::string>& lines) {
    std::string text;
    for (const auto& line : lines) text += line + "\n";
    return text;
  }

  std::string Mutate(std::string text) {
    std::vector<std::string> lines = Lines(text);
    switch (Below(9)) {
      case 0:  // byte flip
        if (!text.empty()) text[Below(text.size())] = static_cast<char>(Below(256));
        return text;
      case 1:  // a syntax character somewhere
        text.insert(Below(text.size() + 1), kGarbage[Below(std::size(kGarbage))]);
        return text;
      case 2:  // delete a line
        if (!lines.empty()) lines.erase(lines.begin() + Below(lines.size()));
        return Join(lines);
      case 3:  // duplicate a line
        if (!lines.empty()) {
          const size_t i = Below(lines.size());
          lines.insert(lines.begin() + i, lines[i]);
        }
        return Join(lines);
      case 4:  // swap two lines
        if (lines.size() > 1) std::swap(lines[Below(lines.size())], lines[Below(lines.size())]);
        return Join(lines);
      case 5: {  // a random value for a field
        if (lines.empty()) return text;
        std::string& line = lines[Below(lines.size())];
        const size_t colon = line.find(": ");
        if (colon != std::string::npos) {
          const size_t end = line.find_first_of(",}", colon + 2);
          line.replace(colon + 2, end == std::string::npos ? std::string::npos : end - colon - 2,
                       RandomValue());
        }
        return Join(lines);
      }
      case 6: {  // a random key, top level or indented
        const std::string indent = Below(2) ? "  " : "";
        lines.insert(lines.begin() + Below(lines.size() + 1),
                     indent + RandomKey() + ": " + RandomValue());
        return Join(lines);
      }
      case 7:  // truncate
        return text.substr(0, Below(text.size() + 1));
      default: {  // re-indent a line
        if (lines.empty()) return text;
        std::string& line = lines[Below(lines.size())];
        if (Below(2) && !line.empty() && line[0] == ' ') {
          line.erase(0, 1);
        } else {
          line.insert(0, Below(2) ? " " : "    ");
        }
        return Join(lines);
      }
    }
  }

  std::vector<std::string> RandomOverrides() {
    std::vector<std::string> overrides;
    if (Below(5) != 0) return overrides;
    const size_t n = 1 + Below(3);
    for (size_t i = 0; i < n; ++i) {
      const std::string path = Below(4) ? paths_[Below(paths_.size())] : RandomKey();
      overrides.push_back(Below(10) ? path + "=" + RandomValue() : path);
    }
    return overrides;
  }

 private:
  std::mt19937 rng_;
  std::vector<std::string> keys_;
  std::vector<std::string> paths_;
};

TEST(JobSpecFuzzTest, MutatedSpecsParseOrFailCleanly) {
  const int kIterations = EnvOr("MESHRUN_FUZZ_ITERATIONS", 6000);
  Mutator mutator(EnvOr("MESHRUN_FUZZ_SEED", 20240520));
  int parsed = 0, rejected = 0;
  for (int i = 0; i < kIterations; ++i) {
    std::string text = kSeeds[mutator.Below(std::size(kSeeds))];
    const size_t mutations = 1 + mutator.Below(4);
    for (size_t m = 0; m < mutations; ++m) text = mutator.Mutate(text);
    const std::vector<std::string> overrides = mutator.RandomOverrides();

    std::optional<StatusOr<JobSpec>> result;
    try {
      result.emplace(ParseJobSpecYaml(text, overrides));
    } catch (...) {
      FAIL() << "iteration " << i << " threw on:\n" << text;
    }
    if (!result->ok()) {
      ++rejected;
      ASSERT_EQ(result->status().code(), StatusCode::kInvalidArgument)
          << "iteration " << i << ": " << result->status().ToString() << "\n"
          << text;
      ASSERT_FALSE(result->status().message().empty());
      // One printable line: user values are escaped in messages.
      for (char ch : result->status().message()) {
        ASSERT_FALSE(static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f)
            << "iteration " << i << ": " << result->status().message();
      }
      continue;
    }
    ++parsed;
    const JobSpec& spec = result->value();
    ASSERT_TRUE(ValidateJobSpec(spec).ok()) << "iteration " << i << "\n" << text;
    const std::string yaml = JobSpecToYaml(spec);
    StatusOr<JobSpec> again = ParseJobSpecYaml(yaml, {});
    ASSERT_TRUE(again.ok()) << "iteration " << i << ": " << again.status().ToString() << "\n"
                            << text << "\n---- written as:\n"
                            << yaml;
    ASSERT_EQ(*again, spec) << "iteration " << i << "\n" << text << "\n---- written as:\n" << yaml;
  }
  // Both outcomes must be common, or the mutations are not exercising the parser.
  EXPECT_GT(parsed, kIterations / 20);
  EXPECT_GT(rejected, kIterations / 4);
  std::cout << "parsed " << parsed << ", rejected " << rejected << " of " << kIterations << "\n";
}

}  // namespace
}  // namespace meshrun
