// The body of TileGemm (tile_gemm.h) for one instruction set. tile_gemm.cc includes this file
// once per instruction set, inside a namespace and a `#pragma GCC target` region that define:
//   kVecBytes            vector width in bytes (16 SSE2, 32 AVX2, 64 AVX-512)
//   kMR                  rows of the register tile (2·kMR accumulators fit the vector file)
//   Fma(a, b, c)         a·b + c on one vector of float and of double, fused where the ISA can
//   Splat(x)             a vector of x, for float and double (one broadcast instruction)
// No include guard: it is meant to be included several times. Nothing here allocates.

template <typename T>
struct VecOf;
template <>
struct VecOf<float> {
  typedef float type __attribute__((vector_size(kVecBytes)));
};
template <>
struct VecOf<double> {
  typedef double type __attribute__((vector_size(kVecBytes)));
};
template <typename T>
using V = typename VecOf<T>::type;

template <typename T>
constexpr int kLanes = kVecBytes / static_cast<int>(sizeof(T));

template <typename T>
inline V<T> Load(const T* p) {
  V<T> v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}
template <typename T>
inline void Store(T* p, V<T> v) {
  __builtin_memcpy(p, &v, sizeof(v));
}

// C[MR, NV·L] (+)= alpha · op(A)[MR, k] · B[k, NV·L]; every column of the tile is in range.
template <typename T, int MR, int NV, bool kTransA>
inline void Tile(int64_t k, T alpha, const T* __restrict A, int64_t lda, const T* __restrict B,
                 int64_t ldb, bool accumulate, T* __restrict C, int64_t ldc) {
  constexpr int L = kLanes<T>;
  V<T> acc[MR][NV];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = V<T>{};
  }
  for (int64_t p = 0; p < k; ++p) {
    V<T> b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) b[v] = Load(B + p * ldb + v * L);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const V<T> a = Splat(kTransA ? A[p * lda + r] : A[r * lda + p]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = Fma(a, b[v], acc[r][v]);
    }
  }
  const V<T> al = Splat(alpha);
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      T* c = C + r * ldc + v * L;
      Store(c, accumulate ? Fma(al, acc[r][v], Load(c)) : al * acc[r][v]);
    }
  }
}

// Rows [0, m) of the tile columns starting at B, C: full kMR-row tiles, then one tile of the
// remaining m mod kMR rows (each row count compiled on its own, so the tail runs as fast).
template <typename T, int NV, bool kTransA>
inline void Columns(int64_t m, int64_t k, T alpha, const T* A, int64_t lda, const T* B, int64_t ldb,
                    bool accumulate, T* C, int64_t ldc) {
  const int64_t a_row = kTransA ? 1 : lda;  // distance between rows of op(A)
  int64_t i = 0;
  for (; i + kMR <= m; i += kMR) {
    Tile<T, kMR, NV, kTransA>(k, alpha, A + i * a_row, lda, B, ldb, accumulate, C + i * ldc, ldc);
  }
  const int rest = static_cast<int>(m - i);
  if (rest == 0) return;
  const T* a = A + i * a_row;
  T* c = C + i * ldc;
  [&]<int... R>(std::integer_sequence<int, R...>) {
    ((rest == R + 1 ? Tile<T, R + 1, NV, kTransA>(k, alpha, a, lda, B, ldb, accumulate, c, ldc)
                    : void()),
     ...);
  }
  (std::make_integer_sequence<int, kMR - 1>{});
}

template <typename T, bool kTransA>
void TileGemmImpl(int64_t m, int64_t n, int64_t k, T alpha, const T* A, int64_t lda, const T* B,
                  int64_t ldb, bool accumulate, T* C, int64_t ldc) {
  constexpr int L = kLanes<T>;
  int64_t j = 0;
  for (; j + 2 * L <= n; j += 2 * L) {
    Columns<T, 2, kTransA>(m, k, alpha, A, lda, B + j, ldb, accumulate, C + j, ldc);
  }
  if (j + L <= n) {
    Columns<T, 1, kTransA>(m, k, alpha, A, lda, B + j, ldb, accumulate, C + j, ldc);
    j += L;
  }
  if (j == n) return;
  // Fewer than one vector of columns left: plain loops, the same order of summation.
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t jj = j; jj < n; ++jj) {
      T s = 0;
      for (int64_t p = 0; p < k; ++p) {
        s += (kTransA ? A[p * lda + i] : A[i * lda + p]) * B[p * ldb + jj];
      }
      T& c = C[i * ldc + jj];
      c = accumulate ? c + alpha * s : alpha * s;
    }
  }
}
