// data_order_dump: prints, as one JSON object, the token ids the engine's sampler (the
// MixtureSampler the trainer fills its batches from) gives the global batch of one step, for
// data_order_doc_test.py to compare with its own implementation of docs/data.md.
//
//   data_order_dump --seq-len T --batch B --seed S --order sequential|shuffled --step K
//                   [--dp N] [--format auto|llmc|nanogpt|text] PATH[=WEIGHT]...
//
// With --dp N each of the N dp ranks fills its own slice (DpRankRange) and the slices are joined
// in rank order, as the trainer's ranks read them. Output: {"windows": [[source, window], …],
// "inputs": [[id × T] × B], "targets": [[id × T] × B]}. Exit 2 with a one-line error on bad input.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/data/batch_sampler.h"
#include "engine/data/mixture_sampler.h"
#include "engine/data/token_stream.h"

namespace {

int DumpFail(const std::string& message) {
  std::fprintf(stderr, "error: %s\n", message.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using meshrun::MixtureSampler;
  int seq_len = 0, batch = 0, dp = 1;
  int64_t step = 0;
  uint64_t seed = 0;
  std::string order_name = "shuffled", format = "auto";
  std::vector<std::pair<std::string, double>> paths;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--seq-len" && has_value) {
      seq_len = std::atoi(argv[++i]);
    } else if (a == "--batch" && has_value) {
      batch = std::atoi(argv[++i]);
    } else if (a == "--seed" && has_value) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--order" && has_value) {
      order_name = argv[++i];
    } else if (a == "--step" && has_value) {
      step = std::atoll(argv[++i]);
    } else if (a == "--dp" && has_value) {
      dp = std::atoi(argv[++i]);
    } else if (a == "--format" && has_value) {
      format = argv[++i];
    } else if (!a.empty() && a[0] != '-') {
      const size_t eq = a.rfind('=');
      if (eq == std::string::npos) {
        paths.emplace_back(a, 1.0);
      } else {
        paths.emplace_back(a.substr(0, eq), std::atof(a.c_str() + eq + 1));
      }
    } else {
      return DumpFail("unknown or incomplete argument '" + a + "'");
    }
  }
  if (paths.empty()) return DumpFail("no data paths given");
  meshrun::StatusOr<meshrun::Order> order = meshrun::ParseOrder(order_name);
  if (!order.ok()) return DumpFail(order.status().message());
  std::vector<std::unique_ptr<meshrun::TokenStream>> streams;
  std::vector<MixtureSampler::Source> sources;
  for (const auto& [path, weight] : paths) {
    meshrun::StatusOr<meshrun::TokenStream> s = meshrun::LoadTokens(path, format);
    if (!s.ok()) return DumpFail(s.status().message());
    streams.push_back(std::make_unique<meshrun::TokenStream>(std::move(*s)));
    sources.push_back({streams.back().get(), weight});
  }
  meshrun::StatusOr<MixtureSampler> sampler =
      MixtureSampler::Create(sources, seq_len, batch, seed, *order);
  if (!sampler.ok()) return DumpFail(sampler.status().message());
  const size_t t = static_cast<size_t>(seq_len);
  std::vector<int32_t> inputs(static_cast<size_t>(batch) * t), targets(inputs.size());
  for (int d = 0; d < dp; ++d) {
    meshrun::StatusOr<meshrun::SeqRange> range = meshrun::DpRankRange(batch, dp, d);
    if (!range.ok()) return DumpFail(range.status().message());
    const size_t at = static_cast<size_t>(range->first) * t;
    const meshrun::Status st =
        sampler->Fill(step, range->first, range->count, inputs.data() + at, targets.data() + at);
    if (!st.ok()) return DumpFail(st.message());
  }
  nlohmann::json out = {{"windows", nlohmann::json::array()},
                        {"inputs", nlohmann::json::array()},
                        {"targets", nlohmann::json::array()}};
  for (int i = 0; i < batch; ++i) {
    const MixtureSampler::Window w = sampler->WindowOf(step, i);
    out["windows"].push_back({w.source, w.window});
    const size_t at = static_cast<size_t>(i) * t;
    out["inputs"].push_back(std::vector<int32_t>(inputs.begin() + at, inputs.begin() + at + t));
    out["targets"].push_back(std::vector<int32_t>(targets.begin() + at, targets.begin() + at + t));
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
