// cuBLASLt is loaded on first use, not at start-up (engine/cuda/cublaslt_loader.h): no GPU needed.
// A process that links the CUDA path has no libcublasLt mapped until a forwarded function runs;
// then the library is found, every forwarded function resolves, and host-side descriptor calls
// reach it. Runs in CI (label unit); a plain main, as the GPU machine has no GoogleTest.
#include "engine/cuda/cublaslt_loader.h"

#include <cublasLt.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

namespace {

bool Mapped(const char* library) {
  std::ifstream maps("/proc/self/maps");
  std::stringstream text;
  text << maps.rdbuf();
  return text.str().find(library) != std::string::npos;
}

int failures = 0;

void Expect(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) ++failures;
}

}  // namespace

int main() {
  Expect(!Mapped("libcublasLt"), "libcublasLt is not mapped at start-up");
  cublasLtMatmulPreference_t pref = nullptr;
  const cublasStatus_t created = cublasLtMatmulPreferenceCreate(&pref);
  const std::string error = meshrun::gpu::CublasLtLoadError();
  Expect(error.empty(), "cuBLASLt loads on first use" + (error.empty() ? "" : ": " + error));
  Expect(Mapped("libcublasLt"), "libcublasLt is mapped after the first call");
  Expect(created == CUBLAS_STATUS_SUCCESS && pref != nullptr,
         "cublasLtMatmulPreferenceCreate reaches the library (status " +
             std::to_string(static_cast<int>(created)) + ")");
  if (pref != nullptr) {
    Expect(cublasLtMatmulPreferenceDestroy(pref) == CUBLAS_STATUS_SUCCESS,
           "cublasLtMatmulPreferenceDestroy");
  }
  cublasLtMatrixLayout_t layout = nullptr;
  Expect(cublasLtMatrixLayoutCreate(&layout, CUDA_R_32F, 64, 32, 64) == CUBLAS_STATUS_SUCCESS &&
             layout != nullptr,
         "cublasLtMatrixLayoutCreate");
  if (layout != nullptr) {
    Expect(cublasLtMatrixLayoutDestroy(layout) == CUBLAS_STATUS_SUCCESS,
           "cublasLtMatrixLayoutDestroy");
  }
  std::string missing;
  for (const std::string& name : meshrun::gpu::CublasLtUnresolved()) missing += " " + name;
  Expect(missing.empty(), "every forwarded function resolves" +
                              (missing.empty() ? "" : std::string(": missing") + missing));
  return failures == 0 ? 0 : 1;
}
