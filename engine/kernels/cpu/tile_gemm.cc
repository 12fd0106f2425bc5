// TileGemm (tile_gemm.h) for three instruction sets, each a copy of tile_gemm_impl.h compiled
// under its own target pragma (GCC's `#pragma GCC target`, clang's `#pragma clang attribute`),
// and the run-time choice among them.
#include "engine/kernels/cpu/tile_gemm.h"

#include <cstdlib>
#include <cstring>
#include <utility>

#include "engine/core/element_type.h"
#include "engine/kernels/cpu/simd.h"

#if MESHRUN_SIMD_X86
#include <immintrin.h>
#endif

namespace meshrun::cpu::internal {
namespace {

// Baseline: whatever the file is compiled for (SSE2 on plain x86-64, the build's -march
// otherwise). ISO C++ mode keeps a·b + c unfused, so this path is multiply then add.
namespace base {
constexpr int kVecBytes = 16;
constexpr int kMR = 6;
template <typename W>
inline W Fma(W a, W b, W c) {
  return a * b + c;
}
typedef float F4 __attribute__((vector_size(16)));
typedef double D2 __attribute__((vector_size(16)));
inline F4 Splat(float x) {
  return F4{x, x, x, x};
}
inline D2 Splat(double x) {
  return D2{x, x};
}
#include "engine/kernels/cpu/tile_gemm_impl.h"
}  // namespace base

#if MESHRUN_SIMD_X86
#if defined(__clang__)  // clang ignores GCC's target pragma
// Vectors pass between the inlined helpers of one region only, never across an ABI boundary.
#pragma clang diagnostic ignored "-Wpsabi"
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif
namespace avx2 {
constexpr int kVecBytes = 32;
constexpr int kMR = 6;  // 12 accumulators + 2 B vectors + 1 broadcast of the 16 ymm registers
typedef float F8 __attribute__((vector_size(32)));
typedef double D4 __attribute__((vector_size(32)));
inline F8 Fma(F8 a, F8 b, F8 c) {
  return _mm256_fmadd_ps(a, b, c);
}
inline D4 Fma(D4 a, D4 b, D4 c) {
  return _mm256_fmadd_pd(a, b, c);
}
inline F8 Splat(float x) {
  return _mm256_set1_ps(x);
}
inline D4 Splat(double x) {
  return _mm256_set1_pd(x);
}
#include "engine/kernels/cpu/tile_gemm_impl.h"
}  // namespace avx2
#if defined(__clang__)
#pragma clang attribute pop
#pragma clang attribute push(__attribute__((target("avx512f"))), apply_to = function)
#else
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f")
#endif
namespace avx512 {
constexpr int kVecBytes = 64;
constexpr int kMR = 8;  // 16 accumulators of the 32 zmm registers
typedef float F16 __attribute__((vector_size(64)));
typedef double D8 __attribute__((vector_size(64)));
inline F16 Fma(F16 a, F16 b, F16 c) {
  return _mm512_fmadd_ps(a, b, c);
}
inline D8 Fma(D8 a, D8 b, D8 c) {
  return _mm512_fmadd_pd(a, b, c);
}
inline F16 Splat(float x) {
  return _mm512_set1_ps(x);
}
inline D8 Splat(double x) {
  return _mm512_set1_pd(x);
}
#include "engine/kernels/cpu/tile_gemm_impl.h"
}  // namespace avx512
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif

enum class Isa { kBase, kAvx2, kAvx512 };

Isa Detect() {
#if MESHRUN_SIMD_X86
  // MESHRUN_FORCE_SCALAR=1 (simd.h) also turns these paths off; MESHRUN_NO_AVX512=1 keeps AVX2.
  if (!simd::HasAvx2()) return Isa::kBase;
  const char* no512 = std::getenv("MESHRUN_NO_AVX512");
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && !(no512 != nullptr && std::strcmp(no512, "1") == 0)) {
    return Isa::kAvx512;
  }
  return Isa::kAvx2;
#else
  return Isa::kBase;
#endif
}

Isa Chosen() {
  static const Isa isa = Detect();
  return isa;
}

}  // namespace

template <typename T>
TileGemmFn<T> TileGemm(bool trans_a) {
#if MESHRUN_SIMD_X86
  switch (Chosen()) {
    case Isa::kAvx512:
      return trans_a ? avx512::TileGemmImpl<T, true> : avx512::TileGemmImpl<T, false>;
    case Isa::kAvx2: return trans_a ? avx2::TileGemmImpl<T, true> : avx2::TileGemmImpl<T, false>;
    case Isa::kBase: break;
  }
#endif
  return trans_a ? base::TileGemmImpl<T, true> : base::TileGemmImpl<T, false>;
}

#if !MESHRUN_FLOAT64  // not a template: the product library holds it (element_type.h)
const char* TileGemmIsa() {
  switch (Chosen()) {
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx2: return "avx2";
    case Isa::kBase: break;
  }
  return "sse2";
}
#endif

template TileGemmFn<MESHRUN_ELEMENT_TYPE> TileGemm<MESHRUN_ELEMENT_TYPE>(bool);

}  // namespace meshrun::cpu::internal
