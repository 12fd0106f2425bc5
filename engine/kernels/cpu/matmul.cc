// Linear layers: out = inp·weightᵀ + bias and its backward, as GEMMs on the buffers in place
// (the transposes are BLAS flags, never copies). Gemm dispatches float32 to oneDNN's sgemm when
// the build has oneDNN (decision 0057), else (and float64 always) to OpenBLAS when the build has
// it and OpenBLAS runs kernels fit for this CPU, and to the built-in GemmFallback otherwise.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include "engine/kernels/cpu/kernel_internal.h"
#include "engine/kernels/cpu/kernels.h"
#include "engine/kernels/cpu/tile_gemm.h"

#ifdef MESHRUN_HAVE_OPENBLAS
#include <cblas.h>
#include <dlfcn.h>
#endif
#ifdef MESHRUN_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

namespace meshrun::cpu {
namespace {

bool EnvIs1(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::string(v) == "1";
}

#ifdef MESHRUN_HAVE_DNNL
// oneDNN's sgemm (decision 0057): one call threaded over the OpenMP team by oneDNN itself (the
// same libgomp pool as every other kernel; inside a parallel region it runs on the calling
// thread), JIT-compiled for the CPU's vector units. Used by default where oneDNN runs AVX-512
// (ahead of OpenBLAS SkylakeX at the model shapes); on AVX2 (MESHRUN_NO_AVX512=1, or a CPU
// without AVX-512) OpenBLAS's Haswell core was level or ahead, so OpenBLAS keeps those.
// MESHRUN_GEMM=openblas or =onednn forces the choice (the benches' per-shape comparison).
struct DnnlChoice {
  bool use = false;
  std::string isa;
};

const char* DnnlIsaName(dnnl_cpu_isa_t isa) {
  switch (isa) {
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "";
  }
}

DnnlChoice ChooseDnnl() {
  DnnlChoice c;
  const char* env = std::getenv("MESHRUN_GEMM");
  const std::string want = env != nullptr ? env : "";
  if (want == "openblas") return c;
  if (EnvIs1("MESHRUN_NO_AVX512")) dnnl_set_max_cpu_isa(dnnl_cpu_isa_avx2);
  const dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
  c.isa = DnnlIsaName(isa);
  const bool avx512 = (isa & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core;
  c.use = !c.isa.empty() && (avx512 || want == "onednn");
  return c;
}

const DnnlChoice& Dnnl() {
  static const DnnlChoice choice = ChooseDnnl();
  return choice;
}
#endif

#ifdef MESHRUN_HAVE_OPENBLAS
// OpenBLAS (DYNAMIC_ARCH) picks its kernels from the CPU model when it loads; releases older than
// the CPU model fall back to "Prescott" (SSE3), which runs at a quarter of this CPU's GEMM rate
// (0.3.21 on a Sapphire Rapids model: Prescott; decision 0041).
struct BlasChoice {
  bool use_blas = true;
  std::string description;
  std::string core_type_hint;
};

bool CoreHasAvx2(const std::string& core) {
  for (const char* good : {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids"}) {
    if (core == good) return true;
  }
  return false;
}

bool CoreHasAvx512(const std::string& core) {
  return core == "SkylakeX" || core == "Cooperlake" || core == "SapphireRapids";
}

// Re-runs OpenBLAS's core choice with OPENBLAS_CORETYPE=want, the variable it reads when it loads:
// gotoblas_dynamic_quit and gotoblas_dynamic_init are what its load and unload run, exported by
// DYNAMIC_ARCH builds (looked up at run time, so a build against a single-core OpenBLAS still
// links and keeps its core). Called once, from the first Gemm, before meshrun's first BLAS call.
// The variable is set only for the call and removed after, so the process's environment (and
// every child's) stays the user's. True when OpenBLAS now reports the core asked for.
bool SelectOpenBlasCore(const std::string& want) {
  using Fn = void (*)();
  auto quit = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "gotoblas_dynamic_quit"));
  auto init = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "gotoblas_dynamic_init"));
  if (quit == nullptr || init == nullptr) return false;
  ::setenv("OPENBLAS_CORETYPE", want.c_str(), 1);
  quit();
  init();
  ::unsetenv("OPENBLAS_CORETYPE");
  return want == openblas_get_corename();
}

