// The dispatch of engine/ops/ops.h: one branch per call on the device type.
#include "engine/ops/ops.h"

#include <array>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>

#include "engine/kernels/cpu/kernels.h"

#if MESHRUN_WITH_CUDA
#include <cuda_runtime_api.h>

#include "engine/cuda/check.h"
#include "engine/cuda/context.h"
#include "engine/cuda/kernels.h"
#endif

namespace meshrun::ops {
namespace {

[[maybe_unused]] Status OnlyFloat(const char* op) {
  return InvalidArgumentError(std::string("ops::") + op +
                              ": cuda runs float32 tensors only (hint: use GPT2<float>)");
}

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

}  // namespace

bool CudaBuilt() {
#if MESHRUN_WITH_CUDA
  return true;
#else
  return false;
#endif
}

// The cuda branch of a templated op: float only; `ctx` names the device's context in the call.
#if MESHRUN_WITH_CUDA
#define MESHRUN_CUDA_OP(name, ...)                                       \
  if constexpr (std::is_same_v<T, float>) {                              \
    MESHRUN_ASSIGN_OR_RETURN(gpu::CudaContext* ctx_ptr, ContextOf(dev)); \
    gpu::CudaContext& ctx = *ctx_ptr;                                    \
    return __VA_ARGS__;                                                  \
  } else {                                                               \
    return OnlyFloat(name);                                              \
  }
#else
#define MESHRUN_CUDA_OP(name, ...) return NotBuilt(name);
#endif

// The whole op: the cpu kernel call (void) or the cuda call (Status).
#define MESHRUN_OP(name, cpu_call, ...) \
  if (dev.type == DeviceType::kCpu) {   \
    cpu_call;                           \
    return OkStatus();                  \
  }                                     \
  MESHRUN_CUDA_OP(name, __VA_ARGS__)

Status CopyFromHost(Device dev, void* dst, const void* host_src, size_t bytes) {
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
  if (dev.type == DeviceType::kCpu) return OkStatus();
#if MESHRUN_WITH_CUDA
  MESHRUN_ASSIGN_OR_RETURN(gpu::CudaContext * ctx, ContextOf(dev));
  return ctx->Synchronize();
#else
  return NotBuilt("Synchronize");
#endif
}

StatusOr<void*> ComputeStreamOf(Device dev) {
  if (dev.type == DeviceType::kCpu) return static_cast<void*>(nullptr);
#if MESHRUN_WITH_CUDA
  MESHRUN_ASSIGN_OR_RETURN(gpu::CudaContext * ctx, ContextOf(dev));
  return static_cast<void*>(ctx->stream());
#else
  return NotBuilt("ComputeStreamOf");
#endif
}

template <typename T>
Status Fill(Device dev, T* dst, double value, int64_t n) {
  MESHRUN_OP("Fill", for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(value),
             (ctx.InvalidateWeights(), gpu::Fill(ctx, dst, static_cast<float>(value), n)))
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

#if MESHRUN_WITH_CUDA
// Elements of a bf16 operand, rounded up so the next operand stays 256-byte aligned.
int64_t Aligned(int64_t n) {
  return (n + 127) / 128 * 128;
}

// The bf16 copy of a weight: the context's cached one while it is still that weight's (the LM
// head's chunks read the same weight again and again), else a fresh cast into the cache.
StatusOr<const gpu::bf16*> Weight16(gpu::CudaContext& ctx, const float* weight, int64_t n) {
  gpu::CudaContext::MixedWeightCache& c = ctx.mixed_weight_cache();
  if (c.source == weight && c.numel == n && c.generation == ctx.weights_generation()) {
    return static_cast<const gpu::bf16*>(c.bf16.get());
  }
  const size_t bytes = sizeof(gpu::bf16) * static_cast<size_t>(n);
  if (c.bf16.bytes() < bytes) {
    c.bf16.Reset();  // stream-ordered reuse: see CachingDeviceAllocator
    MESHRUN_ASSIGN_OR_RETURN(c.bf16, gpu::DeviceBuffer::Allocate(ctx.allocator(), bytes));
  }
  c.source = nullptr;
  MESHRUN_RETURN_IF_ERROR(gpu::Convert(ctx, static_cast<gpu::bf16*>(c.bf16.get()), weight, n));
  c.source = weight;
  c.numel = n;
  c.generation = ctx.weights_generation();
  return static_cast<const gpu::bf16*>(c.bf16.get());
}

Status MixedForward(gpu::CudaContext& ctx, float* out, const float* inp, const float* weight,
                    const float* bias, int64_t N, int64_t C, int64_t OC) {
  if (N <= 0 || OC <= 0) return OkStatus();
  MESHRUN_ASSIGN_OR_RETURN(void* buf, ctx.MixedScratch(sizeof(gpu::bf16) * Aligned(N * C)));
  gpu::bf16* inp16 = static_cast<gpu::bf16*>(buf);
  MESHRUN_RETURN_IF_ERROR(gpu::Convert(ctx, inp16, inp, N * C));
  MESHRUN_ASSIGN_OR_RETURN(const gpu::bf16* w16, Weight16(ctx, weight, OC * C));
  const Status s = gpu::MatmulForwardMixed(ctx, out, inp16, w16, bias, N, C, OC);
  // cuBLASLt may have no bf16 algorithm for a layout (e.g. a leading dimension that is not a
  // multiple of 8 elements): that GEMM runs in float32 instead of failing the step.
  if (s.code() == StatusCode::kUnimplemented) {
    return gpu::MatmulForward(ctx, out, inp, weight, bias, N, C, OC);
  }
  return s;
}

Status MixedBackward(gpu::CudaContext& ctx, float* dinp, float* dweight, float* dbias,
                     const float* dout, const float* inp, const float* weight, int64_t N, int64_t C,
                     int64_t OC) {
  if (N <= 0 || OC <= 0 || C <= 0) return OkStatus();
  const int64_t d = Aligned(N * OC), a = Aligned(N * C);
  MESHRUN_ASSIGN_OR_RETURN(void* buf, ctx.MixedScratch(sizeof(gpu::bf16) * (d + a)));
  gpu::bf16* dout16 = static_cast<gpu::bf16*>(buf);
  gpu::bf16* inp16 = dout16 + d;
  const gpu::bf16* w16 = nullptr;
  MESHRUN_RETURN_IF_ERROR(gpu::Convert(ctx, dout16, dout, N * OC));
  if (dweight != nullptr) MESHRUN_RETURN_IF_ERROR(gpu::Convert(ctx, inp16, inp, N * C));
  if (dinp != nullptr) {
    MESHRUN_ASSIGN_OR_RETURN(w16, Weight16(ctx, weight, OC * C));
  }
  // Each GEMM on its own, with the float32 GEMM as the fallback where cuBLASLt has no bf16
  // algorithm for the layout (see MixedForward).
  if (dinp != nullptr) {
    const Status s = gpu::MatmulBackwardMixed(ctx, dinp, nullptr, dout16, inp16, w16, N, C, OC);
    if (s.code() == StatusCode::kUnimplemented) {
      MESHRUN_RETURN_IF_ERROR(
          gpu::MatmulBackward<float>(ctx, dinp, nullptr, nullptr, dout, inp, weight, N, C, OC));
    } else {
      MESHRUN_RETURN_IF_ERROR(s);
    }
  }
  if (dweight != nullptr) {
    const Status s = gpu::MatmulBackwardMixed(ctx, nullptr, dweight, dout16, inp16, w16, N, C, OC);
    if (s.code() == StatusCode::kUnimplemented) {
      MESHRUN_RETURN_IF_ERROR(
          gpu::MatmulBackward<float>(ctx, nullptr, dweight, nullptr, dout, inp, weight, N, C, OC));
    } else {
      MESHRUN_RETURN_IF_ERROR(s);
    }
  }
  if (dbias != nullptr) return gpu::ColumnSum(ctx, dbias, dout, N, OC, OC);
  return OkStatus();
}
#endif

}  // namespace

Status SetMatmulPrecision(Device dev, MatmulPrecision precision) {
  const bool bf16 = precision == MatmulPrecision::kBf16;
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
  if (n <= 0) return OkStatus();
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
  if (n <= 0) return OkStatus();
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

template <typename T>
Status MatmulForward(Device dev, T* out, const T* inp, const T* weight, const T* bias, int64_t N,
                     int64_t C, int64_t OC) {
#if MESHRUN_WITH_CUDA
  if constexpr (std::is_same_v<T, float>) {
    if (Mixed(dev)) {
      MESHRUN_ASSIGN_OR_RETURN(gpu::CudaContext * ctx, ContextOf(dev));
      return MixedForward(*ctx, out, inp, weight, bias, N, C, OC);
    }
  }
#endif
  MESHRUN_OP("MatmulForward", cpu::MatmulForward(out, inp, weight, bias, N, C, OC),
             gpu::MatmulForward(ctx, out, inp, weight, bias, N, C, OC))
}

template <typename T>
Status MatmulBackward(Device dev, T* dinp, T* dweight, T* dbias, const T* dout, const T* inp,
                      const T* weight, int64_t N, int64_t C, int64_t OC, bool accumulate_dinp) {
#if MESHRUN_WITH_CUDA
  if constexpr (std::is_same_v<T, float>) {
    if (Mixed(dev)) {
      MESHRUN_ASSIGN_OR_RETURN(gpu::CudaContext * ctx, ContextOf(dev));
      // The bf16 GEMM accumulates: an overwrite starts from zero.
      if (dinp != nullptr && !accumulate_dinp) {
        MESHRUN_RETURN_IF_ERROR(Zero(dev, dinp, sizeof(T) * N * C));
      }
      return MixedBackward(*ctx, dinp, dweight, dbias, dout, inp, weight, N, C, OC);
    }
  }
#endif
  MESHRUN_OP(
      "MatmulBackward",
      cpu::MatmulBackward(dinp, dweight, dbias, dout, inp, weight, N, C, OC, accumulate_dinp),
      gpu::MatmulBackward(ctx, dinp, dweight, dbias, dout, inp, weight, N, C, OC,
                          gpu::MatmulBackwardOptions{accumulate_dinp, 0}))
}

template <typename T>
Status AddBias(Device dev, T* out, const T* bias, int64_t N, int64_t C) {
  MESHRUN_OP("AddBias", cpu::AddBias(out, bias, N, C), gpu::AddBias(ctx, out, bias, N, C))
}

template <typename T>
Status BiasBackward(Device dev, T* dbias, const T* dout, int64_t N, int64_t C) {
  MESHRUN_OP("BiasBackward", cpu::BiasBackward(dbias, dout, N, C),
             gpu::ColumnSum(ctx, dbias, dout, N, C, C))
}

template <typename T>
Status LayerNormForward(Device dev, T* out, T* mean, T* rstd, const T* inp, const T* weight,
                        const T* bias, int64_t N, int64_t C, double eps) {
  MESHRUN_OP("LayerNormForward",
             cpu::LayerNormForward(out, mean, rstd, inp, weight, bias, N, C, eps),
             gpu::LayerNormForward(ctx, out, mean, rstd, inp, weight, bias, N, C, eps))
}

template <typename T>
Status LayerNormBackward(Device dev, T* dinp, T* dweight, T* dbias, const T* dout, const T* inp,
                         const T* weight, const T* mean, const T* rstd, int64_t N, int64_t C) {
  MESHRUN_OP("LayerNormBackward",
             cpu::LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C),
             gpu::LayerNormBackward(ctx, dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C))
}

template <typename T>
Status RMSNormForward(Device dev, T* out, T* rstd, const T* inp, const T* weight, int64_t N,
                      int64_t C, double eps) {
  MESHRUN_OP("RMSNormForward", cpu::RMSNormForward(out, rstd, inp, weight, N, C, eps),
             gpu::RMSNormForward(ctx, out, rstd, inp, weight, N, C, eps))
}

template <typename T>
Status RMSNormBackward(Device dev, T* dinp, T* dweight, const T* dout, const T* inp,
                       const T* weight, const T* rstd, int64_t N, int64_t C) {
  MESHRUN_OP("RMSNormBackward", cpu::RMSNormBackward(dinp, dweight, dout, inp, weight, rstd, N, C),
             gpu::RMSNormBackward(ctx, dinp, dweight, dout, inp, weight, rstd, N, C))
}

template <typename T>
Status GeluForward(Device dev, T* out, const T* inp, int64_t n) {
  MESHRUN_OP("GeluForward", cpu::GeluForward(out, inp, n), gpu::GeluForward(ctx, out, inp, n))
}

template <typename T>
Status GeluBackward(Device dev, T* dinp, const T* inp, const T* dout, int64_t n, bool accumulate) {
  MESHRUN_OP("GeluBackward", cpu::GeluBackward(dinp, inp, dout, n, accumulate),
             gpu::GeluBackward(ctx, dinp, inp, dout, n, accumulate))
}

template <typename T>
Status SwiGLUForward(Device dev, T* out, const T* gate_up, int64_t N, int64_t F) {
  MESHRUN_OP("SwiGLUForward", cpu::SwiGLUForward(out, gate_up, N, F),
             gpu::SwiGLUForward(ctx, out, gate_up, N, F))
}

template <typename T>
Status SwiGLUBackward(Device dev, T* dgate_up, const T* gate_up, const T* dout, int64_t N,
                      int64_t F) {
  MESHRUN_OP("SwiGLUBackward", cpu::SwiGLUBackward(dgate_up, gate_up, dout, N, F),
             gpu::SwiGLUBackward(ctx, dgate_up, gate_up, dout, N, F))
}

template <typename T>
Status GeGLUForward(Device dev, T* out, const T* gate_up, int64_t N, int64_t F) {
  MESHRUN_OP("GeGLUForward", cpu::GeGLUForward(out, gate_up, N, F),
             gpu::GeGLUForward(ctx, out, gate_up, N, F))
}

template <typename T>
Status GeGLUBackward(Device dev, T* dgate_up, const T* gate_up, const T* dout, int64_t N,
                     int64_t F) {
  MESHRUN_OP("GeGLUBackward", cpu::GeGLUBackward(dgate_up, gate_up, dout, N, F),
             gpu::GeGLUBackward(ctx, dgate_up, gate_up, dout, N, F))
}

template <typename T>
Status ResidualForward(Device dev, T* out, const T* a, const T* b, int64_t n) {
  MESHRUN_OP("ResidualForward", cpu::ResidualForward(out, a, b, n),
             gpu::ResidualForward(ctx, out, a, b, n))
}

template <typename T>
Status Accumulate(Device dev, T* dst, const T* src, int64_t n) {
  MESHRUN_OP("Accumulate", cpu::Accumulate(dst, src, n), gpu::Accumulate(ctx, dst, src, n))
}

template <typename T>
Status EmbeddingRowsForward(Device dev, T* out, const int32_t* idx, const T* table, int64_t first,
                            int64_t rows, int64_t N, int64_t C) {
  MESHRUN_OP("EmbeddingRowsForward", cpu::EmbeddingRowsForward(out, idx, table, first, rows, N, C),
             gpu::EmbeddingRowsForward(ctx, out, idx, table, first, rows, N, C))
}

template <typename T>
Status EmbeddingRowsBackward(Device dev, T* dtable, const T* dout, const int32_t* idx,
                             int64_t first, int64_t rows, int64_t N, int64_t C) {
  MESHRUN_OP("EmbeddingRowsBackward",
             cpu::EmbeddingRowsBackward(dtable, dout, idx, first, rows, N, C),
             gpu::EmbeddingRowsBackward(ctx, dtable, dout, idx, first, rows, N, C))
}

template <typename T>
Status AddRows(Device dev, T* x, const T* table, const int32_t* idx, int64_t N, int64_t C) {
  MESHRUN_OP("AddRows", cpu::AddRows(x, table, idx, N, C), gpu::AddRows(ctx, x, table, idx, N, C))
}

template <typename T>
Status RopeForward(Device dev, T* x, const T* cos, const T* sin, int64_t BH, int64_t Tn,
                   int64_t D) {
  MESHRUN_OP("RopeForward", cpu::RopeForward(x, cos, sin, BH, Tn, D),
             gpu::RopeForward(ctx, x, cos, sin, BH, Tn, D))
}

template <typename T>
Status RopeBackward(Device dev, T* dx, const T* cos, const T* sin, int64_t BH, int64_t Tn,
                    int64_t D) {
  MESHRUN_OP("RopeBackward", cpu::RopeBackward(dx, cos, sin, BH, Tn, D),
             gpu::RopeBackward(ctx, dx, cos, sin, BH, Tn, D))
}

template <typename T>
Status SplitHeads(Device dev, T* q, T* k, T* v, const T* qkv, int64_t B, int64_t Tn, int64_t H,
                  int64_t K, int64_t D) {
  MESHRUN_OP("SplitHeads", cpu::SplitHeads(q, k, v, qkv, B, Tn, H, K, D),
             gpu::SplitHeads(ctx, q, k, v, qkv, B, Tn, H, K, D))
}

template <typename T>
Status MergeQkvGrads(Device dev, T* dqkv, const T* dq, const T* dk, const T* dv, int64_t B,
                     int64_t Tn, int64_t H, int64_t K, int64_t D) {
  MESHRUN_OP("MergeQkvGrads", cpu::MergeQkvGrads(dqkv, dq, dk, dv, B, Tn, H, K, D),
             gpu::MergeQkvGrads(ctx, dqkv, dq, dk, dv, B, Tn, H, K, D))
}

template <typename T>
Status HeadsToRows(Device dev, T* rows, const T* heads, int64_t B, int64_t Tn, int64_t H,
                   int64_t D) {
  MESHRUN_OP("HeadsToRows", cpu::HeadsToRows(rows, heads, B, Tn, H, D),
             gpu::HeadsToRows(ctx, rows, heads, B, Tn, H, D))
}

template <typename T>
Status RowsToHeads(Device dev, T* heads, const T* rows, int64_t B, int64_t Tn, int64_t H,
                   int64_t D) {
  MESHRUN_OP("RowsToHeads", cpu::RowsToHeads(heads, rows, B, Tn, H, D),
             gpu::RowsToHeads(ctx, heads, rows, B, Tn, H, D))
}

template <typename T>
Status BlocksToSequence(Device dev, T* seq, const T* blocks, int64_t n, int64_t BH, int64_t Tl,
                        int64_t D) {
  MESHRUN_OP("BlocksToSequence", cpu::BlocksToSequence(seq, blocks, n, BH, Tl, D),
             gpu::BlocksToSequence(ctx, seq, blocks, n, BH, Tl, D))
}

template <typename T>
Status SequenceToBlocks(Device dev, T* blocks, const T* seq, int64_t n, int64_t BH, int64_t Tl,
                        int64_t D) {
  MESHRUN_OP("SequenceToBlocks", cpu::SequenceToBlocks(blocks, seq, n, BH, Tl, D),
             gpu::SequenceToBlocks(ctx, blocks, seq, n, BH, Tl, D))
}

#if MESHRUN_WITH_CUDA
// The cuda attention options of a per-query lower bound (null: causal only).
gpu::AttentionOptions MaskedAttention(const int32_t* q_lo) {
  gpu::AttentionOptions o;
  o.q_lo = q_lo;
  return o;
}
#endif

template <typename T>
Status AttentionForward(Device dev, T* out, T* lse, const T* q, const T* k, const T* v,
                        const int32_t* q_pos, const int32_t* k_pos, int64_t B, int64_t H,
                        int64_t Tq, int64_t Tk, int64_t D, double scale, const int32_t* q_lo) {
  MESHRUN_OP("AttentionForward",
             cpu::AttentionForward(out, lse, q, k, v, q_pos, k_pos, B, H, Tq, Tk, D, scale, q_lo),
             gpu::AttentionForward(ctx, out, lse, q, k, v, q_pos, k_pos, B, H, Tq, Tk, D, scale,
                                   MaskedAttention(q_lo)))
}

template <typename T>
Status AttentionBackward(Device dev, T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k,
                         const T* v, const T* out, const T* lse, const int32_t* q_pos,
                         const int32_t* k_pos, int64_t B, int64_t H, int64_t Tq, int64_t Tk,
                         int64_t D, double scale, const int32_t* q_lo) {
  MESHRUN_OP("AttentionBackward",
             cpu::AttentionBackward(dq, dk, dv, dout, q, k, v, out, lse, q_pos, k_pos, B, H, Tq, Tk,
                                    D, scale, q_lo),
             gpu::AttentionBackward(ctx, dq, dk, dv, dout, q, k, v, out, lse, q_pos, k_pos, B, H,
                                    Tq, Tk, D, scale, MaskedAttention(q_lo)))
}

template <typename T>
Status AttentionMerge(Device dev, T* out_a, T* lse_a, const T* out_b, const T* lse_b, int64_t rows,
                      int64_t D) {
  MESHRUN_OP("AttentionMerge", cpu::AttentionMerge(out_a, lse_a, out_b, lse_b, rows, D),
             gpu::AttentionMerge(ctx, out_a, lse_a, out_b, lse_b, rows, D))
}

template <typename T>
Status SoftmaxCrossEntropy(Device dev, T* losses, T* dlogits, const T* logits,
                           const int32_t* targets, int64_t N, int64_t V, double grad_scale) {
  MESHRUN_OP(
      "SoftmaxCrossEntropy",
      cpu::SoftmaxCrossEntropy(losses, dlogits, logits, targets, N, V, static_cast<T>(grad_scale)),
      gpu::SoftmaxCrossEntropy(ctx, losses, dlogits, logits, targets, N, V,
                               static_cast<float>(grad_scale)))
}

template <typename T>
Status VocabShardStats(Device dev, T* stats, const T* logits, const int32_t* targets, int64_t first,
                       int64_t N, int64_t V) {
  MESHRUN_OP("VocabShardStats", cpu::VocabShardStats(stats, logits, targets, first, N, V),
             gpu::VocabShardStats(ctx, stats, logits, targets, first, N, V))
}

template <typename T>
Status VocabShardLoss(Device dev, T* losses, T* lse, const T* all_stats, const int32_t* targets,
                      int64_t shards, int64_t N) {
  MESHRUN_OP("VocabShardLoss", cpu::VocabShardLoss(losses, lse, all_stats, targets, shards, N),
             gpu::VocabShardLoss(ctx, losses, lse, all_stats, targets, shards, N))
}

template <typename T>
Status VocabShardGrad(Device dev, T* dlogits, const T* logits, const T* lse, const int32_t* targets,
                      int64_t first, int64_t N, int64_t V, double grad_scale) {
  MESHRUN_OP(
      "VocabShardGrad",
      cpu::VocabShardGrad(dlogits, logits, lse, targets, first, N, V, static_cast<T>(grad_scale)),
      gpu::VocabShardGrad(ctx, dlogits, logits, lse, targets, first, N, V,
                          static_cast<float>(grad_scale)))
}

template <typename T>
StatusOr<double> Sum(Device dev, const T* x, int64_t n) {
  if (dev.type == DeviceType::kCpu) {
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]);
    return sum;
  }
  MESHRUN_CUDA_OP("Sum", gpu::Sum(ctx, x, n))
}

