// Embedding lookup: finite-difference gradients (repeated tokens and positions included),
// float32 vs float64, accumulation and determinism.
#include <gtest/gtest.h>

#include "engine/kernels/cpu/kernels.h"
#include "tests/engine/kernels/kernel_test_util.h"

namespace meshrun::cpu {
namespace {

using testing::Cast;
using testing::Diff;
using testing::Dot;
using testing::ExpectClose;
using testing::NumericGrad;
using testing::Random;
using testing::RandomInts;

TEST(KernelsEmbedding, BackwardMatchesFiniteDifferences) {
  const int64_t N = 23, C = 70, V = 9, P = 16;  // C > one column task, tokens repeat
  const auto tokens = RandomInts(N, 1, 0, V - 1);
  const auto positions = RandomInts(N, 2, 0, P - 1);  // unordered, repeating: like cp chunks
  auto wte = Random(V * C, 3), wpe = Random(P * C, 4), R = Random(N * C, 5);
  std::vector<double> out(N * C);
  auto loss = [&] {
    EmbeddingForward(out.data(), tokens.data(), positions.data(), wte.data(), wpe.data(), N, C);
    return Dot(out, R);
  };
  const auto dwte0 = Random(V * C, 6), dwpe0 = Random(P * C, 7);
  auto dwte = dwte0, dwpe = dwpe0;
  EmbeddingBackward(dwte.data(), dwpe.data(), R.data(), tokens.data(), positions.data(), N, C);
  ExpectClose(Diff(dwte, dwte0), NumericGrad(wte, loss, 2000), testing::kFdRtol, testing::kFdAtol,
              "dwte");
  ExpectClose(Diff(dwpe, dwpe0), NumericGrad(wpe, loss, 2000), testing::kFdRtol, testing::kFdAtol,
              "dwpe");
  // dwpe may be null (e.g. a tp rank that does not own the position table).
  auto dwte2 = dwte0;
  EmbeddingBackward<double>(dwte2.data(), nullptr, R.data(), tokens.data(), positions.data(), N, C);
  EXPECT_TRUE(testing::BitIdentical(dwte2, dwte));
}

TEST(KernelsEmbedding, Float32MatchesFloat64AndIsDeterministic) {
  SetNumThreads(2);
  const int64_t N = 512, C = 200, V = 50, P = 512;
  const auto tokens = RandomInts(N, 1, 0, V - 1);
  const auto positions = RandomInts(N, 2, 0, P - 1);
  const auto wte = Random(V * C, 3), wpe = Random(P * C, 4), dout = Random(N * C, 5);
  std::vector<double> out(N * C), dwte(V * C, 0.0), dwpe(P * C, 0.0);
  EmbeddingForward(out.data(), tokens.data(), positions.data(), wte.data(), wpe.data(), N, C);
  EmbeddingBackward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), positions.data(), N, C);
  auto wtef = Cast<float>(wte), wpef = Cast<float>(wpe), doutf = Cast<float>(dout);
  auto run = [&] {
    std::vector<float> o(N * C), gt(V * C, 0.f), gp(P * C, 0.f);
    EmbeddingForward(o.data(), tokens.data(), positions.data(), wtef.data(), wpef.data(), N, C);
    EmbeddingBackward(gt.data(), gp.data(), doutf.data(), tokens.data(), positions.data(), N, C);
    return std::vector<std::vector<float>>{o, gt, gp};
  };
  const auto a = run(), b = run();
  ExpectClose(a[0], out, 1e-6, 0, "out");
  ExpectClose(a[1], dwte, 1e-5, 0, "dwte");
  ExpectClose(a[2], dwpe, 1e-5, 0, "dwpe");
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(testing::BitIdentical(a[i], b[i])) << i;
}

}  // namespace
}  // namespace meshrun::cpu
