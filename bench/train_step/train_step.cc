// bench/train_step: tokens/s, TFLOP/s and MFU of meshrun's CPU training step for the tiny, mini
// and GPT-2 124M configurations, beside PyTorch training the same model on the same batch
// shape with the same thread count (bench/torch_baseline.py): current torch from PyPI, eager
// (fused SDPA) and torch.compile, from the venv that tests/python/make-venv makes (never made
// here), and Debian's torch. Each repetition runs meshrun and then every torch column, so noise
// from a shared machine hits all of them alike; the table shows the best repetition of each,
// its spread (± = (best − worst)/best) and meshrun's ratio to it. Prints a table and a JSON line.
//
//   train_step [--configs tiny,mini,gpt2-124m] [--steps N] [--warmup N] [--threads N]
//              [--seq-len T] [--repeats N] [--venv DIR] [--python /usr/bin/python3]
//              [--no-compile] [--no-torch] [--torch-isa same|native]
//              [--torch-malloc jemalloc|system]
//
// --torch-isa same (the default) holds PyTorch to meshrun's instruction set when meshrun's AVX2
// path is forced on an AVX-512 CPU (MESHRUN_NO_AVX512=1; bench/torch_env.h); native never does.
// --torch-malloc jemalloc (the default where libjemalloc2 is installed) preloads jemalloc into
// every PyTorch column and the MKL peak; system runs glibc's malloc (bench/torch_env.h).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/torch_env.h"
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
  std::string isa;  // a PyTorch column's torch.backends.cpu.get_cpu_capability()
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

// One PyTorch column: an interpreter and a torch_baseline.py mode.
struct TorchColumn {
  std::string name;    // column header
  std::string python;  // interpreter with torch
  std::string mode;    // eager | compile
};

std::string SourceDir() {
  const char* src = std::getenv("MESHRUN_SOURCE_DIR");
  return src != nullptr ? src : MESHRUN_BENCH_SOURCE_DIR;
}

bool IsExecutable(const std::string& path) {
  return access(path.c_str(), X_OK) == 0;
}

// The float32 GEMM peak of MKL on this machine, the limit meshrun's GEMM is held to (issue 37):
// torch.mm at 1024³ with the same threads (PyPI torch runs CPU matmuls on MKL), the fastest of
// 20 calls after one untimed, in FLOP/s; 0 when the interpreter or torch is missing.
double MeasureMklPeak(const std::string& python, int threads, const std::string& isa_env) {
  if (!IsExecutable(python)) return 0;
  std::ostringstream cmd;
  cmd << isa_env << "OMP_NUM_THREADS=" << threads << " " << python
      << " -c 'import time,torch\ntorch.set_num_threads(" << threads
      << ")\nn=1024\na=torch.randn(n,n);b=torch.randn(n,n);c=torch.empty(n,n)\n"
         "torch.mm(a,b,out=c)\nbest=1e9\nfor _ in range(20):\n t=time.perf_counter();"
         "torch.mm(a,b,out=c);best=min(best,time.perf_counter()-t)\nprint(2*n**3/best)' "
         "2>/dev/null";
  FILE* f = popen(cmd.str().c_str(), "r");
  if (f == nullptr) return 0;
  char buf[256];
  double v = 0;
  while (std::fgets(buf, sizeof(buf), f) != nullptr) v = std::atof(buf);
  return pclose(f) == 0 ? v : 0;
}

// The 1-minute load average, printed beside each repetition: this bench is often run on shared
// machines, where a figure means little without it.
double LoadAverage() {
  double l[1] = {0};
  return getloadavg(l, 1) == 1 ? l[0] : -1;
}

