// CPU kernel benchmark at GPT-2 small shapes (d_model 768, 12 heads, seq 1024) or at `mini`'s
// (d_model 256, 8 heads, seq 256, batch 8): time and GFLOP/s of each kernel's forward and
// backward beside its roofline bound on this machine, then one JSON line with the same numbers.
//
//   bench_kernels [--config gpt2|mini] [-B batch] [-T seq_len] [-t threads] [-n iters]
//                 [-w warmup] [--fallback] [--torch] [--venv DIR] [--only NAME] [--cpu-time]
//                 [--torch-isa same|native]
//
// Times are the best of -n runs (the machine is shared; the best run is the one least
// disturbed). The roofline bound of a kernel is max(FLOPs / GEMM peak, bytes / bandwidth), with
// the float32 GEMM peak (best Gemm rate at 512³..2048³) and the memory bandwidth (a STREAM
// triad over 3 × 64 MiB, bytes counted as STREAM does, no write-allocate) measured at start
// with the same threads. Bytes are each kernel's compulsory traffic: every input read once,
// every output written once (accumulated outputs read and written).
// --torch adds a torch_ms column: the same ops at the same shapes and threads in current torch
// from PyPI, eager (bench/torch_kernels.py, run with DIR/bin/python right after meshrun's
// kernels; DIR defaults to the build's torch-venv, made by tests/python/make-venv).
// --cpu-time (with -t 1) times every kernel and the roofs by the thread's CPU clock, which a
// loaded machine does not stretch the way it stretches wall time; the MKL peak then too.
// --torch-isa same (the default) holds torch (its column and the MKL peak) to meshrun's
// instruction set where meshrun's AVX2 path is forced on an AVX-512 CPU (bench/torch_env.h);
// PyTorch runs with jemalloc where it is installed.
// --fallback runs the Matmul shapes through GemmFallback instead of the build's Gemm backend.
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "bench/torch_env.h"
#include "engine/kernels/cpu/kernels.h"

