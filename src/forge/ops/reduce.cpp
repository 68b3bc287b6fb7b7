// Reductions and the softmax family: argument checks, the (rows, cols) / (outer, n, inner)
// plan, the CPU kernels (backends/cpu/reduce.h, softmax.h) and each op's backward.
#include "forge/ops/reduce.h"

#include <algorithm>
#include <limits>
#include <string>

#include "forge/autograd/node.h"
#include "forge/backends/cpu/reduce.h"
#include "forge/backends/cpu/softmax.h"
#include "forge/ops/binary.h"
#include "forge/ops/copy.h"
#include "forge/ops/creation.h"
#include "forge/ops/dispatch_device.h"
#include "forge/ops/registry.h"
#include "forge/ops/view.h"

#ifdef FORGE_WITH_CUDA
#include "forge/backends/cuda/reduce.h"
#include "forge/backends/cuda/softmax.h"
#endif

namespace forge::ops {

using autograd::GradMask;
using autograd::record;

// The differentiable ops this file defines (Note [op registry] in ops/registry.h).
[[maybe_unused]] const bool kRegisteredOps = register_ops({"sum", "mean", "var", "amax", "amin", "max", "min",
                                                           "softmax", "log_softmax"});

namespace {

// Wraps a possibly negative `dim` of x (a 0-d tensor takes 0 and -1); the error names the op
// and x's shape.
int64_t wrap_dim_of(const Tensor& x, int64_t dim, const char* op) {
  const int64_t n = std::max<int64_t>(x.dim(), 1);
  FORGE_CHECK(dim >= -n && dim < n, op, ": dim ", dim, " is out of range for a tensor of shape ", x.shape(),
              " (expected ", -n, " <= dim < ", n, ")");
  return dim < 0 ? dim + n : dim;
}

void check_floating(const Tensor& x, const char* op) {
  FORGE_CHECK(is_floating(x.dtype()), op, ": expected a floating-point input (f32, f64, bf16, f16), got ",
              dtype_name(x.dtype()), " of shape ", x.shape(), "; convert with .to(DType::f32) first");
}

// A reduction's plan: the input viewed as a contiguous (outer, n, inner) tensor reduced
// over n, and the output shapes. Usually inner == 1: the reduced dims are moved last (a
// copy unless they already are), giving a (rows, cols) matrix for the row kernels. When
// `lanes` is allowed, x is contiguous and the reduced dims form one block followed by kept
// dims (sum over the batch dim of (B, C)), x is reduced in place by the lane kernel instead.
struct ReducePlan {
  Tensor input;  // detached and contiguous: (rows, cols) when inner == 1, else x's shape
  int64_t outer = 1, n = 1, inner = 1;
  Shape out_shape;   // without the reduced dims (or with them as 1 when keepdim)
  Shape keep_shape;  // always with the reduced dims as 1
  int64_t rows() const { return outer * inner; }
  int64_t cols() const { return n; }
};

ReducePlan plan_reduce(const Tensor& x, const Dims& dims, bool keepdim, const char* op, bool lanes = false) {
  const int64_t nd = x.dim();
  std::vector<bool> reduced(static_cast<size_t>(nd), dims.empty());
  for (int64_t d : dims) {
    const int64_t w = wrap_dim_of(x, d, op);
    if (nd == 0) continue;
    FORGE_CHECK(!reduced[w], op, ": dim ", d, " appears more than once in dims ", Shape(dims), " (input shape ",
                x.shape(), ")");
    reduced[w] = true;
  }
  ReducePlan p;
  std::vector<int64_t> perm;
  int64_t rows = 1, cols = 1;
  for (int64_t d = 0; d < nd; ++d)
    if (!reduced[d]) {
      perm.push_back(d);
      rows *= x.shape()[d];
    }
  for (int64_t d = 0; d < nd; ++d)
    if (reduced[d]) {
      perm.push_back(d);
      cols *= x.shape()[d];
    }
  for (int64_t d = 0; d < nd; ++d) {
    p.keep_shape.push_back(reduced[d] ? 1 : x.shape()[d]);
    if (!reduced[d] || keepdim) p.out_shape.push_back(p.keep_shape.back());
  }
  const Tensor xd = x.detach();
  const Tensor permuted = nd == 0 ? xd : permute(xd, perm);
  p.outer = rows;
  p.n = cols;
  if (lanes && !permuted.is_contiguous() && xd.is_contiguous()) {
    // Do the reduced dims (ignoring size-1 dims, which do not move memory) form one block?
    // Kept dims before it make `outer`, the block `n`, kept dims after it `inner`.
    int64_t outer = 1, inner = 1, phase = 0;  // 0: before the block, 1: in it, 2: after it
    bool one_block = true;
    for (int64_t d = 0; d < nd; ++d) {
      const int64_t size = x.shape()[d];
      if (size == 1) continue;
      if (reduced[d]) {
        one_block &= phase < 2;
        phase = 1;
      } else if (phase == 0) {
        outer *= size;
      } else {
        phase = 2;
        inner *= size;
      }
    }
    if (one_block && inner > 1) {
      p.input = xd;
      p.outer = outer;
      p.inner = inner;
      return p;
    }
  }
  p.input = reshape(contiguous(permuted), {rows, cols});
  return p;
}

// Reductions without an identity (amax, max, argmax, ...) cannot reduce zero elements.
void check_nonempty(const ReducePlan& p, const Tensor& x, const Dims& dims, const char* op) {
  FORGE_CHECK(p.cols() > 0, op, ": cannot reduce over a zero-size dimension (input shape ", x.shape(), ", dims ",
              dims.empty() ? std::string("all") : shape_str(dims), "): ", op, " has no identity element");
}

// sum, mean, amax, amin through cpu::reduce_rows (or reduce_lanes). An empty reduction gives 0 for sum and NaN
// for mean (as PyTorch); amax/amin have been rejected by check_nonempty.
Tensor run_rows(cpu::RowReduce op, const ReducePlan& p, DType out_dtype, [[maybe_unused]] const char* name) {
  Tensor out = empty({p.rows()}, {.dtype = out_dtype, .device = p.input.device()});
  if (p.cols() == 0 && op == cpu::RowReduce::mean) fill_(out, std::numeric_limits<double>::quiet_NaN());
  else if (p.inner == 1 && out.is_cpu()) cpu::reduce_rows(op, p.input, out);
  else if (p.inner == 1) FORGE_ON_CUDA(name, cuda::reduce_rows(op, p.input, out));
  else if (out.is_cpu()) cpu::reduce_lanes(op, p.input, out, p.outer, p.n, p.inner);
  else FORGE_ON_CUDA(name, cuda::reduce_lanes(op, p.input, out, p.outer, p.n, p.inner));
  return reshape(out, p.out_shape);
}

}  // namespace

Tensor sum(const Tensor& x, const Dims& dims, bool keepdim) {
  const DType od = is_floating(x.dtype()) ? x.dtype() : DType::i64;
  ReducePlan p = plan_reduce(x, dims, keepdim, "sum", true);
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

Tensor mean(const Tensor& x, const Dims& dims, bool keepdim) {
  check_floating(x, "mean");
  ReducePlan p = plan_reduce(x, dims, keepdim, "mean", true);
  Tensor out = run_rows(cpu::RowReduce::mean, p, x.dtype(), "mean");
  const double n = static_cast<double>(p.cols());
  record("mean", out, {x}, [in_shape = x.shape(), keep = p.keep_shape, n](const Tensor& g, const GradMask&) {
    return TensorList{expand(div(reshape(g, keep), n), in_shape)};
  });
  return out;
}

Tensor var(const Tensor& x, const Dims& dims, bool keepdim, int64_t correction) {
  check_floating(x, "var");
  ReducePlan p = plan_reduce(x, dims, keepdim, "var");
  Tensor out = empty({p.rows()}, {.dtype = x.dtype(), .device = x.device()});
  if (p.cols() == 0) fill_(out, std::numeric_limits<double>::quiet_NaN());  // as torch.var of nothing
  else if (out.is_cpu()) cpu::var_rows(p.input, out, correction);
  else FORGE_ON_CUDA("var", cuda::var_rows(p.input, out, correction));
  out = reshape(out, p.out_shape);
  const double divisor = static_cast<double>(std::max<int64_t>(p.cols() - correction, 0));
  record("var", out, {x}, [xs = x.detach(), dims, keep = p.keep_shape, divisor](const Tensor& g, const GradMask&) {
    // d var / d x_i = 2 (x_i - mean) / (N - correction)
    Tensor centered = sub(xs, mean(xs, dims, true));
    return TensorList{mul(centered, mul(reshape(g, keep), 2.0 / divisor))};
  }, {x});
  return out;
}

namespace {

Tensor extreme(cpu::RowReduce op, const Tensor& x, const Dims& dims, bool keepdim) {
  const char* name = op == cpu::RowReduce::amax ? "amax" : "amin";
  ReducePlan p = plan_reduce(x, dims, keepdim, name, true);
  check_nonempty(p, x, dims, name);
  Tensor out = run_rows(op, p, x.dtype(), name);
  if (!is_floating(x.dtype())) return out;
  record(name, out, {x}, [xs = x.detach(), y = out.detach(), dims, keep = p.keep_shape](const Tensor& g, const GradMask&) {
    // The gradient is split evenly among the elements equal to the extreme (as PyTorch).
    Tensor hit = to(eq(xs, reshape(y, keep)), g.dtype());
    return TensorList{mul(hit, div(reshape(g, keep), sum(hit, dims, true)))};
  }, {x, out});
  return out;
}

// A zero tensor of `shape` with g (keep-shaped) at position idx (keep-shaped, i64) along
// `dim`: the gradient of picking one element along dim.
Tensor place_at(const Tensor& g, const Tensor& idx, const Shape& keep, const Shape& shape, int64_t dim) {
  Shape pos_shape(shape.size(), 1);
  if (!shape.empty()) pos_shape[dim] = shape[dim];
  Tensor pos = reshape(arange(shape.empty() ? 1 : shape[dim], {.dtype = DType::i64, .device = g.device()}), pos_shape);
  return where(eq(pos, reshape(idx, keep)), reshape(g, keep), 0.0);
}

// max/min/argmax/argmin along one dim; values only when asked for.
ValuesIndices extreme_along(cpu::ArgReduce op, const Tensor& x, int64_t dim, bool keepdim, bool want_values,
                            const char* name) {
  const int64_t d = wrap_dim_of(x, dim, name);
  ReducePlan p = plan_reduce(x, {d}, keepdim, name);
  check_nonempty(p, x, {dim}, name);
  ValuesIndices r;
  r.indices = empty({p.rows()}, {.dtype = DType::i64, .device = x.device()});
  if (want_values) r.values = empty({p.rows()}, {.dtype = x.dtype(), .device = x.device()});
  if (x.is_cpu()) cpu::arg_reduce_rows(op, p.input, want_values ? &r.values : nullptr, r.indices);
  else FORGE_ON_CUDA(name, cuda::arg_reduce_rows(op, p.input, want_values ? &r.values : nullptr, r.indices));
  r.indices = reshape(r.indices, p.out_shape);
  if (!want_values) return r;
  r.values = reshape(r.values, p.out_shape);
  if (is_floating(x.dtype())) {
    record(name, r.values, {x},
           [idx = r.indices, keep = p.keep_shape, in_shape = x.shape(), d](const Tensor& g, const GradMask&) {
             return TensorList{place_at(g, idx, keep, in_shape, d)};
           }, {r.indices});
  }
  return r;
}

Tensor softmax_along(const Tensor& x, int64_t dim, bool log) {
  const char* name = log ? "log_softmax" : "softmax";
  check_floating(x, name);
  const int64_t d = wrap_dim_of(x, dim, name);
  Tensor y = empty(x.shape(), {.dtype = x.dtype(), .device = x.device()});
  if (x.is_cpu()) cpu::softmax_forward(contiguous(x.detach()), y, d, log);
  else FORGE_ON_CUDA(name, cuda::softmax_forward(contiguous(x.detach()), y, d, log));
  record(name, y, {x}, [ys = y.detach(), d, log, name](const Tensor& g, const GradMask&) {
    Tensor dx = empty(ys.shape(), {.dtype = ys.dtype(), .device = ys.device()});
    if (dx.is_cpu()) cpu::softmax_backward(ys, contiguous(g), dx, d, log);
    else FORGE_ON_CUDA(name, cuda::softmax_backward(ys, contiguous(g), dx, d, log));
    return TensorList{dx};
  }, {y});
  return y;
}

}  // namespace

Tensor amax(const Tensor& x, const Dims& dims, bool keepdim) { return extreme(cpu::RowReduce::amax, x, dims, keepdim); }
Tensor amin(const Tensor& x, const Dims& dims, bool keepdim) { return extreme(cpu::RowReduce::amin, x, dims, keepdim); }

ValuesIndices max(const Tensor& x, int64_t dim, bool keepdim) {
  return extreme_along(cpu::ArgReduce::max, x, dim, keepdim, true, "max");
}
ValuesIndices min(const Tensor& x, int64_t dim, bool keepdim) {
  return extreme_along(cpu::ArgReduce::min, x, dim, keepdim, true, "min");
}
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  return extreme_along(cpu::ArgReduce::max, x, dim, keepdim, false, "argmax").indices;
}
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim) {
  return extreme_along(cpu::ArgReduce::min, x, dim, keepdim, false, "argmin").indices;
}

Tensor softmax(const Tensor& x, int64_t dim) { return softmax_along(x, dim, false); }
Tensor log_softmax(const Tensor& x, int64_t dim) { return softmax_along(x, dim, true); }

}  // namespace forge::ops