// Runs bench/torch_baseline.py and reads the JSON line it prints last; its stderr goes to
// `log` (the last run's, for the reason when a column fails).
bool RunTorch(const TorchColumn& col, const BenchConfig& c, int steps, int warmup, int threads,
              const std::string& isa_env, const std::string& log, Result* out) {
  std::ostringstream cmd;
  cmd << isa_env << "OMP_NUM_THREADS=" << threads << " " << col.python << " " << SourceDir()
      << "/bench/torch_baseline.py --config " << c.name << " --mode " << col.mode << " --steps "
      << steps << " --warmup " << std::max(warmup, col.mode == "compile" ? 2 : 0) << " --threads "
      << threads << " --seq-len " << c.model.max_seq_len << " --batch " << c.batch << " 2>" << log;
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
  const size_t cap = last.find("\"cpu_capability\": \"");
  if (cap != std::string::npos) {
    const size_t from = cap + std::strlen("\"cpu_capability\": \"");
    out->isa = last.substr(from, last.find('"', from) - from);
  }
  return out->tokens_per_second > 0;
}

// Best and worst of the repetitions of one column (tokens/s); best = 0 when it never ran.
struct Column {
  double best = 0, worst = 0;
  void Add(double tok_s) {
    if (tok_s <= 0) return;
    worst = best == 0 ? tok_s : std::min(worst, tok_s);
    best = std::max(best, tok_s);
  }
};

// The best float32 GEMM rate of this moment: the trainer's 512³ measurement and a 1024³ one
// (closer to the step's large products), best of 3. MFU in the table is against the best of
// these over the whole run, taken beside each repetition.
double MeasurePeak() {
  const int64_t n = 1024;
  std::vector<float> a(n * n, 0.01f), b(n * n, 0.02f), c(n * n);
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    meshrun::cpu::Gemm(false, true, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return std::max(meshrun::MeasureCpuGemmPeakFlops(), 2.0 * n * n * n / best);
}

const char* Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "unset";
}

std::string CpuModel() {
  std::string model = "unknown CPU";
  if (FILE* f = std::fopen("/proc/cpuinfo", "r")) {
    char line[512];
    while (std::fgets(line, sizeof(line), f) != nullptr) {
      if (std::strncmp(line, "model name", 10) == 0 && std::strchr(line, ':') != nullptr) {
        model = std::strchr(line, ':') + 2;
        model.erase(model.find_last_not_of(" \n") + 1);
        break;
      }
    }
    std::fclose(f);
  }
#if defined(__x86_64__)
  __builtin_cpu_init();
  model += " (";
  model += __builtin_cpu_supports("avx2") ? "avx2" : "no avx2";
  if (__builtin_cpu_supports("fma")) model += " fma";
  if (__builtin_cpu_supports("avx512f")) model += " avx512f";
  model += ")";
#endif
  return model;
}

}  // namespace

