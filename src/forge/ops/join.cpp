#include "forge/ops/join.h"

#include <algorithm>

#include "forge/autograd/grad_mode.h"
#include "forge/autograd/node.h"
#include "forge/ops/copy.h"
#include "forge/ops/creation.h"
#include "forge/ops/dispatch_device.h"
#include "forge/ops/registry.h"
#include "forge/ops/view.h"

namespace forge::ops {

using autograd::GradMask;
using autograd::record;

// The differentiable ops this file defines (Note [op registry] in ops/registry.h).
[[maybe_unused]] const bool kRegisteredOps = register_ops({"cat", "stack", "split", "chunk"});

namespace {

// torch.cat's legacy rule: a 1-D tensor of size 0 may join any list (its shape is not
// checked and it contributes nothing).
bool skipped_by_cat(const Tensor& t) { return t.dim() == 1 && t.shape()[0] == 0; }

}  // namespace

// cat: out = [x0; x1; ...] along `dim`, promoted to the common dtype (torch.cat's rule).
// Forward copies each input into a narrow() view of the output; backward hands every input
// the matching narrow() slice of the gradient (converted back to its dtype).
Tensor cat(const TensorList& xs, int64_t dim) {
  FORGE_CHECK(!xs.empty(), "cat: expected a non-empty list of tensors");
  for (size_t i = 0; i < xs.size(); ++i) {
    FORGE_CHECK(xs[i].defined(), "cat: tensor ", i, " is undefined");
    FORGE_CHECK(xs[i].dim() > 0, "cat: zero-dimensional tensor (at position ", i,
                ") cannot be concatenated; unsqueeze it or use stack");
  }
  detail::check_same_device("cat", xs);
  size_t ref = 0;  // the tensor whose shape the others must match
  while (ref < xs.size() && skipped_by_cat(xs[ref])) ++ref;
  if (ref == xs.size()) ref = 0;  // all are empty 1-D tensors
  const Tensor& r = xs[ref];
  const int64_t d = wrap_dim(dim, r.dim(), "cat");
  DType dtype = xs[0].dtype();
  int64_t total = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const Tensor& x = xs[i];
    dtype = promote_types(dtype, x.dtype());
    if (i != ref && skipped_by_cat(x)) continue;
    FORGE_CHECK(x.dim() == r.dim(), "cat: tensors must have the same number of dims: tensor ", ref, " has shape ",
                r.shape(), " but tensor ", i, " has shape ", x.shape());
    for (int64_t k = 0; k < x.dim(); ++k)
      FORGE_CHECK(k == d || x.shape()[k] == r.shape()[k], "cat: sizes of tensors must match except in dim ", d,
                  ": tensor ", ref, " has shape ", r.shape(), " but tensor ", i, " has shape ", x.shape(),
                  " (mismatch at dim ", k, ")");
    total += x.shape()[d];
  }
  Shape out_shape = r.shape();
  out_shape[d] = total;
  Tensor out = empty(out_shape, {.dtype = dtype, .device = r.device()});

  std::vector<int64_t> starts(xs.size(), -1);  // where each input starts along d (-1: skipped)
  {
    NoGradGuard no_grad;
    int64_t start = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      const Tensor& x = xs[i];
      if (i != ref && skipped_by_cat(x)) continue;
      starts[i] = start;
      const int64_t len = x.shape()[d];
      if (x.numel() > 0) {
        Tensor dst = narrow(out, d, start, len);
        copy_(dst, x.detach());
      }
      start += len;
    }
  }
  if (!is_floating(dtype)) return out;

  std::vector<Shape> shapes;
  std::vector<DType> dtypes;
  for (const Tensor& x : xs) {
    shapes.push_back(x.shape());
    dtypes.push_back(x.dtype());
  }
  record("cat", out, xs, [d, starts, shapes, dtypes](const Tensor& g, const GradMask& need) {
    TensorList grads(need.size());
    for (size_t i = 0; i < need.size(); ++i) {
      if (!need[i]) continue;
      if (starts[i] < 0) {
        grads[i] = zeros(shapes[i], {.dtype = dtypes[i], .device = g.device()});
        continue;
      }
      Tensor gi = narrow(g, d, starts[i], shapes[i][d]);
      grads[i] = gi.dtype() == dtypes[i] ? gi : to(gi, dtypes[i]);
    }
    return grads;
  });
  return out;
}

