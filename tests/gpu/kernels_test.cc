// Every CUDA kernel (engine/cuda/kernels.h) against its CPU counterpart (engine/kernels/cpu) on
// fresh random inputs: float32 within float rounding, bf16 within bf16 tolerance (inputs rounded
// to bf16 first, so both sides see the same numbers).
#include "engine/cuda/kernels.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <vector>

#include "engine/cuda/context.h"
#include "engine/kernels/cpu/kernels.h"
#include "tests/gpu/gpu_test.h"

namespace meshrun {
namespace {

using gpu::bf16;
using gpu::CudaContext;
using gputest::DeviceArray;
using gputest::RandomInts;
using gputest::RandomVector;
using gputest::RoundTo;

CudaContext& Ctx() {
  static std::unique_ptr<CudaContext> ctx = [] {
    auto c = CudaContext::Create(0);
    if (!c.ok()) {
      std::printf("cannot create the CUDA context: %s\n", c.status().ToString().c_str());
      std::abort();
    }
    return std::move(c).value();
  }();
  return *ctx;
}

template <typename T>
double Tol() {
  return std::is_same_v<T, float> ? 2e-5 : 2e-2;
}
template <typename T>
const char* Name() {
  return std::is_same_v<T, float> ? "fp32" : "bf16";
}
template <typename T>
std::string What(const char* op) {
  return std::string(op) + " " + Name<T>();
}

template <typename T>
void CheckEmbedding() {
  std::mt19937 rng(1);
  const int64_t N = 37, C = 48, V = 50, P = 20;
  const auto tokens = RandomInts(rng, N, 0, V - 1), positions = RandomInts(rng, N, 0, P - 1);
  const auto wte = RoundTo<T>(RandomVector(rng, V * C)), wpe = RoundTo<T>(RandomVector(rng, P * C));
  std::vector<float> want(N * C);
  cpu::EmbeddingForward(want.data(), tokens.data(), positions.data(), wte.data(), wpe.data(), N, C);
  auto d_tok = DeviceArray<int32_t>::FromRaw(tokens),
       d_pos = DeviceArray<int32_t>::FromRaw(positions);
  auto d_wte = DeviceArray<T>::FromHost(wte), d_wpe = DeviceArray<T>::FromHost(wpe);
  DeviceArray<T> d_out(N * C);
  ASSERT_OK(gpu::EmbeddingForward(Ctx(), d_out.get(), d_tok.get(), d_pos.get(), d_wte.get(),
                                  d_wpe.get(), N, C));
  EXPECT_CLOSE(What<T>("EmbeddingForward"), d_out.Download(), RoundTo<T>(want), Tol<T>());

  // Backward accumulates into float32 gradients that already hold values.
  const auto dout = RoundTo<T>(RandomVector(rng, N * C));
  auto dwte = RandomVector(rng, V * C), dwpe = RandomVector(rng, P * C);
  auto g_wte = DeviceArray<float>::FromHost(dwte), g_wpe = DeviceArray<float>::FromHost(dwpe);
  auto d_dout = DeviceArray<T>::FromHost(dout);
  cpu::EmbeddingBackward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), positions.data(), N,
                         C);
  ASSERT_OK(gpu::EmbeddingBackward(Ctx(), g_wte.get(), g_wpe.get(), d_dout.get(), d_tok.get(),
                                   d_pos.get(), N, C));
  EXPECT_CLOSE(What<T>("EmbeddingBackward dwte"), g_wte.Download(), dwte, 1e-5);
  EXPECT_CLOSE(What<T>("EmbeddingBackward dwpe"), g_wpe.Download(), dwpe, 1e-5);
}
GPU_TEST(EmbeddingFloat) {
  CheckEmbedding<float>();
}
GPU_TEST(EmbeddingBf16) {
  CheckEmbedding<bf16>();
}

template <typename T>
void CheckLayerNorm(int64_t N, int64_t C) {
  std::mt19937 rng(2);
  const auto inp = RoundTo<T>(RandomVector(rng, N * C, -1.0f, 2.0f));  // mean ≠ 0
  const auto w = RoundTo<T>(RandomVector(rng, C, 0.5f, 1.5f)), b = RoundTo<T>(RandomVector(rng, C));
  std::vector<float> out(N * C), mean(N), rstd(N);
  cpu::LayerNormForward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C,
                        1e-5);
  auto d_inp = DeviceArray<T>::FromHost(inp), d_w = DeviceArray<T>::FromHost(w),
       d_b = DeviceArray<T>::FromHost(b);
  DeviceArray<T> d_out(N * C);
  DeviceArray<float> d_mean(N), d_rstd(N);
  ASSERT_OK(gpu::LayerNormForward(Ctx(), d_out.get(), d_mean.get(), d_rstd.get(), d_inp.get(),
                                  d_w.get(), d_b.get(), N, C, 1e-5));
  EXPECT_CLOSE(What<T>("LayerNormForward out"), d_out.Download(), RoundTo<T>(out), Tol<T>());
  EXPECT_CLOSE(What<T>("LayerNormForward mean"), d_mean.Download(), mean, 1e-5);
  EXPECT_CLOSE(What<T>("LayerNormForward rstd"), d_rstd.Download(), rstd, 1e-5);

  for (const bool accumulate : {true, false}) {
    const auto dout = RoundTo<T>(RandomVector(rng, N * C));
    auto dinp = RoundTo<T>(RandomVector(rng, N * C));
    auto dw = RandomVector(rng, C), db = RandomVector(rng, C);
    auto g_dinp = DeviceArray<T>::FromHost(dinp), g_dout = DeviceArray<T>::FromHost(dout);
    auto g_dw = DeviceArray<float>::FromHost(dw), g_db = DeviceArray<float>::FromHost(db);
    if (!accumulate) std::fill(dinp.begin(), dinp.end(), 0.0f);
    cpu::LayerNormBackward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(),
                           mean.data(), rstd.data(), N, C);
    ASSERT_OK(gpu::LayerNormBackward(Ctx(), g_dinp.get(), g_dw.get(), g_db.get(), g_dout.get(),
                                     d_inp.get(), d_w.get(), d_mean.get(), d_rstd.get(), N, C,
                                     accumulate));
    const std::string tag = accumulate ? " (accumulate)" : " (overwrite)";
    EXPECT_CLOSE(What<T>("LayerNormBackward dinp") + tag, g_dinp.Download(), RoundTo<T>(dinp),
                 Tol<T>());
    EXPECT_CLOSE(What<T>("LayerNormBackward dweight") + tag, g_dw.Download(), dw,
                 std::is_same_v<T, float> ? 2e-5 : 1e-2);
    EXPECT_CLOSE(What<T>("LayerNormBackward dbias") + tag, g_db.Download(), db,
                 std::is_same_v<T, float> ? 2e-5 : 1e-2);
  }
}
GPU_TEST(LayerNormFloat) {
  CheckLayerNorm<float>(67, 96);
}
GPU_TEST(LayerNormBf16) {
  CheckLayerNorm<bf16>(131, 768);
}

