#pragma once
// Basic CPU kernels every op builds on: copy (any strides, any dtype pair), fill,
// arange and the Philox random fills.
#include <cstdint>

#include "forge/core/tensor.h"

namespace forge::cpu {

// dst <- src, same shape; converts the element type; any strides on both sides.
void copy(Tensor& dst, const Tensor& src);
void fill(Tensor& t, double value);
// t[i] = start + i * step, t contiguous.
void arange(Tensor& t, double start, double step);
// Philox streams (Note [RNG streams]); t contiguous and floating.
void uniform(Tensor& t, double lo, double hi, uint64_t seed, uint64_t block_offset);
void normal(Tensor& t, double mean, double std, uint64_t seed, uint64_t block_offset);

}  // namespace forge::cpu
