// The row helpers of simd.h: an AVX2/FMA body for the bulk of each row and the scalar loop
// (also the whole row on CPUs without AVX2) for the rest.
#include "engine/kernels/cpu/simd.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "engine/kernels/cpu/kernel_internal.h"

namespace meshrun::cpu::simd {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

bool DetectAvx512();

bool DetectAvx2() {
  const char* force = std::getenv("MESHRUN_FORCE_SCALAR");
  if (force != nullptr && std::strcmp(force, "1") == 0) return false;
#if MESHRUN_SIMD_X86
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

// 1 − 2/(e^{2u} + 1): tanh with float rounding's absolute error, saturating to ±1.
inline float TanhScalar(float u) {
  return 1.0f - 2.0f / (internal::ExpF(2.0f * u) + 1.0f);
}

void GeluForwardScalar(float* out, const float* inp, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float t = TanhScalar(kSqrt2OverPi * (x + kCubic * x * x * x));
    out[i] = 0.5f * x * (1.0f + t);
  }
}

void GeluBackwardScalar(float* dinp, const float* inp, const float* dout, int64_t n,
                        bool accumulate) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float t = TanhScalar(kSqrt2OverPi * (x + kCubic * x * x * x));
    const float dudx = kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
    const float grad = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * dudx;
    dinp[i] = accumulate ? dinp[i] + grad * dout[i] : grad * dout[i];
  }
}

#if MESHRUN_SIMD_X86

// tanh(k·(x + a·x³)) on 8 lanes, as TanhScalar.
MESHRUN_AVX2 inline __m256 GeluTanh8(__m256 x) {
  const __m256 x2 = _mm256_mul_ps(x, x);
  const __m256 inner = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(kCubic), x2), x, x);
  const __m256 e = Exp8(_mm256_mul_ps(_mm256_set1_ps(2.0f * kSqrt2OverPi), inner));
  const __m256 one = _mm256_set1_ps(1.0f);
  return _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, one)));
}

MESHRUN_AVX2 float RowMaxAvx2(const float* x, int64_t n) {
  __m256 m0 = _mm256_set1_ps(-std::numeric_limits<float>::infinity()), m1 = m0;
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    m0 = _mm256_max_ps(m0, _mm256_loadu_ps(x + j));
    m1 = _mm256_max_ps(m1, _mm256_loadu_ps(x + j + 8));
  }
  float m = HMax8(_mm256_max_ps(m0, m1));
  for (; j < n; ++j) m = std::max(m, x[j]);
  return m;
}

MESHRUN_AVX2 float ExpShiftSumAvx2(float* y, const float* x, int64_t n, float shift) {
  const __m256 s = _mm256_set1_ps(shift);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m256 e0 = Exp8(_mm256_sub_ps(_mm256_loadu_ps(x + j), s));
    const __m256 e1 = Exp8(_mm256_sub_ps(_mm256_loadu_ps(x + j + 8), s));
    _mm256_storeu_ps(y + j, e0);
    _mm256_storeu_ps(y + j + 8, e1);
    acc0 = _mm256_add_ps(acc0, e0);
    acc1 = _mm256_add_ps(acc1, e1);
  }
  float sum = HSum8(_mm256_add_ps(acc0, acc1));
  for (; j < n; ++j) {
    y[j] = internal::ExpF(x[j] - shift);
    sum += y[j];
  }
  return sum;
}

MESHRUN_AVX2 void ExpShiftAvx2(float* x, int64_t n, float shift) {
  const __m256 s = _mm256_set1_ps(shift);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    _mm256_storeu_ps(x + j, Exp8(_mm256_sub_ps(_mm256_loadu_ps(x + j), s)));
  }
  for (; j < n; ++j) x[j] = internal::ExpF(x[j] - shift);
}

MESHRUN_AVX2 void ScaleRowAvx2(float* x, int64_t n, float s) {
  const __m256 sv = _mm256_set1_ps(s);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) _mm256_storeu_ps(x + j, _mm256_mul_ps(_mm256_loadu_ps(x + j), sv));
  for (; j < n; ++j) x[j] *= s;
}