template <typename T>
void CheckMatmul(int64_t N, int64_t C, int64_t OC, bool with_bias, int64_t ld_pad) {
  std::mt19937 rng(3);
  const auto inp = RoundTo<T>(RandomVector(rng, N * C)), w = RoundTo<T>(RandomVector(rng, OC * C));
  const auto bias = RoundTo<T>(RandomVector(rng, OC));
  std::vector<float> out(N * OC);
  cpu::MatmulForward(out.data(), inp.data(), w.data(), with_bias ? bias.data() : nullptr, N, C, OC);
  auto d_inp = DeviceArray<T>::FromHost(inp), d_w = DeviceArray<T>::FromHost(w),
       d_bias = DeviceArray<T>::FromHost(bias);
  DeviceArray<T> d_out(N * OC);
  ASSERT_OK(gpu::MatmulForward(Ctx(), d_out.get(), d_inp.get(), d_w.get(),
                               with_bias ? d_bias.get() : static_cast<T*>(nullptr), N, C, OC));
  const std::string shape = " " + std::to_string(N) + "x" + std::to_string(C) + "x" +
                            std::to_string(OC) + (with_bias ? " +bias" : "");
  EXPECT_CLOSE(What<T>("MatmulForward") + shape, d_out.Download(), RoundTo<T>(out), Tol<T>());

  // Backward with dout rows of stride OC + ld_pad (the LM head's padded vocabulary).
  const int64_t ld = OC + ld_pad;
  const auto dout = RoundTo<T>(RandomVector(rng, N * OC));
  std::vector<float> dout_padded(N * ld, 0.0f);
  for (int64_t i = 0; i < N; ++i) {
    for (int64_t j = 0; j < OC; ++j) dout_padded[i * ld + j] = dout[i * OC + j];
  }
  auto dinp = RoundTo<T>(RandomVector(rng, N * C));
  auto dw = RandomVector(rng, OC * C), db = RandomVector(rng, OC);
  auto g_dinp = DeviceArray<T>::FromHost(dinp), g_dout = DeviceArray<T>::FromHost(dout_padded);
  auto g_dw = DeviceArray<float>::FromHost(dw), g_db = DeviceArray<float>::FromHost(db);
  cpu::MatmulBackward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, C,
                      OC);
  gpu::MatmulBackwardOptions opt;
  opt.ld_dout = ld;
  ASSERT_OK(gpu::MatmulBackward(Ctx(), g_dinp.get(), g_dw.get(), g_db.get(), g_dout.get(),
                                d_inp.get(), d_w.get(), N, C, OC, opt));
  EXPECT_CLOSE(What<T>("MatmulBackward dinp") + shape, g_dinp.Download(), RoundTo<T>(dinp),
               Tol<T>());
  EXPECT_CLOSE(What<T>("MatmulBackward dweight") + shape, g_dw.Download(), dw,
               std::is_same_v<T, float> ? 2e-5 : 1e-2);
  EXPECT_CLOSE(What<T>("MatmulBackward dbias") + shape, g_db.Download(), db,
               std::is_same_v<T, float> ? 2e-5 : 1e-2);
}
GPU_TEST(MatmulFloat) {
  CheckMatmul<float>(64, 96, 80, true, 0);
  CheckMatmul<float>(33, 45, 19, true, 0);  // odd sizes: unaligned rows
  CheckMatmul<float>(40, 32, 50, false, 14);
}
GPU_TEST(MatmulBf16) {
  CheckMatmul<bf16>(128, 96, 80, true, 0);
  CheckMatmul<bf16>(256, 768, 2304, true, 0);
  CheckMatmul<bf16>(64, 64, 200, false, 56);
}

