// The CUDA attention kernels with a lower bound per query (q_lo: sliding windows, documents)
// against the CPU kernel (itself checked against a naive reference in
// tests/engine/kernels/attention_mask_test.cc): generic float32 and bf16, tensor-core bf16;
// whole sequences, a cp chunk pair against every key, and ring blocks with rows that see nothing.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <vector>

#include "engine/cuda/context.h"
#include "engine/cuda/kernels.h"
#include "engine/kernels/cpu/kernels.h"
#include "tests/gpu/gpu_test.h"

namespace meshrun {
namespace {

using gpu::bf16;
using gpu::CudaContext;
using gputest::DeviceArray;
using gputest::RandomVector;
using gputest::RoundTo;

CudaContext& MaskCtx() {
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

std::vector<int32_t> MaskRange(int32_t start, int32_t n) {
  std::vector<int32_t> v(n);
  for (int32_t i = 0; i < n; ++i) v[i] = start + i;
  return v;
}

// q_lo of B sequences at query positions qp: window W (0: none) and, with docs, documents that
// end every `every` positions (shifted per sequence).
std::vector<int32_t> MaskLowerBounds(int64_t B, const std::vector<int32_t>& qp, int window,
                                     int every) {
  std::vector<int32_t> lo;
  for (int64_t b = 0; b < B; ++b) {
    for (int32_t p : qp) {
      int32_t l = INT_MIN;
      if (every > 0) {
        const int32_t shift = static_cast<int32_t>(3 * b);
        l = p < shift ? 0 : shift + (p - shift) / every * every;
      }
      if (window > 0) l = std::max(l, p - window + 1);
      lo.push_back(l);
    }
  }
  return lo;
}

template <typename T>
void CheckMaskedAttention(int64_t B, int64_t H, int64_t Tq, int64_t Tk, int64_t D,
                          const std::vector<int32_t>& q_pos, const std::vector<int32_t>& k_pos,
                          const std::vector<int32_t>& q_lo, gpu::AttentionAlgo algo,
                          const std::string& label) {
  std::mt19937 rng(7);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const auto q = RoundTo<T>(RandomVector(rng, B * H * Tq * D)),
             k = RoundTo<T>(RandomVector(rng, B * H * Tk * D)),
             v = RoundTo<T>(RandomVector(rng, B * H * Tk * D));
  std::vector<float> out(B * H * Tq * D), lse(B * H * Tq);
  cpu::AttentionForward(out.data(), lse.data(), q.data(), k.data(), v.data(), q_pos.data(),
                        k_pos.data(), B, H, Tq, Tk, D, scale, q_lo.data());
  auto d_q = DeviceArray<T>::FromHost(q), d_k = DeviceArray<T>::FromHost(k),
       d_v = DeviceArray<T>::FromHost(v);
  auto d_qp = DeviceArray<int32_t>::FromRaw(q_pos), d_kp = DeviceArray<int32_t>::FromRaw(k_pos),
       d_lo = DeviceArray<int32_t>::FromRaw(q_lo);
  DeviceArray<T> d_out(out.size());
  DeviceArray<float> d_lse(lse.size());
  gpu::AttentionOptions opt;
  opt.algo = algo;
  opt.q_lo = d_lo.get();
  ASSERT_OK(gpu::AttentionForward(MaskCtx(), d_out.get(), d_lse.get(), d_q.get(), d_k.get(),
                                  d_v.get(), d_qp.get(), d_kp.get(), B, H, Tq, Tk, D, scale, opt));
  const bool fp32 = std::is_same_v<T, float>;
  const std::string tag = std::string(fp32 ? " fp32 " : " bf16 ") + label;
  EXPECT_CLOSE("masked AttentionForward out" + tag, d_out.Download(), RoundTo<T>(out),
               fp32 ? 2e-5 : 2e-2);
  EXPECT_CLOSE("masked AttentionForward lse" + tag, d_lse.Download(), lse, fp32 ? 1e-5 : 5e-3);
  const auto out_r = RoundTo<T>(out);
  auto d_out_r = DeviceArray<T>::FromHost(out_r);
  auto d_lse_r = DeviceArray<float>::FromHost(lse);
  const auto dout = RoundTo<T>(RandomVector(rng, out.size()));
  std::vector<float> dq(q.size(), 0.0f), dk(k.size(), 0.0f), dv(v.size(), 0.0f);
  auto g_dq = DeviceArray<T>::FromHost(dq), g_dk = DeviceArray<T>::FromHost(dk),
       g_dv = DeviceArray<T>::FromHost(dv), g_dout = DeviceArray<T>::FromHost(dout);
  cpu::AttentionBackward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(),
                         out_r.data(), lse.data(), q_pos.data(), k_pos.data(), B, H, Tq, Tk, D,
                         scale, q_lo.data());
  ASSERT_OK(gpu::AttentionBackward(MaskCtx(), g_dq.get(), g_dk.get(), g_dv.get(), g_dout.get(),
                                   d_q.get(), d_k.get(), d_v.get(), d_out_r.get(), d_lse_r.get(),
                                   d_qp.get(), d_kp.get(), B, H, Tq, Tk, D, scale, opt));
  const double tol = fp32 ? 5e-5 : 3e-2;
  EXPECT_CLOSE("masked AttentionBackward dq" + tag, g_dq.Download(), RoundTo<T>(dq), tol);
  EXPECT_CLOSE("masked AttentionBackward dk" + tag, g_dk.Download(), RoundTo<T>(dk), tol);
  EXPECT_CLOSE("masked AttentionBackward dv" + tag, g_dv.Download(), RoundTo<T>(dv), tol);
}

template <typename T>
void CheckMaskSuite(gpu::AttentionAlgo algo, int64_t D) {
  const int64_t B = 2, H = 2, T = 192;
  const std::vector<int32_t> all = MaskRange(0, T);
  for (const auto& [window, every] :
       {std::pair{1, 0}, std::pair{9, 0}, std::pair{70, 0}, std::pair{0, 23}, std::pair{40, 50}}) {
    const std::string label =
        "window " + std::to_string(window) + " documents every " + std::to_string(every);
    CheckMaskedAttention<T>(B, H, T, T, D, all, all, MaskLowerBounds(B, all, window, every), algo,
                            label);
    // cp 2, rank 0: chunks 0 and 3 of 4 against every key (allgather).
    std::vector<int32_t> pair = MaskRange(0, T / 4);
    for (int32_t p : MaskRange(3 * T / 4, T / 4)) pair.push_back(p);
    CheckMaskedAttention<T>(B, H, T / 2, T, D, pair, all, MaskLowerBounds(B, pair, window, every),
                            algo, label + " cp chunks");
    // A ring block of later keys: many rows see none of them.
    CheckMaskedAttention<T>(B, H, T / 2, T / 2, D, pair, MaskRange(T / 4, T / 2),
                            MaskLowerBounds(B, pair, window, every), algo, label + " ring block");
  }
}

GPU_TEST(MaskedAttentionGenericFloat) {
  CheckMaskSuite<float>(gpu::AttentionAlgo::kGeneric, 16);
  CheckMaskSuite<float>(gpu::AttentionAlgo::kGeneric, 64);
}
GPU_TEST(MaskedAttentionGenericBf16) {
  CheckMaskSuite<bf16>(gpu::AttentionAlgo::kGeneric, 64);
}
GPU_TEST(MaskedAttentionTensorCoreBf16) {
  CheckMaskSuite<bf16>(gpu::AttentionAlgo::kTensorCore, 64);
}

}  // namespace
}  // namespace meshrun

GPU_TEST_MAIN()
