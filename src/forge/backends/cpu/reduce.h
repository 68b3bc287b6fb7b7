#pragma once
// CPU reductions over the last dim of a contiguous (rows, cols) view.
//
// The ops layer moves the reduced dims last and makes the input contiguous, so every
// reduction here is a row reduction: out[r] = reduce(x[r, 0..cols)).
#include "forge/core/tensor.h"

namespace forge::cpu {

enum class RowReduce { sum, mean, amax, amin };

// x: (rows, cols) contiguous; out: (rows) contiguous. Floating inputs accumulate in
// double; integer sums accumulate in i64 (out must then be i64).
void reduce_rows(RowReduce op, const Tensor& x, Tensor& out);

}  // namespace forge::cpu