// Attention on contiguous (B,H,T,D) tensors with given positions, forward and backward.
template <typename T>
void CheckAttention(int64_t B, int64_t H, int64_t Tq, int64_t Tk, int64_t D,
                    const std::vector<int32_t>& q_pos, const std::vector<int32_t>& k_pos,
                    gpu::AttentionAlgo algo, const char* label) {
  std::mt19937 rng(4);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const auto q = RoundTo<T>(RandomVector(rng, B * H * Tq * D)),
             k = RoundTo<T>(RandomVector(rng, B * H * Tk * D)),
             v = RoundTo<T>(RandomVector(rng, B * H * Tk * D));
  std::vector<float> out(B * H * Tq * D), lse(B * H * Tq);
  cpu::AttentionForward(out.data(), lse.data(), q.data(), k.data(), v.data(), q_pos.data(),
                        k_pos.data(), B, H, Tq, Tk, D, scale);
  auto d_q = DeviceArray<T>::FromHost(q), d_k = DeviceArray<T>::FromHost(k),
       d_v = DeviceArray<T>::FromHost(v);
  auto d_qp = DeviceArray<int32_t>::FromRaw(q_pos), d_kp = DeviceArray<int32_t>::FromRaw(k_pos);
  DeviceArray<T> d_out(out.size());
  DeviceArray<float> d_lse(lse.size());
  gpu::AttentionOptions opt;
  opt.algo = algo;
  ASSERT_OK(gpu::AttentionForward(Ctx(), d_out.get(), d_lse.get(), d_q.get(), d_k.get(), d_v.get(),
                                  d_qp.get(), d_kp.get(), B, H, Tq, Tk, D, scale, opt));
  const std::string tag = std::string(" ") + label;
  EXPECT_CLOSE(What<T>("AttentionForward out") + tag, d_out.Download(), RoundTo<T>(out), Tol<T>());
  EXPECT_CLOSE(What<T>("AttentionForward lse") + tag, d_lse.Download(), lse,
               std::is_same_v<T, float> ? 1e-5 : 5e-3);

  // Backward from the CPU's (rounded) out and lse, so only the backward kernels are compared.
  const auto out_r = RoundTo<T>(out);
  auto d_out_r = DeviceArray<T>::FromHost(out_r);
  auto d_lse_r = DeviceArray<float>::FromHost(lse);
  for (const bool accumulate : {true, false}) {
    const auto dout = RoundTo<T>(RandomVector(rng, out.size()));
    auto dq = RoundTo<T>(RandomVector(rng, q.size())), dk = RoundTo<T>(RandomVector(rng, k.size())),
         dv = RoundTo<T>(RandomVector(rng, v.size()));
    auto g_dq = DeviceArray<T>::FromHost(dq), g_dk = DeviceArray<T>::FromHost(dk),
         g_dv = DeviceArray<T>::FromHost(dv), g_dout = DeviceArray<T>::FromHost(dout);
    if (!accumulate) {
      std::fill(dq.begin(), dq.end(), 0.0f);
      std::fill(dk.begin(), dk.end(), 0.0f);
      std::fill(dv.begin(), dv.end(), 0.0f);
    }
    cpu::AttentionBackward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(),
                           v.data(), out_r.data(), lse.data(), q_pos.data(), k_pos.data(), B, H, Tq,
                           Tk, D, scale);
    opt.accumulate = accumulate;
    ASSERT_OK(gpu::AttentionBackward(Ctx(), g_dq.get(), g_dk.get(), g_dv.get(), g_dout.get(),
                                     d_q.get(), d_k.get(), d_v.get(), d_out_r.get(), d_lse_r.get(),
                                     d_qp.get(), d_kp.get(), B, H, Tq, Tk, D, scale, opt));
    const double tol = std::is_same_v<T, float> ? 5e-5 : 3e-2;
    const std::string t2 = tag + (accumulate ? " (accumulate)" : " (overwrite)");
    EXPECT_CLOSE(What<T>("AttentionBackward dq") + t2, g_dq.Download(), RoundTo<T>(dq), tol);
    EXPECT_CLOSE(What<T>("AttentionBackward dk") + t2, g_dk.Download(), RoundTo<T>(dk), tol);
    EXPECT_CLOSE(What<T>("AttentionBackward dv") + t2, g_dv.Download(), RoundTo<T>(dv), tol);
  }
}

std::vector<int32_t> Range(int32_t start, int32_t n) {
  std::vector<int32_t> v(n);
  for (int32_t i = 0; i < n; ++i) v[i] = start + i;
  return v;
}

// The context-parallel chunk pattern of docs/data.md: chunks c and 2C−1−c of a sequence.
std::vector<int32_t> CpChunks(int32_t T, int32_t C, int32_t c) {
  const int32_t chunk = T / (2 * C);
  std::vector<int32_t> v = Range(c * chunk, chunk);
  for (int32_t p : Range((2 * C - 1 - c) * chunk, chunk)) v.push_back(p);
  return v;
}

template <typename T>
void CheckAttentionSuite(gpu::AttentionAlgo algo, int64_t D) {
  CheckAttention<T>(2, 3, 50, 50, D, Range(0, 50), Range(0, 50), algo, "causal T=50");
  CheckAttention<T>(1, 2, 130, 130, D, Range(0, 130), Range(0, 130), algo, "causal T=130");
  // A ring step: queries later than every key (all visible), and one where the first rows see
  // no key at all (out = 0, lse = -inf).
  CheckAttention<T>(2, 2, 40, 70, D, Range(100, 40), Range(20, 70), algo, "ring block");
  CheckAttention<T>(1, 2, 70, 64, D, Range(0, 70), Range(10, 64), algo, "rows seeing nothing");
  CheckAttention<T>(1, 2, 64, 128, D, CpChunks(128, 2, 0), Range(0, 128), algo, "cp chunks");
}
GPU_TEST(AttentionGenericFloat) {
  CheckAttentionSuite<float>(gpu::AttentionAlgo::kGeneric, 16);
  CheckAttentionSuite<float>(gpu::AttentionAlgo::kGeneric, 64);
  CheckAttention<float>(1, 1, 40, 40, 128, Range(0, 40), Range(0, 40), gpu::AttentionAlgo::kGeneric,
                        "D=128");
}
GPU_TEST(AttentionGenericBf16) {
  CheckAttentionSuite<bf16>(gpu::AttentionAlgo::kGeneric, 64);
}
GPU_TEST(AttentionTensorCoreBf16) {
  EXPECT_TRUE(gpu::AttentionUsesTensorCores<bf16>(64));
  EXPECT_TRUE(!gpu::AttentionUsesTensorCores<float>(64));
  CheckAttentionSuite<bf16>(gpu::AttentionAlgo::kTensorCore, 64);
}