namespace {

using namespace meshrun::cpu;

struct Options {
  std::string config = "gpt2";
  int64_t B = 1, T = 1024, C = 768, H = 12, V = 50257, L = 12;
  int64_t adamw_params = 124'000'000;  // GPT-2 small
  int threads = 0, iters = 7, warmup = 2;
  bool fallback = false;
  bool torch = false;
  bool torch_isa_native = false;  // --torch-isa native: never hold torch's instruction set
  bool cpu_time = false;          // time by the calling thread's CPU clock (one-thread runs only)
  std::string only;  // --only: run the kernel groups whose name contains this (all when empty)
  std::string venv = MESHRUN_BENCH_TORCH_VENV;
};

struct Result {
  std::string name;
  double ms, flops, bytes;
};

std::vector<float> Random(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Best time of fn over iters runs after warmup runs: wall time, or with o.cpu_time the calling
// thread's CPU time (for one-thread runs: what the kernel costs, without the time slices that
// other processes took from it).
double TimeMs(const Options& o, const std::function<void()>& fn) {
  for (int i = 0; i < o.warmup; ++i) fn();
  auto now = [&] {
    if (o.cpu_time) {
      timespec t;
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
      return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
    }
    return std::chrono::duration<double, std::milli>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  double best = 1e300;
  for (int i = 0; i < o.iters; ++i) {
    const double start = now();
    fn();
    best = std::min(best, now() - start);
  }
  return best;
}

// bytes: compulsory memory traffic in bytes (float32 elements × 4).
void Add(std::vector<Result>& results, const std::string& name, double ms, double flops,
         double bytes) {
  results.push_back({name, ms, flops, bytes});
}

// ---- the machine's two roofs, measured with the kernels' threads.
double MeasureGemmPeak(const Options& o) {
  double best = 0;
  for (int64_t n : {512, 1024, 2048}) {
    auto a = Random(n * n, 1), b = Random(n * n, 2);
    std::vector<float> c(n * n);
    Options q = o;
    q.iters = n >= 2048 ? 3 : 5;
    q.warmup = 1;
    const double ms = TimeMs(
        q, [&] { Gemm(false, true, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n); });
    best = std::max(best, 2.0 * n * n * n / (ms * 1e-3));
  }
  return best;
}

double MeasureBandwidth(const Options& o) {
  const int64_t n = 16 << 20;  // 64 MiB per array: far beyond any cache
  std::vector<float> a(n), b(n, 1.f), c(n, 2.f);
  Options q = o;
  q.iters = 15;
  q.warmup = 1;
  const double ms = TimeMs(q, [&] {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) a[i] = b[i] + 3.f * c[i];
  });
  return 3.0 * 4 * n / (ms * 1e-3);
}

void BenchLinear(const Options& o, std::vector<Result>& results, const std::string& name, int64_t N,
                 int64_t C, int64_t OC) {
  auto inp = Random(N * C, 1), w = Random(OC * C, 2, 0.02f), b = Random(OC, 3),
       dout = Random(N * OC, 4);
  Options o_big = o;  // the GPT-2 LM head (80 GFLOP): fewer runs
  if (2.0 * N * C * OC > 2e10) o_big.iters = std::min(o.iters, 3), o_big.warmup = 1;
  std::vector<float> out(N * OC), dinp(N * C), dw(OC * C), db(OC);
  const double flops = 2.0 * N * C * OC;
  double fwd, bwd;
  if (o.fallback) {
    fwd = TimeMs(o_big, [&] {
      GemmFallback(false, true, N, OC, C, 1.f, inp.data(), C, w.data(), C, 0.f, out.data(), OC);
    });
    bwd = TimeMs(o_big, [&] {
      GemmFallback(false, false, N, C, OC, 1.f, dout.data(), OC, w.data(), C, 1.f, dinp.data(), C);
      GemmFallback(true, false, OC, C, N, 1.f, dout.data(), OC, inp.data(), C, 1.f, dw.data(), C);
    });
  } else {
    fwd =
        TimeMs(o_big, [&] { MatmulForward(out.data(), inp.data(), w.data(), b.data(), N, C, OC); });
    bwd = TimeMs(o_big, [&] {
      MatmulBackward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, C,
                     OC);
    });
  }
  Add(results, name + "_fwd", fwd, flops, 4.0 * (N * C + OC * C + OC + N * OC));
  Add(results, name + "_bwd", bwd, 2 * flops,
      4.0 * (N * OC + 2 * N * C + 3 * OC * C + 2 * OC));  // dinp and dweight accumulate
}

void BenchAttention(const Options& o, std::vector<Result>& results) {
  const int64_t B = o.B, H = o.H, T = o.T, D = o.C / o.H;
  const size_t n = B * H * T * D;
  auto q = Random(n, 1), k = Random(n, 2), v = Random(n, 3), dout = Random(n, 4);
  std::vector<float> out(n), lse(B * H * T), dq(n), dk(n), dv(n);
  std::vector<int32_t> pos(T);
  for (int64_t i = 0; i < T; ++i) pos[i] = static_cast<int32_t>(i);
  const double scale = 1.0 / std::sqrt(double(D));
  // Causal: half of the T×T scores; forward QKᵀ and PV, backward five such products.
  const double fwd_flops = 2.0 * 2 * B * H * T * T * D / 2;
  const double fwd = TimeMs(o, [&] {
    AttentionForward(out.data(), lse.data(), q.data(), k.data(), v.data(), pos.data(), pos.data(),
                     B, H, T, T, D, scale);
  });
  const double bwd = TimeMs(o, [&] {
    AttentionBackward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(),
                      out.data(), lse.data(), pos.data(), pos.data(), B, H, T, T, D, scale);
  });
  Add(results, "attention_fwd", fwd, fwd_flops, 4.0 * (4 * n + B * H * T));
  Add(results, "attention_bwd", bwd, 2.5 * fwd_flops, 4.0 * (11 * n + B * H * T));
}

