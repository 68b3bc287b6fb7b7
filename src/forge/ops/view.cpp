#include "forge/ops/view.h"

#include <algorithm>
#include <numeric>

#include "forge/autograd/node.h"
#include "forge/ops/copy.h"
#include "forge/ops/creation.h"
#include "forge/ops/reduce.h"
#include "forge/ops/registry.h"

namespace forge::ops {

using autograd::GradMask;
using autograd::record;

// The differentiable ops this file defines (Note [op registry] in ops/registry.h).
[[maybe_unused]] const bool kRegisteredOps = register_ops({"reshape", "view", "flatten", "transpose", "permute",
                                                           "narrow", "slice", "select", "expand", "squeeze",
                                                           "unsqueeze"});

namespace {

Tensor make_view(const Tensor& t, Shape shape, Strides strides, int64_t offset) {
  return Tensor::make(t.storage(), std::move(shape), std::move(strides), offset, t.dtype());
}

// Backward of every op that only reshapes: the gradient reshaped back.
Tensor record_reshape_like(const char* name, Tensor out, const Tensor& in) {
  Shape in_shape = in.shape();
  record(name, out, {in}, [in_shape](const Tensor& g, const GradMask&) { return TensorList{reshape(g, in_shape)}; });
  return out;
}

// Backward of every op that picks a sub-block: scatter the gradient into zeros.
template <class Pick>
Tensor record_pick(const char* name, Tensor out, const Tensor& in, Pick pick) {
  Shape in_shape = in.shape();
  record(name, out, {in}, [in_shape, pick](const Tensor& g, const GradMask&) {
    Tensor gi = zeros(in_shape, {.dtype = g.dtype(), .device = g.device()});
    Tensor dst = pick(gi);
    copy_(dst, g);
    return TensorList{gi};
  });
  return out;
}

}  // namespace

Shape infer_shape(const Shape& shape, int64_t numel, const char* op) {
  Shape out = shape;
  int64_t infer = -1, known = 1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      FORGE_CHECK(infer < 0, op, ": only one dimension of shape ", shape, " may be -1");
      infer = static_cast<int64_t>(i);
    } else {
      FORGE_CHECK(out[i] >= 0, op, ": invalid size ", out[i], " in shape ", shape);
      known *= out[i];
    }
  }
  if (infer >= 0) {
    FORGE_CHECK(known != 0 && numel % known == 0, op, ": shape ", shape, " is invalid for a tensor of ", numel,
                " elements");
    out[infer] = numel / known;
  }
  FORGE_CHECK(shape_numel(out) == numel, op, ": shape ", shape, " is invalid for a tensor of ", numel, " elements");
  return out;
}

bool view_strides(const Shape& shape, const Strides& strides, const Shape& new_shape, Strides& out) {
  out.assign(new_shape.size(), 1);
  if (shape_numel(shape) == 0) {
    out = contiguous_strides(new_shape);
    return true;
  }
  std::vector<int64_t> os, ost;
  for (size_t i = 0; i < shape.size(); ++i)
    if (shape[i] != 1) {
      os.push_back(shape[i]);
      ost.push_back(strides[i]);
    }
  size_t j = 0;
  size_t i = 0;
  while (i < os.size()) {
    // A chunk: consecutive old dims that are contiguous with each other.
    size_t end = i;
    int64_t chunk = os[i];
    while (end + 1 < os.size() && ost[end] == ost[end + 1] * os[end + 1]) {
      ++end;
      chunk *= os[end];
    }
    const size_t start_j = j;
    int64_t prod = 1;
    while (j < new_shape.size() && prod < chunk) prod *= new_shape[j++];
    if (prod != chunk) return false;
    int64_t st = ost[end];
    for (size_t k = j; k-- > start_j;) {
      out[k] = st;
      st *= new_shape[k];
    }
    i = end + 1;
  }
  for (; j < new_shape.size(); ++j)
    if (new_shape[j] != 1) return false;
  return true;
}

