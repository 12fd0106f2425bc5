// Error conversion for CUDA runtime and cuBLAS results, and the process's first GPU error.
#include "engine/cuda/check.h"

#include <mutex>
#include <string>

namespace meshrun::gpu {
namespace {

std::mutex& ErrorMutex() {
  static std::mutex* mu = new std::mutex();  // never destroyed: used from exit paths
  return *mu;
}

Status& FirstError() {
  static Status* first = new Status();
  return *first;
}

std::string Where(const char* expr, const char* file, int line) {
  return std::string(expr) + " failed at " + file + ":" + std::to_string(line) + ": ";
}

const char* CublasStatusName(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_<unknown>";
}

}  // namespace

Status ToStatus(cudaError_t result, const char* expr, const char* file, int line) {
  if (result == cudaSuccess) return OkStatus();
  StatusCode code = StatusCode::kInternal;
  std::string hint;
  switch (result) {
    case cudaErrorMemoryAllocation:
      code = StatusCode::kResourceExhausted;
      hint = " (hint: lower micro_batch_size or seq_len)";
      break;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
      code = StatusCode::kUnavailable;
      hint = " (hint: check nvidia-smi and CUDA_VISIBLE_DEVICES)";
      break;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidConfiguration: code = StatusCode::kInvalidArgument; break;
    default: break;
  }
  Status s(code, Where(expr, file, line) + cudaGetErrorName(result) + " (" +
                     cudaGetErrorString(result) + ")" + hint);
  RecordGpuError(s);
  return s;
}

Status ToStatus(cublasStatus_t result, const char* expr, const char* file, int line) {
  if (result == CUBLAS_STATUS_SUCCESS) return OkStatus();
  StatusCode code = StatusCode::kInternal;
  if (result == CUBLAS_STATUS_ALLOC_FAILED) code = StatusCode::kResourceExhausted;
  if (result == CUBLAS_STATUS_INVALID_VALUE || result == CUBLAS_STATUS_NOT_SUPPORTED) {
    code = StatusCode::kInvalidArgument;
  }
  Status s(code, Where(expr, file, line) + CublasStatusName(result));
  RecordGpuError(s);
  return s;
}

Status FirstGpuError() {
  std::lock_guard<std::mutex> lock(ErrorMutex());
  return FirstError();
}

void RecordGpuError(const Status& status) {
  if (status.ok()) return;
  std::lock_guard<std::mutex> lock(ErrorMutex());
  if (FirstError().ok()) FirstError() = status;
}

void ClearFirstGpuError() {
  std::lock_guard<std::mutex> lock(ErrorMutex());
  FirstError() = OkStatus();
}

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the non-sticky error so later calls start clean
    return 0;
  }
  return n;
}

}  // namespace meshrun::gpu
