// One device's execution context: the compute stream every kernel runs on, the cuBLASLt handle
// and workspace, a grow-only scratch buffer for the kernels' partial sums, and the cache of
// GEMM algorithms picked by the cuBLASLt heuristic.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>

#include "common/status.h"
#include "engine/core/cuda_allocator.h"

namespace meshrun::gpu {

// Owns its stream, cuBLASLt handle and buffers; memory comes from CudaAllocator(device).
// Not thread-safe: one thread (the rank's training thread) issues its work. Kernels of
// engine/cuda/kernels.h take it as their first argument and enqueue on stream().
class CudaContext {
 public:
  // Makes `device` current on the calling thread. UNAVAILABLE when there is no such device.
  static StatusOr<std::unique_ptr<CudaContext>> Create(int device = 0);
  ~CudaContext();
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  cublasLtHandle_t lt() const { return lt_; }
  void* lt_workspace() const { return lt_workspace_.get(); }
  size_t lt_workspace_bytes() const { return lt_workspace_.bytes(); }
  CachingDeviceAllocator& allocator() const { return *allocator_; }
  const cudaDeviceProp& properties() const { return props_; }

  // A device buffer of at least `bytes`, valid until the next Scratch call. Kernels use it for
  // partial sums within one call; stream order keeps consecutive users apart.
  StatusOr<void*> Scratch(size_t bytes);
  // A second grow-only buffer, for the bf16 copies of a mixed-precision GEMM's operands
  // (engine/ops): valid until the next MixedScratch call; kernels' Scratch does not touch it.
  StatusOr<void*> MixedScratch(size_t bytes);

  // The bf16 copy of the weight the last mixed-precision GEMM read (engine/ops): reused while
  // the same float32 weight (pointer and size) comes back and weights_generation() has not
  // moved; ops that may write parameters (copies, fills, AdamW, the gathers' widening) and
  // ShardedState's gathers call InvalidateWeights().
  struct MixedWeightCache {
    const void* source = nullptr;
    int64_t numel = 0;
    uint64_t generation = 0;
    DeviceBuffer bf16;
  };
  MixedWeightCache& mixed_weight_cache() { return mixed_weight_cache_; }
  uint64_t weights_generation() const { return weights_generation_; }
  void InvalidateWeights() { ++weights_generation_; }

  // Waits for everything enqueued on stream().
  Status Synchronize();

  // GEMM plans keyed by shape, layouts and types (engine/cuda/matmul.cu).
  using GemmKey = std::array<int64_t, 14>;
  std::map<GemmKey, cublasLtMatmulAlgo_t>& gemm_plans() { return gemm_plans_; }

 private:
  CudaContext() = default;

  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  CachingDeviceAllocator* allocator_ = nullptr;
  cudaDeviceProp props_{};
  DeviceBuffer lt_workspace_;
  DeviceBuffer scratch_;
  DeviceBuffer mixed_scratch_;
  MixedWeightCache mixed_weight_cache_;
  uint64_t weights_generation_ = 1;  // the cache's 0 never matches
  std::map<GemmKey, cublasLtMatmulAlgo_t> gemm_plans_;
};

}  // namespace meshrun::gpu