void BenchPointwise(const Options& o, std::vector<Result>& results) {
  const int64_t N = o.B * o.T, C = o.C;
  auto x = Random(N * C, 1), w = Random(C, 2), b = Random(C, 3), dout = Random(N * C, 4);
  std::vector<float> out(N * C), mean(N), rstd(N), dx(N * C), dw(C), db(C);
  Add(results, "layernorm_fwd",
      TimeMs(o,
             [&] {
               LayerNormForward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(),
                                N, C, 1e-5);
             }),
      8.0 * N * C, 4.0 * (2 * N * C + 2 * C + 2 * N));
  Add(results, "layernorm_bwd",
      TimeMs(o,
             [&] {
               LayerNormBackward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(),
                                 mean.data(), rstd.data(), N, C);
             }),
      14.0 * N * C, 4.0 * (4 * N * C + 5 * C + 2 * N));
  auto h = Random(N * 4 * C, 5, 3.f), dh = Random(N * 4 * C, 6);
  std::vector<float> gh(N * 4 * C), dgh(N * 4 * C);
  Add(results, "gelu_fwd", TimeMs(o, [&] { GeluForward(gh.data(), h.data(), N * 4 * C); }),
      20.0 * N * 4 * C, 4.0 * 2 * N * 4 * C);
  Add(results, "gelu_bwd",
      TimeMs(o, [&] { GeluBackward(dgh.data(), h.data(), dh.data(), N * 4 * C); }),
      30.0 * N * 4 * C, 4.0 * 4 * N * 4 * C);
}

void BenchLoss(const Options& o, std::vector<Result>& results) {
  const int64_t N = o.B * o.T, V = o.V;
  auto logits = Random(N * V, 1, 5.f);
  std::vector<float> dlogits(N * V), losses(N);
  std::vector<int32_t> targets(N);
  for (int64_t i = 0; i < N; ++i) targets[i] = static_cast<int32_t>((i * 7919) % V);
  Add(results, "cross_entropy",
      TimeMs(o,
             [&] {
               SoftmaxCrossEntropy(losses.data(), dlogits.data(), logits.data(), targets.data(), N,
                                   V, 1.0f / N);
             }),
      5.0 * N * V, 4.0 * (2 * N * V + 2 * N));
}

void BenchOptimizer(const Options& o, std::vector<Result>& results) {
  const int64_t n = o.adamw_params;
  auto p = Random(n, 1), g = Random(n, 2);
  std::vector<float> m(n, 0.f), v(n, 0.f);
  int64_t step = 0;
  Add(results, "adamw",
      TimeMs(o,
             [&] {
               AdamW(p.data(), g.data(), m.data(), v.data(), n, 3e-4, 0.9, 0.95, 1e-8, 0.1, ++step);
             }),
      12.0 * n, 4.0 * 7 * n);  // read p, g, m, v; write p, m, v
}

// "AMD EPYC (avx2 fma)": the CPU's model name and the vector extensions the kernels use.
std::string CpuDescription() {
  std::string model = "unknown CPU";
  if (FILE* f = std::fopen("/proc/cpuinfo", "r")) {
    char line[512];
    while (std::fgets(line, sizeof(line), f) != nullptr) {
      if (std::strncmp(line, "model name", 10) == 0) {
        const char* colon = std::strchr(line, ':');
        if (colon != nullptr) {
          model = colon + 2;
          model.erase(model.find_last_not_of(" \n") + 1);
        }
        break;
      }
    }
    std::fclose(f);
  }
  std::string flags;
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2")) flags += "avx2 ";
  if (__builtin_cpu_supports("fma")) flags += "fma ";
  if (__builtin_cpu_supports("avx512f")) flags += "avx512f ";
  if (!flags.empty()) flags.pop_back();
#endif
  return model + " (" + (flags.empty() ? "no avx2" : flags) + ")";
}

