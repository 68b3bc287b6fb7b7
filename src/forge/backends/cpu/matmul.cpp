// CPU matrix products, batched over broadcast batch dims.
//
//   out[b, m, n] = sum_k a[b, m, k] * b[b, k, n]
//   a   (*batch, M, K)
//   b   (*batch, K, N)
//   out (*batch, M, N)
//
// Memory contract:
// - out is contiguous and fully overwritten (K == 0 writes zeros); a and b are only read.
// - a and b are strided views. A matrix whose last two dims have strides (ld, 1) goes to
//   BLAS as CblasNoTrans, one with strides (1, ld) as CblasTrans (e.g. x.t(), or the
//   transposed operands of matmul's backward); neither is copied. Only a matrix that fits
//   neither layout (a stride-0 dim, every other column, ...) is packed into a contiguous
//   scratch buffer, one matrix at a time.
// - Batch dims are walked with per-batch element offsets computed from each operand's
//   batch strides, so a broadcast (stride-0) batch dim reuses the same matrix instead of
//   being expanded in memory; a packed matrix is reused while its source does not change.
// - f32/f64: cblas_sgemm/cblas_dgemm, one call per batch (OpenBLAS threads each GEMM).
//   bf16/f16: each matrix is converted to an f32 scratch, multiplied by cblas_sgemm
//   (f32 accumulation) and rounded back once (Note [16-bit conversions] in core/half.h).
//   Integers (i32, i64, u8): a plain loop accumulating in i64, wrapped to the output
//   type, OpenMP-parallel over output rows.
#include "forge/backends/cpu/matmul.h"

#include <cblas.h>

#include <algorithm>
#include <limits>
#include <type_traits>
#include <vector>

#include "forge/backends/cpu/loops.h"
#include "forge/backends/cpu/tensor_kernels.h"
#include "forge/core/convert.h"
#include "forge/core/dispatch.h"

namespace forge::cpu {
namespace {

// How one operand matrix is read through BLAS's row-major interface.
struct BlasLayout {
  bool direct = false;  // false: no BLAS layout fits the strides; pack the matrix first
  CBLAS_TRANSPOSE trans = CblasNoTrans;
  int64_t ld = 0;
};

// A (rows, cols) matrix with element strides (sr, sc). Strides of size-1 dims are free.
BlasLayout blas_layout(int64_t rows, int64_t cols, int64_t sr, int64_t sc) {
  const int64_t row_ld_min = std::max<int64_t>(1, cols), col_ld_min = std::max<int64_t>(1, rows);
  // Row-major: element (r, c) at r * ld + c.
  if ((sc == 1 || cols == 1) && (rows == 1 || sr >= row_ld_min)) {
    return {true, CblasNoTrans, rows == 1 ? row_ld_min : sr};
  }
  // Column-major, i.e. the transpose of a row-major (cols, rows): element (r, c) at r + c * ld.
  if ((sr == 1 || rows == 1) && (cols == 1 || sc >= col_ld_min)) {
    return {true, CblasTrans, cols == 1 ? col_ld_min : sc};
  }
  return {};
}

// The element offset of every batch index (row-major over `batch`) of an operand whose
// leading strides are `strides` (0 on broadcast dims).
std::vector<int64_t> batch_offsets(const Shape& batch, const Strides& strides) {
  const int64_t nb = shape_numel(batch);
  std::vector<int64_t> offs(static_cast<size_t>(nb));
  std::vector<int64_t> idx(batch.size(), 0);
  int64_t off = 0;
  for (int64_t i = 0; i < nb; ++i) {
    offs[static_cast<size_t>(i)] = off;
    for (size_t d = batch.size(); d-- > 0;) {  // step the multi-index
      off += strides[d];
      if (++idx[d] < batch[d]) break;
      off -= batch[d] * strides[d];
      idx[d] = 0;
    }
  }
  return offs;
}

// dst (rows, cols) row-major <- src (rows, cols) with strides (sr, sc), converted to C.
template <class C, class T>
void pack(const T* src, int64_t rows, int64_t cols, int64_t sr, int64_t sc, C* dst) {
#pragma omp parallel for if (rows * cols >= kParallelGrain && rows > 1)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[r * cols + c] = convert<C>(src[r * sr + c * sc]);
}

// One operand of the batched GEMM, stored as T and multiplied as C (f32 for bf16/f16).
template <class T, class C>
struct Operand {
  const T* base;
  std::vector<int64_t> offsets;  // per batch index
  int64_t rows, cols, sr, sc;
  BlasLayout layout;
  std::vector<C> scratch;  // (rows, cols) row-major, when the matrix must be packed
  const T* packed_from = nullptr;

