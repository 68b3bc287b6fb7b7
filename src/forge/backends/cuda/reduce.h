#pragma once
// CUDA row reductions: the counterparts of backends/cpu/reduce.h, with the same
// signatures, math and memory contract (see there and reduce.cu). Differences: floating
// inputs accumulate in f32 (f64 for f64) instead of double, and the summation order is
// a fixed tree (Note [row groups] in reduce.cuh) rather than left to right, so results
// agree with the CPU to rounding and are deterministic from run to run.
#include <cstdint>

#include "forge/backends/cpu/reduce.h"
#include "forge/core/tensor.h"

namespace forge::cuda {

using cpu::ArgReduce;
using cpu::RowReduce;

// x: (rows, cols) contiguous on the GPU; out: (rows). out has x's dtype, except that an
// integer (or bool) sum writes i64. mean needs a floating dtype.
void reduce_rows(RowReduce op, const Tensor& x, Tensor& out);

// x: contiguous, viewed as (outer, n, inner); out: (outer * inner) contiguous.
void reduce_lanes(RowReduce op, const Tensor& x, Tensor& out, int64_t outer, int64_t n, int64_t inner);

// x: (rows, cols) floating, cols >= 1; out: (rows), x's dtype.
void var_rows(const Tensor& x, Tensor& out, int64_t correction);

// x: (rows, cols), any dtype, cols >= 1; indices: (rows) i64; values: (rows) of x's dtype,
// or null. Ties and NaN as on the CPU: the first extremal element, the first NaN if any.
void arg_reduce_rows(ArgReduce op, const Tensor& x, Tensor* values, Tensor& indices);

}  // namespace forge::cuda
