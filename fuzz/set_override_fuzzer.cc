// Fuzz target: `--set KEY=VALUE` overrides (common/job_spec_yaml.h) applied to a fixed, valid
// base spec (the example of docs/job-spec.md). The input is the list of overrides, one per line
// (at most 16). Properties: never a crash, throw or hang; a rejection is INVALID_ARGUMENT with
// a message; an accepted result round-trips through JobSpecToYaml; and overrides are
// assignments, so applying the list twice in a row gives the same spec as applying it once
// (or is rejected, e.g. `model.n_layer=2` after `model=3` the second time round).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/job_spec.h"
#include "common/job_spec_yaml.h"
#include "fuzz/fuzz_check.h"

namespace {

constexpr const char* kBaseSpec = R"(name: tiny-demo
model:       {arch: gpt2, n_layer: 2, n_head: 4, d_model: 64, seq_len: 64, vocab_size: 256}
parallelism: {dp_replicate_size: 1, dp_shard_size: 2, cp_size: 1, tp_size: 2, cp_comm_strategy: allgather}
train:       {steps: 20, global_batch_size: 8, micro_batch_size: 2, lr: 3.0e-4, min_lr: 3.0e-5,
              warmup_steps: 2, weight_decay: 0.1, grad_clip: 1.0, beta1: 0.9, beta2: 0.95,
              eps: 1.0e-8, seed: 1337, precision: fp32}
data:        {train: /data/train.txt, val: /data/val.txt, format: auto, order: sequential, eval_every: 0}
checkpoint:  {dir: /tmp/ckpt, every: 0, keep: 2, resume: auto}
resources:   {device: cpu}
restart:     {max_restarts: 0}
)";

std::string Join(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) out += "  --set " + l + "\n";
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using meshrun::StatusCode;
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> overrides;
  for (size_t start = 0; start <= input.size() && overrides.size() < 16;) {
    const size_t nl = input.find('\n', start);
    overrides.push_back(input.substr(start, nl == std::string::npos ? nl : nl - start));
    if (nl == std::string::npos) break;
    start = nl + 1;
  }
  auto spec = meshrun::ParseJobSpecYaml(kBaseSpec, overrides, "<base>");
  if (!spec.ok()) {
    FUZZ_CHECK(spec.status().code() == StatusCode::kInvalidArgument,
               spec.status().message() + "\n" + Join(overrides));
    FUZZ_CHECK(!spec.status().message().empty(), Join(overrides));
    return 0;
  }
  const std::string yaml = meshrun::JobSpecToYaml(*spec);
  auto again = meshrun::ParseJobSpecYaml(yaml, {}, "<round trip>");
  FUZZ_CHECK(again.ok(), again.status().message() + "\n" + Join(overrides) + yaml);
  FUZZ_CHECK(*again == *spec, Join(overrides) + "--- resolved:\n" + yaml + "--- written again:\n" +
                                  meshrun::JobSpecToYaml(*again));

  std::vector<std::string> twice = overrides;
  twice.insert(twice.end(), overrides.begin(), overrides.end());
  auto doubled = meshrun::ParseJobSpecYaml(kBaseSpec, twice, "<base>");
  if (doubled.ok()) {
    FUZZ_CHECK(*doubled == *spec, Join(overrides) + "--- once:\n" + yaml + "--- twice:\n" +
                                      meshrun::JobSpecToYaml(*doubled));
  } else {
    FUZZ_CHECK(doubled.status().code() == StatusCode::kInvalidArgument,
               doubled.status().message() + "\n" + Join(twice));
  }
  return 0;
}
