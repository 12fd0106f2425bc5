// Mixed precision on cuda (train.precision: bf16, decision 0027): the bf16 GEMMs of
// ops::SetMatmulPrecision against the CPU GEMM on bf16-rounded operands, the casts against
// the CPU casts bit for bit, and the one model in bf16 against the same model in float32 on
// the same GPU: gradients of a tiny model within bf16 tolerance, and a short training run whose
// first steps stay within a bounded distance of the float32 run and whose loss then falls.
//
// Tolerances (docs/gpu.md "Precision"): bf16 keeps 8 bits of mantissa (relative rounding
// 2^-9 ≈ 0.2%); a GEMM of bf16 operands with float32 accumulation differs from the float32 GEMM
// by about that per operand. Gradients of the tiny model: normalised max error ≤ 5e-2 per
// parameter. Training (mean loss per token): |loss_bf16 − loss_fp32| ≤ 2% of the fp32 loss over
// the first 3 steps, ≤ 10% + 0.05 for every later step (the runs drift apart as the updates
// differ), and the bf16 loss of the last step below 90% of its first.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "common/job_spec.h"
#include "engine/kernels/cpu/kernels.h"
#include "engine/model/gpt2.h"
#include "engine/ops/ops.h"
#include "engine/train/optimizer.h"
#include "engine/train/schedule.h"
#include "tests/gpu/gpu_test.h"