Tensor view(const Tensor& t, const Shape& shape) {
  Shape s = infer_shape(shape, t.numel(), "view");
  Strides st;
  FORGE_CHECK(view_strides(t.shape(), t.strides(), s, st), "view: shape ", s,
              " is not compatible with the input's shape ", t.shape(), " and strides ", t.strides(),
              " (the data is not laid out contiguously enough); use reshape(), which copies when it must");
  return record_reshape_like("view", make_view(t, s, st, t.offset()), t);
}

Tensor reshape(const Tensor& t, const Shape& shape) {
  Shape s = infer_shape(shape, t.numel(), "reshape");
  Strides st;
  if (view_strides(t.shape(), t.strides(), s, st)) return record_reshape_like("reshape", make_view(t, s, st, t.offset()), t);
  return view(clone(t), s);
}

Tensor flatten(const Tensor& t, int64_t start_dim, int64_t end_dim) {
  if (t.dim() == 0) return reshape(t, {1});
  const int64_t s = wrap_dim(start_dim, t.dim(), "flatten"), e = wrap_dim(end_dim, t.dim(), "flatten");
  FORGE_CHECK(s <= e, "flatten: start_dim ", start_dim, " comes after end_dim ", end_dim);
  Shape out(t.shape().begin(), t.shape().begin() + s);
  int64_t n = 1;
  for (int64_t d = s; d <= e; ++d) n *= t.shape()[d];
  out.push_back(n);
  out.insert(out.end(), t.shape().begin() + e + 1, t.shape().end());
  return reshape(t, out);
}

Tensor transpose(const Tensor& t, int64_t d0, int64_t d1) {
  const int64_t a = wrap_dim(d0, t.dim(), "transpose"), b = wrap_dim(d1, t.dim(), "transpose");
  Shape s = t.shape();
  Strides st = t.strides();
  if (t.dim() > 0) {
    std::swap(s[a], s[b]);
    std::swap(st[a], st[b]);
  }
  Tensor out = make_view(t, s, st, t.offset());
  record("transpose", out, {t}, [a, b](const Tensor& g, const GradMask&) { return TensorList{transpose(g, a, b)}; });
  return out;
}

Tensor permute(const Tensor& t, const std::vector<int64_t>& dims) {
  const int64_t n = t.dim();
  FORGE_CHECK(static_cast<int64_t>(dims.size()) == n, "permute: got ", dims.size(), " dims for a tensor of ", n,
              " dims (shape ", t.shape(), ")");
  std::vector<int64_t> perm(n), inverse(n, -1);
  Shape s(n);
  Strides st(n);
  for (int64_t i = 0; i < n; ++i) {
    perm[i] = wrap_dim(dims[i], n, "permute");
    FORGE_CHECK(inverse[perm[i]] < 0, "permute: dim ", perm[i], " repeats in ", Shape(dims));
    inverse[perm[i]] = i;
    s[i] = t.shape()[perm[i]];
    st[i] = t.strides()[perm[i]];
  }
  Tensor out = make_view(t, s, st, t.offset());
  record("permute", out, {t}, [inverse](const Tensor& g, const GradMask&) { return TensorList{permute(g, inverse)}; });
  return out;
}

Tensor slice(const Tensor& t, int64_t dim, int64_t start, int64_t end, int64_t step) {
  const int64_t d = wrap_dim(dim, t.dim(), "slice");
  FORGE_CHECK(step > 0, "slice: step must be positive, got ", step);
  FORGE_CHECK(t.dim() > 0, "slice: cannot slice a 0-d tensor");
  const int64_t size = t.shape()[d];
  auto clamp = [size](int64_t v) { return std::clamp<int64_t>(v < 0 ? v + size : v, 0, size); };
  const int64_t b = clamp(start), e = std::max(clamp(end), b);
  Shape s = t.shape();
  Strides st = t.strides();
  s[d] = (e - b + step - 1) / step;
  const int64_t offset = t.offset() + b * st[d];
  st[d] *= step;
  Tensor out = make_view(t, s, st, offset);
  return record_pick("slice", out, t, [d, b, e, step](const Tensor& gi) { return slice(gi, d, b, e, step); });
}