// q, k, v read in place from packed (B,T,3,H,D) rows and the output written as (B,T,H,D) rows,
// as the model does; compared with the contiguous CPU kernels.
template <typename T>
void CheckAttentionStrided(gpu::AttentionAlgo algo) {
  std::mt19937 rng(5);
  const int64_t B = 2, Tn = 96, H = 3, D = 64, C = H * D;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const auto qkv = RoundTo<T>(RandomVector(rng, B * Tn * 3 * C));
  std::vector<float> q(B * H * Tn * D), k(q.size()), v(q.size());
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < Tn; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t d = 0; d < D; ++d) {
          const int64_t dst = ((b * H + h) * Tn + t) * D + d, row = (b * Tn + t) * 3 * C;
          q[dst] = qkv[row + h * D + d];
          k[dst] = qkv[row + C + h * D + d];
          v[dst] = qkv[row + 2 * C + h * D + d];
        }
      }
    }
  }
  const auto pos = Range(0, Tn);
  std::vector<float> out(q.size()), lse(B * H * Tn);
  cpu::AttentionForward(out.data(), lse.data(), q.data(), k.data(), v.data(), pos.data(),
                        pos.data(), B, H, Tn, Tn, D, scale);
  std::vector<float> out_rows(B * Tn * C);  // (B,T,H,D)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < Tn; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t d = 0; d < D; ++d) {
          out_rows[(b * Tn + t) * C + h * D + d] = out[((b * H + h) * Tn + t) * D + d];
        }
      }
    }
  }
  auto d_qkv = DeviceArray<T>::FromHost(qkv);
  auto d_pos = DeviceArray<int32_t>::FromRaw(pos);
  DeviceArray<T> d_out(B * Tn * C);
  DeviceArray<float> d_lse(lse.size());
  gpu::AttentionOptions opt;
  opt.q = opt.k = opt.v = gpu::HeadLayout{Tn * 3 * C, D, 3 * C};
  opt.out = gpu::HeadLayout{Tn * C, D, C};
  opt.algo = algo;
  const T* base = d_qkv.get();
  ASSERT_OK(gpu::AttentionForward(Ctx(), d_out.get(), d_lse.get(), base, base + C, base + 2 * C,
                                  d_pos.get(), d_pos.get(), B, H, Tn, Tn, D, scale, opt));
  EXPECT_CLOSE(What<T>("AttentionForward strided out"), d_out.Download(), RoundTo<T>(out_rows),
               Tol<T>());
  EXPECT_CLOSE(What<T>("AttentionForward strided lse"), d_lse.Download(), lse,
               std::is_same_v<T, float> ? 1e-5 : 5e-3);

  // Backward into a packed dqkv (overwrite), against the CPU's split-head gradients.
  const auto dout_rows = RoundTo<T>(RandomVector(rng, B * Tn * C));
  std::vector<float> dout(q.size());
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < Tn; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t d = 0; d < D; ++d) {
          dout[((b * H + h) * Tn + t) * D + d] = dout_rows[(b * Tn + t) * C + h * D + d];
        }
      }
    }
  }
  std::vector<float> dq(q.size(), 0.0f), dk(q.size(), 0.0f), dv(q.size(), 0.0f);
  const auto out_r = RoundTo<T>(out);
  cpu::AttentionBackward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(),
                         out_r.data(), lse.data(), pos.data(), pos.data(), B, H, Tn, Tn, D, scale);
  std::vector<float> want(B * Tn * 3 * C);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < Tn; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t d = 0; d < D; ++d) {
          const int64_t src = ((b * H + h) * Tn + t) * D + d, row = (b * Tn + t) * 3 * C;
          want[row + h * D + d] = dq[src];
          want[row + C + h * D + d] = dk[src];
          want[row + 2 * C + h * D + d] = dv[src];
        }
      }
    }
  }
  auto d_dout = DeviceArray<T>::FromHost(dout_rows);
  auto d_out_r = DeviceArray<T>::FromHost(out_rows);
  auto d_lse_r = DeviceArray<float>::FromHost(lse);
  DeviceArray<T> d_dqkv(want.size());
  opt.accumulate = false;
  T* g = d_dqkv.get();
  ASSERT_OK(gpu::AttentionBackward(Ctx(), g, g + C, g + 2 * C, d_dout.get(), base, base + C,
                                   base + 2 * C, d_out_r.get(), d_lse_r.get(), d_pos.get(),
                                   d_pos.get(), B, H, Tn, Tn, D, scale, opt));
  EXPECT_CLOSE(What<T>("AttentionBackward strided dqkv"), d_dqkv.Download(), RoundTo<T>(want),
               std::is_same_v<T, float> ? 5e-5 : 3e-2);
}
GPU_TEST(AttentionStridedFloat) {
  CheckAttentionStrided<float>(gpu::AttentionAlgo::kGeneric);
}
GPU_TEST(AttentionStridedBf16Generic) {
  CheckAttentionStrided<bf16>(gpu::AttentionAlgo::kGeneric);
}
GPU_TEST(AttentionStridedBf16TensorCore) {
  CheckAttentionStrided<bf16>(gpu::AttentionAlgo::kTensorCore);
}

GPU_TEST(AttentionInvalidShapes) {
  gpu::AttentionOptions opt;
  opt.algo = gpu::AttentionAlgo::kTensorCore;
  DeviceArray<float> lse(4);
  const Status s = gpu::AttentionForward<bf16>(Ctx(), nullptr, lse.get(), nullptr, nullptr, nullptr,
                                               nullptr, nullptr, 1, 1, 4, 4, 32, 1.0, opt);
  EXPECT_TRUE(s.code() == StatusCode::kInvalidArgument);
}

template <typename T>
void CheckMerge() {
  std::mt19937 rng(6);
  const int64_t rows = 45, D = 40;
  auto out_a = RoundTo<T>(RandomVector(rng, rows * D)),
       out_b = RoundTo<T>(RandomVector(rng, rows * D));
  auto lse_a = RandomVector(rng, rows, -3.0f, 3.0f), lse_b = RandomVector(rng, rows, -3.0f, 3.0f);
  lse_a[3] = lse_a[10] = -INFINITY;
  lse_b[5] = lse_b[10] = -INFINITY;
  auto g_oa = DeviceArray<T>::FromHost(out_a), g_ob = DeviceArray<T>::FromHost(out_b);
  auto g_la = DeviceArray<float>::FromHost(lse_a), g_lb = DeviceArray<float>::FromHost(lse_b);
  cpu::AttentionMerge(out_a.data(), lse_a.data(), out_b.data(), lse_b.data(), rows, D);
  ASSERT_OK(gpu::AttentionMerge(Ctx(), g_oa.get(), g_la.get(), g_ob.get(), g_lb.get(), rows, D));
  EXPECT_CLOSE(What<T>("AttentionMerge out"), g_oa.Download(), RoundTo<T>(out_a), Tol<T>());
  EXPECT_CLOSE(What<T>("AttentionMerge lse"), g_la.Download(), lse_a, 1e-6);
}
GPU_TEST(AttentionMergeFloat) {
  CheckMerge<float>();
}
GPU_TEST(AttentionMergeBf16) {
  CheckMerge<bf16>();
}