MESHRUN_AVX2 void GeluForwardAvx2(float* out, const float* inp, int64_t n) {
  const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(inp + i);
    const __m256 t = GeluTanh8(x);
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(half, x), _mm256_add_ps(one, t)));
  }
  GeluForwardScalar(out + i, inp + i, n - i);
}

MESHRUN_AVX2 void GeluBackwardAvx2(float* dinp, const float* inp, const float* dout, int64_t n,
                                   bool accumulate) {
  const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
  const __m256 k = _mm256_set1_ps(kSqrt2OverPi), a3 = _mm256_set1_ps(3.0f * kCubic);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(inp + i);
    const __m256 t = GeluTanh8(x);
    const __m256 dudx = _mm256_mul_ps(k, _mm256_fmadd_ps(_mm256_mul_ps(a3, x), x, one));
    const __m256 sech2 = _mm256_fnmadd_ps(t, t, one);  // 1 − t²
    const __m256 grad = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_mul_ps(half, x), sech2), dudx,
                                        _mm256_mul_ps(half, _mm256_add_ps(one, t)));
    // fma(g, d, 0) rounds as g·d does: overwriting equals accumulating onto zeros, bit for bit.
    const __m256 base = accumulate ? _mm256_loadu_ps(dinp + i) : _mm256_setzero_ps();
    _mm256_storeu_ps(dinp + i, _mm256_fmadd_ps(grad, _mm256_loadu_ps(dout + i), base));
  }
  GeluBackwardScalar(dinp + i, inp + i, dout + i, n - i, accumulate);
}

// AVX-512 versions of the row loops that dominate attention's softmax and the MLP's GELU
// (decision 0041): the same Cephes reduction and polynomial as Exp8 on 16 lanes, so values agree
// with the AVX2 and scalar paths to rounding (sums run in 16 lanes instead of 8).
#define MESHRUN_AVX512 __attribute__((target("avx512f,avx2,fma")))
// GCC 12 warns inside its own avx512fintrin.h (_mm512_undefined_ps in the reductions).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

MESHRUN_AVX512 inline __m512 Exp16(__m512 x) {
  const __m512 xc = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i e =
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  const __m512 y = _mm512_mul_ps(p, _mm512_castsi512_ps(e));
  const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GE_OQ);
  return _mm512_maskz_mov_ps(keep, y);
}

MESHRUN_AVX512 inline __m512 GeluTanh16(__m512 x) {
  const __m512 x2 = _mm512_mul_ps(x, x);
  const __m512 inner = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(kCubic), x2), x, x);
  const __m512 e = Exp16(_mm512_mul_ps(_mm512_set1_ps(2.0f * kSqrt2OverPi), inner));
  const __m512 one = _mm512_set1_ps(1.0f);
  return _mm512_sub_ps(one, _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, one)));
}

MESHRUN_AVX512 float ExpShiftSumAvx512(float* y, const float* x, int64_t n, float shift) {
  const __m512 s = _mm512_set1_ps(shift);
  __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0;
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) {
    const __m512 e0 = Exp16(_mm512_sub_ps(_mm512_loadu_ps(x + j), s));
    const __m512 e1 = Exp16(_mm512_sub_ps(_mm512_loadu_ps(x + j + 16), s));
    _mm512_storeu_ps(y + j, e0);
    _mm512_storeu_ps(y + j + 16, e1);
    acc0 = _mm512_add_ps(acc0, e0);
    acc1 = _mm512_add_ps(acc1, e1);
  }
  float sum = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
  for (; j < n; ++j) {
    y[j] = internal::ExpF(x[j] - shift);
    sum += y[j];
  }
  return sum;
}

MESHRUN_AVX512 void ExpShiftAvx512(float* x, int64_t n, float shift) {
  const __m512 s = _mm512_set1_ps(shift);
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    _mm512_storeu_ps(x + j, Exp16(_mm512_sub_ps(_mm512_loadu_ps(x + j), s)));
  }
  for (; j < n; ++j) x[j] = internal::ExpF(x[j] - shift);
}

MESHRUN_AVX512 void GeluForwardAvx512(float* out, const float* inp, int64_t n) {
  const __m512 half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(inp + i);
    const __m512 t = GeluTanh16(x);
    _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_mul_ps(half, x), _mm512_add_ps(one, t)));
  }
  GeluForwardScalar(out + i, inp + i, n - i);
}

