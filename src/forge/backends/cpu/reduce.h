#pragma once
// CPU reductions over the last dim of a contiguous (rows, cols) matrix.
//
// The ops layer moves the reduced dims last and makes the input contiguous, so every
// reduction here is a row reduction over x_r = x[r, 0..cols):
//
//   sum    out[r] = sum_c x[r, c]
//   mean   out[r] = sum_c x[r, c] / cols
//   amax   out[r] = max_c x[r, c]                     (NaN if the row holds a NaN)
//   amin   out[r] = min_c x[r, c]                     (NaN if the row holds a NaN)
//   var    out[r] = sum_c (x[r, c] - mean_r)^2 / max(cols - correction, 0)
//   arg    indices[r] = the first c where x[r, c] is extremal (the first NaN if any),
//          values[r] = x[r, indices[r]]
//
// Memory contract: x (rows, cols) is read only; out / values / indices (rows) are
// contiguous and overwritten, never accumulated into. All kernels but sum need cols >= 1
// (the ops layer rejects or special-cases empty rows).
//
// Accumulation: floating inputs in double (bf16/f16/f32/f64), integer sums in int64.
// var is two-pass within a column block and blocks are merged with Chan's formula, so
// it stays accurate for data far from zero (e.g. 1e8 + small noise).
//
// Lanes: sum/mean/amax/amin also reduce the middle dim of a contiguous (outer, n, inner)
// view, out[o, i] = reduce_j x[o, j, i], for reduced dims that sit before kept ones (a bias
// gradient summed over the batch dim) without a transposing copy. Blocks of up to
// kReduceLanes neighbouring outputs are accumulated side by side, reading contiguous runs.
//
// Threads: rows are split across OpenMP threads. A row longer than kReduceBlock columns is
// cut into fixed blocks of kReduceBlock whose partial results are combined left to right,
// so a long row uses every thread and the result does not depend on the thread count.
#include <cstdint>

#include "forge/core/tensor.h"

namespace forge::cpu {

inline constexpr int64_t kReduceBlock = 32768;
inline constexpr int64_t kReduceLanes = 64;

enum class RowReduce { sum, mean, amax, amin };

// x: (rows, cols); out: (rows). out has x's dtype, except that an integer (or bool) sum
// writes i64. mean needs a floating dtype.
void reduce_rows(RowReduce op, const Tensor& x, Tensor& out);

// x: contiguous, viewed as (outer, n, inner); out: (outer * inner) contiguous. Dtypes and the
// n >= 1 requirement as in reduce_rows. Each output is reduced by one thread in order of j
// (threads take (o, lane block) tiles), so results do not depend on the thread count.
void reduce_lanes(RowReduce op, const Tensor& x, Tensor& out, int64_t outer, int64_t n, int64_t inner);

// x: (rows, cols) floating, cols >= 1; out: (rows), x's dtype.
void var_rows(const Tensor& x, Tensor& out, int64_t correction);

enum class ArgReduce { max, min };

// x: (rows, cols), any dtype, cols >= 1; indices: (rows) i64; values: (rows) of x's dtype,
// or null when only the indices are wanted (argmax / argmin).
void arg_reduce_rows(ArgReduce op, const Tensor& x, Tensor* values, Tensor& indices);

}  // namespace forge::cpu
