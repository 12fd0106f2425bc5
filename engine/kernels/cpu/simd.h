// Internal to the CPU kernels: AVX2/FMA versions of the float loops that the compiler does not
// vectorize by itself (e^x, tanh-GELU, softmax rows), chosen at run time by CPU features so that
// one binary built for baseline x86-64 (MESHRUN_KERNELS_MARCH empty) still runs them on any
// AVX2 machine, and falls back to the scalar loops elsewhere (docs/decisions/0013).
// Every function here is single-threaded; the kernels split the work over threads around them.
#pragma once

#include <cstdint>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MESHRUN_SIMD_X86 1
#include <immintrin.h>
#define MESHRUN_AVX2 __attribute__((target("avx2,fma")))
#else
#define MESHRUN_SIMD_X86 0
#define MESHRUN_AVX2
#endif

namespace meshrun::cpu::simd {

// True when this CPU has AVX2 and FMA (checked once); MESHRUN_FORCE_SCALAR=1 in the
// environment turns the AVX2 paths off, so the tests and benchmarks can compare the two.
bool HasAvx2();
// True when HasAvx2() and the CPU has AVX-512F, unless MESHRUN_NO_AVX512=1: ExpShiftSum,
// ExpShift and the GELU rows then run 16 lanes (decision 0041).
bool HasAvx512();

#if MESHRUN_SIMD_X86

// e^x on 8 floats, the algorithm of internal::ExpF (Cephes' polynomial after a reduction by
// ln 2) with FMA: ≤ 2 ulp on [-87, 88], exactly 0 below -87 (masked scores are -inf), saturated
// at e^88 above.
MESHRUN_AVX2 inline __m256 Exp8(__m256 x) {
  const __m256 xc = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  const __m256 underflow = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ);
  return _mm256_andnot_ps(underflow, y);
}

// Horizontal sum and max of 8 lanes.
MESHRUN_AVX2 inline float HSum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
MESHRUN_AVX2 inline float HMax8(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

#endif  // MESHRUN_SIMD_X86

// ---- row helpers (AVX2 when HasAvx2(), else scalar; the kernels call these directly).
// max_j x[j] (-inf for n = 0).
float RowMax(const float* x, int64_t n);
// y[j] = e^(x[j] − shift), returns Σ_j y[j] (summed in 8 lanes, then across). y may be x.
float ExpShiftSum(float* y, const float* x, int64_t n, float shift);
// x[j] = e^(x[j] − shift).
void ExpShift(float* x, int64_t n, float shift);
// x[j] *= s.
void ScaleRow(float* x, int64_t n, float s);
// tanh-GELU over n elements: out = gelu(inp); dinp += gelu'(inp)·dout (= when not accumulate).
void GeluForwardRow(float* out, const float* inp, int64_t n);
void GeluBackwardRow(float* dinp, const float* inp, const float* dout, int64_t n,
                     bool accumulate = true);

}  // namespace meshrun::cpu::simd