// Runs bench/torch_kernels.py at o's shapes; kernel name → ms, empty when it could not run.
std::map<std::string, double> RunTorchKernels(const Options& o, std::string* why) {
  std::map<std::string, double> ms;
  const std::string py = o.venv + "/bin/python";
  if (access(py.c_str(), X_OK) != 0) {
    *why = py + " is missing; make it once (downloads torch from PyPI) with " +
           MESHRUN_BENCH_SOURCE_DIR + "/tests/python/make-venv " + o.venv + " " +
           MESHRUN_BENCH_SOURCE_DIR + "/bench/requirements-torch.txt";
    return ms;
  }
  const std::string cmd =
      meshrun::bench::TorchIsaEnv(o.torch_isa_native) + meshrun::bench::TorchMallocEnv(false) + py +
      " " + MESHRUN_BENCH_SOURCE_DIR + "/bench/torch_kernels.py --B " + std::to_string(o.B) +
      " --T " + std::to_string(o.T) + " --C " + std::to_string(o.C) + " --H " +
      std::to_string(o.H) + " --V " + std::to_string(o.V) + " --adamw-params " +
      std::to_string(o.adamw_params) + " --threads " + std::to_string(NumThreads()) + " --iters " +
      std::to_string(o.iters) + " --warmup " + std::to_string(o.warmup) + " 2>/dev/null";
  FILE* f = popen(cmd.c_str(), "r");
  std::string line, last;
  char buf[8192];
  while (f != nullptr && std::fgets(buf, sizeof(buf), f) != nullptr) {
    if (buf[0] == '{') last = buf;
  }
  if (f == nullptr || pclose(f) != 0 || last.empty()) {
    *why = cmd + " failed";
    return ms;
  }
  // {"...": ..., "results": {"name": ms, ...}}: the pairs inside the object after "results".
  const size_t results = last.find("\"results\"");
  size_t pos = results == std::string::npos ? results : last.find('{', results);
  while (pos != std::string::npos && last[pos] != '}') {
    const size_t q0 = last.find('"', pos + 1);
    const size_t q1 = q0 == std::string::npos ? q0 : last.find('"', q0 + 1);
    const size_t colon = q1 == std::string::npos ? q1 : last.find(':', q1);
    if (colon == std::string::npos) break;
    ms[last.substr(q0 + 1, q1 - q0 - 1)] = std::atof(last.c_str() + colon + 1);
    pos = last.find_first_of(",}", colon);
  }
  return ms;
}

// The float32 GEMM peak of MKL, the limit meshrun's GEMM is held to (issue 37): torch.mm at
// 1024³ with the same threads in the --venv interpreter (PyPI torch runs CPU matmuls on MKL), the
// fastest of 20 calls after one untimed, in FLOP/s; 0 when the interpreter or torch is missing.
double MeasureMklPeak(const Options& o, int threads) {
  const char* clock = o.cpu_time && threads == 1 ? "thread_time" : "perf_counter";
  const std::string py = o.venv + "/bin/python";
  if (access(py.c_str(), X_OK) != 0) return 0;
  const std::string cmd = meshrun::bench::TorchIsaEnv(o.torch_isa_native) +
                          "OMP_NUM_THREADS=" + std::to_string(threads) + " " + py +
                          " -c 'import time,torch\ntorch.set_num_threads(" +
                          std::to_string(threads) +
                          ")\nn=1024\na=torch.randn(n,n);b=torch.randn(n,n);c=torch.empty(n,n)\n"
                          "torch.mm(a,b,out=c)\nbest=1e9\nfor _ in range(20):\n t=time." +
                          clock + "();torch.mm(a,b,out=c);best=min(best,time." + clock +
                          "()-t)\nprint(2*n**3/best)' 2>/dev/null";
  FILE* f = popen(cmd.c_str(), "r");
  if (f == nullptr) return 0;
  char buf[256];
  double v = 0;
  while (std::fgets(buf, sizeof(buf), f) != nullptr) v = std::atof(buf);
  return pclose(f) == 0 ? v : 0;
}

const char* Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "unset";
}

// The first three fields of /proc/loadavg ("?" where it cannot be read).
std::string LoadAverage() {
  std::string s = "?";
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    char buf[128] = {};
    if (std::fgets(buf, sizeof(buf), f) != nullptr) {
      s = buf;
      size_t cut = 0;
      for (int field = 0; field < 3 && cut != std::string::npos; ++field)
        cut = s.find(' ', cut + (field ? 1 : 0));
      if (cut != std::string::npos) s.resize(cut);
    }
    std::fclose(f);
  }
  return s;
}

// The "why not within 2×" line of a kernel: x1 is its x_bound on one thread (< 0: not run).
// Kernels above this multiple of their bound get a line saying why (issue #37 asks within 1.5x).
constexpr double kWhyAbove = 1.5;

