#pragma once
// Views: new shapes/strides over the same storage. All differentiable.
#include <vector>

#include "forge/core/tensor.h"

namespace forge::ops {

// One dim of `shape` may be -1 (inferred). view() never copies and throws if the strides
// do not allow it; reshape() views when it can and copies otherwise.
Tensor view(const Tensor& t, const Shape& shape);
Tensor reshape(const Tensor& t, const Shape& shape);
Tensor flatten(const Tensor& t, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor transpose(const Tensor& t, int64_t d0, int64_t d1);
Tensor permute(const Tensor& t, const std::vector<int64_t>& dims);
Tensor narrow(const Tensor& t, int64_t dim, int64_t start, int64_t length);
// Python's t[start:end:step] along dim (negative start/end count from the end; clamped).
Tensor slice(const Tensor& t, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
// t[..., index, ...]: removes `dim`.
Tensor select(const Tensor& t, int64_t dim, int64_t index);
// Broadcast to `shape` (-1 keeps a dim; new leading dims allowed); stride 0, no copy.
Tensor expand(const Tensor& t, const Shape& shape);
Tensor squeeze(const Tensor& t, int64_t dim);
Tensor squeeze(const Tensor& t);
Tensor unsqueeze(const Tensor& t, int64_t dim);

// The strides a view of (shape, strides) as `new_shape` would have, if one exists.
bool view_strides(const Shape& shape, const Strides& strides, const Shape& new_shape, Strides& out);
// Resolves one -1 in `shape` against `numel`; throws naming `op` on mismatch.
Shape infer_shape(const Shape& shape, int64_t numel, const char* op);

}  // namespace forge::ops
