// engine/ops/ops.h's memory, precision and conversion functions; the ops of the op table are
// dispatched in engine/ops/dispatch.cc.
#include "engine/ops/ops.h"

#include <array>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "engine/ops/ops_internal.h"

#if MESHRUN_WITH_CUDA
#include <cuda_runtime_api.h>

#include "engine/cuda/check.h"
#include "engine/cuda/context.h"
#include "engine/cuda/kernels.h"
#endif

namespace meshrun::ops {
namespace internal {

#if MESHRUN_WITH_CUDA
// One context (stream, cuBLASLt handle) per device, for the life of the process.
StatusOr<gpu::CudaContext*> ContextOf(Device dev) {
  static std::mutex mu;
  static std::map<int, std::unique_ptr<gpu::CudaContext>>* contexts =
      new std::map<int, std::unique_ptr<gpu::CudaContext>>();
  std::lock_guard<std::mutex> lock(mu);
  auto it = contexts->find(dev.index);
  if (it != contexts->end()) return it->second.get();
  MESHRUN_ASSIGN_OR_RETURN(std::unique_ptr<gpu::CudaContext> ctx,
                           gpu::CudaContext::Create(dev.index));
  gpu::CudaContext* raw = ctx.get();
  contexts->emplace(dev.index, std::move(ctx));
  return raw;
}
#else
Status NotBuilt(const char* op) {
  return UnavailableError(std::string("ops::") + op +
                          ": device cuda is not built into this engine (hint: configure with "
                          "-DMESHRUN_WITH_CUDA=ON on a machine with the CUDA toolkit)");
}
#endif

}  // namespace internal

#if MESHRUN_WITH_CUDA
using internal::ContextOf;
#else
using internal::NotBuilt;
#endif

bool CudaBuilt() {
#if MESHRUN_WITH_CUDA
  return true;
#else
  return false;
#endif
}

Status CopyFromHost(Device dev, void* dst, const void* host_src, size_t bytes) {
  if (dev.type == DeviceType::kCount) return OkStatus();
  if (dev.type == DeviceType::kCpu) {
    if (bytes > 0) std::memcpy(dst, host_src, bytes);
    return OkStatus();
  }
#if MESHRUN_WITH_CUDA
  if (bytes == 0) return OkStatus();
  MESHRUN_ASSIGN_OR_RETURN(gpu::CudaContext * ctx, ContextOf(dev));
  ctx->InvalidateWeights();
  // On the compute stream, then wait: the host buffer may change once this returns, and no
  // kernel may read dst before the copy lands (no legacy-stream copy racing the stream).
  MESHRUN_GPU_TRY(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, ctx->stream()));
  return ctx->Synchronize();
#else
  return NotBuilt("CopyFromHost");
#endif
}

Status CopyToHost(Device dev, void* host_dst, const void* src, size_t bytes) {
  if (dev.type == DeviceType::kCount) {
    // What a counting run reads back (losses, norms) reads as zeros.
    if (bytes > 0) std::memset(host_dst, 0, bytes);
    return OkStatus();
  }
  if (dev.type == DeviceType::kCpu) {
    if (bytes > 0) std::memcpy(host_dst, src, bytes);
    return OkStatus();
  }
#if MESHRUN_WITH_CUDA
  if (bytes == 0) return OkStatus();
  MESHRUN_ASSIGN_OR_RETURN(gpu::CudaContext * ctx, ContextOf(dev));
  MESHRUN_GPU_TRY(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, ctx->stream()));
  return ctx->Synchronize();
#else
  return NotBuilt("CopyToHost");
#endif
}

Status Copy(Device dev, void* dst, const void* src, size_t bytes) {
  if (dev.type == DeviceType::kCount) return OkStatus();
  if (dev.type == DeviceType::kCpu) {
    if (bytes > 0) std::memmove(dst, src, bytes);
    return OkStatus();
  }
#if MESHRUN_WITH_CUDA
  if (bytes == 0) return OkStatus();
  MESHRUN_ASSIGN_OR_RETURN(gpu::CudaContext * ctx, ContextOf(dev));
  ctx->InvalidateWeights();
  MESHRUN_GPU_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ctx->stream()));
  return OkStatus();
#else
  return NotBuilt("Copy");
#endif
}

Status Zero(Device dev, void* dst, size_t bytes) {
  if (dev.type == DeviceType::kCount) return OkStatus();
  if (dev.type == DeviceType::kCpu) {
    if (bytes > 0) std::memset(dst, 0, bytes);
    return OkStatus();
  }
#if MESHRUN_WITH_CUDA
  if (bytes == 0) return OkStatus();
  MESHRUN_ASSIGN_OR_RETURN(gpu::CudaContext * ctx, ContextOf(dev));
  ctx->InvalidateWeights();
  MESHRUN_GPU_TRY(cudaMemsetAsync(dst, 0, bytes, ctx->stream()));
  return OkStatus();
#else
  return NotBuilt("Zero");
#endif
}