MESHRUN_AVX512 void GeluBackwardAvx512(float* dinp, const float* inp, const float* dout, int64_t n,
                                       bool accumulate) {
  const __m512 half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f);
  const __m512 k = _mm512_set1_ps(kSqrt2OverPi), a3 = _mm512_set1_ps(3.0f * kCubic);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(inp + i);
    const __m512 t = GeluTanh16(x);
    const __m512 dudx = _mm512_mul_ps(k, _mm512_fmadd_ps(_mm512_mul_ps(a3, x), x, one));
    const __m512 sech2 = _mm512_fnmadd_ps(t, t, one);  // 1 − t²
    const __m512 grad = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_mul_ps(half, x), sech2), dudx,
                                        _mm512_mul_ps(half, _mm512_add_ps(one, t)));
    const __m512 base = accumulate ? _mm512_loadu_ps(dinp + i) : _mm512_setzero_ps();
    _mm512_storeu_ps(dinp + i, _mm512_fmadd_ps(grad, _mm512_loadu_ps(dout + i), base));
  }
  GeluBackwardScalar(dinp + i, inp + i, dout + i, n - i, accumulate);
}
#pragma GCC diagnostic pop

#endif  // MESHRUN_SIMD_X86

// AVX-512 for the row loops above: on an AVX2 path (HasAvx2()), with avx512f, unless
// MESHRUN_NO_AVX512=1 (the switch that keeps attention's tile GEMM on AVX2 too).
bool DetectAvx512() {
#if MESHRUN_SIMD_X86
  const char* no512 = std::getenv("MESHRUN_NO_AVX512");
  if (no512 != nullptr && std::strcmp(no512, "1") == 0) return false;
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f");
#else
  return false;
#endif
}

}  // namespace

bool HasAvx512() {
  static const bool has = DetectAvx2() && DetectAvx512();
  return has;
}

bool HasAvx2() {
  static const bool has = DetectAvx2();
  return has;
}

float RowMax(const float* x, int64_t n) {
#if MESHRUN_SIMD_X86
  if (HasAvx2()) return RowMaxAvx2(x, n);
#endif
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n; ++j) m = std::max(m, x[j]);
  return m;
}

float ExpShiftSum(float* y, const float* x, int64_t n, float shift) {
#if MESHRUN_SIMD_X86
  if (HasAvx512()) return ExpShiftSumAvx512(y, x, n, shift);
  if (HasAvx2()) return ExpShiftSumAvx2(y, x, n, shift);
#endif
  float sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    y[j] = internal::ExpF(x[j] - shift);
    sum += y[j];
  }
  return sum;
}

void ExpShift(float* x, int64_t n, float shift) {
#if MESHRUN_SIMD_X86
  if (HasAvx512()) return ExpShiftAvx512(x, n, shift);
  if (HasAvx2()) return ExpShiftAvx2(x, n, shift);
#endif
  for (int64_t j = 0; j < n; ++j) x[j] = internal::ExpF(x[j] - shift);
}

void ScaleRow(float* x, int64_t n, float s) {
#if MESHRUN_SIMD_X86
  if (HasAvx2()) return ScaleRowAvx2(x, n, s);
#endif
  for (int64_t j = 0; j < n; ++j) x[j] *= s;
}

void GeluForwardRow(float* out, const float* inp, int64_t n) {
#if MESHRUN_SIMD_X86
  if (HasAvx512()) return GeluForwardAvx512(out, inp, n);
  if (HasAvx2()) return GeluForwardAvx2(out, inp, n);
#endif
  GeluForwardScalar(out, inp, n);
}

void GeluBackwardRow(float* dinp, const float* inp, const float* dout, int64_t n, bool accumulate) {
#if MESHRUN_SIMD_X86
  if (HasAvx512()) return GeluBackwardAvx512(dinp, inp, dout, n, accumulate);
  if (HasAvx2()) return GeluBackwardAvx2(dinp, inp, dout, n, accumulate);
#endif
  GeluBackwardScalar(dinp, inp, dout, n, accumulate);
}

}  // namespace meshrun::cpu::simd
