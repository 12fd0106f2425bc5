// A tiny self-contained test harness for tests/gpu (the GPU machine has no GoogleTest): GPU_TEST
// registers a test, EXPECT_* / ASSERT_OK record failures with file:line, and RunAllGpuTests skips
// everything with "skipped: no CUDA device (cudaGetDeviceCount: <cudaGetErrorName>)" when
// cudaGetDeviceCount reports none, exiting
// MESHRUN_TEST_SKIP_CODE so that ctest (SKIP_RETURN_CODE) reports the test as skipped.
// Also: device array helpers and a normalised array comparison with tolerances per precision.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/status.h"
#include "engine/cuda/check.h"

// CMake passes the skip code of cmake/MeshrunHelpers.cmake; scripts/gpu-check's direct nvcc
// build does not, and gets the same value here.
#ifndef MESHRUN_TEST_SKIP_CODE
#define MESHRUN_TEST_SKIP_CODE 77
#endif

namespace meshrun::gputest {

struct TestCase {
  const char* name;
  void (*fn)();
};

inline std::vector<TestCase>& Registry() {
  static std::vector<TestCase> tests;
  return tests;
}

inline int& CurrentFailures() {
  static int failures = 0;
  return failures;
}

struct Registrar {
  Registrar(const char* name, void (*fn)()) { Registry().push_back({name, fn}); }
};

inline void Fail(const char* file, int line, const std::string& what) {
  std::printf("  %s:%d: failure: %s\n", file, line, what.c_str());
  std::fflush(stdout);
  ++CurrentFailures();
}

// Runs the registered tests whose name contains argv[1] (all without an argument).
inline int RunAllGpuTests(int argc, char** argv) {
  // Why there is no device, by the runtime's own name for it (cudaErrorNoDevice,
  // cudaErrorInsufficientDriver, ...), so a skip on a GPU machine is told apart from CI's.
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    (void)cudaGetLastError();
    std::printf("skipped: no CUDA device (cudaGetDeviceCount: %s; %zu tests not run)\n",
                e != cudaSuccess ? cudaGetErrorName(e) : "0 devices", Registry().size());
    return MESHRUN_TEST_SKIP_CODE;
  }
  cudaDeviceProp prop{};
  (void)cudaGetDeviceProperties(&prop, 0);
  std::printf("device 0: %s (sm_%d%d, %.1f GiB)\n", prop.name, prop.major, prop.minor,
              static_cast<double>(prop.totalGlobalMem) / (1 << 30));
  const std::string filter = argc > 1 ? argv[1] : "";
  int failed = 0, run = 0;
  for (const TestCase& t : Registry()) {
    if (!filter.empty() && std::string(t.name).find(filter) == std::string::npos) continue;
    ++run;
    std::printf("[ RUN      ] %s\n", t.name);
    std::fflush(stdout);
    CurrentFailures() = 0;
    const auto start = std::chrono::steady_clock::now();
    t.fn();
    const cudaError_t sticky = cudaDeviceSynchronize();
    if (sticky != cudaSuccess) {
      Fail(__FILE__, __LINE__,
           std::string("CUDA error after the test: ") + cudaGetErrorString(sticky));
    }
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (CurrentFailures() == 0) {
      std::printf("[       OK ] %s (%.0f ms)\n", t.name, ms);
    } else {
      std::printf("[  FAILED  ] %s (%.0f ms, %d failures)\n", t.name, ms, CurrentFailures());
      ++failed;
    }
    std::fflush(stdout);
    if (sticky != cudaSuccess) break;  // the context is unusable: later tests would only cascade
  }
  std::printf("%d tests, %d passed, %d failed\n", run, run - failed, failed);
  const Status first = gpu::FirstGpuError();
  if (!first.ok()) std::printf("first GPU error: %s\n", first.ToString().c_str());
  return failed == 0 ? 0 : 1;
}

// Normalised max error: max|got − want| / max(max|want|, floor). Fails (with the worst index)
// above tol, on any NaN/inf mismatch, or on a size mismatch. ±inf must match exactly.
inline bool ExpectClose(const char* file, int line, const std::string& what,
                        const std::vector<float>& got, const std::vector<float>& want, double tol,
                        double floor = 1e-6) {
  if (got.size() != want.size()) {
    Fail(file, line,
         what + ": size " + std::to_string(got.size()) + " vs " + std::to_string(want.size()));
    return false;
  }
  double max_ref = floor, max_err = 0;
  size_t worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isinf(want[i]) || std::isinf(got[i])) {
      if (got[i] != want[i]) {
        Fail(file, line,
             what + ": [" + std::to_string(i) + "] got " + std::to_string(got[i]) + ", want " +
                 std::to_string(want[i]));
        return false;
      }
      continue;
    }
    if (std::isnan(got[i]) || std::isnan(want[i])) {
      Fail(file, line, what + ": NaN at [" + std::to_string(i) + "]");
      return false;
    }
    max_ref = std::max(max_ref, static_cast<double>(std::fabs(want[i])));
  }
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isinf(want[i])) continue;
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (err > max_err) {
      max_err = err;
      worst = i;
    }
  }
  const double rel = max_err / max_ref;
  if (rel > tol) {
    Fail(file, line,
         what + ": normalised error " + std::to_string(rel) + " > " + std::to_string(tol) +
             " (worst [" + std::to_string(worst) + "] got " + std::to_string(got[worst]) +
             ", want " + std::to_string(want[worst]) + ", max|want| " + std::to_string(max_ref) +
             ")");
    return false;
  }
  return true;
}