template <typename T>
StatusOr<double> SumOfSquares(Device dev, const T* x, int64_t n) {
  if (dev.type == DeviceType::kCpu) return cpu::SumOfSquares(x, n);
  MESHRUN_CUDA_OP("SumOfSquares", gpu::SumOfSquares(ctx, x, n))
}

template <typename T>
Status Scale(Device dev, T* x, int64_t n, double s) {
  MESHRUN_OP("Scale", cpu::Scale(x, n, s), (ctx.InvalidateWeights(), gpu::Scale(ctx, x, n, s)))
}

template <typename T>
Status AdamW(Device dev, T* param, const T* grad, T* m, T* v, int64_t n, double lr, double beta1,
             double beta2, double eps, double weight_decay, int64_t step){
    MESHRUN_OP("AdamW", cpu::AdamW(param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, step),
               (ctx.InvalidateWeights(),
                gpu::AdamW<float>(ctx, param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay,
                                  step, 1.0f, nullptr)))}

Status Lion(Device dev, float* param, const float* grad, float* m, int64_t n, double lr,
            double beta1, double beta2, double weight_decay) {
  using T = float;  // MESHRUN_CUDA_OP's type
  MESHRUN_OP(
      "Lion", cpu::Lion(param, grad, m, n, lr, beta1, beta2, weight_decay),
      (ctx.InvalidateWeights(), gpu::Lion(ctx, param, grad, m, n, lr, beta1, beta2, weight_decay)))
}

