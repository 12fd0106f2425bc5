// CPU kernel benchmark at GPT-2 small shapes (d_model 768, 12 heads, seq 1024): time and
// GFLOP/s of each kernel's forward and backward, then one JSON line with the same numbers.
//
//   bench_kernels [-B batch] [-T seq_len] [-t threads] [-n iters] [-w warmup] [--fallback]
//
// --fallback runs the Matmul shapes through GemmFallback instead of the build's Gemm backend.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "engine/kernels/cpu/kernels.h"

namespace {

using namespace meshrun::cpu;

struct Options {
  int64_t B = 1, T = 1024, C = 768, H = 12, V = 50257;
  int threads = 0, iters = 5, warmup = 2;
  bool fallback = false;
};

struct Result {
  std::string name;
  double ms, gflops;
};

std::vector<float> Random(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Median wall time of fn over iters runs after warmup runs.
double TimeMs(const Options& o, const std::function<void()>& fn) {
  for (int i = 0; i < o.warmup; ++i) fn();
  std::vector<double> t;
  for (int i = 0; i < o.iters; ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                    .count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void Add(std::vector<Result>& results, const std::string& name, double ms, double flops) {
  results.push_back({name, ms, flops / (ms * 1e-3) / 1e9});
}

void BenchLinear(const Options& o, std::vector<Result>& results, const std::string& name, int64_t N,
                 int64_t C, int64_t OC) {
  auto inp = Random(N * C, 1), w = Random(OC * C, 2, 0.02f), b = Random(OC, 3),
       dout = Random(N * OC, 4);
  std::vector<float> out(N * OC), dinp(N * C), dw(OC * C), db(OC);
  const double flops = 2.0 * N * C * OC;
  double fwd, bwd;
  if (o.fallback) {
    fwd = TimeMs(o, [&] {
      GemmFallback(false, true, N, OC, C, 1.f, inp.data(), C, w.data(), C, 0.f, out.data(), OC);
    });
    bwd = TimeMs(o, [&] {
      GemmFallback(false, false, N, C, OC, 1.f, dout.data(), OC, w.data(), C, 1.f, dinp.data(), C);
      GemmFallback(true, false, OC, C, N, 1.f, dout.data(), OC, inp.data(), C, 1.f, dw.data(), C);
    });
  } else {
    fwd = TimeMs(o, [&] { MatmulForward(out.data(), inp.data(), w.data(), b.data(), N, C, OC); });
    bwd = TimeMs(o, [&] {
      MatmulBackward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, C,
                     OC);
    });
  }
  Add(results, name + "_fwd", fwd, flops);
  Add(results, name + "_bwd", bwd, 2 * flops);
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
  Add(results, "attention_fwd", fwd, fwd_flops);
  Add(results, "attention_bwd", bwd, 2.5 * fwd_flops);
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
      8.0 * N * C);
  Add(results, "layernorm_bwd",
      TimeMs(o,
             [&] {
               LayerNormBackward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(),
                                 mean.data(), rstd.data(), N, C);
             }),
      14.0 * N * C);
  auto h = Random(N * 4 * C, 5, 3.f), dh = Random(N * 4 * C, 6);
  std::vector<float> gh(N * 4 * C), dgh(N * 4 * C);
  Add(results, "gelu_fwd", TimeMs(o, [&] { GeluForward(gh.data(), h.data(), N * 4 * C); }),
      20.0 * N * 4 * C);
  Add(results, "gelu_bwd",
      TimeMs(o, [&] { GeluBackward(dgh.data(), h.data(), dh.data(), N * 4 * C); }),
      30.0 * N * 4 * C);
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
      5.0 * N * V);
}

void BenchOptimizer(const Options& o, std::vector<Result>& results) {
  const int64_t n = 124'000'000;  // GPT-2 small
  auto p = Random(n, 1), g = Random(n, 2);
  std::vector<float> m(n, 0.f), v(n, 0.f);
  int64_t step = 0;
  Add(results, "adamw_124M",
      TimeMs(o,
             [&] {
               AdamW(p.data(), g.data(), m.data(), v.data(), n, 3e-4, 0.9, 0.95, 1e-8, 0.1, ++step);
             }),
      12.0 * n);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> long {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "error: %s: missing value (hint: e.g. %s 4)\n", a.c_str(), a.c_str());
        std::exit(2);
      }
      return std::strtol(argv[++i], nullptr, 10);
    };
    if (a == "-B") {
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
    } else {
      std::fprintf(stderr,
                   "error: %s: unknown flag (hint: bench_kernels [-B batch] [-T seq_len] "
                   "[-t threads] [-n iters] [-w warmup] [--fallback])\n",
                   a.c_str());
      return 2;
    }
  }
  SetNumThreads(o.threads);
  const int64_t N = o.B * o.T, C = o.C;
  std::vector<Result> results;
  BenchLinear(o, results, "matmul_qkv", N, C, 3 * C);
  BenchLinear(o, results, "matmul_attn_proj", N, C, C);
  BenchLinear(o, results, "matmul_fc", N, C, 4 * C);
  BenchLinear(o, results, "matmul_mlp_proj", N, 4 * C, C);
  BenchAttention(o, results);
  BenchPointwise(o, results);
  BenchLoss(o, results);
  BenchOptimizer(o, results);

  const char* gemm = o.fallback ? "fallback" : GemmBackend();
  std::printf("# meshrun CPU kernels: B=%ld T=%ld C=%ld H=%ld threads=%d gemm=%s\n", long(o.B),
              long(o.T), long(o.C), long(o.H), NumThreads(), gemm);
  std::printf("%-20s %12s %10s\n", "kernel", "time_ms", "GFLOP/s");
  for (const Result& r : results) {
    std::printf("%-20s %12.3f %10.1f\n", r.name.c_str(), r.ms, r.gflops);
  }
  std::printf(
      "{\"bench\":\"kernels\",\"B\":%ld,\"T\":%ld,\"threads\":%d,\"gemm\":\"%s\",\"results\":[",
      long(o.B), long(o.T), NumThreads(), gemm);
  for (size_t i = 0; i < results.size(); ++i) {
    std::printf("%s{\"kernel\":\"%s\",\"ms\":%.4f,\"gflops\":%.2f}", i ? "," : "",
                results[i].name.c_str(), results[i].ms, results[i].gflops);
  }
  std::printf("]}\n");
  return 0;
}
