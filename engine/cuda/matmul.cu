// Linear layers on cuBLASLt: bf16 (or float) operands, float32 accumulation, the bias fused as an
// epilogue, weight gradients accumulated straight into float32 (bf16 A/B with a float32 C/D).
//
// cuBLASLt is column-major; a row-major X[r,c] is the column-major Xᵀ. Every call below is written
// as the column-major product it hands to cuBLASLt (the llm.c mapping).
#include <cstdint>
#include <string>

#include "engine/cuda/check.h"
#include "engine/cuda/common.cuh"
#include "engine/cuda/kernels.h"

namespace meshrun::gpu {
namespace {

using internal::FromFloat;
using internal::GridFor;
using internal::ToFloat;

template <typename T>
constexpr cudaDataType_t DataTypeOf();
template <>
constexpr cudaDataType_t DataTypeOf<float>() {
  return CUDA_R_32F;
}
template <>
constexpr cudaDataType_t DataTypeOf<bf16>() {
  return CUDA_R_16BF;
}

// Column-major D[m,n] = op(A)[m,k]·op(B)[k,n] + beta·D (+ bias[m] on every column).
struct LtGemm {
  void* d = nullptr;
  cudaDataType_t d_type = CUDA_R_32F;
  int64_t ldd = 0;
  const void* a = nullptr;
  int64_t lda = 0;
  bool trans_a = false;
  const void* b = nullptr;
  int64_t ldb = 0;
  bool trans_b = false;
  cudaDataType_t ab_type = CUDA_R_32F;
  int64_t m = 0, n = 0, k = 0;
  float beta = 0;
  const void* bias = nullptr;  // d_type, m elements
};

int64_t Alignment(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  int64_t a = 256;
  while (a > 1 && v % a != 0) a /= 2;
  return a;
}

// Destroys the cuBLASLt descriptors of one call on every return path.
struct LtDescriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtDescriptors() {
    if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
    if (d != nullptr) cublasLtMatrixLayoutDestroy(d);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
  }
};

Status RunLt(CudaContext& ctx, const LtGemm& g) {
  LtDescriptors s;
  MESHRUN_GPU_TRY(cublasLtMatmulDescCreate(&s.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  MESHRUN_GPU_TRY(
      cublasLtMatmulDescSetAttribute(s.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  MESHRUN_GPU_TRY(
      cublasLtMatmulDescSetAttribute(s.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  if (g.bias != nullptr) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const int32_t bias_type = g.d_type;
    MESHRUN_GPU_TRY(cublasLtMatmulDescSetAttribute(s.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                                   sizeof(epilogue)));
    MESHRUN_GPU_TRY(cublasLtMatmulDescSetAttribute(s.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias,
                                                   sizeof(g.bias)));
    MESHRUN_GPU_TRY(cublasLtMatmulDescSetAttribute(s.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                   &bias_type, sizeof(bias_type)));
  }
  const uint64_t a_rows = g.trans_a ? g.k : g.m, a_cols = g.trans_a ? g.m : g.k;
  const uint64_t b_rows = g.trans_b ? g.n : g.k, b_cols = g.trans_b ? g.k : g.n;
  MESHRUN_GPU_TRY(cublasLtMatrixLayoutCreate(&s.a, g.ab_type, a_rows, a_cols, g.lda));
  MESHRUN_GPU_TRY(cublasLtMatrixLayoutCreate(&s.b, g.ab_type, b_rows, b_cols, g.ldb));
  MESHRUN_GPU_TRY(cublasLtMatrixLayoutCreate(&s.d, g.d_type, g.m, g.n, g.ldd));

  const int64_t align_a = Alignment(g.a), align_b = Alignment(g.b), align_d = Alignment(g.d);
  const CudaContext::GemmKey key = {g.m,
                                    g.n,
                                    g.k,
                                    g.lda,
                                    g.ldb,
                                    g.ldd,
                                    g.trans_a + 2 * g.trans_b + 4 * (g.bias != nullptr),
                                    g.ab_type,
                                    g.d_type,
                                    align_a,
                                    align_b,
                                    align_d,
                                    g.bias != nullptr ? Alignment(g.bias) : 0,
                                    0};
  auto& plans = ctx.gemm_plans();
  auto it = plans.find(key);
  if (it == plans.end()) {
    MESHRUN_GPU_TRY(cublasLtMatmulPreferenceCreate(&s.pref));
    const uint64_t ws = ctx.lt_workspace_bytes();
    MESHRUN_GPU_TRY(cublasLtMatmulPreferenceSetAttribute(
        s.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    // The heuristic assumes 256-byte aligned pointers unless told otherwise.
    const uint32_t al[3] = {static_cast<uint32_t>(align_a), static_cast<uint32_t>(align_b),
                            static_cast<uint32_t>(align_d)};
    MESHRUN_GPU_TRY(cublasLtMatmulPreferenceSetAttribute(
        s.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al[0], sizeof(al[0])));
    MESHRUN_GPU_TRY(cublasLtMatmulPreferenceSetAttribute(
        s.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al[1], sizeof(al[1])));
    MESHRUN_GPU_TRY(cublasLtMatmulPreferenceSetAttribute(
        s.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al[2], sizeof(al[2])));
    MESHRUN_GPU_TRY(cublasLtMatmulPreferenceSetAttribute(
        s.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al[2], sizeof(al[2])));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    // "No algorithm" comes back either as found == 0 or as CUBLAS_STATUS_NOT_SUPPORTED: both
    // are UNIMPLEMENTED here (not a recorded GPU error), so the caller can take its unfused
    // fallback (the bias added by a separate kernel).
    const cublasStatus_t heuristic = cublasLtMatmulAlgoGetHeuristic(
        ctx.lt(), s.op, s.a, s.b, s.d, s.d, s.pref, 1, &result, &found);
    if (heuristic != CUBLAS_STATUS_NOT_SUPPORTED) {
      MESHRUN_GPU_TRY(heuristic);
    }
    if (heuristic == CUBLAS_STATUS_NOT_SUPPORTED || found == 0) {
      Status st = UnimplementedError(
          "cuBLASLt has no algorithm for m=" + std::to_string(g.m) + " n=" + std::to_string(g.n) +
          " k=" + std::to_string(g.k) + " lda=" + std::to_string(g.lda) +
          " ldb=" + std::to_string(g.ldb) + " ldd=" + std::to_string(g.ldd) +
          (g.bias != nullptr ? " with bias" : ""));
      return st;  // callers record it if they have no fallback
    }
    it = plans.emplace(key, result.algo).first;
  }
  const float alpha = 1.0f;
  MESHRUN_GPU_TRY(cublasLtMatmul(ctx.lt(), s.op, &alpha, g.a, s.a, g.b, s.b, &g.beta, g.d, s.d, g.d,
                                 s.d, &it->second, ctx.lt_workspace(), ctx.lt_workspace_bytes(),
                                 ctx.stream()));
  return OkStatus();
}

// out[r, c] += bias[c]: the fallback when the bias cannot be an epilogue (misaligned pointer).
template <typename T>
__global__ void AddBiasKernel(T* out, const T* bias, int64_t N, int64_t OC, int64_t ld) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < N * OC;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / OC, c = i % OC;
    out[r * ld + c] = FromFloat<T>(ToFloat(out[r * ld + c]) + ToFloat(bias[c]));
  }
}

}  // namespace

// RunLt with the bias in its epilogue when `fused_bias` (an aligned bias), falling back to a
// plain GEMM and a separate bias add where cuBLASLt has no algorithm with the epilogue.
template <typename T>
Status RunLtWithBias(CudaContext& ctx, LtGemm g, bool fused_bias, const T* bias, T* out, int N,
                     int OC, int ld_out) {
  g.bias = fused_bias ? bias : nullptr;
  const Status s = RunLt(ctx, g);
  if (s.code() == StatusCode::kUnimplemented && fused_bias) {
    fused_bias = false;
    g.bias = nullptr;
    MESHRUN_RETURN_IF_ERROR(RunLt(ctx, g));
  } else {
    MESHRUN_RETURN_IF_ERROR(s);
  }
  if (bias != nullptr && !fused_bias) {
    AddBiasKernel<<<GridFor(N * OC, 256), 256, 0, ctx.stream()>>>(out, bias, N, OC, ld_out);
    MESHRUN_GPU_TRY_LAUNCH();
  }
  return OkStatus();
}

template <typename T>
Status MatmulForward(CudaContext& ctx, T* out, const T* inp, const T* weight, const T* bias,
                     int64_t N, int64_t C, int64_t OC, int64_t ld_out) {
  if (N <= 0 || OC <= 0) return OkStatus();
  if (ld_out == 0) ld_out = OC;
  // cuBLASLt wants a 16-byte aligned bias for the epilogue; otherwise add it separately.
  bool fused_bias = bias != nullptr && Alignment(bias) >= 16;
  // outᵀ[OC,N] = (weightᵀ)ᵀ·inpᵀ: A = weight seen as col-major [C,OC], transposed.
  LtGemm g;
  g.d = out;
  g.d_type = DataTypeOf<T>();
  g.ldd = ld_out;
  g.a = weight;
  g.lda = C;
  g.trans_a = true;
  g.b = inp;
  g.ldb = C;
  g.trans_b = false;
  g.ab_type = DataTypeOf<T>();
  g.m = OC;
  g.n = N;
  g.k = C;
  g.beta = 0.0f;
  return RunLtWithBias(ctx, g, fused_bias, bias, out, N, OC, ld_out);
}

template <typename T>
Status MatmulBackward(CudaContext& ctx, T* dinp, float* dweight, float* dbias, const T* dout,
                      const T* inp, const T* weight, int64_t N, int64_t C, int64_t OC,
                      const MatmulBackwardOptions& options) {
  if (N <= 0 || OC <= 0 || C <= 0) return OkStatus();
  const int64_t ld = options.ld_dout == 0 ? OC : options.ld_dout;
  if (dinp != nullptr) {
    // dinpᵀ[C,N] = weightᵀ[C,OC]·doutᵀ[OC,N].
    LtGemm g;
    g.d = dinp;
    g.d_type = DataTypeOf<T>();
    g.ldd = C;
    g.a = weight;
    g.lda = C;
    g.b = dout;
    g.ldb = ld;
    g.ab_type = DataTypeOf<T>();
    g.m = C;
    g.n = N;
    g.k = OC;
    g.beta = options.accumulate_dinp ? 1.0f : 0.0f;
    MESHRUN_RETURN_IF_ERROR(RunLt(ctx, g));
  }
  if (dweight != nullptr) {
    // dweightᵀ[C,OC] += inpᵀ[C,N]·dout[N,OC]; dout seen as col-major [OC,N], transposed.
    LtGemm g;
    g.d = dweight;
    g.d_type = CUDA_R_32F;
    g.ldd = C;
    g.a = inp;
    g.lda = C;
    g.b = dout;
    g.ldb = ld;
    g.trans_b = true;
    g.ab_type = DataTypeOf<T>();
    g.m = C;
    g.n = OC;
    g.k = N;
    g.beta = 1.0f;
    MESHRUN_RETURN_IF_ERROR(RunLt(ctx, g));
  }
  if (dbias != nullptr) MESHRUN_RETURN_IF_ERROR(ColumnSum(ctx, dbias, dout, N, OC, ld));
  return OkStatus();
}

Status MatmulForwardMixed(CudaContext& ctx, float* out, const bf16* inp, const bf16* weight,
                          const float* bias, int64_t N, int64_t C, int64_t OC) {
  if (N <= 0 || OC <= 0) return OkStatus();
  bool fused_bias = bias != nullptr && Alignment(bias) >= 16;
  LtGemm g;  // as MatmulForward: bf16 A/B, float32 D (and bias)
  g.d = out;
  g.d_type = CUDA_R_32F;
  g.ldd = OC;
  g.a = weight;
  g.lda = C;
  g.trans_a = true;
  g.b = inp;
  g.ldb = C;
  g.ab_type = CUDA_R_16BF;
  g.m = OC;
  g.n = N;
  g.k = C;
  g.beta = 0.0f;
  return RunLtWithBias(ctx, g, fused_bias, bias, out, N, OC, OC);
}

Status MatmulBackwardMixed(CudaContext& ctx, float* dinp, float* dweight, const bf16* dout,
                           const bf16* inp, const bf16* weight, int64_t N, int64_t C, int64_t OC) {
  if (N <= 0 || OC <= 0 || C <= 0) return OkStatus();
  if (dinp != nullptr) {
    LtGemm g;  // dinpᵀ[C,N] += weightᵀ[C,OC]·doutᵀ[OC,N]
    g.d = dinp;
    g.d_type = CUDA_R_32F;
    g.ldd = C;
    g.a = weight;
    g.lda = C;
    g.b = dout;
    g.ldb = OC;
    g.ab_type = CUDA_R_16BF;
    g.m = C;
    g.n = N;
    g.k = OC;
    g.beta = 1.0f;
    MESHRUN_RETURN_IF_ERROR(RunLt(ctx, g));
  }
  if (dweight != nullptr) {
    LtGemm g;  // dweightᵀ[C,OC] += inpᵀ[C,N]·dout[N,OC]
    g.d = dweight;
    g.d_type = CUDA_R_32F;
    g.ldd = C;
    g.a = inp;
    g.lda = C;
    g.b = dout;
    g.ldb = OC;
    g.trans_b = true;
    g.ab_type = CUDA_R_16BF;
    g.m = C;
    g.n = OC;
    g.k = N;
    g.beta = 1.0f;
    MESHRUN_RETURN_IF_ERROR(RunLt(ctx, g));
  }
  return OkStatus();
}

#define MESHRUN_INSTANTIATE(T)                                                              \
  template Status MatmulForward<T>(CudaContext&, T*, const T*, const T*, const T*, int64_t, \
                                   int64_t, int64_t, int64_t);                              \
  template Status MatmulBackward<T>(CudaContext&, T*, float*, float*, const T*, const T*,   \
                                    const T*, int64_t, int64_t, int64_t,                    \
                                    const MatmulBackwardOptions&);
MESHRUN_INSTANTIATE(float)
MESHRUN_INSTANTIATE(bf16)
#undef MESHRUN_INSTANTIATE

}  // namespace meshrun::gpu
