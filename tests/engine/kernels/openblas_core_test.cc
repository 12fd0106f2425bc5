// OpenBLAS's core choice (decision 0041): an OpenBLAS that loaded with a core below this CPU's
// vector units (0.3.21 picks "Prescott", SSE3, on Sapphire Rapids models it does not know) is
// switched by the first Gemm to the core the CPU runs, and MESHRUN_NO_AVX512=1 gives the AVX2
// core on an AVX-512 CPU. OpenBLAS reads OPENBLAS_CORETYPE only when it loads, so each case runs
// in a child process that loads it as Prescott and then removes the variable before the first
// Gemm, as on a machine whose OpenBLAS does not know the CPU.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "engine/kernels/cpu/kernels.h"
#include "tests/engine/kernels/kernel_test_util.h"

namespace meshrun::cpu {
namespace {

constexpr char kChildVar[] = "MESHRUN_TEST_OPENBLAS_CHILD";  // the core the child expects

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
bool HasAvx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
bool HasAvx512() {  // what Gemm asks of a CPU before choosing OpenBLAS's SkylakeX core
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
}
#else
bool HasAvx2() {
  return false;
}
bool HasAvx512() {
  return false;
}
#endif

// Runs in the child only: OpenBLAS loaded as Prescott; the first Gemm must switch it.
TEST(KernelsOpenBlasCoreChild, SwitchesFromPrescott) {
  const char* want = std::getenv(kChildVar);
  // Only in the child of the test below (a skip would mark the whole ctest entry skipped).
  if (want == nullptr) return;
  ASSERT_STREQ(std::getenv("OPENBLAS_CORETYPE"), "Prescott");
  ::unsetenv("OPENBLAS_CORETYPE");
  const auto A = testing::Random(37 * 300, 1), B = testing::Random(300 * 71, 2);
  auto af = testing::Cast<float>(A), bf = testing::Cast<float>(B);
  std::vector<float> c1(37 * 71), c2(37 * 71);
  Gemm<float>(false, false, 37, 71, 300, 1.0f, af.data(), 300, bf.data(), 71, 0.0f, c1.data(), 71);
  const std::string backend = GemmBackend();
  EXPECT_EQ(backend.rfind(std::string("openblas (") + want + ", selected by meshrun", 0), 0)
      << backend;
  EXPECT_NE(backend.find("OpenBLAS chose Prescott"), std::string::npos) << backend;
  EXPECT_EQ(std::getenv("OPENBLAS_CORETYPE"), nullptr) << "the environment stays the user's";
  GemmFallback<float>(false, false, 37, 71, 300, 1.0f, af.data(), 300, bf.data(), 71, 0.0f,
                      c2.data(), 71);
  testing::ExpectClose(c1, c2, 2e-5, 0, backend);
}

void RunChild(const std::string& want, bool no512) {
  const char* old = std::getenv("MESHRUN_NO_AVX512");
  const std::string saved = old != nullptr ? old : "";
  ::setenv(kChildVar, want.c_str(), 1);
  ::setenv("OPENBLAS_CORETYPE", "Prescott", 1);
  if (no512)
    ::setenv("MESHRUN_NO_AVX512", "1", 1);
  else
    ::unsetenv("MESHRUN_NO_AVX512");
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const int rc = std::system(("'" + self +
                              "' --gtest_brief=1 "
                              "--gtest_filter=KernelsOpenBlasCoreChild.SwitchesFromPrescott")
                                 .c_str());
  ::unsetenv(kChildVar);
  ::unsetenv("OPENBLAS_CORETYPE");
  if (old != nullptr)
    ::setenv("MESHRUN_NO_AVX512", saved.c_str(), 1);
  else
    ::unsetenv("MESHRUN_NO_AVX512");
  EXPECT_EQ(rc, 0) << "child expecting " << want << (no512 ? " with MESHRUN_NO_AVX512=1" : "");
}

TEST(KernelsOpenBlasCore, PrescottIsReplacedByTheCpusCore) {
  const std::string backend = GemmBackend();
  if (backend.rfind("openblas", 0) != 0) GTEST_SKIP() << backend;
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) GTEST_SKIP() << "OPENBLAS_CORETYPE is set";
  if (!HasAvx2()) GTEST_SKIP() << "no AVX2 on this CPU";
  const bool avx512 = HasAvx512();
  RunChild(avx512 ? "SkylakeX" : "Haswell", false);
  if (avx512) RunChild("Haswell", true);
}

}  // namespace
}  // namespace meshrun::cpu
