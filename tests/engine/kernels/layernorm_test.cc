// LayerNorm: finite-difference gradients, float32 vs float64, accumulation and determinism.
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

TEST(KernelsLayerNorm, ForwardNormalizesRows) {
  const int64_t N = 3, C = 50;
  auto inp = Random(N * C, 1, 3.0, 5.0);  // |mean| >> std: the two-pass variance matters
  std::vector<double> w(C, 1.0), b(C, 0.0), out(N * C), mean(N), rstd(N);
  LayerNormForward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C,
                   1e-5);
  for (int64_t i = 0; i < N; ++i) {
    double m = 0, v = 0;
    for (int64_t c = 0; c < C; ++c) m += inp[i * C + c];
    m /= C;
    for (int64_t c = 0; c < C; ++c) v += (inp[i * C + c] - m) * (inp[i * C + c] - m);
    v /= C;
    EXPECT_NEAR(mean[i], m, 1e-13);
    EXPECT_NEAR(rstd[i], 1 / std::sqrt(v + 1e-5), 1e-10);
    for (int64_t c = 0; c < C; ++c) {
      EXPECT_NEAR(out[i * C + c], (inp[i * C + c] - m) / std::sqrt(v + 1e-5), 1e-10);
    }
  }
}

TEST(KernelsLayerNorm, BackwardMatchesFiniteDifferences) {
  const int64_t N = 37, C = 19;  // N spans two row blocks of the dweight reduction
  auto inp = Random(N * C, 1, -2, 2), w = Random(C, 2), b = Random(C, 3), R = Random(N * C, 4);
  std::vector<double> out(N * C), mean(N), rstd(N);
  auto loss = [&] {
    LayerNormForward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C,
                     1e-5);
    return Dot(out, R);
  };
  loss();
  const auto dinp0 = Random(N * C, 5), dw0 = Random(C, 6), db0 = Random(C, 7);
  auto dinp = dinp0, dw = dw0, db = db0;
  LayerNormBackward(dinp.data(), dw.data(), db.data(), R.data(), inp.data(), w.data(), mean.data(),
                    rstd.data(), N, C);
  ExpectClose(Diff(dinp, dinp0), NumericGrad(inp, loss, 1000), testing::kFdRtol, testing::kFdAtol,
              "dinp");
  ExpectClose(Diff(dw, dw0), NumericGrad(w, loss), testing::kFdRtol, testing::kFdAtol, "dweight");
  ExpectClose(Diff(db, db0), NumericGrad(b, loss), testing::kFdRtol, testing::kFdAtol, "dbias");
}

TEST(KernelsLayerNorm, Float32MatchesFloat64AndIsDeterministic) {
  SetNumThreads(2);
  const int64_t N = 300, C = 768;
  const auto inp = Random(N * C, 1, -3, 3), w = Random(C, 2), b = Random(C, 3),
             dout = Random(N * C, 4);
  std::vector<double> out(N * C), mean(N), rstd(N), dinp(N * C, 0.0), dw(C, 0.0), db(C, 0.0);
  LayerNormForward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C,
                   1e-5);
  LayerNormBackward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(),
                    mean.data(), rstd.data(), N, C);
  auto inpf = Cast<float>(inp), wf = Cast<float>(w), bf = Cast<float>(b), doutf = Cast<float>(dout);
  auto run = [&] {
    std::vector<float> o(N * C), m(N), r(N), gi(N * C, 0.f), gw(C, 0.f), gb(C, 0.f);
    LayerNormForward(o.data(), m.data(), r.data(), inpf.data(), wf.data(), bf.data(), N, C, 1e-5);
    LayerNormBackward(gi.data(), gw.data(), gb.data(), doutf.data(), inpf.data(), wf.data(),
                      m.data(), r.data(), N, C);
    return std::vector<std::vector<float>>{o, gi, gw, gb};
  };
  const auto a = run(), b2 = run();
  ExpectClose(a[0], out, 1e-5, 0, "out");
  ExpectClose(a[1], dinp, 1e-5, 0, "dinp");
  ExpectClose(a[2], dw, 1e-5, 0, "dweight");
  ExpectClose(a[3], db, 1e-5, 0, "dbias");
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(testing::BitIdentical(a[i], b2[i])) << i;
}

}  // namespace
}  // namespace meshrun::cpu
