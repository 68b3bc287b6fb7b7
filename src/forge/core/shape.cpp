#include "forge/core/shape.h"

#include <algorithm>

#include "forge/core/error.h"

namespace forge {

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
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