Status Synchronize(Device dev) {
  if (dev.type == DeviceType::kCpu || dev.type == DeviceType::kCount) return OkStatus();
#if MESHRUN_WITH_CUDA
  MESHRUN_ASSIGN_OR_RETURN(gpu::CudaContext * ctx, ContextOf(dev));
  return ctx->Synchronize();
#else
  return NotBuilt("Synchronize");
#endif
}

StatusOr<void*> ComputeStreamOf(Device dev) {
  if (dev.type == DeviceType::kCpu || dev.type == DeviceType::kCount) {
    return static_cast<void*>(nullptr);
  }
#if MESHRUN_WITH_CUDA
  MESHRUN_ASSIGN_OR_RETURN(gpu::CudaContext * ctx, ContextOf(dev));
  return static_cast<void*>(ctx->stream());
#else
  return NotBuilt("ComputeStreamOf");
#endif
}

namespace {

// The devices whose GEMMs run in bf16 (SetMatmulPrecision), by cuda device index.
std::array<std::atomic<bool>, 64>& MixedDevices() {
  static std::array<std::atomic<bool>, 64> mixed{};
  return mixed;
}

bool Mixed(Device dev) {
  return dev.type == DeviceType::kCuda && dev.index >= 0 && dev.index < 64 &&
         MixedDevices()[static_cast<size_t>(dev.index)].load(std::memory_order_relaxed);
}

uint16_t FloatToBf16Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

float Bf16BitsToFloat(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

}  // namespace

Status SetMatmulPrecision(Device dev, MatmulPrecision precision) {
  const bool bf16 = precision == MatmulPrecision::kBf16;
  if (dev.type == DeviceType::kCount) return OkStatus();
  if (dev.type == DeviceType::kCpu) {
    if (!bf16) return OkStatus();
    return InvalidArgumentError(
        "ops::SetMatmulPrecision: bf16 GEMMs run on cuda only; the CPU kernels compute in "
        "float32 (hint: use precision fp32 on cpu)");
  }
  if (dev.index < 0 || dev.index >= 64) {
    return InvalidArgumentError("ops::SetMatmulPrecision: cuda device index " +
                                std::to_string(dev.index) + " is out of range [0, 64)");
  }
  MixedDevices()[static_cast<size_t>(dev.index)].store(bf16, std::memory_order_relaxed);
  return OkStatus();
}

void ParametersChanged(Device dev) {
#if MESHRUN_WITH_CUDA
  if (dev.type != DeviceType::kCuda) return;
  StatusOr<gpu::CudaContext*> ctx = ContextOf(dev);
  if (ctx.ok()) (*ctx)->InvalidateWeights();
#else
  (void)dev;
#endif
}

MatmulPrecision MatmulPrecisionOf(Device dev) {
  return Mixed(dev) ? MatmulPrecision::kBf16 : MatmulPrecision::kFloat32;
}

Status CastToBf16(Device dev, uint16_t* dst, const float* src, int64_t n) {
  if (n <= 0 || dev.type == DeviceType::kCount) return OkStatus();
  if (dev.type == DeviceType::kCpu) {
    for (int64_t i = 0; i < n; ++i) dst[i] = FloatToBf16Bits(src[i]);
    return OkStatus();
  }
#if MESHRUN_WITH_CUDA
  MESHRUN_ASSIGN_OR_RETURN(gpu::CudaContext * ctx, ContextOf(dev));
  return gpu::Convert(*ctx, reinterpret_cast<gpu::bf16*>(dst), src, n);
#else
  return NotBuilt("CastToBf16");
#endif
}

Status CastFromBf16(Device dev, float* dst, const uint16_t* src, int64_t n) {
  if (n <= 0 || dev.type == DeviceType::kCount) return OkStatus();
  if (dev.type == DeviceType::kCpu) {
    for (int64_t i = 0; i < n; ++i) dst[i] = Bf16BitsToFloat(src[i]);
    return OkStatus();
  }
#if MESHRUN_WITH_CUDA
  MESHRUN_ASSIGN_OR_RETURN(gpu::CudaContext * ctx, ContextOf(dev));
  ctx->InvalidateWeights();
  return gpu::Convert(*ctx, dst, reinterpret_cast<const gpu::bf16*>(src), n);
#else
  return NotBuilt("CastFromBf16");
#endif
}

}  // namespace meshrun::ops