template <typename T>
void CheckElementwise() {
  std::mt19937 rng(7);
  const int64_t n = 10007;
  const auto x = RoundTo<T>(RandomVector(rng, n, -4.0f, 4.0f)),
             y = RoundTo<T>(RandomVector(rng, n));
  auto d_x = DeviceArray<T>::FromHost(x), d_y = DeviceArray<T>::FromHost(y);
  DeviceArray<T> d_out(n);
  std::vector<float> want(n);
  cpu::GeluForward(want.data(), x.data(), n);
  ASSERT_OK(gpu::GeluForward(Ctx(), d_out.get(), d_x.get(), n));
  EXPECT_CLOSE(What<T>("GeluForward"), d_out.Download(), RoundTo<T>(want), Tol<T>());

  auto dinp = RoundTo<T>(RandomVector(rng, n));
  auto g_dinp = DeviceArray<T>::FromHost(dinp);
  cpu::GeluBackward(dinp.data(), x.data(), y.data(), n);
  ASSERT_OK(gpu::GeluBackward(Ctx(), g_dinp.get(), d_x.get(), d_y.get(), n));
  EXPECT_CLOSE(What<T>("GeluBackward (accumulate)"), g_dinp.Download(), RoundTo<T>(dinp), Tol<T>());
  // In place (dinp aliases dout), overwriting: what the model does.
  std::vector<float> inplace(n, 0.0f);
  cpu::GeluBackward(inplace.data(), x.data(), y.data(), n);
  auto g_y = DeviceArray<T>::FromHost(y);
  ASSERT_OK(gpu::GeluBackward(Ctx(), g_y.get(), d_x.get(), g_y.get(), n, /*accumulate=*/false));
  EXPECT_CLOSE(What<T>("GeluBackward (in place)"), g_y.Download(), RoundTo<T>(inplace), Tol<T>());

  std::vector<float> sum(n);
  cpu::ResidualForward(sum.data(), x.data(), y.data(), n);
  ASSERT_OK(gpu::ResidualForward(Ctx(), d_out.get(), d_x.get(), d_y.get(), n));
  EXPECT_CLOSE(What<T>("ResidualForward"), d_out.Download(), RoundTo<T>(sum), Tol<T>());
  cpu::Accumulate(sum.data(), y.data(), n);
  ASSERT_OK(gpu::Accumulate(Ctx(), d_out.get(), d_y.get(), n));
  EXPECT_CLOSE(What<T>("Accumulate"), d_out.Download(), RoundTo<T>(sum), Tol<T>());
}
GPU_TEST(ElementwiseFloat) {
  CheckElementwise<float>();
}
GPU_TEST(ElementwiseBf16) {
  CheckElementwise<bf16>();
}

template <typename T>
void CheckCrossEntropy(int64_t N, int64_t V, int64_t pad) {
  std::mt19937 rng(8);
  const int64_t ld = V + pad;
  const auto logits = RoundTo<T>(RandomVector(rng, N * V, -5.0f, 5.0f));
  auto targets = RandomInts(rng, N, 0, V - 1);
  if (N > 3) targets[N / 2] = targets[1] = -100;  // ignored (loss masks): no loss, no gradient
  std::vector<float> padded(N * ld, 7.0f);        // pad columns: garbage that must be ignored
  for (int64_t i = 0; i < N; ++i) {
    for (int64_t j = 0; j < V; ++j) padded[i * ld + j] = logits[i * V + j];
  }
  const float grad_scale = 1.0f / static_cast<float>(N);
  std::vector<float> losses(N), dlogits(N * V);
  cpu::SoftmaxCrossEntropy(losses.data(), dlogits.data(), logits.data(), targets.data(), N, V,
                           grad_scale);
  std::vector<float> want_d(N * ld, 0.0f);
  for (int64_t i = 0; i < N; ++i) {
    for (int64_t j = 0; j < V; ++j) want_d[i * ld + j] = dlogits[i * V + j];
  }
  auto d_logits = DeviceArray<T>::FromHost(padded);
  auto d_targets = DeviceArray<int32_t>::FromRaw(targets);
  DeviceArray<float> d_losses(N);
  // Loss only, then in place with the gradient (dlogits aliases logits).
  ASSERT_OK(gpu::SoftmaxCrossEntropy(Ctx(), d_losses.get(), static_cast<T*>(nullptr),
                                     d_logits.get(), d_targets.get(), N, V, grad_scale, ld));
  EXPECT_CLOSE(What<T>("SoftmaxCrossEntropy losses"), d_losses.Download(), losses, 1e-5);
  ASSERT_OK(gpu::SoftmaxCrossEntropy(Ctx(), d_losses.get(), d_logits.get(), d_logits.get(),
                                     d_targets.get(), N, V, grad_scale, ld));
  EXPECT_CLOSE(What<T>("SoftmaxCrossEntropy losses (with grad)"), d_losses.Download(), losses,
               1e-5);
  EXPECT_CLOSE(What<T>("SoftmaxCrossEntropy dlogits"), d_logits.Download(), RoundTo<T>(want_d),
               Tol<T>());
}
GPU_TEST(CrossEntropyFloat) {
  CheckCrossEntropy<float>(33, 257, 0);
  CheckCrossEntropy<float>(5, 50257, 47);
}
GPU_TEST(CrossEntropyBf16) {
  CheckCrossEntropy<bf16>(33, 256, 0);
  CheckCrossEntropy<bf16>(4, 50257, 47);
}

