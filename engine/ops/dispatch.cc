// The dispatch of the op table (engine/ops/op_table.inc): every row becomes ops::Name(dev, ...),
// one branch on the device type per call, to cpu::Name or to the op's CUDA kernel
// (cuda_kernels::Name below: gpu::Name of engine/cuda/kernels.h, or the adapter that stands in for
// it), instantiated for this library's element type (engine/core/element_type.h; decision 0067).
// A float64 twin (MESHRUN_FLOAT64) compiles no cuda branch: double answers INVALID_ARGUMENT there.
#include <cstring>
#include <string>
#include <type_traits>

#include "engine/core/element_type.h"
#include "engine/kernels/cpu/kernels.h"
#include "engine/ops/ops.h"
#include "engine/ops/ops_internal.h"

#if MESHRUN_WITH_CUDA && !MESHRUN_FLOAT64
#define MESHRUN_OPS_CUDA 1
#include "engine/cuda/context.h"
#include "engine/cuda/kernels.h"
#else
#define MESHRUN_OPS_CUDA 0
#endif

namespace meshrun::ops {
namespace {

[[maybe_unused]] Status OnlyFloat(const char* op) {
  return InvalidArgumentError(std::string("ops::") + op +
                              ": cuda runs float32 tensors only (hint: use GPT2<float>)");
}

#if MESHRUN_OPS_CUDA
bool MixedPrecision(const gpu::CudaContext& ctx) {
  return MatmulPrecisionOf(Device{DeviceType::kCuda, ctx.device()}) == MatmulPrecision::kBf16;
}

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
  auto one = [&](float* di, float* dw) -> Status {
    const Status s = gpu::MatmulBackwardMixed(ctx, di, dw, dout16, inp16, w16, N, C, OC);
    if (s.code() != StatusCode::kUnimplemented) return s;
    return gpu::MatmulBackward<float>(ctx, di, dw, nullptr, dout, inp, weight, N, C, OC);
  };
  if (dinp != nullptr) MESHRUN_RETURN_IF_ERROR(one(dinp, nullptr));
  if (dweight != nullptr) MESHRUN_RETURN_IF_ERROR(one(nullptr, dweight));
  if (dbias != nullptr) return gpu::ColumnSum(ctx, dbias, dout, N, OC, OC);
  return OkStatus();
}

// The cuda attention options of a per-query lower bound (null: causal only).
gpu::AttentionOptions MaskedAttention(const int32_t* q_lo) {
  gpu::AttentionOptions o;
  o.q_lo = q_lo;
  return o;
}
#endif

}  // namespace

#if MESHRUN_OPS_CUDA
// The CUDA kernel of each op of the table, on float32: gpu::Name called with the row's arguments
// after the context, unless an adapter here stands in for it (qualified lookup finds an adapter
// first): the ops that may write parameters invalidate the cached bf16 weights, the GEMMs run in
// bf16 on a mixed device, and the kernels whose options differ get them here.
namespace cuda_kernels {
using namespace gpu;  // NOLINT: the default CUDA kernel of an op is gpu::Name

Status Fill(gpu::CudaContext& ctx, float* dst, double value, int64_t n) {
  ctx.InvalidateWeights();
  return gpu::Fill(ctx, dst, static_cast<float>(value), n);
}

Status MatmulForward(gpu::CudaContext& ctx, float* out, const float* inp, const float* weight,
                     const float* bias, int64_t N, int64_t C, int64_t OC) {
  if (MixedPrecision(ctx)) return MixedForward(ctx, out, inp, weight, bias, N, C, OC);
  return gpu::MatmulForward(ctx, out, inp, weight, bias, N, C, OC);
}

Status MatmulBackward(gpu::CudaContext& ctx, float* dinp, float* dweight, float* dbias,
                      const float* dout, const float* inp, const float* weight, int64_t N,
                      int64_t C, int64_t OC, bool accumulate_dinp) {
  if (MixedPrecision(ctx)) {
    // The bf16 GEMM accumulates: an overwrite starts from zero.
    if (dinp != nullptr && !accumulate_dinp) {
      MESHRUN_RETURN_IF_ERROR(
          ops::Zero(Device{DeviceType::kCuda, ctx.device()}, dinp, sizeof(float) * N * C));
    }
    return MixedBackward(ctx, dinp, dweight, dbias, dout, inp, weight, N, C, OC);
  }
  return gpu::MatmulBackward(ctx, dinp, dweight, dbias, dout, inp, weight, N, C, OC,
                             gpu::MatmulBackwardOptions{accumulate_dinp, 0});
}

Status BiasBackward(gpu::CudaContext& ctx, float* dbias, const float* dout, int64_t N, int64_t C) {
  return gpu::ColumnSum(ctx, dbias, dout, N, C, C);
}

Status AttentionForward(gpu::CudaContext& ctx, float* out, float* lse, const float* q,
                        const float* k, const float* v, const int32_t* q_pos, const int32_t* k_pos,
                        int64_t B, int64_t H, int64_t Tq, int64_t Tk, int64_t D, double scale,
                        const int32_t* q_lo) {
  return gpu::AttentionForward(ctx, out, lse, q, k, v, q_pos, k_pos, B, H, Tq, Tk, D, scale,
                               MaskedAttention(q_lo));
}

Status AttentionBackward(gpu::CudaContext& ctx, float* dq, float* dk, float* dv, const float* dout,
                         const float* q, const float* k, const float* v, const float* out,
                         const float* lse, const int32_t* q_pos, const int32_t* k_pos, int64_t B,
                         int64_t H, int64_t Tq, int64_t Tk, int64_t D, double scale,
                         const int32_t* q_lo) {
  return gpu::AttentionBackward(ctx, dq, dk, dv, dout, q, k, v, out, lse, q_pos, k_pos, B, H, Tq,
                                Tk, D, scale, MaskedAttention(q_lo));
}

Status Scale(gpu::CudaContext& ctx, float* x, int64_t n, double s) {
  ctx.InvalidateWeights();
  return gpu::Scale(ctx, x, n, s);
}

Status AdamW(gpu::CudaContext& ctx, float* param, const float* grad, float* m, float* v, int64_t n,
             double lr, double beta1, double beta2, double eps, double weight_decay, int64_t step) {
  ctx.InvalidateWeights();
  return gpu::AdamW<float>(ctx, param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, step,
                           1.0f, nullptr);
}

Status Lion(gpu::CudaContext& ctx, float* param, const float* grad, float* m, int64_t n, double lr,
            double beta1, double beta2, double weight_decay) {
  ctx.InvalidateWeights();
  return gpu::Lion(ctx, param, grad, m, n, lr, beta1, beta2, weight_decay);
}

}  // namespace cuda_kernels
#endif