BlasChoice ChooseBlas() {
  BlasChoice c;
#ifdef _OPENMP
  openblas_set_num_threads(1);  // even when SetNumThreads is never called (BlasPanels)
#endif
  const std::string loaded = openblas_get_corename();
  std::string core = loaded;
  std::string hint, selected;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  // The AVX2 path on an AVX-512 CPU (MESHRUN_NO_AVX512=1, as for the tile GEMM) is OpenBLAS's
  // Haswell core; MESHRUN_FORCE_SCALAR=1 changes nothing here (OpenBLAS is not meshrun's SIMD).
  const bool no512 = EnvIs1("MESHRUN_NO_AVX512");
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr) {  // set by the user: theirs to choose
    if (avx512 && !no512 && !CoreHasAvx512(core)) {
      hint = "SkylakeX";
    } else if (avx2 && (!CoreHasAvx2(core) || (no512 && CoreHasAvx512(core)))) {
      hint = "Haswell";
    }
  }
  if (!hint.empty() && SelectOpenBlasCore(hint)) {
    selected = hint;
    hint.clear();
  }
  core = openblas_get_corename();
#ifdef __AVX2__
  // GemmFallback is compiled for AVX2 or better: prefer it to an OpenBLAS stuck below AVX2.
  c.use_blas = !(avx2 && !CoreHasAvx2(core));
#endif
#endif
  if (c.use_blas) {
    c.description =
        "openblas (" + core +
        (selected.empty() ? std::string() : ", selected by meshrun; OpenBLAS chose " + loaded) +
        ")";
  } else {
    c.description = "fallback (OpenBLAS chose core " + core +
                    " for this CPU; set OPENBLAS_CORETYPE=" + hint + " to use it)";
  }
  c.core_type_hint = hint;
  return c;
}

const BlasChoice& Choice() {
  static const BlasChoice choice = ChooseBlas();
  return choice;
}