std::string WhyAboveLimit(const std::string& name, double x1) {
  char head[96] = "";
  if (x1 >= 0) std::snprintf(head, sizeof(head), "1 thread (CPU time) %.2fx; ", x1);
  if (x1 >= 0 && x1 <= kWhyAbove) {
    return std::string(head) +
           "within 1.5x on one thread; the gap is the wall clock of two threads on a shared "
           "machine (a core that other work holds stalls what is handed to it)";
  }
  std::string why;
  if (name.rfind("attention", 0) == 0) {
    why =
        "the FLOP bound counts the two (five) products only; per score the kernel also masks, "
        "takes a max and an e^x (about a third of the work at head dim 32), and the 64-key "
        "blocks on the causal diagonal still compute part of what they mask";
  } else if (name.rfind("matmul", 0) == 0) {
    why = "OpenBLAS's own rate at this shape (the roof is its best rate at 512^3-2048^3)";
  } else if (name == "cross_entropy") {
    why =
        "one e^x per logit: bound by the e^x polynomial (about 15 instructions per 8 logits), "
        "which neither roof counts";
  } else if (name.rfind("gelu", 0) == 0) {
    why = "tanh through e^x and a division per element: compute the FLOP count undercounts";
  } else if (name.rfind("layernorm", 0) == 0) {
    why = "two passes over each row (statistics, then normalise) where the byte bound counts one";
  } else if (name == "adamw") {
    why = "a sqrt and a division per parameter beside the bytes";
  } else {
    why = "not analysed";
  }
  return std::string(head) + why;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--config") o.config = argv[i + 1];
  }
  if (o.config == "mini") {
    o.B = 8, o.T = 256, o.C = 256, o.H = 8, o.V = 256, o.L = 4;
    o.adamw_params = o.V * o.C + o.T * o.C + o.L * (12 * o.C * o.C + 13 * o.C) + 2 * o.C;
  } else if (o.config != "gpt2") {
    std::fprintf(stderr, "error: --config %s: unknown (hint: gpt2 or mini)\n", o.config.c_str());
    return 2;
  }
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> long {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "error: %s: missing value (hint: e.g. %s 4)\n", a.c_str(), a.c_str());
        std::exit(2);
      }
      return std::strtol(argv[++i], nullptr, 10);
    };
    if (a == "--config") {
      ++i;
    } else if (a == "-B") {
      o.B = next();
    } else if (a == "-T") {
      o.T = next();
    } else if (a == "-t") {
      o.threads = static_cast<int>(next());
    } else if (a == "-n") {
      o.iters = std::max(1, static_cast<int>(next()));
    } else if (a == "-w") {
      o.warmup = static_cast<int>(next());
    } else if (a == "--fallback") {
      o.fallback = true;
    } else if (a == "--torch") {
      o.torch = true;
    } else if (a == "--cpu-time") {
      o.cpu_time = true;
    } else if (a == "--torch-isa") {
      const std::string v = ++i < argc ? argv[i] : "";
      if (v != "same" && v != "native") {
        std::fprintf(stderr, "error: --torch-isa: '%s' is not same or native\n", v.c_str());
        return 2;
      }
      o.torch_isa_native = v == "native";
    } else if (a == "--only") {
      if (++i >= argc) {
        std::fprintf(stderr, "error: --only: missing value (hint: e.g. --only attention)\n");
        return 2;
      }
      o.only = argv[i];
    } else if (a == "--venv") {
      if (++i >= argc) {
        std::fprintf(stderr, "error: --venv: missing value\n");
        return 2;
      }
      o.venv = argv[i];
    } else {
      std::fprintf(
          stderr,
          "error: %s: unknown flag (hint: bench_kernels [--config gpt2|mini] [-B batch] "
          "[-T seq_len] [-t threads] [-n iters] [-w warmup] [--fallback] [--torch] [--venv DIR] "
          "[--only NAME] [--cpu-time] [--torch-isa same|native])\n",
          a.c_str());
      return 2;
    }
  }
  if (o.cpu_time && o.threads != 1) {
    std::fprintf(stderr, "error: --cpu-time: needs -t 1, got -t %d (hint: add -t 1)\n", o.threads);
    return 2;
  }
  SetNumThreads(o.threads);
  const double peak0 = MeasureGemmPeak(o);
  const double bandwidth0 = MeasureBandwidth(o);
  const int64_t N = o.B * o.T, C = o.C;
  // Runs the kernel groups that `want` names (a group is named by the kernels it holds).
  auto run_groups = [&](const Options& o, const std::function<bool(const char*)>& want) {
    std::vector<Result> r;
    if (want("matmul_qkv")) BenchLinear(o, r, "matmul_qkv", N, C, 3 * C);
    if (want("matmul_attn_proj")) BenchLinear(o, r, "matmul_attn_proj", N, C, C);
    if (want("matmul_fc")) BenchLinear(o, r, "matmul_fc", N, C, 4 * C);
    if (want("matmul_mlp_proj")) BenchLinear(o, r, "matmul_mlp_proj", N, 4 * C, C);
    if (want("matmul_lm_head")) BenchLinear(o, r, "matmul_lm_head", N, C, o.V);
    if (want("attention")) BenchAttention(o, r);
    if (want("layernorm gelu")) BenchPointwise(o, r);
    if (want("cross_entropy")) BenchLoss(o, r);
    if (want("adamw")) BenchOptimizer(o, r);
    return r;
  };
  auto run_all = [&] {
    return run_groups(
        o, [&](const char* group) { return std::string(group).find(o.only) != std::string::npos; });
  };
  std::vector<Result> results = run_all();
  std::string torch_why;
  std::map<std::string, double> torch_ms;
  if (o.torch) {
    // meshrun, torch, meshrun again (best of the two kept): a burst of load on the shared
    // machine then hits both sides rather than one.
    torch_ms = RunTorchKernels(o, &torch_why);
    const std::vector<Result> again = run_all();
    for (size_t i = 0; i < results.size(); ++i)
      results[i].ms = std::min(results[i].ms, again[i].ms);
  }
  // The roofs once more after the kernels, the better of the two kept: on a shared machine a
  // roof measured while someone else held a core would flatter every ratio.
  const double peak = std::max(peak0, MeasureGemmPeak(o));
  const double mkl_peak = MeasureMklPeak(o, NumThreads());
  const double bandwidth = std::max(bandwidth0, MeasureBandwidth(o));
  auto x_bound = [](const Result& r, double pk, double bw) {
    return r.ms / (std::max(r.flops / pk, r.bytes / bw) * 1e3);
  };

  // Every kernel above 1.5× (kWhyAbove) of its bound runs once more on one thread, timed by CPU
  // clock, against roofs measured the same way: within 1.5× there, the kernel is fine and the gap
  // is the wall clock of two threads (on this shared machine, mostly a core another process holds);
  // still above, it is the kernel itself, and `why` says what.
  std::map<std::string, double> x1;  // kernel → x_bound on one thread
  double peak1 = 0, bandwidth1 = 0;
  {
    std::vector<std::string> slow;
    for (const Result& r : results) {
      if (x_bound(r, peak, bandwidth) > kWhyAbove) slow.push_back(r.name);
    }
    if (!slow.empty() && NumThreads() > 1) {
      const int threads = NumThreads();
      Options o1 = o;
      o1.threads = 1;
      o1.cpu_time = true;
      SetNumThreads(1);
      peak1 = MeasureGemmPeak(o1);
      bandwidth1 = MeasureBandwidth(o1);
      const std::vector<Result> again = run_groups(o1, [&](const char* group) {
        for (const std::string& name : slow) {
          if (std::string(group).find(name.substr(0, name.find_last_of('_'))) != std::string::npos)
            return true;
          if (std::string(group).find(name) != std::string::npos) return true;
        }
        return false;
      });
      for (const Result& r : again) x1[r.name] = x_bound(r, peak1, bandwidth1);
      SetNumThreads(threads);
    }
  }

  const char* gemm = o.fallback ? "fallback" : GemmBackend();
  const std::string cpu = CpuDescription();
  std::printf("# meshrun CPU kernels, %s: B=%ld T=%ld C=%ld H=%ld V=%ld threads=%d gemm=%s\n",
              o.config.c_str(), long(o.B), long(o.T), long(o.C), long(o.H), long(o.V), NumThreads(),
              gemm);
  std::printf("# cpu: %s; OMP_WAIT_POLICY=%s GOMP_SPINCOUNT=%s; best of %d runs\n", cpu.c_str(),
              Env("OMP_WAIT_POLICY"), Env("GOMP_SPINCOUNT"), o.iters);
  std::printf("# roofs: float32 GEMM peak %.1f GFLOP/s, memory bandwidth %.1f GB/s (triad)\n",
              peak / 1e9, bandwidth / 1e9);
  std::printf("# isa: attention tile GEMM %s; GEMM %s; torch %s; torch malloc %s\n", KernelIsa(),
              gemm, meshrun::bench::TorchIsaDescription(o.torch_isa_native).c_str(),
              meshrun::bench::TorchMallocDescription(false).c_str());
  if (mkl_peak > 0) {
    std::printf(
        "# limit: MKL sgemm peak %.1f GFLOP/s (torch.mm 1024^3, %d threads, %s/bin/python); "
        "meshrun's GEMM peak is %.0f%% of it\n",
        mkl_peak / 1e9, NumThreads(), o.venv.c_str(), 100.0 * peak / mkl_peak);
  } else {
    std::printf("# limit: no MKL peak (%s/bin/python with torch is missing)\n", o.venv.c_str());
  }
  if (o.torch && torch_ms.empty()) std::printf("# no torch column: %s\n", torch_why.c_str());
  const bool have_torch = !torch_ms.empty();
  if (have_torch)
    std::printf("# torch_ms: bench/torch_kernels.py with %s/bin/python\n", o.venv.c_str());
  std::printf("%-22s %10s %9s %8s %10s %10s %8s", "kernel", "time_ms", "GFLOP/s", "GB/s", "flop_ms",
              "byte_ms", "x_bound");
  if (have_torch) std::printf(" %10s %7s", "torch_ms", "ratio");
  std::printf("\n");
  double total_ms = 0, total_bound_ms = 0;
  for (const Result& r : results) {
    const double flop_ms = r.flops / peak * 1e3, byte_ms = r.bytes / bandwidth * 1e3;
    const double bound = std::max(flop_ms, byte_ms);
    total_ms += r.ms;
    total_bound_ms += bound;
    std::printf("%-22s %10.3f %9.1f %8.1f %10.3f %10.3f %8.2f", r.name.c_str(), r.ms,
                r.flops / (r.ms * 1e-3) / 1e9, r.bytes / (r.ms * 1e-3) / 1e9, flop_ms, byte_ms,
                r.ms / bound);
    if (have_torch) {
      const auto it = torch_ms.find(r.name);
      const double t = it == torch_ms.end() ? 0 : it->second;
      std::printf(" %10.3f %7.2f", t, t > 0 ? t / r.ms : 0.0);  // ratio > 1: meshrun faster
    }
    std::printf("\n");
  }
  std::printf("%-22s %10.3f %9s %8s %21.3f %8.2f\n", "total", total_ms, "", "", total_bound_ms,
              total_ms / total_bound_ms);
  // Why each kernel above 1.5× of its bound is there.
  bool any_slow = false;
  for (const Result& r : results) {
    if (x_bound(r, peak, bandwidth) <= kWhyAbove) continue;
    if (!any_slow && !x1.empty()) {
      std::printf(
          "# one thread, CPU time: roofs GEMM %.1f GFLOP/s, bandwidth %.1f GB/s; load average %s\n",
          peak1 / 1e9, bandwidth1 / 1e9, LoadAverage().c_str());
    }
    any_slow = true;
    const auto it = x1.find(r.name);
    std::printf("# why %s is %.2fx of its bound: %s\n", r.name.c_str(), x_bound(r, peak, bandwidth),
                WhyAboveLimit(r.name, it == x1.end() ? -1 : it->second).c_str());
  }
  std::printf(
      "{\"bench\":\"kernels\",\"config\":\"%s\",\"B\":%ld,\"T\":%ld,\"threads\":%d,\"gemm\":\"%s\","
      "\"cpu\":\"%s\",\"isa\":\"%s\",\"gemm_peak_gflops\":%.2f,\"mkl_peak_gflops\":%.2f,"
      "\"bandwidth_gbs\":%.2f,\"results\":[",
      o.config.c_str(), long(o.B), long(o.T), NumThreads(), gemm, cpu.c_str(), KernelIsa(),
      peak / 1e9, mkl_peak / 1e9, bandwidth / 1e9);
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    const double bound = std::max(r.flops / peak, r.bytes / bandwidth) * 1e3;
    const auto it = torch_ms.find(r.name);
    std::printf(
        "%s{\"kernel\":\"%s\",\"ms\":%.4f,\"gflops\":%.2f,\"bound_ms\":%.4f,\"torch_ms\":%.4f}",
        i ? "," : "", r.name.c_str(), r.ms, r.flops / (r.ms * 1e-3) / 1e9, bound,
        it == torch_ms.end() ? 0.0 : it->second);
  }
  std::printf("]}\n");
  return 0;
}
