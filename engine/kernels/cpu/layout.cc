// Data movement of the model: head split/merge of the fused qkv rows, (B,H,T,D) ↔ (B,T,H·D),
// context-parallel blocks ↔ one sequence, bias rows and the position embedding's rows.
#include <algorithm>
#include <cstring>

#include "engine/kernels/cpu/kernel_internal.h"
#include "engine/kernels/cpu/kernels.h"

namespace meshrun::cpu {

template <typename T>
void SplitHeads(T* q, T* k, T* v, const T* qkv, int64_t B, int64_t Tn, int64_t H, int64_t K,
                int64_t D) {
  const int64_t W = (H + 2 * K) * D, group = H / K;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < Tn; ++t) {
      const T* row = qkv + (b * Tn + t) * W;
      for (int64_t h = 0; h < H; ++h) {
        const int64_t dst = ((b * H + h) * Tn + t) * D;
        const int64_t kv = h / group;
        std::memcpy(q + dst, row + h * D, sizeof(T) * D);
        std::memcpy(k + dst, row + (H + kv) * D, sizeof(T) * D);
        std::memcpy(v + dst, row + (H + K + kv) * D, sizeof(T) * D);
      }
    }
  }
}

template <typename T>
void MergeQkvGrads(T* dqkv, const T* dq, const T* dk, const T* dv, int64_t B, int64_t Tn, int64_t H,
                   int64_t K, int64_t D) {
  const int64_t W = (H + 2 * K) * D, group = H / K;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < Tn; ++t) {
      T* row = dqkv + (b * Tn + t) * W;
      std::memset(row + H * D, 0, sizeof(T) * 2 * K * D);
      for (int64_t h = 0; h < H; ++h) {
        const int64_t src = ((b * H + h) * Tn + t) * D;
        const int64_t kv = h / group;
        std::memcpy(row + h * D, dq + src, sizeof(T) * D);
        T* rk = row + (H + kv) * D;
        T* rv = row + (H + K + kv) * D;
        for (int64_t d = 0; d < D; ++d) {
          rk[d] += dk[src + d];
          rv[d] += dv[src + d];
        }
      }
    }
  }
}

namespace {

template <typename T>
void TransposeHeads(T* rows, T* heads, int64_t B, int64_t Tn, int64_t H, int64_t D, bool to_rows) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < Tn; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        T* r = rows + (b * Tn + t) * H * D + h * D;
        T* x = heads + ((b * H + h) * Tn + t) * D;
        if (to_rows) {
          std::memcpy(r, x, sizeof(T) * D);
        } else {
          std::memcpy(x, r, sizeof(T) * D);
        }
      }
    }
  }
}

template <typename T>
void Blocks(T* blocks, T* seq, int64_t n, int64_t BH, int64_t Tl, int64_t D, bool to_seq) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t bh = 0; bh < BH; ++bh) {
      T* blk = blocks + ((j * BH + bh) * Tl) * D;
      T* dst = seq + (bh * n * Tl + j * Tl) * D;
      if (to_seq) {
        std::memcpy(dst, blk, sizeof(T) * Tl * D);
      } else {
        std::memcpy(blk, dst, sizeof(T) * Tl * D);
      }
    }
  }
}

}  // namespace

template <typename T>
void HeadsToRows(T* rows, const T* heads, int64_t B, int64_t Tn, int64_t H, int64_t D) {
  TransposeHeads(rows, const_cast<T*>(heads), B, Tn, H, D, /*to_rows=*/true);
}

template <typename T>
void RowsToHeads(T* heads, const T* rows, int64_t B, int64_t Tn, int64_t H, int64_t D) {
  TransposeHeads(const_cast<T*>(rows), heads, B, Tn, H, D, /*to_rows=*/false);
}

template <typename T>
void BlocksToSequence(T* seq, const T* blocks, int64_t n, int64_t BH, int64_t Tl, int64_t D) {
  Blocks(const_cast<T*>(blocks), seq, n, BH, Tl, D, /*to_seq=*/true);
}

template <typename T>
void SequenceToBlocks(T* blocks, const T* seq, int64_t n, int64_t BH, int64_t Tl, int64_t D) {
  Blocks(blocks, const_cast<T*>(seq), n, BH, Tl, D, /*to_seq=*/false);
}

template <typename T>
void AddBias(T* out, const T* bias, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    for (int64_t j = 0; j < C; ++j) out[i * C + j] += bias[j];
  }
}

template <typename T>
void BiasBackward(T* dbias, const T* dout, int64_t N, int64_t C) {
  // Parallel over blocks of 64 columns, each block's rows read contiguously and summed in row
  // order in vector lanes: the sums of one column per thread over strided rows it replaces,
  // bit for bit (each column still adds its rows in order), without reading a row's cache line
  // once per column.
  constexpr int64_t kCols = 64;
  const int64_t n_tasks = (C + kCols - 1) / kCols;
#pragma omp parallel for schedule(static) if (internal::WorthParallel(N * C))
  for (int64_t t = 0; t < n_tasks; ++t) {
    const int64_t j0 = t * kCols;
    const int64_t nj = std::min(kCols, C - j0);
    T acc[kCols] = {};
    for (int64_t i = 0; i < N; ++i) {
      const T* d = dout + i * C + j0;
#pragma omp simd
      for (int64_t j = 0; j < nj; ++j) acc[j] += d[j];
    }
    for (int64_t j = 0; j < nj; ++j) dbias[j0 + j] += acc[j];
  }
}

template <typename T>
void AddRows(T* x, const T* table, const int32_t* idx, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const T* row = table + static_cast<int64_t>(idx[i]) * C;
    for (int64_t c = 0; c < C; ++c) x[i * C + c] += row[c];
  }
}

MESHRUN_INSTANTIATE_CPU_KERNELS(SplitHeads, MergeQkvGrads, HeadsToRows, RowsToHeads,
                                BlocksToSequence, SequenceToBlocks, AddBias, BiasBackward, AddRows)

}  // namespace meshrun::cpu
