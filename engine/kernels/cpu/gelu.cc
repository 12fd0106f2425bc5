// tanh-GELU (HF "gelu_new"), forward and backward. float runs simd.h's row loops (AVX2 when the
// CPU has it); double, the tests' reference precision, runs std::tanh.
#include <algorithm>
#include <cmath>

#include "engine/kernels/cpu/kernel_internal.h"
#include "engine/kernels/cpu/kernels.h"
#include "engine/kernels/cpu/simd.h"

namespace meshrun::cpu {
namespace {

constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kCubic = 0.044715;
// Elements per task of the float path: a multiple of 16 lanes, large enough to amortise the
// schedule, small enough that dynamic hand-out balances threads on a loaded machine.
constexpr int64_t kChunk = 16384;

}  // namespace

template <typename T>
void GeluForward(T* out, const T* inp, int64_t n) {
  if constexpr (sizeof(T) == sizeof(float)) {
    const int64_t n_chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(dynamic, 1) if (internal::WorthParallel(n))
    for (int64_t c = 0; c < n_chunks; ++c) {
      const int64_t i0 = c * kChunk;
      simd::GeluForwardRow(out + i0, inp + i0, std::min(kChunk, n - i0));
    }
  } else {
    const T k = static_cast<T>(kSqrt2OverPi);
    const T a = static_cast<T>(kCubic);
#pragma omp parallel for simd schedule(static) if (internal::WorthParallel(n))
    for (int64_t i = 0; i < n; ++i) {
      const T x = inp[i];
      const T t = std::tanh(k * (x + a * x * x * x));
      out[i] = T(0.5) * x * (T(1) + t);
    }
  }
}

template <typename T>
void GeluBackward(T* dinp, const T* inp, const T* dout, int64_t n, bool accumulate) {
  if constexpr (sizeof(T) == sizeof(float)) {
    const int64_t n_chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(dynamic, 1) if (internal::WorthParallel(n))
    for (int64_t c = 0; c < n_chunks; ++c) {
      const int64_t i0 = c * kChunk;
      simd::GeluBackwardRow(dinp + i0, inp + i0, dout + i0, std::min(kChunk, n - i0), accumulate);
    }
  } else {
    const T k = static_cast<T>(kSqrt2OverPi);
    const T a = static_cast<T>(kCubic);
#pragma omp parallel for simd schedule(static) if (internal::WorthParallel(n))
    for (int64_t i = 0; i < n; ++i) {
      const T x = inp[i];
      const T t = std::tanh(k * (x + a * x * x * x));
      const T dudx = k * (T(1) + T(3) * a * x * x);
      const T grad = T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * dudx;
      dinp[i] = accumulate ? dinp[i] + grad * dout[i] : grad * dout[i];
    }
  }
}

MESHRUN_INSTANTIATE_CPU_KERNELS(GeluForward, GeluBackward)

}  // namespace meshrun::cpu