// stack: every input unsqueezed at `dim`, then cat.
Tensor stack(const TensorList& xs, int64_t dim) {
  FORGE_CHECK(!xs.empty(), "stack: expected a non-empty list of tensors");
  for (size_t i = 0; i < xs.size(); ++i) FORGE_CHECK(xs[i].defined(), "stack: tensor ", i, " is undefined");
  const int64_t n = xs[0].dim();
  FORGE_CHECK(dim >= -(n + 1) && dim <= n, "stack: dim ", dim, " is out of range for tensors of ", n,
              " dims (expected ", -(n + 1), " <= dim <= ", n, ")");
  const int64_t d = dim < 0 ? dim + n + 1 : dim;
  TensorList parts;
  parts.reserve(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    FORGE_CHECK(xs[i].shape() == xs[0].shape(), "stack: expects tensors of one shape, but tensor 0 has shape ",
                xs[0].shape(), " and tensor ", i, " has shape ", xs[i].shape());
    parts.push_back(unsqueeze(xs[i], d));
  }
  return cat(parts, d);
}

TensorList split(const Tensor& x, int64_t split_size, int64_t dim) {
  FORGE_CHECK(x.dim() > 0, "split: cannot split a 0-d tensor");
  const int64_t d = wrap_dim(dim, x.dim(), "split");
  const int64_t size = x.shape()[d];
  FORGE_CHECK(split_size > 0 || (split_size == 0 && size == 0), "split: split_size must be positive, got ",
              split_size, " for dim ", d, " of shape ", x.shape(), " (0 is allowed only for a dim of size 0)");
  // At least one piece, as torch (a split_size larger than the dim gives the whole tensor).
  const int64_t pieces = split_size == 0 ? 1 : std::max<int64_t>((size + split_size - 1) / split_size, 1);
  TensorList out;
  out.reserve(static_cast<size_t>(pieces));
  for (int64_t i = 0; i < pieces; ++i) {
    const int64_t start = i * split_size;
    out.push_back(narrow(x, d, start, std::min(split_size, size - start)));
  }
  return out;
}

TensorList split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  FORGE_CHECK(x.dim() > 0, "split: cannot split a 0-d tensor");
  const int64_t d = wrap_dim(dim, x.dim(), "split");
  int64_t sum = 0;
  for (int64_t s : sizes) {
    FORGE_CHECK(s >= 0, "split: split sizes ", Shape(sizes), " contain the negative size ", s);
    sum += s;
  }
  FORGE_CHECK(sum == x.shape()[d], "split: split sizes ", Shape(sizes), " sum to ", sum, " but dim ", d,
              " of shape ", x.shape(), " has size ", x.shape()[d]);
  TensorList out;
  out.reserve(sizes.size());
  int64_t start = 0;
  for (int64_t s : sizes) {
    out.push_back(narrow(x, d, start, s));
    start += s;
  }
  return out;
}

// Pieces of ceil(size / chunks) along dim (so possibly fewer than `chunks`, as torch.chunk).
TensorList chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  FORGE_CHECK(chunks > 0, "chunk: chunks must be positive, got ", chunks, " (shape ", x.shape(), ")");
  FORGE_CHECK(x.dim() > 0, "chunk: cannot chunk a 0-d tensor");
  const int64_t d = wrap_dim(dim, x.dim(), "chunk");
  const int64_t size = x.shape()[d];
  const int64_t split_size = (size + chunks - 1) / chunks;
  // An empty dim still yields `chunks` empty pieces (torch does the same).
  if (size == 0) return split(x, std::vector<int64_t>(static_cast<size_t>(chunks), 0), d);
  return split(x, split_size, d);
}

}  // namespace forge::ops