GPU_TEST(AdamWMatchesCpu) {
  std::mt19937 rng(9);
  const int64_t n = 5003;
  auto p = RandomVector(rng, n), m(std::vector<float>(n, 0.0f)), v(std::vector<float>(n, 0.0f));
  auto d_p = DeviceArray<float>::FromHost(p), d_m = DeviceArray<float>::FromHost(m),
       d_v = DeviceArray<float>::FromHost(v);
  DeviceArray<bf16> d_copy(n);
  for (int64_t step = 1; step <= 5; ++step) {
    auto g = RandomVector(rng, n);
    const double clip = step % 2 == 0 ? 0.37 : 1.0;  // the clip factor, folded into the read
    auto d_g = DeviceArray<float>::FromHost(g);
    cpu::Scale(g.data(), n, clip);
    cpu::AdamW(p.data(), g.data(), m.data(), v.data(), n, 1e-2, 0.9, 0.95, 1e-8, 0.1, step);
    ASSERT_OK(gpu::AdamW<bf16>(Ctx(), d_p.get(), d_g.get(), d_m.get(), d_v.get(), n, 1e-2, 0.9,
                               0.95, 1e-8, 0.1, step, static_cast<float>(clip), d_copy.get()));
  }
  EXPECT_CLOSE("AdamW param", d_p.Download(), p, 1e-5);
  EXPECT_CLOSE("AdamW exp_avg", d_m.Download(), m, 1e-5);
  EXPECT_CLOSE("AdamW exp_avg_sq", d_v.Download(), v, 1e-5);
  // The bf16 copy is the device's own fp32 result rounded (exactly), and the cpu's within one
  // bf16 step: the two fp32 results differ in the last bits, which can round apart.
  EXPECT_CLOSE("AdamW bf16 copy of the fp32 result", d_copy.Download(),
               RoundTo<bf16>(d_p.Download()), 1e-6);
  EXPECT_CLOSE("AdamW bf16 copy vs cpu", d_copy.Download(), p, 1e-2);
}

GPU_TEST(Reductions) {
  std::mt19937 rng(10);
  const int64_t n = 1000003;
  const auto x = RandomVector(rng, n);
  auto d_x = DeviceArray<float>::FromHost(x);
  double want_sq = 0, want_sum = 0;
  for (float f : x) {
    want_sq += static_cast<double>(f) * f;
    want_sum += f;
  }
  ASSERT_OK_AND_ASSIGN(const double sq, gpu::SumOfSquares(Ctx(), d_x.get(), n));
  ASSERT_OK_AND_ASSIGN(const double sum, gpu::Sum(Ctx(), d_x.get(), n));
  EXPECT_NEAR(sq, cpu::SumOfSquares(x.data(), n), 1e-9 * want_sq);
  EXPECT_NEAR(sum, want_sum, 1e-9 * n);
  ASSERT_OK_AND_ASSIGN(const double again, gpu::SumOfSquares(Ctx(), d_x.get(), n));
  EXPECT_TRUE(again == sq);  // deterministic

  auto y = x;
  cpu::Scale(y.data(), n, 0.25);
  ASSERT_OK(gpu::Scale(Ctx(), d_x.get(), n, 0.25));
  EXPECT_CLOSE("Scale", d_x.Download(), y, 1e-7);

  const int64_t rows = 300, cols = 70, ld = 77;
  const auto m = RandomVector(rng, rows * ld);
  std::vector<float> want(cols, 1.0f);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) want[j] += m[i * ld + j];
  }
  auto d_m = DeviceArray<float>::FromHost(m);
  auto d_out = DeviceArray<float>::FromHost(std::vector<float>(cols, 1.0f));
  ASSERT_OK(gpu::ColumnSum(Ctx(), d_out.get(), d_m.get(), rows, cols, ld));
  EXPECT_CLOSE("ColumnSum", d_out.Download(), want, 1e-5);
}

GPU_TEST(ConvertRoundsToBf16) {
  std::mt19937 rng(11);
  const auto x = RandomVector(rng, 999, -100.0f, 100.0f);
  auto d_x = DeviceArray<float>::FromHost(x);
  DeviceArray<bf16> d_b(x.size());
  DeviceArray<float> d_back(x.size());
  ASSERT_OK((gpu::Convert<bf16, float>(Ctx(), d_b.get(), d_x.get(), x.size())));
  ASSERT_OK((gpu::Convert<float, bf16>(Ctx(), d_back.get(), d_b.get(), x.size())));
  EXPECT_CLOSE("Convert fp32->bf16->fp32", d_back.Download(), RoundTo<bf16>(x), 0.0);
}

// ---- the ops of the one model beyond the GPT-2 set (engine/cuda/model_ops.cu), float32.
GPU_TEST(RMSNormFloat) {
  std::mt19937 rng(21);
  const int64_t N = 33, C = 80;
  const auto x = RandomVector(rng, N * C), w = RandomVector(rng, C), dy = RandomVector(rng, N * C);
  std::vector<float> out(N * C), rstd(N), dx = RandomVector(rng, N * C), dw = RandomVector(rng, C);
  auto d_x = DeviceArray<float>::FromHost(x), d_w = DeviceArray<float>::FromHost(w),
       d_dy = DeviceArray<float>::FromHost(dy), d_dx = DeviceArray<float>::FromHost(dx),
       d_dw = DeviceArray<float>::FromHost(dw);
  DeviceArray<float> d_out(N * C), d_rstd(N);
  cpu::RMSNormForward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5);
  cpu::RMSNormBackward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), N, C);
  ASSERT_OK(
      gpu::RMSNormForward(Ctx(), d_out.get(), d_rstd.get(), d_x.get(), d_w.get(), N, C, 1e-5));
  ASSERT_OK(gpu::RMSNormBackward(Ctx(), d_dx.get(), d_dw.get(), d_dy.get(), d_x.get(), d_w.get(),
                                 d_rstd.get(), N, C));
  EXPECT_CLOSE("RMSNormForward", d_out.Download(), out, 2e-5);
  EXPECT_CLOSE("RMSNorm rstd", d_rstd.Download(), rstd, 2e-5);
  EXPECT_CLOSE("RMSNormBackward dinp", d_dx.Download(), dx, 2e-5);
  EXPECT_CLOSE("RMSNormBackward dweight", d_dw.Download(), dw, 2e-5);
}

