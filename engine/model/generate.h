// Text generation from a GPT-2: greedy or sampled (temperature, top-k, top-p, a seed) decoding
// of new tokens after a prompt. Each new token runs the model over the last max_seq_len tokens
// (no KV cache: generation here is for looking at what a model learned, not for serving).
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "engine/model/gpt2.h"

namespace meshrun {

struct SamplingOptions {
  int max_new_tokens = 64;
  double temperature = 0;  // 0: greedy (the most likely token, the first of equals)
  int top_k = 0;           // > 0: sample among the k most likely
  double top_p = 1.0;      // < 1: sample among the smallest set whose probability reaches p
  uint64_t seed = 1;
};

// The prompt's continuation (new tokens only). INVALID_ARGUMENT for an empty prompt or ids
// outside the vocabulary.
StatusOr<std::vector<int32_t>> Generate(GPT2<float>& model, const std::vector<int32_t>& prompt,
                                        const SamplingOptions& options);

}  // namespace meshrun
