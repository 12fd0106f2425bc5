// The one model (engine/model/gpt2.h) on cuda against the same model on cpu: the same
// parameters, the same batches, both architectures (GPT-2 and Llama with grouped-query
// attention); losses, every gradient and a few AdamW steps within float32 tolerance. Tiny shapes.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "common/job_spec.h"
#include "engine/model/gpt2.h"
#include "engine/ops/ops.h"
#include "engine/train/optimizer.h"
#include "engine/train/schedule.h"
#include "tests/gpu/gpu_test.h"

namespace meshrun {
namespace {

using gputest::RandomInts;

constexpr Device kCuda{DeviceType::kCuda, 0};

GPT2Config Tiny(Arch arch, Device device) {
  GPT2Config cfg;
  cfg.arch = arch;
  cfg.vocab_size = 97;  // not a multiple of anything: exercises the ragged edges
  cfg.n_layer = 2;
  cfg.n_head = 4;
  cfg.n_kv_head = arch == Arch::kLlama ? 2 : 4;
  cfg.d_model = 64;
  cfg.d_ff = 96;
  cfg.max_seq_len = 32;
  cfg.tie_embeddings = arch == Arch::kGpt2;
  cfg.device = device;
  return cfg;
}

std::vector<float> Host(Device dev, const float* p, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  const Status s = ops::CopyToHost(dev, out.data(), p, sizeof(float) * n);
  if (!s.ok()) std::printf("  copy to host: %s\n", s.ToString().c_str());
  return out;
}

const char* ArchName(Arch a) {
  return a == Arch::kLlama ? "llama" : "gpt2";
}

// One forward/backward on each device from the same initialisation; then the gradients of every
// parameter and the loss agree.
void CheckGradients(Arch arch) {
  GPT2<float> cpu_model(Tiny(arch, Device{})), gpu_model(Tiny(arch, kCuda));
  cpu_model.InitDeterministic(7);
  gpu_model.InitDeterministic(7);
  std::mt19937 rng(3);
  const int B = 2, T = 16;
  const auto in = RandomInts(rng, B * T, 0, 96), tg = RandomInts(rng, B * T, 0, 96);
  cpu_model.ZeroGrad();
  gpu_model.ZeroGrad();
  auto want = cpu_model.ForwardBackward(in.data(), tg.data(), B, T, 1.0 / (B * T));
  ASSERT_OK(want.status());
  ASSERT_OK_AND_ASSIGN(const double got,
                       gpu_model.ForwardBackward(in.data(), tg.data(), B, T, 1.0 / (B * T)));
  EXPECT_NEAR(got, *want, 1e-4 * std::fabs(*want));
  for (const ParamInfo& p : cpu_model.params()) {
    const std::vector<float> g_cpu(cpu_model.grad(p), cpu_model.grad(p) + p.numel);
    EXPECT_CLOSE(std::string(ArchName(arch)) + " grad " + p.name,
                 Host(kCuda, gpu_model.grad(p), p.numel), g_cpu, 2e-4);
  }
}

GPU_TEST(GradientsMatchCpuGpt2) {
  CheckGradients(Arch::kGpt2);
}
GPU_TEST(GradientsMatchCpuLlama) {
  CheckGradients(Arch::kLlama);
}

// One rank's update as ClipAndStep (engine/train/update.h) does it, through the same ops on either
// device (the test links the model only, like bench/gpu_train_step).
struct Optimizer {
  explicit Optimizer(GPT2<float>& m)
      : model(m),
        exp_avg(Tensor::Zeros({m.num_params()}, ScalarType::kFloat32, m.config().device)),
        exp_avg_sq(Tensor::Zeros({m.num_params()}, ScalarType::kFloat32, m.config().device)) {}
  StatusOr<UpdateResult> Step(const TrainSpec& tr, int64_t step) {
    const Device dev = model.config().device;
    UpdateResult r;
    MESHRUN_ASSIGN_OR_RETURN(const double sq,
                             ops::SumOfSquares(dev, model.grads_data(), model.num_params()));
    r.grad_norm = std::sqrt(sq);
    if (tr.grad_clip > 0 && r.grad_norm > tr.grad_clip) {
      MESHRUN_RETURN_IF_ERROR(ops::Scale(dev, model.grads_data(), model.num_params(),
                                         tr.grad_clip / (r.grad_norm + 1e-6)));
    }
    r.lr = LearningRate(tr.lr, tr.min_lr, tr.warmup_steps, tr.steps, step);
    for (const ParamInfo& p : model.params()) {
      MESHRUN_RETURN_IF_ERROR(
          ops::AdamW(dev, model.param(p), model.grad(p), exp_avg.data<float>() + p.offset,
                     exp_avg_sq.data<float>() + p.offset, p.numel, r.lr, tr.beta1, tr.beta2, tr.eps,
                     p.decay ? tr.weight_decay : 0.0, step + 1));
    }
    return r;
  }
  GPT2<float>& model;
  Tensor exp_avg, exp_avg_sq;
};

// A few training steps (AdamW state on the device) track the cpu run step by step, and the
// loss falls.
void CheckTraining(Arch arch) {
  GPT2<float> cpu_model(Tiny(arch, Device{})), gpu_model(Tiny(arch, kCuda));
  Optimizer cpu_state(cpu_model), gpu_state(gpu_model);
  cpu_model.InitDeterministic(11);
  gpu_model.InitDeterministic(11);
  TrainSpec tr;
  tr.steps = 6;
  tr.lr = 3e-3;
  tr.min_lr = 3e-4;
  tr.warmup_steps = 1;
  std::mt19937 rng(5);
  const int B = 2, T = 16;
  const auto in = RandomInts(rng, B * T, 0, 96), tg = RandomInts(rng, B * T, 0, 96);
  double first = 0, last = 0;
  for (int step = 0; step < tr.steps; ++step) {
    cpu_model.ZeroGrad();
    gpu_model.ZeroGrad();
    auto want = cpu_model.ForwardBackward(in.data(), tg.data(), B, T, 1.0 / (B * T));
    ASSERT_OK(want.status());
    ASSERT_OK_AND_ASSIGN(const double got,
                         gpu_model.ForwardBackward(in.data(), tg.data(), B, T, 1.0 / (B * T)));
    EXPECT_NEAR(got / (B * T), *want / (B * T), 1e-3);
    auto u_cpu = cpu_state.Step(tr, step);
    ASSERT_OK(u_cpu.status());
    ASSERT_OK_AND_ASSIGN(const UpdateResult u_gpu, gpu_state.Step(tr, step));
    EXPECT_NEAR(u_gpu.grad_norm, u_cpu->grad_norm, 1e-3 * u_cpu->grad_norm);
    if (step == 0) first = got;
    last = got;
  }
  EXPECT_TRUE(last < first);
  EXPECT_CLOSE(
      std::string(ArchName(arch)) + " params after training",
      Host(kCuda, gpu_model.params_data(), gpu_model.num_params()),
      std::vector<float>(cpu_model.params_data(), cpu_model.params_data() + cpu_model.num_params()),
      1e-3);
}

GPU_TEST(TrainingTracksCpuGpt2) {
  CheckTraining(Arch::kGpt2);
}
GPU_TEST(TrainingTracksCpuLlama) {
  CheckTraining(Arch::kLlama);
}

// The batch shape shrinks and grows again: every call refills the token ids and positions
// (a stale position row would shift the position embedding or the rotary angles).
GPU_TEST(ShapeShrinksAndGrows) {
  for (Arch arch : {Arch::kGpt2, Arch::kLlama}) {
    GPT2<float> cpu_model(Tiny(arch, Device{})), gpu_model(Tiny(arch, kCuda));
    cpu_model.InitDeterministic(13);
    gpu_model.InitDeterministic(13);
    std::mt19937 rng(17);
    for (auto [B, T] : {std::pair{2, 16}, std::pair{1, 8}, std::pair{2, 16}, std::pair{3, 5}}) {
      const auto in = RandomInts(rng, B * T, 0, 96), tg = RandomInts(rng, B * T, 0, 96);
      auto want = cpu_model.ForwardLoss(in.data(), tg.data(), B, T);
      ASSERT_OK(want.status());
      ASSERT_OK_AND_ASSIGN(const double got, gpu_model.ForwardLoss(in.data(), tg.data(), B, T));
      EXPECT_NEAR(got, *want, 1e-4 * std::fabs(*want));
    }
  }
}

// float64 has no cuda kernels: a clear error, not a crash.
GPU_TEST(DoubleIsRefusedOnCuda) {
  GPT2Config cfg = Tiny(Arch::kGpt2, kCuda);
  const Status s = ops::Scale(kCuda, static_cast<double*>(nullptr), 0, 1.0);
  EXPECT_TRUE(!s.ok());
  EXPECT_TRUE(s.message().find("float32") != std::string::npos);
  (void)cfg;
}

}  // namespace
}  // namespace meshrun

GPU_TEST_MAIN()
