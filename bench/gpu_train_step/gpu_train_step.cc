// bench/gpu_train_step: training steps of GPT-2 124M (seq_len 1024) of the one model
// (engine/model/gpt2.h on device cuda, the trainer's ops) on one GPU: tokens/s, model TFLOP/s
// and MFU (docs/model.md: 6·N + 12·n_layer·d_model·seq_len FLOPs per
// token; peak from a table by GPU name, or --peak-tflops). Prints a table, then one JSON line.
// bench/gpu_torch_baseline.py runs the same model and batch in PyTorch for the ratio.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/gpu_peak.h"
#include "common/job_spec.h"
#include "engine/core/tensor.h"
#include "engine/cuda/check.h"
#include "engine/model/gpt2.h"
#include "engine/ops/ops.h"
#include "engine/train/schedule.h"

namespace meshrun {
namespace {

struct Flags {
  int batch = 32;
  int seq_len = 1024;
  int steps = 10;
  int warmup = 3;
  int n_layer = 12, n_head = 12, d_model = 768, vocab = 50257;
  std::string precision = "fp32";  // the one model trains in float32 on cuda so far
  std::string attention = "auto";  // auto | generic
  double peak_tflops = 0;          // 0: from the table
};

void Usage() {
  std::fprintf(stderr,
               "usage: gpu_train_step [--batch B] [--seq-len T] [--steps N] [--warmup W]\n"
               "                      [--precision fp32] [--attention auto|generic]\n"
               "                      [--peak-tflops X] [--n-layer L] [--n-head H] [--d-model C]\n"
               "                      [--vocab V]\n");
}

bool ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&](const char* name) -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "error: %s: missing value\n", name);
        return nullptr;
      }
      return argv[++i];
    };
    const char* v = nullptr;
    if (a == "--help" || a == "-h") {
      Usage();
      std::exit(0);
    } else if (a == "--batch" && (v = next("--batch"))) {
      f->batch = std::atoi(v);
    } else if (a == "--seq-len" && (v = next("--seq-len"))) {
      f->seq_len = std::atoi(v);
    } else if (a == "--steps" && (v = next("--steps"))) {
      f->steps = std::atoi(v);
    } else if (a == "--warmup" && (v = next("--warmup"))) {
      f->warmup = std::atoi(v);
    } else if (a == "--precision" && (v = next("--precision"))) {
      f->precision = v;
    } else if (a == "--attention" && (v = next("--attention"))) {
      f->attention = v;
    } else if (a == "--peak-tflops" && (v = next("--peak-tflops"))) {
      f->peak_tflops = std::atof(v);
    } else if (a == "--n-layer" && (v = next("--n-layer"))) {
      f->n_layer = std::atoi(v);
    } else if (a == "--n-head" && (v = next("--n-head"))) {
      f->n_head = std::atoi(v);
    } else if (a == "--d-model" && (v = next("--d-model"))) {
      f->d_model = std::atoi(v);
    } else if (a == "--vocab" && (v = next("--vocab"))) {
      f->vocab = std::atoi(v);
    } else {
      std::fprintf(stderr, "error: %s: unknown flag or missing value (hint: --help)\n", a.c_str());
      return false;
    }
  }
  if (f->batch < 1 || f->seq_len < 1 || f->steps < 1 || f->warmup < 0) {
    std::fprintf(stderr, "error: --batch, --seq-len and --steps must be ≥ 1, --warmup ≥ 0\n");
    return false;
  }
  if (f->precision != "fp32") {
    std::fprintf(stderr,
                 "error: --precision: \"%s\": the one model trains in float32 on cuda so far "
                 "(hint: --precision fp32)\n",
                 f->precision.c_str());
    return false;
  }
  if (f->attention != "auto" && f->attention != "generic") {
    std::fprintf(stderr, "error: --attention: \"%s\" (hint: auto or generic)\n",
                 f->attention.c_str());
    return false;
  }
  return true;
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// ‖g‖, torch's clip_grad_norm_ and AdamW over the flat buffers (one rank: what
// ClipAndStep (engine/train/update.h) does without shards).
Status ClipAndStep(GPT2<float>& model, float* m, float* v, const TrainSpec& tr, int64_t step) {
  const Device dev = model.config().device;
  MESHRUN_ASSIGN_OR_RETURN(const double sq,
                           ops::SumOfSquares(dev, model.grads_data(), model.num_params()));
  const double norm = std::sqrt(sq);
  if (tr.grad_clip > 0 && norm > tr.grad_clip) {
    MESHRUN_RETURN_IF_ERROR(
        ops::Scale(dev, model.grads_data(), model.num_params(), tr.grad_clip / (norm + 1e-6)));
  }
  const double lr = LearningRate(tr.lr, tr.min_lr, tr.warmup_steps, tr.steps, step);
  for (const ParamInfo& p : model.params()) {
    MESHRUN_RETURN_IF_ERROR(ops::AdamW(dev, model.param(p), model.grad(p), m + p.offset,
                                       v + p.offset, p.numel, lr, tr.beta1, tr.beta2, tr.eps,
                                       p.decay ? tr.weight_decay : 0.0, step + 1));
  }
  return OkStatus();
}