int main(int argc, char** argv) {
  std::string configs = "tiny,mini,gpt2-124m", debian_python = "/usr/bin/python3";
  std::string venv = MESHRUN_BENCH_TORCH_VENV;
  int steps = 5, warmup = 2, seq_len = 256, repeats = 3;
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  if (const char* omp = std::getenv("OMP_NUM_THREADS")) threads = std::atoi(omp);
  bool torch = true, compile = true, torch_isa_native = false, torch_malloc_system = false;
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
    else if (a == "--repeats")
      repeats = std::max(1, std::atoi(next().c_str()));
    else if (a == "--venv")
      venv = next();
    else if (a == "--python")  // the Debian column's interpreter ("" for none)
      debian_python = next();
    else if (a == "--no-compile")
      compile = false;
    else if (a == "--no-torch")
      torch = false;
    else if (a == "--torch-isa") {
      const std::string v = next();
      if (v != "same" && v != "native") {
        std::fprintf(stderr, "error: --torch-isa: %s is not same or native\n", v.c_str());
        return 2;
      }
      torch_isa_native = v == "native";
    } else if (a == "--torch-malloc") {
      const std::string v = next();
      if (v != "jemalloc" && v != "system") {
        std::fprintf(stderr, "error: --torch-malloc: %s is not jemalloc or system\n", v.c_str());
        return 2;
      }
      torch_malloc_system = v == "system";
    } else {
      std::fprintf(stderr,
                   "error: %s: unknown flag (hint: see the comment at the top of "
                   "bench/train_step/train_step.cc)\n",
                   a.c_str());
      return 2;
    }
  }
  meshrun::cpu::SetNumThreads(threads);

  std::vector<TorchColumn> columns;
  if (torch) {
    const std::string py = venv + "/bin/python";
    if (IsExecutable(py)) {
      columns.push_back({"eager", py, "eager"});
      if (compile) columns.push_back({"compile", py, "compile"});
    } else {
      std::printf(
          "# no PyPI torch: %s is missing; make it once (downloads torch from PyPI) with\n"
          "#   %s/tests/python/make-venv %s %s/bench/requirements-torch.txt\n",
          py.c_str(), SourceDir().c_str(), venv.c_str(), SourceDir().c_str());
    }
    if (!debian_python.empty() && !columns.empty()) {
      columns.push_back({"debian", debian_python, "eager"});
    }
  }
  std::printf(
      "# cpu: %s; %d threads; gemm %s; kernel isa %s; OMP_WAIT_POLICY=%s GOMP_SPINCOUNT=%s\n",
      CpuModel().c_str(), threads, meshrun::cpu::GemmBackend(), meshrun::cpu::KernelIsa(),
      Env("OMP_WAIT_POLICY"), Env("GOMP_SPINCOUNT"));
  // Every PyTorch command's environment: its instruction set and its allocator.
  const std::string isa_env = meshrun::bench::TorchIsaEnv(torch_isa_native) +
                              meshrun::bench::TorchMallocEnv(torch_malloc_system);
  if (torch) {
    std::printf("# torch isa: %s; torch malloc: %s\n",
                meshrun::bench::TorchIsaDescription(torch_isa_native).c_str(),
                meshrun::bench::TorchMallocDescription(torch_malloc_system).c_str());
  }
  const std::string mkl_python = venv + "/bin/python";
  std::printf("# best of %d interleaved repetitions (each the median of %d steps after %d warmup)",
              repeats, steps, warmup);
  for (const TorchColumn& col : columns) {
    std::printf("; %s: %s --mode %s", col.name.c_str(), col.python.c_str(), col.mode.c_str());
  }
  std::printf("\n");
  const std::string log =
      "/tmp/meshrun-bench-train-step-torch." + std::to_string(getpid()) + ".log";

  std::ostringstream json;
  std::ostringstream table;
  json << "{\"bench\":\"train_step\",\"threads\":" << threads << ",\"repeats\":" << repeats
       << ",\"results\":[";
  std::stringstream names(configs);
  std::string name;
  bool first = true;
  double peak = 0, mkl_peak = 0;
  while (std::getline(names, name, ',')) {
    const BenchConfig c = ConfigNamed(name, seq_len);
    Column mesh;
    std::vector<Column> torch_cols(columns.size());
    std::vector<std::string> failed(columns.size());
    for (int rep = 0; rep < repeats; ++rep) {
      peak = std::max(peak, MeasurePeak());
      if (torch) mkl_peak = std::max(mkl_peak, MeasureMklPeak(mkl_python, threads, isa_env));
      const double load = LoadAverage();
      const double tps = RunMeshrun(c, steps, warmup).tokens_per_second;
      mesh.Add(tps);
      std::printf("# %s rep %d: load %.2f; meshrun %.0f tok/s", c.name.c_str(), rep + 1, load, tps);
      for (size_t k = 0; k < columns.size(); ++k) {
        Result t;
        if (!failed[k].empty()) continue;
        if (RunTorch(columns[k], c, steps, warmup, threads, isa_env, log, &t)) {
          torch_cols[k].Add(t.tokens_per_second);
          std::printf("; %s %.0f (%s)", columns[k].name.c_str(), t.tokens_per_second,
                      t.isa.empty() ? "isa ?" : t.isa.c_str());
        } else {
          failed[k] =
              columns[k].python + " --mode " + columns[k].mode + " failed (see " + log + ")";
          std::printf("; %s: %s", columns[k].name.c_str(), failed[k].c_str());
        }
      }
      std::printf("; load %.2f\n", LoadAverage());
      std::fflush(stdout);
    }
    const double flops_per_token = meshrun::GPT2FlopsPerToken(c.model, c.model.max_seq_len);
    const double tflops = mesh.best * flops_per_token / 1e12;
    table << std::left << std::setw(10) << c.name << std::right << std::setw(7)
          << c.batch * c.model.max_seq_len << std::fixed << std::setprecision(0) << std::setw(10)
          << mesh.best << std::setw(6) << std::setprecision(0)
          << 100.0 * (mesh.best - mesh.worst) / mesh.best << "%" << std::setprecision(1)
          << std::setw(8) << tflops * 1e3 << std::setw(7) << 100.0 * tflops * 1e12 / peak << "%"
          << std::setw(7) << (mkl_peak > 0 ? 100.0 * tflops * 1e12 / mkl_peak : 0.0) << "%";
    json << (first ? "" : ",") << "{\"config\":\"" << c.name
         << "\",\"seq_len\":" << c.model.max_seq_len << ",\"batch\":" << c.batch
         << ",\"tokens_per_second\":" << mesh.best << ",\"tokens_per_second_worst\":" << mesh.worst
         << ",\"tflops\":" << tflops << ",\"mfu\":" << tflops * 1e12 / peak
         << ",\"mfu_mkl\":" << (mkl_peak > 0 ? tflops * 1e12 / mkl_peak : 0.0);
    for (size_t k = 0; k < columns.size(); ++k) {
      const Column& t = torch_cols[k];
      table << std::setprecision(0) << std::setw(10) << t.best << std::setw(6)
            << (t.best > 0 ? 100.0 * (t.best - t.worst) / t.best : 0) << "%" << std::setprecision(2)
            << std::setw(7) << (t.best > 0 ? mesh.best / t.best : 0.0);
      json << ",\"torch_" << columns[k].name << "_tokens_per_second\":" << t.best << ",\"ratio_"
           << columns[k].name << "\":" << (t.best > 0 ? mesh.best / t.best : 0.0);
    }
    table << "\n";
    json << "}";
    first = false;
  }
  json << "],\"gemm_peak_gflops\":" << peak / 1e9 << ",\"mkl_peak_gflops\":" << mkl_peak / 1e9
       << ",\"kernel_isa\":\"" << meshrun::cpu::KernelIsa() << "\",\"gemm\":\""
       << meshrun::cpu::GemmBackend() << "\",\"torch_isa\":\""
       << (meshrun::bench::TorchIsaEnv(torch_isa_native).empty() ? "native" : "avx2")
       << "\",\"torch_malloc\":\""
       << (meshrun::bench::TorchMallocEnv(torch_malloc_system).empty() ? "glibc" : "jemalloc")
       << "\"}";
  std::printf("# float32 GEMM peak (512^3 and 1024^3, best over the run): %.1f GFLOP/s\n",
              peak / 1e9);
  std::printf("# MKL sgemm peak (torch.mm 1024^3, %d threads, best over the run): %.1f GFLOP/s%s\n",
              threads, mkl_peak / 1e9,
              mkl_peak > 0 ? "" : " (no PyPI torch: MFU/MKL not measured)");
  std::printf("%-10s%7s%10s%7s%8s%8s%8s", "config", "tokens", "meshrun", "±", "GFLOP/s", "MFU",
              "MFU/MKL");
  for (const TorchColumn& col : columns) {
    std::printf("%10s%7s%7s", col.name.c_str(), "±", "ratio");
  }
  std::printf("\n%s%s\n", table.str().c_str(), json.str().c_str());
  std::remove(log.c_str());
  return 0;
}
