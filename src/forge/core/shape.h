#pragma once
// Shapes and strides (in elements), and the index arithmetic every op shares.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace forge {

using Shape = std::vector<int64_t>;
using Strides = std::vector<int64_t>;

// Note [checked sizes]: element and byte counts of shapes are computed with overflow checks (a
// shape read from a file or a config, n_embd = 2^62, must be an error, never a wrapped small
// allocation); both throw a forge::Error naming the shape.
int64_t shape_numel(const Shape& shape);
size_t checked_nbytes(const Shape& shape, size_t element_size);
Strides contiguous_strides(const Shape& shape);

// Wraps a possibly negative dim into [0, ndim); throws naming `op` when out of range.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);

// NumPy broadcasting: aligns trailing dims; sizes must match or be 1. Throws naming `op`
// and both shapes on mismatch.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

}  // namespace forge
