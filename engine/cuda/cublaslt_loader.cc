// See cublaslt_loader.h: the cublasLt* entry points the engine uses, forwarding to the library
// loaded on first use. A missing library or symbol reads as CUBLAS_STATUS_NOT_INITIALIZED, and
// CudaContext::Create's error then carries CublasLtLoadError().
#include "engine/cuda/cublaslt_loader.h"

#include <cublasLt.h>
#include <dlfcn.h>

#include <mutex>

#ifndef MESHRUN_CUDA_LIBRARY_DIR  // set by engine/cuda/CMakeLists.txt from the toolkit found
#define MESHRUN_CUDA_LIBRARY_DIR "/usr/local/cuda/lib64"
#endif

namespace meshrun::gpu {
namespace {

struct Library {
  void* handle = nullptr;
  std::string error;
};

Library& Loaded() {
  static Library lib;
  static std::once_flag once;
  std::call_once(once, [] {
    // The soname of the headers this was compiled with, then the unversioned name, then the
    // toolkit's own folder (for a binary run outside the build tree's run path).
    const std::string soname = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
    for (const std::string& name : {soname, std::string("libcublasLt.so"),
                                    std::string(MESHRUN_CUDA_LIBRARY_DIR) + "/" + soname}) {
      lib.handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (lib.handle != nullptr) break;
      const char* why = dlerror();
      lib.error += (lib.error.empty() ? "" : "; ") + std::string(why != nullptr ? why : name);
    }
    if (lib.handle != nullptr) lib.error.clear();
  });
  return lib;
}

void* Resolve(const char* symbol) {
  Library& lib = Loaded();
  if (lib.handle == nullptr) return nullptr;
  void* fn = dlsym(lib.handle, symbol);
  if (fn == nullptr) {
    static std::mutex mu;
    std::lock_guard<std::mutex> lock(mu);
    const char* why = dlerror();
    lib.error = "dlsym " + std::string(symbol) + ": " + (why != nullptr ? why : "not found");
  }
  return fn;
}

}  // namespace

std::string CublasLtLoadError() {
  return Loaded().error;
}

std::vector<std::string> CublasLtUnresolved() {
  // The names forwarded below, one per MESHRUN_LT_FORWARD.
  static const char* const kForwarded[] = {
      "cublasLtCreate",
      "cublasLtDestroy",
      "cublasLtMatmul",
      "cublasLtMatmulAlgoGetHeuristic",
      "cublasLtMatmulDescCreate",
      "cublasLtMatmulDescDestroy",
      "cublasLtMatmulDescSetAttribute",
      "cublasLtMatmulPreferenceCreate",
      "cublasLtMatmulPreferenceDestroy",
      "cublasLtMatmulPreferenceSetAttribute",
      "cublasLtMatrixLayoutCreate",
      "cublasLtMatrixLayoutDestroy",
  };
  std::vector<std::string> missing;
  Library& lib = Loaded();
  for (const char* name : kForwarded) {
    if (lib.handle == nullptr || dlsym(lib.handle, name) == nullptr) missing.push_back(name);
  }
  return missing;
}

}  // namespace meshrun::gpu

// Each forwarder: the library's function of the same name, resolved once.
#define MESHRUN_LT_FORWARD(name, params, args)                               \
  extern "C" cublasStatus_t CUBLASWINAPI name params {                       \
    using Fn = decltype(&name);                                              \
    static const Fn fn = reinterpret_cast<Fn>(meshrun::gpu::Resolve(#name)); \
    if (fn == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;                 \
    return fn args;                                                          \
  }

MESHRUN_LT_FORWARD(cublasLtCreate, (cublasLtHandle_t * handle), (handle))
MESHRUN_LT_FORWARD(cublasLtDestroy, (cublasLtHandle_t handle), (handle))
MESHRUN_LT_FORWARD(cublasLtMatmul,
                   (cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha,
                    const void* A, cublasLtMatrixLayout_t Adesc, const void* B,
                    cublasLtMatrixLayout_t Bdesc, const void* beta, const void* C,
                    cublasLtMatrixLayout_t Cdesc, void* D, cublasLtMatrixLayout_t Ddesc,
                    const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes,
                    cudaStream_t stream),
                   (handle, desc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo,
                    workspace, workspace_bytes, stream))
MESHRUN_LT_FORWARD(cublasLtMatmulAlgoGetHeuristic,
                   (cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                    cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                    cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                    cublasLtMatmulPreference_t preference, int requested,
                    cublasLtMatmulHeuristicResult_t results[], int* returned),
                   (handle, desc, Adesc, Bdesc, Cdesc, Ddesc, preference, requested, results,
                    returned))
MESHRUN_LT_FORWARD(cublasLtMatmulDescCreate,
                   (cublasLtMatmulDesc_t * desc, cublasComputeType_t compute, cudaDataType_t scale),
                   (desc, compute, scale))
MESHRUN_LT_FORWARD(cublasLtMatmulDescDestroy, (cublasLtMatmulDesc_t desc), (desc))
MESHRUN_LT_FORWARD(cublasLtMatmulDescSetAttribute,
                   (cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const void* buf,
                    size_t bytes),
                   (desc, attr, buf, bytes))
MESHRUN_LT_FORWARD(cublasLtMatmulPreferenceCreate, (cublasLtMatmulPreference_t * pref), (pref))
MESHRUN_LT_FORWARD(cublasLtMatmulPreferenceDestroy, (cublasLtMatmulPreference_t pref), (pref))
MESHRUN_LT_FORWARD(cublasLtMatmulPreferenceSetAttribute,
                   (cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr,
                    const void* buf, size_t bytes),
                   (pref, attr, buf, bytes))
MESHRUN_LT_FORWARD(cublasLtMatrixLayoutCreate,
                   (cublasLtMatrixLayout_t * layout, cudaDataType type, uint64_t rows,
                    uint64_t cols, int64_t ld),
                   (layout, type, rows, cols, ld))
MESHRUN_LT_FORWARD(cublasLtMatrixLayoutDestroy, (cublasLtMatrixLayout_t layout), (layout))
