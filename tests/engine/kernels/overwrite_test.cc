// The kernels' overwrite forms (issue #37: no zeroing pass before a first write) give what
// accumulating onto zeros gives, bit for bit, whatever the buffer held; and BiasBackward's
// row-contiguous blocks add each column's rows in row order, as a plain column loop does.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "engine/kernels/cpu/kernels.h"

namespace meshrun::cpu {
namespace {

std::vector<float> RandomFloats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0;
}

TEST(KernelsOverwrite, GeluBackwardOverwriteEqualsAccumulatingOntoZeros) {
  SetNumThreads(2);
  // Long enough to run in parallel chunks, with a tail past the vector width.
  for (const int64_t n : {int64_t{13}, int64_t{1000003}}) {
    const std::vector<float> inp = RandomFloats(n, 1), dout = RandomFloats(n, 2);
    std::vector<float> zeros(n, 0.0f);
    GeluBackward(zeros.data(), inp.data(), dout.data(), n);
    std::vector<float> garbage(n, std::numeric_limits<float>::quiet_NaN());
    GeluBackward(garbage.data(), inp.data(), dout.data(), n, /*accumulate=*/false);
    EXPECT_TRUE(SameBits(zeros, garbage)) << "n " << n;
    // And accumulating still adds.
    std::vector<float> twice = zeros;
    GeluBackward(twice.data(), inp.data(), dout.data(), n);
    EXPECT_EQ(twice[n / 2], zeros[n / 2] + zeros[n / 2]);
  }
}

TEST(KernelsOverwrite, MatmulBackwardOverwriteEqualsAccumulatingOntoZeros) {
  SetNumThreads(2);
  const int64_t N = 97, C = 80, OC = 130;
  const std::vector<float> dout = RandomFloats(N * OC, 3), inp = RandomFloats(N * C, 4),
                           weight = RandomFloats(OC * C, 5);
  std::vector<float> zeros(N * C, 0.0f);
  std::vector<float> dw_a(OC * C, 0.0f), dw_b(OC * C, 0.0f);
  MatmulBackward(zeros.data(), dw_a.data(), static_cast<float*>(nullptr), dout.data(), inp.data(),
                 weight.data(), N, C, OC);
  std::vector<float> garbage(N * C, std::numeric_limits<float>::quiet_NaN());
  MatmulBackward(garbage.data(), dw_b.data(), static_cast<float*>(nullptr), dout.data(), inp.data(),
                 weight.data(), N, C, OC, /*accumulate_dinp=*/false);
  EXPECT_TRUE(SameBits(zeros, garbage));
  EXPECT_TRUE(SameBits(dw_a, dw_b));  // the weight gradient still accumulates either way
  std::vector<float> acc = zeros;
  MatmulBackward(acc.data(), static_cast<float*>(nullptr), static_cast<float*>(nullptr),
                 dout.data(), inp.data(), weight.data(), N, C, OC);
  EXPECT_NEAR(acc[5], 2.0f * zeros[5], 1e-4f * std::fabs(zeros[5]) + 1e-6f);
}

TEST(KernelsOverwrite, BiasBackwardAddsEachColumnsRowsInRowOrder) {
  SetNumThreads(2);
  // C past one 64-column block and not a multiple of it; N large enough to run in parallel.
  for (const int64_t C : {int64_t{7}, int64_t{200}}) {
    const int64_t N = 4099;
    const std::vector<float> dout = RandomFloats(N * C, 6);
    std::vector<float> dbias = RandomFloats(C, 7);
    std::vector<float> expect = dbias;
    for (int64_t j = 0; j < C; ++j) {
      float sum = 0;
      for (int64_t i = 0; i < N; ++i) sum += dout[i * C + j];
      expect[j] += sum;
    }
    BiasBackward(dbias.data(), dout.data(), N, C);
    EXPECT_TRUE(SameBits(dbias, expect)) << "C " << C;
  }
}

}  // namespace
}  // namespace meshrun::cpu
