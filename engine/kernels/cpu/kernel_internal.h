// Internal to the CPU kernels (not part of their interface): when a loop is worth a thread team,
// and scalar math written so that the compiler vectorizes it inside `#pragma omp simd` loops
// (libm's expf is not vectorized without -ffast-math, and exp dominates softmax, attention and
// GELU).
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace meshrun::cpu::internal {

// Below this much work (element updates, or multiply-adds / 16) a kernel stays on the calling
// thread: waking the team costs more than it saves, and on a loaded machine much more (a
// descheduled thread stalls every barrier for a time slice).
constexpr double kMinParallelWork = 1 << 15;
inline bool WorthParallel(double work) {
  return work >= kMinParallelWork;
}

// e^x for float with ≤ 2 ulp error on [-87, 88]: e^x = 2^n · e^r, n = round(x·log2 e),
// |r| ≤ ln2/2, with Cephes' expf polynomial. x < -87 (including -inf) gives exactly 0, which
// masked attention scores rely on; x > 88 saturates at e^88 (the kernels never go there).
inline float ExpF(float x) {
  const float xc = std::min(std::max(x, -87.0f), 88.0f);
  // Round to nearest without floor/nearbyint (which need SSE4.1 to vectorize): adding 1.5·2^23
  // pushes the fraction out of the mantissa.
  constexpr float kRound = 12582912.0f;
  const float n = (xc * 1.44269504088896341f + kRound) - kRound;
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const float scale = std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
  return x < -87.0f ? 0.0f : p * scale;
}

template <typename T>
inline T Exp(T x) {
  if constexpr (sizeof(T) == sizeof(float)) {
    return ExpF(x);
  } else {
    return std::exp(x);  // float64 is the tests' reference precision: accuracy over speed
  }
}

}  // namespace meshrun::cpu::internal