  Operand(const Tensor& t, const Shape& batch)
      : base(t.data<T>()),
        offsets(batch_offsets(batch, t.strides())),
        rows(t.shape()[t.dim() - 2]),
        cols(t.shape()[t.dim() - 1]),
        sr(t.strides()[t.dim() - 2]),
        sc(t.strides()[t.dim() - 1]),
        layout(blas_layout(rows, cols, sr, sc)) {}

  // The matrix of batch index i as BLAS reads it: its pointer, transpose flag and ld.
  const C* matrix(int64_t i, CBLAS_TRANSPOSE& trans, int64_t& ld) {
    const T* src = base + offsets[static_cast<size_t>(i)];
    if constexpr (std::is_same_v<T, C>) {
      if (layout.direct) {
        trans = layout.trans;
        ld = layout.ld;
        return src;
      }
    }
    trans = CblasNoTrans;
    ld = std::max<int64_t>(1, cols);
    if (scratch.empty()) scratch.resize(static_cast<size_t>(rows * cols));
    if (src != packed_from) {  // a broadcast batch dim keeps the same source: pack once
      pack(src, rows, cols, sr, sc, scratch.data());
      packed_from = src;
    }
    return scratch.data();
  }
};

template <class C>
void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k, const C* a, int64_t lda,
          const C* b, int64_t ldb, C* c, int64_t ldc) {
  const auto i = [](int64_t v) { return static_cast<blasint>(v); };
  if constexpr (std::is_same_v<C, float>) {
    cblas_sgemm(CblasRowMajor, ta, tb, i(m), i(n), i(k), 1.0f, a, i(lda), b, i(ldb), 0.0f, c, i(ldc));
  } else {
    static_assert(std::is_same_v<C, double>);
    cblas_dgemm(CblasRowMajor, ta, tb, i(m), i(n), i(k), 1.0, a, i(lda), b, i(ldb), 0.0, c, i(ldc));
  }
}

// f32, f64 (BLAS directly) and bf16, f16 (through f32).
template <class T>
void matmul_blas(const Tensor& a, const Tensor& b, Tensor& out, const Shape& batch) {
  using C = acc_t<T>;
  constexpr bool kConvert = !std::is_same_v<T, C>;
  Operand<T, C> A(a, batch), B(b, batch);
  const int64_t M = A.rows, K = A.cols, N = B.cols, nb = shape_numel(batch);
  T* o = out.data<T>();
  std::vector<C> acc(kConvert ? static_cast<size_t>(M * N) : 0);  // (M, N) f32 result
  for (int64_t i = 0; i < nb; ++i) {
    CBLAS_TRANSPOSE ta, tb;
    int64_t lda, ldb;
    const C* pa = A.matrix(i, ta, lda);
    const C* pb = B.matrix(i, tb, ldb);
    T* po = o + i * M * N;
    if constexpr (kConvert) {
      gemm<C>(ta, tb, M, N, K, pa, lda, pb, ldb, acc.data(), N);
      const int64_t mn = M * N;
#pragma omp parallel for if (mn >= kParallelGrain)
      for (int64_t j = 0; j < mn; ++j) po[j] = convert<T>(acc[static_cast<size_t>(j)]);
    } else {
      gemm<C>(ta, tb, M, N, K, pa, lda, pb, ldb, po, N);
    }
  }
}

// Integer dtypes: out[b, m, n] = sum_k a[b, m, k] * b[b, k, n], accumulated in i64.
template <class T>
void matmul_integer(const Tensor& a, const Tensor& b, Tensor& out, const Shape& batch) {
  const std::vector<int64_t> oa = batch_offsets(batch, a.strides()), ob = batch_offsets(batch, b.strides());
  const int64_t M = a.shape()[a.dim() - 2], K = a.shape()[a.dim() - 1], N = b.shape()[b.dim() - 1];
  const int64_t asr = a.strides()[a.dim() - 2], asc = a.strides()[a.dim() - 1];
  const int64_t bsr = b.strides()[b.dim() - 2], bsc = b.strides()[b.dim() - 1];
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  T* po = out.data<T>();
  const int64_t rows = shape_numel(batch) * M;
#pragma omp parallel for if (rows * N * K >= kParallelGrain && rows > 1)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = r / M, m = r % M;
    const T* arow = pa + oa[static_cast<size_t>(i)] + m * asr;
    const T* bmat = pb + ob[static_cast<size_t>(i)];
    for (int64_t n = 0; n < N; ++n) {
      int64_t acc = 0;
      for (int64_t k = 0; k < K; ++k)
        acc += static_cast<int64_t>(arow[k * asc]) * static_cast<int64_t>(bmat[k * bsr + n * bsc]);
      po[r * N + n] = static_cast<T>(acc);
    }
  }
}

}  // namespace

