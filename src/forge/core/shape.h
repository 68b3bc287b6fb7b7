#pragma once
// Shapes and strides (in elements), and the index arithmetic every op shares.
#include <cstdint>
#include <vector>

namespace forge {

using Shape = std::vector<int64_t>;
using Strides = std::vector<int64_t>;

int64_t shape_numel(const Shape& shape);
Strides contiguous_strides(const Shape& shape);

// Wraps a possibly negative dim into [0, ndim); throws naming `op` when out of range.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);

// NumPy broadcasting: aligns trailing dims; sizes must match or be 1. Throws naming `op`
// and both shapes on mismatch.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

}  // namespace forge
