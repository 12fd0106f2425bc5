// Thread count of the CPU kernels: one setting shared by the OpenMP loops and by OpenBLAS, so
// the rank's cores are used by exactly one pool at a time.
#include <atomic>

#include "engine/kernels/cpu/kernels.h"

#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef MESHRUN_HAVE_OPENBLAS
#include <cblas.h>
#endif

namespace meshrun::cpu {
namespace {
// Only read when there is no OpenMP (then the kernels run serially but BLAS may still thread).
std::atomic<int> g_num_threads{1};
}  // namespace

void SetNumThreads(int n) {
  if (n <= 0) return;
  g_num_threads = n;
#ifdef _OPENMP
  omp_set_num_threads(n);
#endif
#ifdef MESHRUN_HAVE_OPENBLAS
#ifdef _OPENMP
  // Gemm splits each product over the OpenMP team itself (matmul.cc, BlasPanels): a second
  // pool of OpenBLAS threads would only spin against it.
  openblas_set_num_threads(1);
#else
  openblas_set_num_threads(n);
#endif
#endif
}

int NumThreads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return g_num_threads;
#endif
}

}  // namespace meshrun::cpu