GPU_TEST(SwiGLUFloat) {
  std::mt19937 rng(22);
  const int64_t N = 29, F = 70;
  const auto gu = RandomVector(rng, N * 2 * F, -4, 4), dy = RandomVector(rng, N * F);
  std::vector<float> out(N * F), dgu = RandomVector(rng, N * 2 * F);
  auto d_gu = DeviceArray<float>::FromHost(gu), d_dy = DeviceArray<float>::FromHost(dy),
       d_dgu = DeviceArray<float>::FromHost(dgu);
  DeviceArray<float> d_out(N * F);
  cpu::SwiGLUForward(out.data(), gu.data(), N, F);
  cpu::SwiGLUBackward(dgu.data(), gu.data(), dy.data(), N, F);
  ASSERT_OK(gpu::SwiGLUForward(Ctx(), d_out.get(), d_gu.get(), N, F));
  ASSERT_OK(gpu::SwiGLUBackward(Ctx(), d_dgu.get(), d_gu.get(), d_dy.get(), N, F));
  EXPECT_CLOSE("SwiGLUForward", d_out.Download(), out, 2e-5);
  EXPECT_CLOSE("SwiGLUBackward", d_dgu.Download(), dgu, 2e-5);
}

GPU_TEST(RopeFloat) {
  std::mt19937 rng(23);
  const int64_t BH = 6, Tn = 11, D = 16;
  auto x = RandomVector(rng, BH * Tn * D), dx = RandomVector(rng, BH * Tn * D);
  const auto cs = RandomVector(rng, Tn * D / 2), sn = RandomVector(rng, Tn * D / 2);
  auto d_x = DeviceArray<float>::FromHost(x), d_dx = DeviceArray<float>::FromHost(dx),
       d_c = DeviceArray<float>::FromHost(cs), d_s = DeviceArray<float>::FromHost(sn);
  cpu::RopeForward(x.data(), cs.data(), sn.data(), BH, Tn, D);
  cpu::RopeBackward(dx.data(), cs.data(), sn.data(), BH, Tn, D);
  ASSERT_OK(gpu::RopeForward(Ctx(), d_x.get(), d_c.get(), d_s.get(), BH, Tn, D));
  ASSERT_OK(gpu::RopeBackward(Ctx(), d_dx.get(), d_c.get(), d_s.get(), BH, Tn, D));
  EXPECT_CLOSE("RopeForward", d_x.Download(), x, 2e-5);
  EXPECT_CLOSE("RopeBackward", d_dx.Download(), dx, 2e-5);
}

GPU_TEST(EmbeddingRowsAndPositionsFloat) {
  std::mt19937 rng(24);
  const int64_t N = 41, C = 24, first = 30, rows = 25, V = 80;
  const auto tokens = RandomInts(rng, N, 0, V - 1), pos = RandomInts(rng, N, 0, 9);
  const auto table = RandomVector(rng, rows * C), wpe = RandomVector(rng, 10 * C),
             dout = RandomVector(rng, N * C);
  std::vector<float> out(N * C), dtable = RandomVector(rng, rows * C);
  auto d_tok = DeviceArray<int32_t>::FromRaw(tokens), d_pos = DeviceArray<int32_t>::FromRaw(pos);
  auto d_table = DeviceArray<float>::FromHost(table), d_wpe = DeviceArray<float>::FromHost(wpe),
       d_dout = DeviceArray<float>::FromHost(dout), d_dtable = DeviceArray<float>::FromHost(dtable);
  DeviceArray<float> d_out(N * C);
  cpu::EmbeddingRowsForward(out.data(), tokens.data(), table.data(), first, rows, N, C);
  cpu::AddRows(out.data(), wpe.data(), pos.data(), N, C);
  cpu::EmbeddingRowsBackward(dtable.data(), dout.data(), tokens.data(), first, rows, N, C);
  ASSERT_OK(
      gpu::EmbeddingRowsForward(Ctx(), d_out.get(), d_tok.get(), d_table.get(), first, rows, N, C));
  ASSERT_OK(gpu::AddRows(Ctx(), d_out.get(), d_wpe.get(), d_pos.get(), N, C));
  ASSERT_OK(gpu::EmbeddingRowsBackward(Ctx(), d_dtable.get(), d_dout.get(), d_tok.get(), first,
                                       rows, N, C));
  EXPECT_CLOSE("EmbeddingRowsForward + AddRows", d_out.Download(), out, 1e-6);
  EXPECT_CLOSE("EmbeddingRowsBackward", d_dtable.Download(), dtable, 1e-5);
}

GPU_TEST(BiasRowsFloat) {
  std::mt19937 rng(25);
  const int64_t N = 300, C = 45;
  auto x = RandomVector(rng, N * C), db = RandomVector(rng, C);
  const auto b = RandomVector(rng, C), dout = RandomVector(rng, N * C);
  auto d_x = DeviceArray<float>::FromHost(x), d_b = DeviceArray<float>::FromHost(b),
       d_db = DeviceArray<float>::FromHost(db), d_dout = DeviceArray<float>::FromHost(dout);
  cpu::AddBias(x.data(), b.data(), N, C);
  cpu::BiasBackward(db.data(), dout.data(), N, C);
  ASSERT_OK(gpu::AddBias(Ctx(), d_x.get(), d_b.get(), N, C));
  ASSERT_OK(gpu::ColumnSum(Ctx(), d_db.get(), d_dout.get(), N, C, C));
  EXPECT_CLOSE("AddBias", d_x.Download(), x, 1e-6);
  EXPECT_CLOSE("BiasBackward (ColumnSum)", d_db.Download(), db, 1e-5);
}