// Host-side element conversion for float and bf16.
template <typename T>
inline T FromF(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    return __float2bfloat16_rn(x);
  }
}
template <typename T>
inline float ToF(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    return __bfloat162float(x);
  }
}

// Rounds every value to what T can hold (so CPU and GPU see identical inputs).
template <typename T>
inline std::vector<float> RoundTo(std::vector<float> v) {
  for (float& x : v) x = ToF<T>(FromF<T>(x));
  return v;
}

// A device array owned by the test (plain cudaMalloc: independent of the allocator under test).
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(size_t n) : n_(n) {
    if (cudaMalloc(reinterpret_cast<void**>(&ptr_), sizeof(T) * (n == 0 ? 1 : n)) != cudaSuccess)
      ptr_ = nullptr;
  }
  // From floats, converted to T.
  static DeviceArray FromHost(const std::vector<float>& host) {
    DeviceArray a(host.size());
    a.Upload(host);
    return a;
  }
  static DeviceArray FromRaw(const std::vector<T>& host) {
    DeviceArray a(host.size());
    if (!host.empty()) {
      cudaMemcpy(a.ptr_, host.data(), sizeof(T) * host.size(), cudaMemcpyHostToDevice);
      cudaDeviceSynchronize();  // see Upload
    }
    return a;
  }
  ~DeviceArray() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceArray(DeviceArray&& o) noexcept : ptr_(o.ptr_), n_(o.n_) {
    o.ptr_ = nullptr;
    o.n_ = 0;
  }
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(n_, o.n_);
    return *this;
  }

  void Upload(const std::vector<float>& host) {
    std::vector<T> tmp(host.size());
    for (size_t i = 0; i < host.size(); ++i) tmp[i] = FromF<T>(host[i]);
    if (tmp.empty()) return;
    cudaMemcpy(ptr_, tmp.data(), sizeof(T) * tmp.size(), cudaMemcpyHostToDevice);
    // From pageable memory the copy may return once staged, on the legacy stream that the
    // kernels' non-blocking stream does not wait for: wait until it has landed.
    cudaDeviceSynchronize();
  }
  std::vector<float> Download() const {
    cudaDeviceSynchronize();
    std::vector<T> tmp(n_);
    if (n_ > 0) cudaMemcpy(tmp.data(), ptr_, sizeof(T) * n_, cudaMemcpyDeviceToHost);
    std::vector<float> out(n_);
    for (size_t i = 0; i < n_; ++i) out[i] = ToF<T>(tmp[i]);
    return out;
  }
  T* get() const { return ptr_; }
  size_t size() const { return n_; }

 private:
  T* ptr_ = nullptr;
  size_t n_ = 0;
};

inline std::vector<float> RandomVector(std::mt19937& rng, size_t n, float lo = -1.0f,
                                       float hi = 1.0f) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

inline std::vector<int32_t> RandomInts(std::mt19937& rng, size_t n, int32_t lo, int32_t hi) {
  std::uniform_int_distribution<int32_t> u(lo, hi);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = u(rng);
  return v;
}

}  // namespace meshrun::gputest

#define GPU_TEST(name)                                                \
  static void name();                                                 \
  static ::meshrun::gputest::Registrar name##_registrar(#name, name); \
  static void name()

#define EXPECT_TRUE(cond)                                                                \
  do {                                                                                   \
    if (!(cond)) ::meshrun::gputest::Fail(__FILE__, __LINE__, "EXPECT_TRUE(" #cond ")"); \
  } while (0)

#define EXPECT_NEAR(a, b, tol)                                                                     \
  do {                                                                                             \
    const double _a = (a), _b = (b), _t = (tol);                                                   \
    if (!(std::fabs(_a - _b) <= _t)) {                                                             \
      ::meshrun::gputest::Fail(__FILE__, __LINE__,                                                 \
                               std::string("EXPECT_NEAR(" #a ", " #b "): ") + std::to_string(_a) + \
                                   " vs " + std::to_string(_b) + " (tolerance " +                  \
                                   std::to_string(_t) + ")");                                      \
    }                                                                                              \
  } while (0)

// In a test body (returns void): fails and leaves the test when `expr` is not OK.
#define ASSERT_OK(expr)                                                           \
  do {                                                                            \
    const ::meshrun::Status _s = (expr);                                          \
    if (!_s.ok()) {                                                               \
      ::meshrun::gputest::Fail(__FILE__, __LINE__, #expr " -> " + _s.ToString()); \
      return;                                                                     \
    }                                                                             \
  } while (0)

// In a test body: `lhs` = the value of a StatusOr, or fail and leave the test.
#define ASSERT_OK_AND_ASSIGN(lhs, expr) \
  ASSERT_OK_AND_ASSIGN_IMPL(MESHRUN_CONCAT(_gt_or_, __LINE__), lhs, expr)
#define ASSERT_OK_AND_ASSIGN_IMPL(tmp, lhs, expr)                                         \
  auto tmp = (expr);                                                                      \
  if (!tmp.ok()) {                                                                        \
    ::meshrun::gputest::Fail(__FILE__, __LINE__, #expr " -> " + tmp.status().ToString()); \
    return;                                                                               \
  }                                                                                       \
  lhs = std::move(tmp).value()

// EXPECT_CLOSE(what, got, want, tol): variadic so that a tolerance expression may hold commas.
#define EXPECT_CLOSE(what, got, want, ...) \
  ::meshrun::gputest::ExpectClose(__FILE__, __LINE__, what, got, want, __VA_ARGS__)

#define GPU_TEST_MAIN()                                    \
  int main(int argc, char** argv) {                        \
    return ::meshrun::gputest::RunAllGpuTests(argc, argv); \
  }
