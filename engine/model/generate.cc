// Decoding: one full forward per new token over the window of the last max_seq_len tokens.
#include "engine/model/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

namespace meshrun {

namespace {

// The next token from one row of logits.
int32_t Pick(const float* logits, int64_t V, const SamplingOptions& o, std::mt19937_64& rng) {
  if (o.temperature <= 0) {
    return static_cast<int32_t>(std::max_element(logits, logits + V) - logits);
  }
  std::vector<int32_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  size_t keep = order.size();
  if (o.top_k > 0) keep = std::min(keep, static_cast<size_t>(o.top_k));
  std::vector<double> p(keep);
  const double top = logits[order[0]];
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) {
    p[i] = std::exp((logits[order[i]] - top) / o.temperature);
    sum += p[i];
  }
  if (o.top_p < 1.0) {
    double mass = 0;
    size_t n = 0;
    while (n < keep && mass < o.top_p * sum) mass += p[n++];
    keep = std::max<size_t>(1, n);
    p.resize(keep);
  }
  std::discrete_distribution<size_t> pick(p.begin(), p.end());
  return order[pick(rng)];
}

}  // namespace

StatusOr<std::vector<int32_t>> Generate(GPT2<float>& model, const std::vector<int32_t>& prompt,
                                        const SamplingOptions& o) {
  const int64_t V = model.config().vocab_size;
  const size_t window = static_cast<size_t>(model.config().max_seq_len);
  if (prompt.empty()) {
    return InvalidArgumentError("--prompt: empty (hint: give at least one character)");
  }
  for (int32_t t : prompt) {
    if (t < 0 || t >= V) {
      return InvalidArgumentError("--prompt: token " + std::to_string(t) +
                                  " is outside the model's vocabulary of " + std::to_string(V));
    }
  }
  std::mt19937_64 rng(o.seed);
  std::vector<int32_t> all = prompt, out;
  for (int i = 0; i < o.max_new_tokens; ++i) {
    const size_t first = all.size() > window ? all.size() - window : 0;
    const int T = static_cast<int>(all.size() - first);
    MESHRUN_RETURN_IF_ERROR(model.Forward(all.data() + first, 1, T));
    const int32_t next = Pick(model.logits() + static_cast<int64_t>(T - 1) * V, V, o, rng);
    out.push_back(next);
    all.push_back(next);
  }
  return out;
}

}  // namespace meshrun
