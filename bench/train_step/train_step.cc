// bench/train_step: tokens/s, TFLOP/s and MFU of meshrun's CPU training step for the tiny, mini
// and GPT-2 124M configurations, beside PyTorch training the same model on the same batch
// shape with the same thread count (bench/torch_baseline.py). Prints a table and a JSON line.
//
//   train_step [--configs tiny,mini,gpt2-124m] [--steps N] [--warmup N] [--threads N]
//              [--seq-len T] [--no-torch] [--python /usr/bin/python3]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/kernels/cpu/kernels.h"
#include "engine/model/gpt2.h"
#include "engine/train/trainer.h"

namespace {

using meshrun::GPT2;
using meshrun::GPT2Config;

struct BenchConfig {
  std::string name;
  GPT2Config model;
  int batch = 8;
  int micro_batch = 8;
};

BenchConfig ConfigNamed(const std::string& name, int seq_len) {
  BenchConfig c;
  c.name = name;
  c.model.max_seq_len = seq_len;
  if (name == "tiny") {
    c.model.vocab_size = 256, c.model.n_layer = 2, c.model.n_head = 4, c.model.d_model = 64;
    c.model.max_seq_len = 64;
    c.batch = c.micro_batch = 8;
  } else if (name == "mini") {
    c.model.vocab_size = 256, c.model.n_layer = 4, c.model.n_head = 8, c.model.d_model = 256;
    c.batch = c.micro_batch = 8;
  } else if (name == "gpt2-124m") {
    c.model.vocab_size = 50257, c.model.n_layer = 12, c.model.n_head = 12, c.model.d_model = 768;
    c.batch = c.micro_batch = 4;
  } else {
    std::fprintf(stderr, "error: --configs: unknown config '%s' (hint: tiny, mini or gpt2-124m)\n",
                 name.c_str());
    std::exit(2);
  }
  return c;
}

struct Result {
  double step_seconds = 0;
  double tokens_per_second = 0;
  double tflops = 0;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One training step exactly as the trainer runs it: forward/backward, clip, AdamW.
Result RunMeshrun(const BenchConfig& c, int steps, int warmup) {
  GPT2<float> model(c.model);
  model.InitDeterministic(1337);
  const int T = c.model.max_seq_len, B = c.batch;
  std::mt19937 rng(0);
  std::uniform_int_distribution<int> tok(0, c.model.vocab_size - 1);
  std::vector<int32_t> inputs(static_cast<size_t>(B) * T), targets(inputs.size());
  for (auto& x : inputs) x = tok(rng);
  for (auto& x : targets) x = tok(rng);
  std::vector<float> m(model.num_params(), 0.f), v(model.num_params(), 0.f);
  std::vector<double> times;
  for (int s = 0; s < warmup + steps; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    model.ZeroGrad();
    for (int first = 0; first < B; first += c.micro_batch) {
      (void)model.ForwardBackward(inputs.data() + static_cast<size_t>(first) * T,
                                  targets.data() + static_cast<size_t>(first) * T, c.micro_batch, T,
                                  1.0 / (static_cast<double>(B) * T));
    }
    const double norm =
        std::sqrt(meshrun::cpu::SumOfSquares(model.grads_data(), model.num_params()));
    if (norm > 1.0)
      meshrun::cpu::Scale(model.grads_data(), model.num_params(), 1.0 / (norm + 1e-6));
    for (const auto& p : model.params()) {
      meshrun::cpu::AdamW(model.param(p), model.grad(p), m.data() + p.offset, v.data() + p.offset,
                          p.numel, 3e-4, 0.9, 0.95, 1e-8, p.decay ? 0.1 : 0.0, s + 1);
    }
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s >= warmup) times.push_back(dt);
  }
  Result r;
  r.step_seconds = Median(times);
  r.tokens_per_second = static_cast<double>(B) * T / r.step_seconds;
  r.tflops = r.tokens_per_second * meshrun::GPT2FlopsPerToken(c.model, T) / 1e12;
  return r;
}

// Runs bench/torch_baseline.py and reads the JSON line it prints last.
bool RunTorch(const std::string& python, const BenchConfig& c, int steps, int warmup, int threads,
              Result* out) {
  std::ostringstream cmd;
  const char* src = std::getenv("MESHRUN_SOURCE_DIR");
  std::string script = std::string(src ? src : ".") + "/bench/torch_baseline.py";
  cmd << python << " " << script << " --config " << c.name << " --steps " << steps << " --warmup "
      << warmup << " --threads " << threads << " --seq-len " << c.model.max_seq_len << " --batch "
      << c.batch << " 2>/dev/null";
  FILE* f = popen(cmd.str().c_str(), "r");
  if (f == nullptr) return false;
  char buf[4096];
  std::string last;
  while (std::fgets(buf, sizeof(buf), f) != nullptr) {
    if (buf[0] == '{') last = buf;
  }
  if (pclose(f) != 0 || last.empty()) return false;
  auto number = [&](const char* key) {
    const std::string k = std::string("\"") + key + "\":";
    const size_t pos = last.find(k);
    return pos == std::string::npos ? 0.0 : std::atof(last.c_str() + pos + k.size());
  };
  out->tokens_per_second = number("tokens_per_second");
  out->step_seconds = number("step_seconds");
  out->tflops = number("tflops");
  return out->tokens_per_second > 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string configs = "tiny,mini,gpt2-124m", python = "/usr/bin/python3";
  int steps = 5, warmup = 2, seq_len = 256;
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  if (const char* omp = std::getenv("OMP_NUM_THREADS")) threads = std::atoi(omp);
  bool torch = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "error: %s: missing value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--configs")
      configs = next();
    else if (a == "--steps")
      steps = std::atoi(next().c_str());
    else if (a == "--warmup")
      warmup = std::atoi(next().c_str());
    else if (a == "--threads")
      threads = std::atoi(next().c_str());
    else if (a == "--seq-len")
      seq_len = std::atoi(next().c_str());
    else if (a == "--python")
      python = next();
    else if (a == "--no-torch")
      torch = false;
    else {
      std::fprintf(stderr,
                   "error: %s: unknown flag (hint: see the comment at the top of "
                   "bench/train_step/train_step.cc)\n",
                   a.c_str());
      return 2;
    }
  }
  meshrun::cpu::SetNumThreads(threads);
  const double peak = meshrun::MeasureCpuGemmPeakFlops();
  std::printf("# float32 GEMM peak (512^3 sgemm, best of 5, %d threads): %.1f GFLOP/s\n", threads,
              peak / 1e9);
  std::printf("%-10s %8s %6s | %10s %8s %7s | %10s %8s | %6s\n", "config", "tokens", "thr",
              "meshrun/s", "TFLOP/s", "MFU", "torch/s", "TFLOP/s", "ratio");
  std::ostringstream json;
  json << "{\"bench\":\"train_step\",\"threads\":" << threads
       << ",\"gemm_peak_gflops\":" << peak / 1e9 << ",\"results\":[";
  std::stringstream names(configs);
  std::string name;
  bool first = true;
  while (std::getline(names, name, ',')) {
    const BenchConfig c = ConfigNamed(name, seq_len);
    const Result r = RunMeshrun(c, steps, warmup);
    Result t;
    const bool have_torch = torch && RunTorch(python, c, steps, warmup, threads, &t);
    const double ratio = have_torch ? r.tokens_per_second / t.tokens_per_second : 0.0;
    std::printf("%-10s %8d %6d | %10.0f %8.4f %6.1f%% | %10.0f %8.4f | %6.2f\n", c.name.c_str(),
                c.batch * c.model.max_seq_len, threads, r.tokens_per_second, r.tflops,
                100.0 * r.tflops * 1e12 / peak, t.tokens_per_second, t.tflops, ratio);
    json << (first ? "" : ",") << "{\"config\":\"" << c.name
         << "\",\"seq_len\":" << c.model.max_seq_len << ",\"batch\":" << c.batch
         << ",\"tokens_per_second\":" << r.tokens_per_second << ",\"tflops\":" << r.tflops
         << ",\"mfu\":" << r.tflops * 1e12 / peak
         << ",\"torch_tokens_per_second\":" << (have_torch ? t.tokens_per_second : 0)
         << ",\"ratio\":" << ratio << "}";
    first = false;
    std::fflush(stdout);
  }
  json << "]}";
  std::printf("%s\n", json.str().c_str());
  return 0;
}
