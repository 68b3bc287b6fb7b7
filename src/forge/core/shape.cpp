#include "forge/core/shape.h"

#include <algorithm>

#include "forge/core/error.h"

namespace forge {

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  bool overflow = false;
  for (int64_t s : shape) overflow |= __builtin_mul_overflow(n, s, &n);
  // Note [checked sizes]: a shape from a file or a config (n_embd = 2^62) must not wrap.
  if (overflow) throw Error("shape " + shape_str(shape) + " has more elements than an int64 holds");
  return n;
}

size_t checked_nbytes(const Shape& shape, size_t element_size) {
  const int64_t n = shape_numel(shape);
  size_t bytes = 0;
  if (n < 0 || __builtin_mul_overflow(static_cast<size_t>(n), element_size, &bytes) ||
      bytes > static_cast<size_t>(INT64_MAX))
    throw Error("shape " + shape_str(shape) + " of " + std::to_string(element_size) +
                "-byte elements needs more bytes than an int64 holds");
  return bytes;
}

Strides contiguous_strides(const Shape& shape) {
  Strides st(shape.size());
  int64_t acc = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    st[i] = acc;
    acc *= std::max<int64_t>(shape[i], 1);
  }
  return st;
}

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op) {
  const int64_t n = std::max<int64_t>(ndim, 1);  // a 0-d tensor accepts dim 0 and -1
  FORGE_CHECK(dim >= -n && dim < n, op, ": dim ", dim, " is out of range for a tensor of ", ndim,
              " dims (expected ", -n, " <= dim < ", n, ")");
  return dim < 0 ? dim + n : dim;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    FORGE_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", a, " and ", b,
                " cannot be broadcast together (dim ", static_cast<int64_t>(i), ": ", da, " vs ", db, ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

}  // namespace forge
