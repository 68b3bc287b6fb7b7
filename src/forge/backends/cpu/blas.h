#pragma once
// The BLAS helpers the CPU kernels share (internal to backends/cpu).
//
// gemm: C (m, n) = alpha * op(A) op(B) + beta * C, row-major, through OpenBLAS. Empty
// products are handled here (BLAS rejects some leading dimensions of empty matrices):
// k == 0 gives beta * C (C zeroed when beta == 0, so NaN garbage never survives).
// SerialBlasScope: holds OpenBLAS to one thread while OpenMP threads each call it
// (restored on exit), so the two thread pools do not oversubscribe the cores.
#include <cblas.h>

#include <cstdint>
#include <type_traits>

extern "C" {
int openblas_get_num_threads(void);
void openblas_set_num_threads(int num_threads);
}

namespace forge::cpu {

class SerialBlasScope {
 public:
  explicit SerialBlasScope(bool active) : saved_(active ? openblas_get_num_threads() : 0) {
    if (saved_ > 1) openblas_set_num_threads(1);
  }
  ~SerialBlasScope() {
    if (saved_ > 1) openblas_set_num_threads(saved_);
  }
  SerialBlasScope(const SerialBlasScope&) = delete;
  SerialBlasScope& operator=(const SerialBlasScope&) = delete;

 private:
  int saved_;
};

template <class C>
void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k, C alpha, const C* a, int64_t lda,
          const C* b, int64_t ldb, C beta, C* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == C(0) ? C(0) : beta * c[i * ldc + j];
    return;
  }
  const auto i = [](int64_t v) { return static_cast<blasint>(v); };
  if constexpr (std::is_same_v<C, float>) {
    cblas_sgemm(CblasRowMajor, ta, tb, i(m), i(n), i(k), alpha, a, i(lda), b, i(ldb), beta, c, i(ldc));
  } else {
    static_assert(std::is_same_v<C, double>);
    cblas_dgemm(CblasRowMajor, ta, tb, i(m), i(n), i(k), alpha, a, i(lda), b, i(ldb), beta, c, i(ldc));
  }
}

}  // namespace forge::cpu