void matmul(const Tensor& a, const Tensor& b, Tensor& out) {
  const int64_t nd = out.dim();
  FORGE_CHECK(nd >= 2 && a.dim() == nd && b.dim() == nd, "cpu::matmul: expected operands of ", nd,
              " dims (batch dims expanded), got shapes ", a.shape(), ", ", b.shape(), " -> ", out.shape());
  FORGE_CHECK(a.dtype() == out.dtype() && b.dtype() == out.dtype(), "cpu::matmul: dtypes differ: ",
              dtype_name(a.dtype()), ", ", dtype_name(b.dtype()), " -> ", dtype_name(out.dtype()));
  FORGE_CHECK(out.is_contiguous(), "cpu::matmul: output must be contiguous (shape ", out.shape(), ")");
  const Shape batch(out.shape().begin(), out.shape().end() - 2);
  const int64_t M = out.shape()[nd - 2], N = out.shape()[nd - 1], K = a.shape()[nd - 1];
  FORGE_CHECK(Shape(a.shape().begin(), a.shape().end() - 2) == batch &&
                  Shape(b.shape().begin(), b.shape().end() - 2) == batch && a.shape()[nd - 2] == M &&
                  b.shape()[nd - 2] == K && b.shape()[nd - 1] == N,
              "cpu::matmul: inconsistent shapes ", a.shape(), " @ ", b.shape(), " -> ", out.shape());
  if (out.numel() == 0) return;
  if (K == 0) {  // an empty sum
    fill(out, 0.0);
    return;
  }
  dispatch_numeric(out.dtype(), "matmul", [&]<class T>() {
    if constexpr (std::is_integral_v<T>) {
      matmul_integer<T>(a, b, out, batch);
    } else {
      constexpr int64_t kMax = std::numeric_limits<blasint>::max();
      FORGE_CHECK(M <= kMax && N <= kMax && K <= kMax && std::max(a.strides()[nd - 2], a.strides()[nd - 1]) <= kMax &&
                      std::max(b.strides()[nd - 2], b.strides()[nd - 1]) <= kMax,
                  "matmul: shapes ", a.shape(), " and ", b.shape(), " exceed the BLAS integer range");
      matmul_blas<T>(a, b, out, batch);
    }
  });
}

}  // namespace forge::cpu