namespace meshrun {
namespace {

using gputest::RandomInts;

constexpr Device kCuda{DeviceType::kCuda, 0};

// Every test leaves the device in float32 (the default), whatever it asserted.
struct PrecisionScope {
  explicit PrecisionScope(ops::MatmulPrecision p) { (void)ops::SetMatmulPrecision(kCuda, p); }
  ~PrecisionScope() { (void)ops::SetMatmulPrecision(kCuda, ops::MatmulPrecision::kFloat32); }
};

float RoundBf16(float f) {
  uint16_t b = 0;
  (void)ops::CastToBf16(Device{}, &b, &f, 1);
  float out = 0;
  (void)ops::CastFromBf16(Device{}, &out, &b, 1);
  return out;
}

std::vector<float> Random(std::mt19937& rng, int64_t n, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<float> Host(const float* p, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  const Status s = ops::CopyToHost(kCuda, out.data(), p, sizeof(float) * n);
  if (!s.ok()) std::printf("  copy to host: %s\n", s.ToString().c_str());
  return out;
}

// A device copy of a host vector, freed with the Tensor.
Tensor Upload(const std::vector<float>& v) {
  Tensor t = Tensor::Empty({static_cast<int64_t>(v.size())}, ScalarType::kFloat32, kCuda);
  (void)ops::CopyFromHost(kCuda, t.raw(), v.data(), sizeof(float) * v.size());
  return t;
}

GPU_TEST(CastsMatchTheCpuBitForBit) {
  std::mt19937 rng(1);
  std::vector<float> x = Random(rng, 4099, 3.0f);
  x[0] = 0.0f;
  x[1] = -0.0f;
  x[2] = 1.0f + 1.0f / 256;  // a tie: rounds to even
  x[3] = 3.0e38f;
  std::vector<uint16_t> want(x.size());
  ASSERT_OK(ops::CastToBf16(Device{}, want.data(), x.data(), static_cast<int64_t>(x.size())));
  Tensor dx = Upload(x);
  Tensor d16 = Tensor::Empty({static_cast<int64_t>(x.size())}, ScalarType::kBFloat16, kCuda);
  ASSERT_OK(ops::CastToBf16(kCuda, static_cast<uint16_t*>(d16.raw()), dx.data<float>(),
                            static_cast<int64_t>(x.size())));
  std::vector<uint16_t> got(x.size());
  ASSERT_OK(ops::CopyToHost(kCuda, got.data(), d16.raw(), sizeof(uint16_t) * got.size()));
  size_t mismatches = 0;
  for (size_t i = 0; i < got.size(); ++i) mismatches += got[i] != want[i] ? 1 : 0;
  EXPECT_TRUE(mismatches == 0);
  ASSERT_OK(ops::CastFromBf16(kCuda, dx.data<float>(), static_cast<const uint16_t*>(d16.raw()),
                              static_cast<int64_t>(x.size())));
  std::vector<float> back(x.size());
  ASSERT_OK(ops::CastFromBf16(Device{}, back.data(), want.data(), static_cast<int64_t>(x.size())));
  EXPECT_CLOSE("widened", Host(dx.data<float>(), static_cast<int64_t>(x.size())), back, 0.0);
}

// The bf16 GEMMs compute exactly the products of the bf16-rounded operands (accumulated in
// float32): against the CPU GEMM of the rounded operands they agree to float32 accumulation.
GPU_TEST(MixedMatmulIsTheGemmOfTheRoundedOperands) {
  std::mt19937 rng(2);
  const int64_t N = 37, C = 72, OC = 50;
  std::vector<float> inp = Random(rng, N * C), w = Random(rng, OC * C, 0.1f),
                     bias = Random(rng, OC), dout = Random(rng, N * OC);
  std::vector<float> inp_r = inp, w_r = w, dout_r = dout;
  for (float& x : inp_r) x = RoundBf16(x);
  for (float& x : w_r) x = RoundBf16(x);
  for (float& x : dout_r) x = RoundBf16(x);
  std::vector<float> out(N * OC), dinp(N * C, 0.5f), dw(OC * C, 0.25f), db(OC, 0.125f);
  cpu::MatmulForward(out.data(), inp_r.data(), w_r.data(), bias.data(), N, C, OC);
  // The bias gradient comes from the float32 dout; dinp and dweight from the rounded one.
  cpu::MatmulBackward(dinp.data(), dw.data(), static_cast<float*>(nullptr), dout_r.data(),
                      inp_r.data(), w_r.data(), N, C, OC);
  cpu::BiasBackward(db.data(), dout.data(), N, OC);

  PrecisionScope bf16(ops::MatmulPrecision::kBf16);
  EXPECT_TRUE(ops::MatmulPrecisionOf(kCuda) == ops::MatmulPrecision::kBf16);
  Tensor d_inp = Upload(inp), d_w = Upload(w), d_bias = Upload(bias), d_dout = Upload(dout),
         d_out = Upload(std::vector<float>(N * OC)),
         d_dinp = Upload(std::vector<float>(N * C, 0.5f)),
         d_dw = Upload(std::vector<float>(OC * C, 0.25f)),
         d_db = Upload(std::vector<float>(OC, 0.125f));
  ASSERT_OK(ops::MatmulForward(kCuda, d_out.data<float>(), d_inp.data<float>(), d_w.data<float>(),
                               d_bias.data<float>(), N, C, OC));
  ASSERT_OK(ops::MatmulBackward(kCuda, d_dinp.data<float>(), d_dw.data<float>(), d_db.data<float>(),
                                d_dout.data<float>(), d_inp.data<float>(), d_w.data<float>(), N, C,
                                OC));
  EXPECT_CLOSE("mixed forward", Host(d_out.data<float>(), N * OC), out, 2e-5);
  EXPECT_CLOSE("mixed dinp (accumulated)", Host(d_dinp.data<float>(), N * C), dinp, 2e-5);
  EXPECT_CLOSE("mixed dweight (accumulated)", Host(d_dw.data<float>(), OC * C), dw, 2e-5);
  EXPECT_CLOSE("mixed dbias (accumulated)", Host(d_db.data<float>(), OC), db, 2e-5);
}

// The bf16 copy of the last weight is reused only while that weight cannot have changed: after
// an upload into the same buffer, and after a write no op announces (a GEMM's output landing in
// the weight's buffer, as a collective's would) followed by ops::ParametersChanged, the next GEMM
// reads the new weight.
GPU_TEST(MixedMatmulRereadsAChangedWeight) {
  std::mt19937 rng(4);
  const int64_t N = 16, C = 32, OC = 24;
  const std::vector<float> inp = Random(rng, N * C), w1 = Random(rng, OC * C, 0.1f),
                           w2 = Random(rng, OC * C, 0.1f);
  auto cpu_forward = [&](const std::vector<float>& w) {
    std::vector<float> a = inp, b = w, out(N * OC);
    for (float& x : a) x = RoundBf16(x);
    for (float& x : b) x = RoundBf16(x);
    cpu::MatmulForward(out.data(), a.data(), b.data(), static_cast<const float*>(nullptr), N, C,
                       OC);
    return out;
  };
  PrecisionScope bf16(ops::MatmulPrecision::kBf16);
  Tensor d_inp = Upload(inp), d_w = Upload(w1), d_out = Upload(std::vector<float>(N * OC));
  auto forward = [&]() -> std::vector<float> {
    const Status s =
        ops::MatmulForward(kCuda, d_out.data<float>(), d_inp.data<float>(), d_w.data<float>(),
                           static_cast<const float*>(nullptr), N, C, OC);
    if (!s.ok()) std::printf("  forward: %s\n", s.ToString().c_str());
    return Host(d_out.data<float>(), N * OC);
  };
  // For the write below: w3[OC, C] = src[OC, K]·mixᵀ with mix [C, K] (uploaded first: an
  // upload is a write the ops announce).
  const int64_t K = 8;
  Tensor d_src = Upload(Random(rng, OC * K)), d_mix = Upload(Random(rng, C * K, 0.1f));
  EXPECT_CLOSE("first weight", forward(), cpu_forward(w1), 2e-5);
  EXPECT_CLOSE("first weight again", forward(), cpu_forward(w1), 2e-5);
  ASSERT_OK(ops::CopyFromHost(kCuda, d_w.raw(), w2.data(), sizeof(float) * w2.size()));
  EXPECT_CLOSE("uploaded weight", forward(), cpu_forward(w2), 2e-5);
  // A float32 GEMM (which neither uses nor announces anything to the cache) writes the weight.
  ASSERT_OK(ops::SetMatmulPrecision(kCuda, ops::MatmulPrecision::kFloat32));
  ASSERT_OK(ops::MatmulForward(kCuda, d_w.data<float>(), d_src.data<float>(), d_mix.data<float>(),
                               static_cast<const float*>(nullptr), OC, K, C));
  ASSERT_OK(ops::SetMatmulPrecision(kCuda, ops::MatmulPrecision::kBf16));
  ops::ParametersChanged(kCuda);
  const std::vector<float> w3 = Host(d_w.data<float>(), OC * C);
  EXPECT_CLOSE("weight written by a GEMM", forward(), cpu_forward(w3), 2e-5);
}

GPT2Config Tiny() {
  GPT2Config cfg;
  cfg.vocab_size = 97;
  cfg.n_layer = 2;
  cfg.n_head = 4;
  cfg.d_model = 64;
  cfg.max_seq_len = 32;
  cfg.device = kCuda;
  return cfg;
}

GPU_TEST(Bf16GradientsOfATinyModelWithinBf16Tolerance) {
  GPT2<float> ref(Tiny()), mixed(Tiny());
  ref.InitDeterministic(7);
  mixed.InitDeterministic(7);
  std::mt19937 rng(3);
  const int B = 2, T = 16;
  const auto in = RandomInts(rng, B * T, 0, 96), tg = RandomInts(rng, B * T, 0, 96);
  ref.ZeroGrad();
  mixed.ZeroGrad();
  ASSERT_OK_AND_ASSIGN(const double want,
                       ref.ForwardBackward(in.data(), tg.data(), B, T, 1.0 / (B * T)));
  double got = 0;
  {
    PrecisionScope bf16(ops::MatmulPrecision::kBf16);
    ASSERT_OK_AND_ASSIGN(got, mixed.ForwardBackward(in.data(), tg.data(), B, T, 1.0 / (B * T)));
  }
  EXPECT_NEAR(got, want, 1e-2 * std::fabs(want));
  for (const ParamInfo& p : ref.params()) {
    EXPECT_CLOSE("bf16 grad " + p.name, Host(mixed.grad(p), p.numel), Host(ref.grad(p), p.numel),
                 5e-2);
  }
}

// AdamW on the float32 master weights, as ClipAndStep (engine/train/update.h) (one rank).
Status Step(GPT2<float>& m, Tensor& exp_avg, Tensor& exp_avg_sq, const TrainSpec& tr,
            int64_t step) {
  MESHRUN_ASSIGN_OR_RETURN(const double sq,
                           ops::SumOfSquares(kCuda, m.grads_data(), m.num_params()));
  const double norm = std::sqrt(sq);
  if (tr.grad_clip > 0 && norm > tr.grad_clip) {
    MESHRUN_RETURN_IF_ERROR(
        ops::Scale(kCuda, m.grads_data(), m.num_params(), tr.grad_clip / (norm + 1e-6)));
  }
  const double lr = LearningRate(tr.lr, tr.min_lr, tr.warmup_steps, tr.steps, step);
  for (const ParamInfo& p : m.params()) {
    MESHRUN_RETURN_IF_ERROR(
        ops::AdamW(kCuda, m.param(p), m.grad(p), exp_avg.data<float>() + p.offset,
                   exp_avg_sq.data<float>() + p.offset, p.numel, lr, tr.beta1, tr.beta2, tr.eps,
                   p.decay ? tr.weight_decay : 0.0, step + 1));
  }
  return OkStatus();
}

GPU_TEST(Bf16TrainingTracksTheFloat32RunAndTheLossFalls) {
  GPT2<float> ref(Tiny()), mixed(Tiny());
  ref.InitDeterministic(11);
  mixed.InitDeterministic(11);
  auto zeros = [&] { return Tensor::Zeros({ref.num_params()}, ScalarType::kFloat32, kCuda); };
  Tensor m_ref = zeros(), v_ref = zeros(), m_mix = zeros(), v_mix = zeros();
  TrainSpec tr;
  tr.steps = 20;
  tr.lr = 3e-3;
  tr.min_lr = 3e-4;
  tr.warmup_steps = 2;
  std::mt19937 rng(5);
  const int B = 4, T = 32;
  // A learnable stream: each target is a fixed function of its input.
  const auto in = RandomInts(rng, B * T, 0, 96);
  std::vector<int32_t> tg(in.size());
  for (size_t i = 0; i < in.size(); ++i) tg[i] = (in[i] * 7 + 3) % 97;
  double first = 0, last = 0;
  for (int step = 0; step < tr.steps; ++step) {
    ref.ZeroGrad();
    mixed.ZeroGrad();
    ASSERT_OK_AND_ASSIGN(const double want,
                         ref.ForwardBackward(in.data(), tg.data(), B, T, 1.0 / (B * T)));
    ASSERT_OK(Step(ref, m_ref, v_ref, tr, step));
    double got = 0;
    {
      PrecisionScope bf16(ops::MatmulPrecision::kBf16);
      ASSERT_OK_AND_ASSIGN(got, mixed.ForwardBackward(in.data(), tg.data(), B, T, 1.0 / (B * T)));
    }
    ASSERT_OK(Step(mixed, m_mix, v_mix, tr, step));
    std::printf("  step %2d  mean loss fp32 %.5f  bf16 %.5f\n", step + 1, want / (B * T),
                got / (B * T));
    const double mean_want = want / (B * T), mean_got = got / (B * T);
    EXPECT_NEAR(mean_got, mean_want, step < 3 ? 2e-2 * mean_want : 0.1 * mean_want + 0.05);
    if (step == 0) first = got;
    last = got;
  }
  EXPECT_TRUE(last < 0.9 * first);
}

GPU_TEST(CpuRefusesBf16Gemms) {
  const Status s = ops::SetMatmulPrecision(Device{}, ops::MatmulPrecision::kBf16);
  EXPECT_TRUE(!s.ok());
  EXPECT_TRUE(ops::SetMatmulPrecision(Device{}, ops::MatmulPrecision::kFloat32).ok());
}

}  // namespace
}  // namespace meshrun

GPU_TEST_MAIN()