Tensor narrow(const Tensor& t, int64_t dim, int64_t start, int64_t length) {
  const int64_t d = wrap_dim(dim, t.dim(), "narrow");
  const int64_t size = t.shape()[d];
  const int64_t b = start < 0 ? start + size : start;
  FORGE_CHECK(b >= 0 && length >= 0 && b + length <= size, "narrow: start ", start, " and length ", length,
              " are out of range for dim ", d, " of size ", size, " (shape ", t.shape(), ")");
  return slice(t, d, b, b + length, 1);
}

Tensor select(const Tensor& t, int64_t dim, int64_t index) {
  FORGE_CHECK(t.dim() > 0, "select: cannot select from a 0-d tensor");
  const int64_t d = wrap_dim(dim, t.dim(), "select");
  const int64_t size = t.shape()[d];
  FORGE_CHECK(index >= -size && index < size, "select: index ", index, " is out of range for dim ", d, " of size ",
              size, " (shape ", t.shape(), ")");
  const int64_t i = index < 0 ? index + size : index;
  Shape s = t.shape();
  Strides st = t.strides();
  const int64_t offset = t.offset() + i * st[d];
  s.erase(s.begin() + d);
  st.erase(st.begin() + d);
  Tensor out = make_view(t, s, st, offset);
  return record_pick("select", out, t, [d, i](const Tensor& gi) { return select(gi, d, i); });
}

Tensor expand(const Tensor& t, const Shape& shape) {
  const int64_t n = static_cast<int64_t>(shape.size()), m = t.dim();
  FORGE_CHECK(n >= m, "expand: the target shape ", shape, " has fewer dims than the tensor's shape ", t.shape());
  Shape s(n);
  Strides st(n);
  for (int64_t i = n - 1; i >= 0; --i) {
    const int64_t j = i - (n - m);
    if (j < 0) {
      FORGE_CHECK(shape[i] >= 0, "expand: new leading dim ", i, " of ", shape, " must be given (not -1)");
      s[i] = shape[i];
      st[i] = 0;
      continue;
    }
    const int64_t cur = t.shape()[j];
    const int64_t want = shape[i] == -1 ? cur : shape[i];
    FORGE_CHECK(want == cur || cur == 1, "expand: cannot expand shape ", t.shape(), " to ", shape, " (dim ", i,
                ": size ", cur, " is not 1 and differs from ", want, ")");
    s[i] = want;
    st[i] = (want == cur) ? t.strides()[j] : 0;
  }
  Tensor out = make_view(t, s, st, t.offset());
  Shape in_shape = t.shape();
  record("expand", out, {t}, [in_shape](const Tensor& g, const GradMask&) { return TensorList{sum_to(g, in_shape)}; });
  return out;
}

Tensor squeeze(const Tensor& t, int64_t dim) {
  if (t.dim() == 0) return record_reshape_like("squeeze", make_view(t, {}, {}, t.offset()), t);
  const int64_t d = wrap_dim(dim, t.dim(), "squeeze");
  Shape s = t.shape();
  Strides st = t.strides();
  if (s[d] == 1) {
    s.erase(s.begin() + d);
    st.erase(st.begin() + d);
  }
  return record_reshape_like("squeeze", make_view(t, s, st, t.offset()), t);
}

Tensor squeeze(const Tensor& t) {
  Shape s;
  Strides st;
  for (int64_t i = 0; i < t.dim(); ++i)
    if (t.shape()[i] != 1) {
      s.push_back(t.shape()[i]);
      st.push_back(t.strides()[i]);
    }
  return record_reshape_like("squeeze", make_view(t, s, st, t.offset()), t);
}

Tensor unsqueeze(const Tensor& t, int64_t dim) {
  const int64_t n = t.dim();
  FORGE_CHECK(dim >= -(n + 1) && dim <= n, "unsqueeze: dim ", dim, " is out of range for a tensor of ", n,
              " dims (expected ", -(n + 1), " <= dim <= ", n, ")");
  const int64_t d = dim < 0 ? dim + n + 1 : dim;
  Shape s = t.shape();
  Strides st = t.strides();
  const int64_t stride = d < n ? st[d] * s[d] : 1;
  s.insert(s.begin() + d, 1);
  st.insert(st.begin() + d, stride);
  return record_reshape_like("unsqueeze", make_view(t, s, st, t.offset()), t);
}

}  // namespace forge::ops
