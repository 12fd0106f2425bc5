// CudaContext: stream, cuBLASLt handle, workspace and scratch of one device.
#include "engine/cuda/context.h"

#include <string>

#include "engine/cuda/check.h"
#include "engine/cuda/cublaslt_loader.h"

namespace meshrun::gpu {
namespace {

// cuBLASLt's recommendation for Hopper is 32 MiB (llm.c uses the same).
constexpr size_t kLtWorkspaceBytes = size_t{32} << 20;

}  // namespace

StatusOr<std::unique_ptr<CudaContext>> CudaContext::Create(int device) {
  const int n = DeviceCount();
  if (device < 0 || device >= n) {
    return UnavailableError("cuda:" + std::to_string(device) + " does not exist (" +
                            std::to_string(n) +
                            " CUDA devices visible; hint: check nvidia-smi and "
                            "CUDA_VISIBLE_DEVICES, or run with resources.device: cpu)");
  }
  std::unique_ptr<CudaContext> ctx(new CudaContext());
  ctx->device_ = device;
  MESHRUN_GPU_TRY(cudaSetDevice(device));
  MESHRUN_GPU_TRY(cudaGetDeviceProperties(&ctx->props_, device));
  MESHRUN_GPU_TRY(cudaStreamCreateWithFlags(&ctx->stream_, cudaStreamNonBlocking));
  if (cublasLtCreate(&ctx->lt_) != CUBLAS_STATUS_SUCCESS && !CublasLtLoadError().empty()) {
    return UnavailableError("cuBLASLt could not be loaded: " + CublasLtLoadError() +
                            " (hint: install the CUDA toolkit's cuBLAS, or put its lib folder on "
                            "LD_LIBRARY_PATH)");
  }
  if (ctx->lt_ == nullptr) MESHRUN_GPU_TRY(cublasLtCreate(&ctx->lt_));
  ctx->allocator_ = &CudaAllocator(device);
  MESHRUN_ASSIGN_OR_RETURN(ctx->lt_workspace_,
                           DeviceBuffer::Allocate(*ctx->allocator_, kLtWorkspaceBytes));
  return ctx;
}

CudaContext::~CudaContext() {
  if (stream_ != nullptr) (void)cudaStreamSynchronize(stream_);
  lt_workspace_.Reset();
  scratch_.Reset();
  mixed_scratch_.Reset();
  mixed_weight_cache_.bf16.Reset();
  if (lt_ != nullptr) (void)cublasLtDestroy(lt_);
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
}

StatusOr<void*> CudaContext::Scratch(size_t bytes) {
  if (scratch_.bytes() < bytes) {
    scratch_.Reset();  // stream-ordered reuse: see CachingDeviceAllocator
    MESHRUN_ASSIGN_OR_RETURN(scratch_, DeviceBuffer::Allocate(*allocator_, bytes));
  }
  return scratch_.get();
}

StatusOr<void*> CudaContext::MixedScratch(size_t bytes) {
  if (mixed_scratch_.bytes() < bytes) {
    mixed_scratch_.Reset();
    MESHRUN_ASSIGN_OR_RETURN(mixed_scratch_, DeviceBuffer::Allocate(*allocator_, bytes));
  }
  return mixed_scratch_.get();
}

Status CudaContext::Synchronize() {
  MESHRUN_GPU_TRY(cudaStreamSynchronize(stream_));
  return OkStatus();
}

}  // namespace meshrun::gpu