GPU_TEST(VocabShardCrossEntropyFloat) {
  std::mt19937 rng(26);
  const int64_t N = 19, V = 37, shards = 3, first = 37;
  const auto logits = RandomVector(rng, N * V, -5, 5);
  auto targets = RandomInts(rng, N, 0, static_cast<int32_t>(shards * V - 1));
  targets[5] = -100;  // ignored (loss masks): no loss, no gradient
  // Stats of this shard, then every shard's stats (the others random) as after the all-gather.
  std::vector<float> stats(2 * N), all = RandomVector(rng, shards * 2 * N, -3, 3);
  cpu::VocabShardStats(stats.data(), logits.data(), targets.data(), first, N, V);
  auto d_logits = DeviceArray<float>::FromHost(logits);
  auto d_tg = DeviceArray<int32_t>::FromRaw(targets);
  DeviceArray<float> d_stats(2 * N);
  ASSERT_OK(gpu::VocabShardStats(Ctx(), d_stats.get(), d_logits.get(), d_tg.get(), first, N, V));
  EXPECT_CLOSE("VocabShardStats", d_stats.Download(), stats, 2e-5);
  std::copy(stats.begin(), stats.end(), all.begin() + 2 * N);  // this rank is shard 1
  std::vector<float> losses(N), lse(N), dlogits(N * V);
  cpu::VocabShardLoss(losses.data(), lse.data(), all.data(), targets.data(), shards, N);
  cpu::VocabShardGrad(dlogits.data(), logits.data(), lse.data(), targets.data(), first, N, V,
                      0.25f);
  auto d_all = DeviceArray<float>::FromHost(all);
  DeviceArray<float> d_losses(N), d_lse(N), d_dlogits(N * V);
  ASSERT_OK(
      gpu::VocabShardLoss(Ctx(), d_losses.get(), d_lse.get(), d_all.get(), d_tg.get(), shards, N));
  ASSERT_OK(gpu::VocabShardGrad(Ctx(), d_dlogits.get(), d_logits.get(), d_lse.get(), d_tg.get(),
                                first, N, V, 0.25f));
  EXPECT_CLOSE("VocabShardLoss", d_losses.Download(), losses, 2e-5);
  EXPECT_CLOSE("VocabShardLoss lse", d_lse.Download(), lse, 2e-5);
  EXPECT_CLOSE("VocabShardGrad", d_dlogits.Download(), dlogits, 2e-5);
}

GPU_TEST(AttentionLayoutsFloat) {
  std::mt19937 rng(27);
  const int64_t B = 2, Tn = 7, H = 4, K = 2, D = 8, W = (H + 2 * K) * D, n = 3;
  const auto qkv = RandomVector(rng, B * Tn * W);
  const int64_t heads = B * H * Tn * D;
  std::vector<float> q(heads), k(heads), v(heads);
  cpu::SplitHeads(q.data(), k.data(), v.data(), qkv.data(), B, Tn, H, K, D);
  auto d_qkv = DeviceArray<float>::FromHost(qkv);
  DeviceArray<float> d_q(heads), d_k(heads), d_v(heads);
  ASSERT_OK(gpu::SplitHeads(Ctx(), d_q.get(), d_k.get(), d_v.get(), d_qkv.get(), B, Tn, H, K, D));
  EXPECT_CLOSE("SplitHeads q", d_q.Download(), q, 1e-7);
  EXPECT_CLOSE("SplitHeads k", d_k.Download(), k, 1e-7);
  EXPECT_CLOSE("SplitHeads v", d_v.Download(), v, 1e-7);

  const auto dq = RandomVector(rng, heads), dk = RandomVector(rng, heads),
             dv = RandomVector(rng, heads);
  std::vector<float> dqkv(B * Tn * W);
  cpu::MergeQkvGrads(dqkv.data(), dq.data(), dk.data(), dv.data(), B, Tn, H, K, D);
  auto d_dq = DeviceArray<float>::FromHost(dq), d_dk = DeviceArray<float>::FromHost(dk),
       d_dv = DeviceArray<float>::FromHost(dv);
  DeviceArray<float> d_dqkv(B * Tn * W);
  ASSERT_OK(
      gpu::MergeQkvGrads(Ctx(), d_dqkv.get(), d_dq.get(), d_dk.get(), d_dv.get(), B, Tn, H, K, D));
  EXPECT_CLOSE("MergeQkvGrads", d_dqkv.Download(), dqkv, 1e-6);

  std::vector<float> rows(heads), back(heads);
  cpu::HeadsToRows(rows.data(), q.data(), B, Tn, H, D);
  cpu::RowsToHeads(back.data(), dq.data(), B, Tn, H, D);
  DeviceArray<float> d_rows(heads), d_back(heads);
  ASSERT_OK(gpu::HeadsToRows(Ctx(), d_rows.get(), d_q.get(), B, Tn, H, D));
  ASSERT_OK(gpu::RowsToHeads(Ctx(), d_back.get(), d_dq.get(), B, Tn, H, D));
  EXPECT_CLOSE("HeadsToRows", d_rows.Download(), rows, 1e-7);
  EXPECT_CLOSE("RowsToHeads", d_back.Download(), back, 1e-7);

  const auto blocks = RandomVector(rng, n * heads);
  std::vector<float> seq(n * heads), blocks_back(n * heads);
  cpu::BlocksToSequence(seq.data(), blocks.data(), n, B * H, Tn, D);
  cpu::SequenceToBlocks(blocks_back.data(), seq.data(), n, B * H, Tn, D);
  auto d_blocks = DeviceArray<float>::FromHost(blocks);
  DeviceArray<float> d_seq(n * heads), d_blocks_back(n * heads);
  ASSERT_OK(gpu::BlocksToSequence(Ctx(), d_seq.get(), d_blocks.get(), n, B * H, Tn, D));
  ASSERT_OK(gpu::SequenceToBlocks(Ctx(), d_blocks_back.get(), d_seq.get(), n, B * H, Tn, D));
  EXPECT_CLOSE("BlocksToSequence", d_seq.Download(), seq, 1e-7);
  EXPECT_CLOSE("SequenceToBlocks", d_blocks_back.Download(), blocks_back, 1e-7);
}

}  // namespace
}  // namespace meshrun

GPU_TEST_MAIN()