// The cuda branch of an op: its CUDA kernel on float32; double answers INVALID_ARGUMENT, and an
// engine without the CUDA path UNAVAILABLE.
#if MESHRUN_OPS_CUDA
#define MESHRUN_CUDA_BRANCH(name, ...)                                         \
  if constexpr (std::is_same_v<T, float>) {                                    \
    MESHRUN_ASSIGN_OR_RETURN(gpu::CudaContext* ctx, internal::ContextOf(dev)); \
    return cuda_kernels::name(*ctx, __VA_ARGS__);                              \
  } else {                                                                     \
    return OnlyFloat(#name);                                                   \
  }
#elif MESHRUN_WITH_CUDA
#define MESHRUN_CUDA_BRANCH(name, ...) return OnlyFloat(#name);
#else
#define MESHRUN_CUDA_BRANCH(name, ...) return internal::NotBuilt(#name);
#endif

#define MESHRUN_OPS_ARGS(...) MESHRUN_PP_LIST(MESHRUN_PARAM_NAME, __VA_ARGS__)
#define MESHRUN_OPS_PARAMS(...) MESHRUN_PP_LIST(MESHRUN_PARAM_DEF, __VA_ARGS__)

#define MESHRUN_OP(name, ...)                                \
  template <typename T>                                      \
  Status name(Device dev, MESHRUN_OPS_PARAMS(__VA_ARGS__)) { \
    if (dev.type == DeviceType::kCount) return OkStatus();   \
    if (dev.type == DeviceType::kCpu) {                      \
      cpu::name(MESHRUN_OPS_ARGS(__VA_ARGS__));              \
      return OkStatus();                                     \
    }                                                        \
    MESHRUN_CUDA_BRANCH(name, MESHRUN_OPS_ARGS(__VA_ARGS__)) \
  }
#define MESHRUN_REDUCTION_OP(name, ...)                                                \
  template <typename T>                                                                \
  StatusOr<double> name(Device dev, MESHRUN_OPS_PARAMS(__VA_ARGS__)) {                 \
    if (dev.type == DeviceType::kCount) return 0.0;                                    \
    if (dev.type == DeviceType::kCpu) return cpu::name(MESHRUN_OPS_ARGS(__VA_ARGS__)); \
    MESHRUN_CUDA_BRANCH(name, MESHRUN_OPS_ARGS(__VA_ARGS__))                           \
  }
#if MESHRUN_FLOAT64  // float32 only: the product library holds them
#define MESHRUN_FLOAT_OP(name, ...)
#else
#define MESHRUN_FLOAT_OP(name, ...)                               \
  Status name(Device dev, MESHRUN_OPS_PARAMS(__VA_ARGS__)) {      \
    using T [[maybe_unused]] = float; /* MESHRUN_CUDA_BRANCH's */ \
    if (dev.type == DeviceType::kCount) return OkStatus();        \
    if (dev.type == DeviceType::kCpu) {                           \
      cpu::name(MESHRUN_OPS_ARGS(__VA_ARGS__));                   \
      return OkStatus();                                          \
    }                                                             \
    MESHRUN_CUDA_BRANCH(name, MESHRUN_OPS_ARGS(__VA_ARGS__))      \
  }
#endif
#include "engine/ops/op_table.inc"

// The explicit instantiations, through each op's function type.
namespace {
namespace signature {
#define MESHRUN_OP(name, ...) \
  template <typename T>       \
  using name = Status(Device, MESHRUN_PP_LIST(MESHRUN_PARAM_TYPE, __VA_ARGS__));
#define MESHRUN_REDUCTION_OP(name, ...) \
  template <typename T>                 \
  using name = StatusOr<double>(Device, MESHRUN_PP_LIST(MESHRUN_PARAM_TYPE, __VA_ARGS__));
#define MESHRUN_FLOAT_OP(name, ...)
#include "engine/ops/op_table.inc"
}  // namespace signature
}  // namespace

#define MESHRUN_OP(name, ...) \
  template signature::name<MESHRUN_ELEMENT_TYPE> name<MESHRUN_ELEMENT_TYPE>;
#define MESHRUN_REDUCTION_OP(name, ...) \
  template signature::name<MESHRUN_ELEMENT_TYPE> name<MESHRUN_ELEMENT_TYPE>;
#define MESHRUN_FLOAT_OP(name, ...)
#include "engine/ops/op_table.inc"

}  // namespace meshrun::ops