inline CBLAS_TRANSPOSE Op(bool trans) {
  return trans ? CblasTrans : CblasNoTrans;
}
inline void Blas(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                 int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, Op(ta), Op(tb), M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
inline void Blas(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A,
                 int64_t lda, const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, Op(ta), Op(tb), M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// One thread pool for the whole rank: OpenBLAS runs single-threaded and the OpenMP team splits
// each product into column (or row) panels. With OpenBLAS's own pthreads pool beside OpenMP's,
// each pool's idle threads spin (sched_yield, libgomp's spin wait) on the cores the other pool
// is computing on: 35% of a `mini` step's CPU time went there.
// Panels: up to kPanelsPerThread per thread, at least kMinPanel wide (each panel packs the whole
// other operand once more), multiples of 16 (the widths of OpenBLAS's AVX2 kernels), handed out
// dynamically, so a thread that the machine's other work holds up costs its own panel, not the
// whole product. Panel bounds depend only on the shape and the thread count, and each output
// element is written by one panel, so results do not depend on which thread ran which panel.
constexpr int kPanelsPerThread = 4;
constexpr int64_t kMinPanel = 128;

template <typename T>
void BlasPanels(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda,
                const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
#ifdef _OPENMP
  const int threads = omp_get_max_threads();
  const bool split_n = N >= M;
  const int64_t dim = split_n ? N : M;
  const int64_t parts = std::min<int64_t>(threads * kPanelsPerThread, dim / kMinPanel);
  if (threads > 1 && parts > 1 && !omp_in_parallel() &&
      internal::WorthParallel(static_cast<double>(M) * N * K / 16)) {
    auto edge = [&](int64_t i) { return i == parts ? dim : (dim * i / parts) / 16 * 16; };
#pragma omp parallel for schedule(dynamic, 1) num_threads(std::min <int64_t>(threads, parts))
    for (int64_t part = 0; part < parts; ++part) {
      const int64_t lo = edge(part), len = edge(part + 1) - lo;
      if (len <= 0) continue;
      if (split_n) {
        Blas(ta, tb, M, len, K, alpha, A, lda, tb ? B + lo * ldb : B + lo, ldb, beta, C + lo, ldc);
      } else {
        Blas(ta, tb, len, N, K, alpha, ta ? A + lo : A + lo * lda, lda, B, ldb, beta, C + lo * ldc,
             ldc);
      }
    }
    return;
  }
#endif
  Blas(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
#endif

// Columns per task of the dbias reduction: a multiple of a cache line.
constexpr int64_t kBiasCols = 64;

}  // namespace

#if !MESHRUN_FLOAT64  // not templates: the product library holds them (element_type.h)
const char* GemmBackend() {
#ifdef MESHRUN_HAVE_OPENBLAS
  const std::string others = Choice().description;
#else
  const std::string others = "fallback (built without BLAS)";
#endif
#ifdef MESHRUN_HAVE_DNNL
  if (Dnnl().use) {
    // OpenBLAS first: what runs float64 (and what the core-choice test looks for).
    static const std::string both =
        others + " for float64; onednn " + std::to_string(DNNL_VERSION_MAJOR) + "." +
        std::to_string(DNNL_VERSION_MINOR) + " sgemm (" + Dnnl().isa + ") for float32";
    return both.c_str();
  }
#endif
  static const std::string only = others;
  return only.c_str();
}

const char* OpenBlasCoreTypeHint() {
#ifdef MESHRUN_HAVE_OPENBLAS
  return Choice().core_type_hint.c_str();
#else
  return "";
#endif
}

const char* KernelIsa() {
  return internal::TileGemmIsa();
}
#endif

template <typename T>
void Gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
          int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
#ifdef MESHRUN_HAVE_DNNL
  if constexpr (std::is_same_v<T, float>) {
    if (Dnnl().use) {
      // Row-major; oneDNN checks lda/ldb even when K == 0, as BLAS does.
      const int64_t min_lda = std::max<int64_t>(trans_a ? M : K, 1);
      const int64_t min_ldb = std::max<int64_t>(trans_b ? K : N, 1);
      if (dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A,
                     std::max(lda, min_lda), B, std::max(ldb, min_ldb), beta, C,
                     ldc) == dnnl_success) {
        return;
      }
    }
  }
#endif
#ifdef MESHRUN_HAVE_OPENBLAS
  if (Choice().use_blas) {
    // BLAS checks lda/ldb even when K == 0; keep them valid.
    BlasPanels(trans_a, trans_b, M, N, K, alpha, A, std::max<int64_t>(lda, 1), B,
               std::max<int64_t>(ldb, 1), beta, C, ldc);
    return;
  }
#endif
  GemmFallback(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

template <typename T>
void MatmulForward(T* out, const T* inp, const T* weight, const T* bias, int64_t N, int64_t C,
                   int64_t OC) {
  Gemm(false, true, N, OC, C, T(1), inp, C, weight, C, T(0), out, OC);
  if (bias == nullptr) return;
#pragma omp parallel for schedule(static) if (internal::WorthParallel(N * OC))
  for (int64_t i = 0; i < N; ++i) {
    T* o = out + i * OC;
#pragma omp simd
    for (int64_t j = 0; j < OC; ++j) o[j] += bias[j];
  }
}

template <typename T>
void MatmulBackward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                    int64_t N, int64_t C, int64_t OC, bool accumulate_dinp) {
  if (dinp != nullptr) {
    Gemm(false, false, N, C, OC, T(1), dout, OC, weight, C, accumulate_dinp ? T(1) : T(0), dinp, C);
  }
  if (dweight != nullptr) Gemm(true, false, OC, C, N, T(1), dout, OC, inp, C, T(1), dweight, C);
  if (dbias == nullptr) return;
  // Parallel over columns, rows summed in order: deterministic for any thread count.
  const int64_t n_tasks = (OC + kBiasCols - 1) / kBiasCols;
#pragma omp parallel for schedule(static) if (internal::WorthParallel(N * OC))
  for (int64_t t = 0; t < n_tasks; ++t) {
    const int64_t j0 = t * kBiasCols;
    const int64_t nj = std::min(kBiasCols, OC - j0);
    T acc[kBiasCols] = {};
    for (int64_t i = 0; i < N; ++i) {
      const T* d = dout + i * OC + j0;
#pragma omp simd
      for (int64_t j = 0; j < nj; ++j) acc[j] += d[j];
    }
    for (int64_t j = 0; j < nj; ++j) dbias[j0 + j] += acc[j];
  }
}

#define MESHRUN_INSTANTIATE(T)                                                                 \
  template void Gemm<T>(bool, bool, int64_t, int64_t, int64_t, T, const T*, int64_t, const T*, \
                        int64_t, T, T*, int64_t);
MESHRUN_INSTANTIATE(MESHRUN_ELEMENT_TYPE)  // float; double in the float64 twin (element_type.h)
#undef MESHRUN_INSTANTIATE
MESHRUN_INSTANTIATE_CPU_KERNELS(MatmulForward, MatmulBackward)

#if !MESHRUN_FLOAT64
double MeasureMatmulFlops() {
  const int64_t n = 512;
  std::vector<float> a(n * n), b(n * n), c(n * n);
  for (int64_t i = 0; i < n * n; ++i) {
    a[i] = static_cast<float>((i % 17) - 8) * 0.01f;
    b[i] = static_cast<float>((i % 13) - 6) * 0.01f;
  }
  // One untimed call (thread start-up, first touch of the pages), then the fastest of at least
  // 10 calls over at least 60 ms: a peak taken from a few milliseconds on a core that something
  // else held for them read 3x low and made MFU exceed 100%.
  MatmulForward(c.data(), a.data(), b.data(), static_cast<const float*>(nullptr), n, n, n);
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  double best = 1e30;
  for (int rep = 0; rep < 200; ++rep) {
    const Clock::time_point t0 = Clock::now();
    MatmulForward(c.data(), a.data(), b.data(), static_cast<const float*>(nullptr), n, n, n);
    const Clock::time_point t1 = Clock::now();
    best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
    if (rep >= 9 && t1 - start >= std::chrono::milliseconds(60)) break;
  }
  return 2.0 * n * n * n / best;
}
#endif

}  // namespace meshrun::cpu
