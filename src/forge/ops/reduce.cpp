#include "forge/ops/reduce.h"

#include <algorithm>

#include "forge/autograd/node.h"
#include "forge/backends/cpu/reduce.h"
#include "forge/ops/binary.h"
#include "forge/ops/copy.h"
#include "forge/ops/creation.h"
#include "forge/ops/dispatch_device.h"
#include "forge/ops/view.h"

namespace forge::ops {

using autograd::GradMask;
using autograd::record;

namespace {

// A reduction's plan: the input as a contiguous (rows, cols) matrix whose rows are the
// kept positions and whose columns are the reduced ones, and the output shapes.
struct ReducePlan {
  Tensor matrix;     // (rows, cols), contiguous
  Shape out_shape;   // without the reduced dims (or with them as 1 when keepdim)
  Shape keep_shape;  // always with the reduced dims as 1
  std::vector<bool> reduced;
};

ReducePlan plan_reduce(const Tensor& x, const Dims& dims, bool keepdim, const char* op) {
  const int64_t n = x.dim();
  ReducePlan p;
  p.reduced.assign(static_cast<size_t>(n), dims.empty());
  for (int64_t d : dims) {
    const int64_t w = wrap_dim(d, n, op);
    if (n == 0) continue;
    FORGE_CHECK(!p.reduced[w] || dims.empty(), op, ": dim ", w, " appears more than once in ", Shape(dims));
    p.reduced[w] = true;
  }
  std::vector<int64_t> perm;
  int64_t rows = 1, cols = 1;
  for (int64_t d = 0; d < n; ++d)
    if (!p.reduced[d]) {
      perm.push_back(d);
      rows *= x.shape()[d];
    }
  for (int64_t d = 0; d < n; ++d)
    if (p.reduced[d]) {
      perm.push_back(d);
      cols *= x.shape()[d];
    }
  for (int64_t d = 0; d < n; ++d) {
    p.keep_shape.push_back(p.reduced[d] ? 1 : x.shape()[d]);
    if (!p.reduced[d] || keepdim) p.out_shape.push_back(p.keep_shape.back());
  }
  Tensor xd = x.detach();
  Tensor permuted = n == 0 ? xd : permute(xd, perm);
  p.matrix = reshape(contiguous(permuted), {rows, cols});
  return p;
}

Tensor run_rows(cpu::RowReduce op, const ReducePlan& p, DType out_dtype, const char* name) {
  Tensor out = empty({p.matrix.shape()[0]}, {.dtype = out_dtype, .device = p.matrix.device()});
  if (p.matrix.shape()[1] == 0) {
    FORGE_CHECK(op == cpu::RowReduce::sum, name, ": cannot reduce over an empty dimension (no identity)");
    return fill_(out, 0.0), reshape(out, p.out_shape);
  }
  if (out.is_cpu()) cpu::reduce_rows(op, p.matrix, out);
  else detail::throw_not_on_cuda(name);
  return reshape(out, p.out_shape);
}

}  // namespace

Tensor sum(const Tensor& x, const Dims& dims, bool keepdim) {
  const DType od = is_floating(x.dtype()) ? x.dtype() : DType::i64;
  ReducePlan p = plan_reduce(x, dims, keepdim, "sum");
  Tensor out = run_rows(cpu::RowReduce::sum, p, od, "sum");
  if (!is_floating(od)) return out;
  Shape in_shape = x.shape(), keep = p.keep_shape;
  record("sum", out, {x}, [in_shape, keep](const Tensor& g, const GradMask&) {
    return TensorList{expand(reshape(g, keep), in_shape)};
  });
  return out;
}

Tensor sum_to(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  const int64_t lead = g.dim() - static_cast<int64_t>(shape.size());
  FORGE_CHECK(lead >= 0, "sum_to: cannot reduce shape ", g.shape(), " to the larger shape ", shape);
  Dims dims;
  for (int64_t d = 0; d < g.dim(); ++d) {
    if (d < lead) {
      dims.push_back(d);
    } else {
      const int64_t want = shape[d - lead];
      FORGE_CHECK(want == g.shape()[d] || want == 1, "sum_to: shape ", g.shape(), " does not broadcast from ", shape);
      if (want == 1 && g.shape()[d] != 1) dims.push_back(d);
    }
  }
  Tensor r = dims.empty() ? g : sum(g, dims, true);
  return reshape(r, shape);
}

// ---- to be completed: mean, var, amax/amin, max/min/argmax/argmin, softmax family ----
Tensor mean(const Tensor&, const Dims&, bool) { detail::throw_not_on_cuda("mean (unimplemented)"); }
Tensor var(const Tensor&, const Dims&, bool, int64_t) { detail::throw_not_on_cuda("var (unimplemented)"); }
Tensor amax(const Tensor&, const Dims&, bool) { detail::throw_not_on_cuda("amax (unimplemented)"); }
Tensor amin(const Tensor&, const Dims&, bool) { detail::throw_not_on_cuda("amin (unimplemented)"); }
ValuesIndices max(const Tensor&, int64_t, bool) { detail::throw_not_on_cuda("max (unimplemented)"); }
ValuesIndices min(const Tensor&, int64_t, bool) { detail::throw_not_on_cuda("min (unimplemented)"); }
Tensor argmax(const Tensor&, int64_t, bool) { detail::throw_not_on_cuda("argmax (unimplemented)"); }
Tensor argmin(const Tensor&, int64_t, bool) { detail::throw_not_on_cuda("argmin (unimplemented)"); }
Tensor softmax(const Tensor&, int64_t) { detail::throw_not_on_cuda("softmax (unimplemented)"); }
Tensor log_softmax(const Tensor&, int64_t) { detail::throw_not_on_cuda("log_softmax (unimplemented)"); }

}  // namespace forge::ops