int Run(const Flags& f) {
  int devices = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess || devices == 0) {
    const std::string why =
        e != cudaSuccess ? std::string("cudaGetDeviceCount: ") + cudaGetErrorName(e) : "0 devices";
    std::printf("skipped: no CUDA device (%s)\n", why.c_str());
    std::printf("{\"bench\":\"gpu_train_step\",\"skipped\":%s}\n",
                JsonString("no CUDA device (" + why + ")").c_str());
    return 0;
  }
  cudaDeviceProp prop{};
  (void)cudaGetDeviceProperties(&prop, 0);
  const std::string gpu_name = prop.name;
  const double peak =
      f.peak_tflops > 0 ? f.peak_tflops : DenseBf16PeakTflops(gpu_name).value_or(0.0);

  GPT2Config cfg;
  cfg.vocab_size = f.vocab;
  cfg.n_layer = f.n_layer;
  cfg.n_head = f.n_head;
  cfg.d_model = f.d_model;
  cfg.max_seq_len = f.seq_len;
  cfg.device = Device{DeviceType::kCuda, 0};
  GPT2<float> model(cfg);
  model.InitDeterministic(1337);
  Tensor m = Tensor::Zeros({model.num_params()}, ScalarType::kFloat32, cfg.device);
  Tensor v = Tensor::Zeros({model.num_params()}, ScalarType::kFloat32, cfg.device);
  const int B = f.batch, T = f.seq_len;
  const int64_t tokens_per_step = static_cast<int64_t>(B) * T;
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> tok(0, cfg.vocab_size - 1);
  std::vector<int32_t> inputs(tokens_per_step), targets(tokens_per_step);

  TrainSpec train;
  train.steps = f.warmup + f.steps;
  train.lr = 3e-4;
  train.min_lr = 3e-5;
  train.warmup_steps = 2;
  std::vector<double> losses;
  double timed_seconds = 0;
  for (int step = 0; step < f.warmup + f.steps; ++step) {
    for (int64_t i = 0; i < tokens_per_step; ++i) {
      inputs[i] = tok(rng);
      targets[i] = tok(rng);
    }
    const auto start = std::chrono::steady_clock::now();
    model.ZeroGrad();
    StatusOr<double> loss = model.ForwardBackward(inputs.data(), targets.data(), B, T,
                                                  1.0 / static_cast<double>(tokens_per_step));
    if (!loss.ok()) {
      std::fprintf(stderr, "error: step %d: %s\n", step, loss.status().ToString().c_str());
      return 1;
    }
    Status s = ClipAndStep(model, m.data<float>(), v.data<float>(), train, step);
    if (s.ok()) s = ops::Synchronize(cfg.device);
    if (!s.ok()) {
      std::fprintf(stderr, "error: update %d: %s\n", step, s.ToString().c_str());
      return 1;
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    losses.push_back(*loss / static_cast<double>(tokens_per_step));
    if (step >= f.warmup) timed_seconds += seconds;
    std::fprintf(stderr, "step %3d  loss %.4f  %.1f ms%s\n", step + 1, losses.back(), 1e3 * seconds,
                 step < f.warmup ? "  (warmup)" : "");
  }
  const double step_seconds = timed_seconds / f.steps;
  const double tokens_per_second = static_cast<double>(tokens_per_step) / step_seconds;
  const double flops_per_token = GPT2FlopsPerToken(cfg, T);
  const double tflops = tokens_per_second * flops_per_token / 1e12;
  const double mfu = peak > 0 ? tflops / peak : -1;
  const MemoryStats mem = AllocatorFor(cfg.device).Stats();

  std::printf("%-28s %s\n", "gpu", gpu_name.c_str());
  std::printf("%-28s gpt2 L=%d H=%d C=%d V=%d, %s, attention %s\n", "model", cfg.n_layer,
              cfg.n_head, cfg.d_model, cfg.vocab_size, f.precision.c_str(), "generic (float32)");
  std::printf("%-28s %d x %d = %lld tokens\n", "batch", B, T,
              static_cast<long long>(tokens_per_step));
  std::printf("%-28s %.2f ms (mean of %d after %d warmup)\n", "step time", 1e3 * step_seconds,
              f.steps, f.warmup);
  std::printf("%-28s %.0f\n", "tokens/s", tokens_per_second);
  std::printf("%-28s %.3g\n", "model FLOPs/token (§7)", flops_per_token);
  std::printf("%-28s %.1f\n", "model TFLOP/s", tflops);
  if (mfu >= 0) {
    std::printf("%-28s %.1f%% (peak %.1f TFLOP/s dense bf16)\n", "MFU", 100 * mfu, peak);
  } else {
    std::printf("%-28s n/a (unknown GPU; pass --peak-tflops)\n", "MFU");
  }
  std::printf("%-28s %.2f GiB\n", "peak device memory", mem.peak_bytes / double(1 << 30));
  std::printf("%-28s %.4f -> %.4f\n", "loss first -> last", losses.front(), losses.back());
  std::printf(
      "{\"bench\":\"gpu_train_step\",\"gpu\":%s,\"model\":\"gpt2\",\"n_layer\":%d,\"n_head\":%d,"
      "\"d_model\":%d,\"vocab_size\":%d,\"precision\":%s,\"attention\":%s,\"batch\":%d,"
      "\"seq_len\":%d,\"steps\":%d,\"step_seconds\":%.6f,\"tokens_per_second\":%.1f,"
      "\"flops_per_token\":%.6g,\"tflops\":%.3f,\"peak_tflops\":%.1f,\"mfu\":%s,"
      "\"peak_memory_bytes\":%lld,\"loss_first\":%.6f,\"loss_last\":%.6f}\n",
      JsonString(gpu_name).c_str(), cfg.n_layer, cfg.n_head, cfg.d_model, cfg.vocab_size,
      JsonString(f.precision).c_str(), JsonString(f.attention).c_str(), B, T, f.steps, step_seconds,
      tokens_per_second, flops_per_token, tflops, peak,
      mfu >= 0 ? std::to_string(mfu).c_str() : "null", static_cast<long long>(mem.peak_bytes),
      losses.front(), losses.back());
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace meshrun

int main(int argc, char** argv) {
  meshrun::Flags flags;
  if (!meshrun::ParseFlags(argc, argv, &flags)) return 2;
  return meshrun::Run(flags);
}