#define MESHRUN_OPS_INSTANTIATE(T)                                                                 \
  template Status Fill<T>(Device, T*, double, int64_t);                                            \
  template Status MatmulForward<T>(Device, T*, const T*, const T*, const T*, int64_t, int64_t,     \
                                   int64_t);                                                       \
  template Status MatmulBackward<T>(Device, T*, T*, T*, const T*, const T*, const T*, int64_t,     \
                                    int64_t, int64_t, bool);                                       \
  template Status AddBias<T>(Device, T*, const T*, int64_t, int64_t);                              \
  template Status BiasBackward<T>(Device, T*, const T*, int64_t, int64_t);                         \
  template Status LayerNormForward<T>(Device, T*, T*, T*, const T*, const T*, const T*, int64_t,   \
                                      int64_t, double);                                            \
  template Status LayerNormBackward<T>(Device, T*, T*, T*, const T*, const T*, const T*, const T*, \
                                       const T*, int64_t, int64_t);                                \
  template Status RMSNormForward<T>(Device, T*, T*, const T*, const T*, int64_t, int64_t, double); \
  template Status RMSNormBackward<T>(Device, T*, T*, const T*, const T*, const T*, const T*,       \
                                     int64_t, int64_t);                                            \
  template Status GeluForward<T>(Device, T*, const T*, int64_t);                                   \
  template Status GeluBackward<T>(Device, T*, const T*, const T*, int64_t, bool);                  \
  template Status SwiGLUForward<T>(Device, T*, const T*, int64_t, int64_t);                        \
  template Status SwiGLUBackward<T>(Device, T*, const T*, const T*, int64_t, int64_t);             \
  template Status GeGLUForward<T>(Device, T*, const T*, int64_t, int64_t);                         \
  template Status GeGLUBackward<T>(Device, T*, const T*, const T*, int64_t, int64_t);              \
  template Status ResidualForward<T>(Device, T*, const T*, const T*, int64_t);                     \
  template Status Accumulate<T>(Device, T*, const T*, int64_t);                                    \
  template Status EmbeddingRowsForward<T>(Device, T*, const int32_t*, const T*, int64_t, int64_t,  \
                                          int64_t, int64_t);                                       \
  template Status EmbeddingRowsBackward<T>(Device, T*, const T*, const int32_t*, int64_t, int64_t, \
                                           int64_t, int64_t);                                      \
  template Status AddRows<T>(Device, T*, const T*, const int32_t*, int64_t, int64_t);              \
  template Status RopeForward<T>(Device, T*, const T*, const T*, int64_t, int64_t, int64_t);       \
  template Status RopeBackward<T>(Device, T*, const T*, const T*, int64_t, int64_t, int64_t);      \
  template Status SplitHeads<T>(Device, T*, T*, T*, const T*, int64_t, int64_t, int64_t, int64_t,  \
                                int64_t);                                                          \
  template Status MergeQkvGrads<T>(Device, T*, const T*, const T*, const T*, int64_t, int64_t,     \
                                   int64_t, int64_t, int64_t);                                     \
  template Status HeadsToRows<T>(Device, T*, const T*, int64_t, int64_t, int64_t, int64_t);        \
  template Status RowsToHeads<T>(Device, T*, const T*, int64_t, int64_t, int64_t, int64_t);        \
  template Status BlocksToSequence<T>(Device, T*, const T*, int64_t, int64_t, int64_t, int64_t);   \
  template Status SequenceToBlocks<T>(Device, T*, const T*, int64_t, int64_t, int64_t, int64_t);   \
  template Status AttentionForward<T>(Device, T*, T*, const T*, const T*, const T*,                \
                                      const int32_t*, const int32_t*, int64_t, int64_t, int64_t,   \
                                      int64_t, int64_t, double, const int32_t*);                   \
  template Status AttentionBackward<T>(Device, T*, T*, T*, const T*, const T*, const T*, const T*, \
                                       const T*, const T*, const int32_t*, const int32_t*,         \
                                       int64_t, int64_t, int64_t, int64_t, int64_t, double,        \
                                       const int32_t*);                                            \
  template Status AttentionMerge<T>(Device, T*, T*, const T*, const T*, int64_t, int64_t);         \
  template Status SoftmaxCrossEntropy<T>(Device, T*, T*, const T*, const int32_t*, int64_t,        \
                                         int64_t, double);                                         \
  template Status VocabShardStats<T>(Device, T*, const T*, const int32_t*, int64_t, int64_t,       \
                                     int64_t);                                                     \
  template Status VocabShardLoss<T>(Device, T*, T*, const T*, const int32_t*, int64_t, int64_t);   \
  template Status VocabShardGrad<T>(Device, T*, const T*, const T*, const int32_t*, int64_t,       \
                                    int64_t, int64_t, double);                                     \
  template StatusOr<double> Sum<T>(Device, const T*, int64_t);                                     \
  template StatusOr<double> SumOfSquares<T>(Device, const T*, int64_t);                            \
  template Status Scale<T>(Device, T*, int64_t, double);                                           \
  template Status AdamW<T>(Device, T*, const T*, T*, T*, int64_t, double, double, double, double,  \
                           double, int64_t);
MESHRUN_OPS_INSTANTIATE(float) MESHRUN_OPS_INSTANTIATE(double)
#undef MESHRUN_OPS_INSTANTIATE

}  // namespace meshrun::ops
