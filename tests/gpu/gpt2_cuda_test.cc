// The single-GPU GPT-2 (engine/cuda/gpt2_cuda.h) against the CPU model (engine/model/gpt2.h):
// logits and gradients in float32, and short training runs whose losses track the CPU engine
// (float32 tightly, bf16 within bf16 tolerance). The CPU reference loop is the CPU trainer's
// update (ShardedState::ClipAndStep of engine/train/sharding.cc) written out with the CPU kernels,
// so this test needs neither meshrun_engine nor nlohmann-json.
#include "engine/cuda/gpt2_cuda.h"

#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "common/job_spec.h"
#include "engine/kernels/cpu/kernels.h"
#include "engine/model/gpt2.h"
#include "engine/train/schedule.h"
#include "tests/gpu/gpu_test.h"

namespace meshrun {
namespace {

using gpu::GPT2Cuda;
using gpu::GPT2CudaOptions;
using gpu::Precision;

GPT2Config TinyConfig() {
  GPT2Config cfg;
  cfg.vocab_size = 256;
  cfg.n_layer = 2;
  cfg.n_head = 2;
  cfg.d_model = 128;  // head size 64: the tensor-core attention runs in bf16
  cfg.max_seq_len = 64;
  return cfg;
}

// A learnable token stream: each token is an affine function of the previous one plus a little
// noise, so the loss falls well below ln(256) within a few steps.
std::vector<int32_t> TokenStream(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> noise(0, 3);
  std::vector<int32_t> s(n);
  s[0] = 7;
  for (size_t i = 1; i < n; ++i) s[i] = (s[i - 1] * 5 + 17 + noise(rng)) % 256;
  return s;
}

struct Batch {
  std::vector<int32_t> inputs, targets;
};

// Windows (docs/data.md, order sequential) of step k.
Batch MakeBatch(const std::vector<int32_t>& stream, int step, int B, int T) {
  const int64_t windows = (static_cast<int64_t>(stream.size()) - 1) / T;
  Batch b;
  for (int i = 0; i < B; ++i) {
    const int64_t w = (static_cast<int64_t>(step) * B + i) % windows;
    for (int t = 0; t < T; ++t) {
      b.inputs.push_back(stream[w * T + t]);
      b.targets.push_back(stream[w * T + t + 1]);
    }
  }
  return b;
}

StatusOr<std::unique_ptr<GPT2Cuda>> MakeModel(const GPT2Config& cfg, Precision p,
                                              bool tensor_cores = true) {
  GPT2CudaOptions o;
  o.precision = p;
  o.tensor_core_attention = tensor_cores;
  MESHRUN_ASSIGN_OR_RETURN(std::unique_ptr<GPT2Cuda> m, GPT2Cuda::Create(cfg, o));
  MESHRUN_RETURN_IF_ERROR(m->InitDeterministic(1337));
  return m;
}

GPU_TEST(ForwardMatchesCpuFloat32) {
  const GPT2Config cfg = TinyConfig();
  const int B = 3, T = 64;
  const auto stream = TokenStream(4096, 1);
  const Batch batch = MakeBatch(stream, 0, B, T);
  GPT2<float> cpu_model(cfg);
  cpu_model.InitDeterministic(1337);
  ASSERT_OK(cpu_model.Forward(batch.inputs.data(), B, T));
  const std::vector<float> want(cpu_model.logits(), cpu_model.logits() + B * T * cfg.vocab_size);

  ASSERT_OK_AND_ASSIGN(auto model, MakeModel(cfg, Precision::kFloat32));
  ASSERT_OK(model->Forward(batch.inputs.data(), B, T));
  std::vector<float> got(want.size());
  ASSERT_OK(model->GetLogits(got.data()));
  EXPECT_CLOSE("logits fp32", got, want, 1e-4);

  ASSERT_OK_AND_ASSIGN(const double loss,
                       model->ForwardLoss(batch.inputs.data(), batch.targets.data(), B, T));
  ASSERT_OK_AND_ASSIGN(const double cpu_loss,
                       cpu_model.ForwardLoss(batch.inputs.data(), batch.targets.data(), B, T));
  EXPECT_NEAR(loss, cpu_loss, 1e-5 * std::fabs(cpu_loss));

  // bf16: the same model within bf16 tolerance.
  ASSERT_OK_AND_ASSIGN(auto bf, MakeModel(cfg, Precision::kBFloat16));
  ASSERT_OK_AND_ASSIGN(const double bf_loss,
                       bf->ForwardLoss(batch.inputs.data(), batch.targets.data(), B, T));
  EXPECT_NEAR(bf_loss, cpu_loss, 0.02 * std::fabs(cpu_loss));
}

// Per-parameter normalised comparison of two flat gradient buffers.
void CompareGrads(const char* label, const std::vector<ParamInfo>& layout,
                  const std::vector<float>& got, const std::vector<float>& want, double tol) {
  for (const ParamInfo& p : layout) {
    const std::vector<float> g(got.begin() + p.offset, got.begin() + p.offset + p.numel);
    const std::vector<float> w(want.begin() + p.offset, want.begin() + p.offset + p.numel);
    EXPECT_CLOSE(std::string(label) + " grad " + p.name, g, w, tol);
  }
}

GPU_TEST(GradientsMatchCpuFloat32) {
  const GPT2Config cfg = TinyConfig();
  const int B = 2, T = 64;
  const auto stream = TokenStream(4096, 2);
  const Batch batch = MakeBatch(stream, 1, B, T);
  const double scale = 1.0 / (B * T);
  GPT2<float> cpu_model(cfg);
  cpu_model.InitDeterministic(1337);
  cpu_model.ZeroGrad();
  ASSERT_OK_AND_ASSIGN(
      const double cpu_loss,
      cpu_model.ForwardBackward(batch.inputs.data(), batch.targets.data(), B, T, scale));
  const std::vector<float> want(cpu_model.grads_data(),
                                cpu_model.grads_data() + cpu_model.num_params());

  ASSERT_OK_AND_ASSIGN(auto model, MakeModel(cfg, Precision::kFloat32));
  ASSERT_OK(model->ZeroGrad());
  ASSERT_OK_AND_ASSIGN(
      const double loss,
      model->ForwardBackward(batch.inputs.data(), batch.targets.data(), B, T, scale));
  EXPECT_NEAR(loss, cpu_loss, 1e-5 * std::fabs(cpu_loss));
  std::vector<float> got(model->num_params());
  ASSERT_OK(model->GetGrads(got.data()));
  CompareGrads("fp32", model->params(), got, want, 1e-3);

  // bf16 (tensor-core attention): the same gradients within bf16 tolerance.
  ASSERT_OK_AND_ASSIGN(auto bf, MakeModel(cfg, Precision::kBFloat16));
  ASSERT_OK(bf->ZeroGrad());
  ASSERT_OK_AND_ASSIGN(const double bf_loss,
                       bf->ForwardBackward(batch.inputs.data(), batch.targets.data(), B, T, scale));
  EXPECT_NEAR(bf_loss, cpu_loss, 0.02 * std::fabs(cpu_loss));
  ASSERT_OK(bf->GetGrads(got.data()));
  CompareGrads("bf16", bf->params(), got, want, 0.1);
}

TrainSpec TrainConfig(int steps) {
  TrainSpec tr;
  tr.steps = steps;
  tr.lr = 1e-3;
  tr.min_lr = 1e-4;
  tr.warmup_steps = 2;
  tr.weight_decay = 0.1;
  tr.grad_clip = 1.0;
  return tr;
}

// The CPU engine's loop: ForwardBackward on the mean loss, clip by the global norm, AdamW.
StatusOr<std::vector<double>> CpuLosses(const GPT2Config& cfg, const std::vector<int32_t>& stream,
                                        int B, int T, const TrainSpec& tr) {
  GPT2<float> model(cfg);
  model.InitDeterministic(1337);
  const int64_t n = model.num_params();
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  std::vector<double> losses;
  for (int step = 0; step < tr.steps; ++step) {
    const Batch b = MakeBatch(stream, step, B, T);
    model.ZeroGrad();
    MESHRUN_ASSIGN_OR_RETURN(
        const double sum,
        model.ForwardBackward(b.inputs.data(), b.targets.data(), B, T, 1.0 / (B * T)));
    losses.push_back(sum / (B * T));
    float* g = model.grads_data();
    const double norm = std::sqrt(cpu::SumOfSquares(g, n));
    if (tr.grad_clip > 0 && norm > tr.grad_clip) cpu::Scale(g, n, tr.grad_clip / (norm + 1e-6));
    const double lr = LearningRate(tr.lr, tr.min_lr, tr.warmup_steps, tr.steps, step);
    for (const ParamInfo& p : model.params()) {
      cpu::AdamW(model.params_data() + p.offset, g + p.offset, m.data() + p.offset,
                 v.data() + p.offset, p.numel, lr, tr.beta1, tr.beta2, tr.eps,
                 p.decay ? tr.weight_decay : 0.0, step + 1);
    }
  }
  return losses;
}

void CheckTraining(const char* label, Precision precision, bool tensor_cores, double rel_tol) {
  const GPT2Config cfg = TinyConfig();
  const int B = 4, T = 64;
  const TrainSpec tr = TrainConfig(20);
  const auto stream = TokenStream(64 * 200 + 1, 3);
  static const StatusOr<std::vector<double>> cpu = CpuLosses(cfg, stream, B, T, tr);
  ASSERT_OK(cpu.status());
  const std::vector<double>& want = *cpu;

  ASSERT_OK_AND_ASSIGN(auto model, MakeModel(cfg, precision, tensor_cores));
  std::printf("  %-18s step  gpu loss   cpu loss\n", label);
  for (int step = 0; step < tr.steps; ++step) {
    const Batch b = MakeBatch(stream, step, B, T);
    ASSERT_OK(model->ZeroGrad());
    ASSERT_OK_AND_ASSIGN(const double sum, model->ForwardBackward(b.inputs.data(), b.targets.data(),
                                                                  B, T, 1.0 / (B * T)));
    const double loss = sum / (B * T);
    ASSERT_OK_AND_ASSIGN(const UpdateResult u, model->ClipAndAdamW(tr, step));
    std::printf("  %-18s %4d  %.6f   %.6f  (grad norm %.4f, lr %.2e)\n", label, step + 1, loss,
                want[step], u.grad_norm, u.lr);
    EXPECT_NEAR(loss, want[step], rel_tol * want[step]);
  }
  EXPECT_TRUE(want.back() < want.front() - 0.3);  // the reference itself learns
}

GPU_TEST(TrainingTracksCpuFloat32) {
  CheckTraining("fp32", Precision::kFloat32, false, 2e-3);
}
GPU_TEST(TrainingTracksCpuBf16TensorCore) {
  CheckTraining("bf16 tensor-core", Precision::kBFloat16, true, 3e-2);
}
GPU_TEST(TrainingTracksCpuBf16Generic) {
  CheckTraining("bf16 generic", Precision::kBFloat16, false, 3e-2);
}

// GPT-2 small's widths (d_model 768, 12 heads, the real 50257-token vocabulary, padded to 50304
// on the device) with one layer: the padded LM head, cross-entropy and tied-embedding gradient.
GPU_TEST(Gpt2SmallShapesMatchCpu) {
  GPT2Config cfg;
  cfg.vocab_size = 50257;
  cfg.n_layer = 1;
  cfg.n_head = 12;
  cfg.d_model = 768;
  cfg.max_seq_len = 256;
  const int B = 2, T = 256;
  std::mt19937 rng(4);
  Batch batch;
  batch.inputs = gputest::RandomInts(rng, B * T, 0, cfg.vocab_size - 1);
  batch.targets = gputest::RandomInts(rng, B * T, 0, cfg.vocab_size - 1);
  const double scale = 1.0 / (B * T);
  GPT2<float> cpu_model(cfg);
  cpu_model.InitDeterministic(1337);
  cpu_model.ZeroGrad();
  ASSERT_OK_AND_ASSIGN(
      const double cpu_loss,
      cpu_model.ForwardBackward(batch.inputs.data(), batch.targets.data(), B, T, scale));
  const std::vector<float> want(cpu_model.grads_data(),
                                cpu_model.grads_data() + cpu_model.num_params());
  EXPECT_NEAR(cpu_loss / (B * T), std::log(50257.0), 0.5);

  for (const Precision p : {Precision::kFloat32, Precision::kBFloat16}) {
    ASSERT_OK_AND_ASSIGN(auto model, MakeModel(cfg, p));
    ASSERT_OK(model->ZeroGrad());
    ASSERT_OK_AND_ASSIGN(
        const double loss,
        model->ForwardBackward(batch.inputs.data(), batch.targets.data(), B, T, scale));
    const bool fp32 = p == Precision::kFloat32;
    EXPECT_NEAR(loss, cpu_loss, (fp32 ? 1e-5 : 1e-2) * cpu_loss);
    std::vector<float> got(model->num_params());
    ASSERT_OK(model->GetGrads(got.data()));
    CompareGrads(fp32 ? "gpt2-small fp32" : "gpt2-small bf16", model->params(), got, want,
                 fp32 ? 2e-3 : 0.1);
  }
}

GPU_TEST(ParamsRoundTripAndMemoryStats) {
  const GPT2Config cfg = TinyConfig();
  ASSERT_OK_AND_ASSIGN(auto model, MakeModel(cfg, Precision::kBFloat16));
  GPT2<float> cpu_model(cfg);
  cpu_model.InitDeterministic(1337);
  std::vector<float> got(model->num_params());
  ASSERT_OK(model->GetParams(got.data()));
  const std::vector<float> want(cpu_model.params_data(),
                                cpu_model.params_data() + cpu_model.num_params());
  EXPECT_CLOSE("params after InitDeterministic", got, want, 0.0);
  const MemoryStats m = model->memory_stats();
  EXPECT_TRUE(m.allocated_bytes >= static_cast<int64_t>(4 * sizeof(float) * model->num_params()));
  EXPECT_TRUE(m.peak_bytes >= m.allocated_bytes);
  EXPECT_TRUE(m.reserved_bytes >= m.allocated_bytes);
}

GPU_TEST(InvalidConfigIsRejected) {
  GPT2Config cfg = TinyConfig();
  cfg.n_head = 3;  // 128 % 3 != 0
  auto m = GPT2Cuda::Create(cfg);
  EXPECT_TRUE(!m.ok() && m.status().code() == StatusCode::kInvalidArgument);
  ASSERT_OK_AND_ASSIGN(auto model, MakeModel(TinyConfig(), Precision::kFloat32));
  std::vector<int32_t> tokens(2 * 65, 1);
  EXPECT_TRUE(model->Forward(tokens.data(), 2, 65).code() == StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace meshrun

GPU_TEST_MAIN()
