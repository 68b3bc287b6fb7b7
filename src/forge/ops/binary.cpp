#include "forge/ops/binary.h"

#include <cmath>

#include "forge/autograd/node.h"
#include "forge/backends/cpu/binary.h"
#include "forge/ops/copy.h"
#include "forge/ops/creation.h"
#include "forge/ops/dispatch_device.h"
#include "forge/ops/reduce.h"
#include "forge/ops/registry.h"
#include "forge/ops/unary.h"
#include "forge/ops/view.h"

#ifdef FORGE_WITH_CUDA
#include "forge/backends/cuda/elementwise.h"
#endif

namespace forge::ops {

using autograd::GradMask;
using autograd::record;

// The differentiable ops this file defines (Note [op registry] in ops/registry.h).
[[maybe_unused]] const bool kRegisteredOps = register_ops({"add", "sub", "mul", "div", "pow", "maximum", "minimum",
                                                           "where", "masked_fill"});

namespace {

// Runs the kernel: a and b (of dtype `ct`) broadcast to `shape`, into a new tensor.
Tensor run_binary(BinaryOp op, const Tensor& a, const Tensor& b, const Shape& shape, DType out_dtype, double alpha) {
  Tensor out = empty(shape, {.dtype = out_dtype, .device = a.device()});
  const Tensor ae = a.shape() == shape ? a : expand(a, shape);
  const Tensor be = b.shape() == shape ? b : expand(b, shape);
  if (out.is_cpu()) cpu::binary(op, ae, be, out, alpha);
  else FORGE_ON_CUDA(binary_name(op), cuda::binary(op, ae, be, out, alpha));
  return out;
}

Tensor run_where(const Tensor& cond, const Tensor& a, const Tensor& b, const Shape& shape) {
  Tensor out = empty(shape, {.dtype = a.dtype(), .device = a.device()});
  const Tensor ce = cond.shape() == shape ? cond : expand(cond, shape);
  const Tensor ae = a.shape() == shape ? a : expand(a, shape);
  const Tensor be = b.shape() == shape ? b : expand(b, shape);
  if (out.is_cpu()) cpu::where(ce, ae, be, out);
  else FORGE_ON_CUDA("where", cuda::where(ce, ae, be, out));
  return out;
}

// a == 0 && b >= 0: where d(a^b)/db is defined as 0 (as PyTorch).
Tensor pow_zero_mask(const Tensor& a, const Tensor& b) {
  Tensor za = eq(a, 0.0), nb = ge(b, 0.0);
  return run_where(za, nb, za, broadcast_shapes(za.shape(), nb.shape(), "pow"));
}

// The gradient for input x from a gradient of the broadcast shape: summed over broadcast
// dims and converted back to x's dtype.
Tensor reduce_grad(const Tensor& g, const Tensor& x) {
  Tensor r = g.shape() == x.shape() ? g : sum_to(g, x.shape());
  return r.dtype() == x.dtype() ? r : to(r, x.dtype());
}

int category(DType t) { return t == DType::boolean ? 0 : (is_floating(t) ? 2 : 1); }

// PyTorch's result_type for two tensors: a 0-d tensor (and so a scalar operand) raises
// the dtype of a dimensioned one only when it is of a higher category (bool < integer <
// floating): f16 [n] + 0-d f32 stays f16, i32 [n] + 0-d f64 becomes f64.
DType result_type(const Tensor& a, const Tensor& b) {
  const bool ad = a.dim() > 0, bd = b.dim() > 0;
  if (ad == bd) return promote_types(a.dtype(), b.dtype());
  const DType d = ad ? a.dtype() : b.dtype(), z = ad ? b.dtype() : a.dtype();
  return category(z) > category(d) ? promote_types(d, z) : d;
}

DType compute_dtype(BinaryOp op, const Tensor& a, const Tensor& b) {
  const DType ct = result_type(a, b);
  const bool arithmetic = !binary_is_comparison(op);
  FORGE_CHECK(!(arithmetic && ct == DType::boolean), binary_name(op), ": not supported for bool tensors (shapes ",
              a.shape(), " and ", b.shape(), "); convert with .to(DType::i64) or .to(DType::f32) first");
  if (op == BinaryOp::div && !is_floating(ct)) return DType::f32;  // true division, as PyTorch
  return ct;
}

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b, double alpha = 1.0) {
  const char* name = binary_name(op);
  detail::check_same_device(name, {a, b});
  const DType ct = compute_dtype(op, a, b);
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
  const Tensor ac = a.dtype() == ct ? a.detach() : to(a.detach(), ct);
  const Tensor bc = b.dtype() == ct ? b.detach() : to(b.detach(), ct);
  const bool cmp = binary_is_comparison(op);
  Tensor out = run_binary(op, ac, bc, shape, cmp ? DType::boolean : ct, alpha);
  if (cmp || !is_floating(ct)) return out;

  Tensor a0 = a, b0 = b;  // original handles: shapes and dtypes for the gradients
  Tensor y = out.detach();
  // What the backward reads (Note [saved tensor versions]): add/sub read nothing.
  TensorList saved;
  if (op == BinaryOp::div || op == BinaryOp::pow) saved = {ac, bc, y};
  else if (op != BinaryOp::add && op != BinaryOp::sub) saved = {ac, bc};
  record(name, out, {a, b}, [op, alpha, ac, bc, a0, b0, y](const Tensor& g, const GradMask& need) {
    Tensor ga, gb;
    switch (op) {
      case BinaryOp::add:
        if (need[0]) ga = g;
        if (need[1]) gb = alpha == 1.0 ? g : mul(g, alpha);
        break;
      case BinaryOp::sub:
        if (need[0]) ga = g;
        if (need[1]) gb = mul(g, -alpha);
        break;
      case BinaryOp::mul:
        if (need[0]) ga = mul(g, bc);
        if (need[1]) gb = mul(g, ac);
        break;
      case BinaryOp::div:
        if (need[0]) ga = div(g, bc);
        if (need[1]) gb = neg(div(mul(g, y), bc));
        break;
      case BinaryOp::pow:
        // d/da a^b = b a^(b-1);  d/db a^b = a^b log a (0 where a == 0 and b >= 0, as PyTorch)
        if (need[0]) ga = mul(g, mul(bc, pow(ac, sub(bc, 1.0))));
        if (need[1]) gb = masked_fill(mul(mul(g, y), log(ac)), pow_zero_mask(ac, bc), 0.0);
        break;
      case BinaryOp::maximum:
      case BinaryOp::minimum: {
        // The gradient goes to the selected input; ties split it evenly (as PyTorch).
        Tensor wins = op == BinaryOp::maximum ? gt(ac, bc) : lt(ac, bc);
        Tensor share_a = add(to(wins, g.dtype()), mul(to(eq(ac, bc), g.dtype()), 0.5));
        if (need[0]) ga = mul(g, share_a);
        if (need[1]) gb = mul(g, rsub(share_a, 1.0));
        break;
      }
      default:
        break;
    }
    return TensorList{ga.defined() ? reduce_grad(ga, a0) : Tensor(), gb.defined() ? reduce_grad(gb, b0) : Tensor()};
  }, saved);
  return out;
}

// The dtype a double scalar takes next to tensor t (see binary.h).
DType scalar_dtype(const Tensor& t, double v) {
  if (is_floating(t.dtype())) return t.dtype();
  if (std::floor(v) == v) return t.dtype() == DType::boolean ? DType::i64 : t.dtype();  // like a Python int
  return DType::f32;                                                                    // like a Python float
}

Tensor scalar_like(const Tensor& t, double v) { return scalar_tensor(v, {.dtype = scalar_dtype(t, v), .device = t.device()}); }

}  // namespace

Tensor add(const Tensor& a, const Tensor& b, double alpha) { return binary(BinaryOp::add, a, b, alpha); }
Tensor sub(const Tensor& a, const Tensor& b, double alpha) { return binary(BinaryOp::sub, a, b, alpha); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary(BinaryOp::mul, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary(BinaryOp::div, a, b); }
Tensor pow(const Tensor& a, const Tensor& b) { return binary(BinaryOp::pow, a, b); }
Tensor maximum(const Tensor& a, const Tensor& b) { return binary(BinaryOp::maximum, a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return binary(BinaryOp::minimum, a, b); }

Tensor add(const Tensor& a, double b) { return binary(BinaryOp::add, a, scalar_like(a, b)); }
Tensor sub(const Tensor& a, double b) { return binary(BinaryOp::sub, a, scalar_like(a, b)); }
Tensor rsub(const Tensor& a, double b) { return binary(BinaryOp::sub, scalar_like(a, b), a); }
Tensor mul(const Tensor& a, double b) { return binary(BinaryOp::mul, a, scalar_like(a, b)); }
Tensor div(const Tensor& a, double b) { return binary(BinaryOp::div, a, scalar_like(a, b)); }
Tensor rdiv(const Tensor& a, double b) { return binary(BinaryOp::div, scalar_like(a, b), a); }
Tensor pow(const Tensor& a, double e) { return binary(BinaryOp::pow, a, scalar_like(a, e)); }
Tensor pow(double base, const Tensor& e) { return binary(BinaryOp::pow, scalar_like(e, base), e); }
Tensor maximum(const Tensor& a, double b) { return binary(BinaryOp::maximum, a, scalar_like(a, b)); }
Tensor minimum(const Tensor& a, double b) { return binary(BinaryOp::minimum, a, scalar_like(a, b)); }

Tensor eq(const Tensor& a, const Tensor& b) { return binary(BinaryOp::eq, a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return binary(BinaryOp::ne, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return binary(BinaryOp::lt, a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return binary(BinaryOp::le, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return binary(BinaryOp::gt, a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return binary(BinaryOp::ge, a, b); }
Tensor eq(const Tensor& a, double b) { return binary(BinaryOp::eq, a, scalar_like(a, b)); }
Tensor ne(const Tensor& a, double b) { return binary(BinaryOp::ne, a, scalar_like(a, b)); }
Tensor lt(const Tensor& a, double b) { return binary(BinaryOp::lt, a, scalar_like(a, b)); }
Tensor le(const Tensor& a, double b) { return binary(BinaryOp::le, a, scalar_like(a, b)); }
Tensor gt(const Tensor& a, double b) { return binary(BinaryOp::gt, a, scalar_like(a, b)); }
Tensor ge(const Tensor& a, double b) { return binary(BinaryOp::ge, a, scalar_like(a, b)); }

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  detail::check_same_device("where", {cond, a, b});
  FORGE_CHECK(cond.dtype() == DType::boolean, "where: condition must be a bool tensor, got ", dtype_name(cond.dtype()),
              " of shape ", cond.shape(), " (build it with a comparison, e.g. gt(x, 0.0))");
  const DType ct = result_type(a, b);
  const Shape shape = broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), "where"), b.shape(), "where");
  const Tensor ac = a.dtype() == ct ? a.detach() : to(a.detach(), ct);
  const Tensor bc = b.dtype() == ct ? b.detach() : to(b.detach(), ct);
  Tensor out = run_where(cond, ac, bc, shape);
  if (!is_floating(ct)) return out;
  Tensor c = cond.detach(), a0 = a, b0 = b;
  record("where", out, {a, b}, [c, a0, b0](const Tensor& g, const GradMask& need) {
    Tensor zero = zeros({}, {.dtype = g.dtype(), .device = g.device()});
    Tensor ga = need[0] ? reduce_grad(run_where(c, g, zero, g.shape()), a0) : Tensor();
    Tensor gb = need[1] ? reduce_grad(run_where(c, zero, g, g.shape()), b0) : Tensor();
    return TensorList{ga, gb};
  }, {c});
  return out;
}

Tensor where(const Tensor& cond, const Tensor& a, double b) { return where(cond, a, scalar_like(a, b)); }

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  FORGE_CHECK(mask.dtype() == DType::boolean, "masked_fill: mask must be a bool tensor, got ", dtype_name(mask.dtype()),
              " of shape ", mask.shape());
  const Shape shape = broadcast_shapes(x.shape(), mask.shape(), "masked_fill");
  FORGE_CHECK(shape == x.shape(), "masked_fill: mask of shape ", mask.shape(), " does not broadcast to the input's shape ",
              x.shape());
  Tensor v = scalar_tensor(value, {.dtype = x.dtype(), .device = x.device()});
  return where(mask, v, x);
}

Tensor& add_(Tensor& a, const Tensor& b, double alpha) {
  check_inplace(a, "add_");
  detail::check_same_device("add_", {a, b});
  FORGE_CHECK(broadcast_shapes(a.shape(), b.shape(), "add_") == a.shape(), "add_: cannot add shape ", b.shape(),
              " in place into shape ", a.shape());
  const Tensor bc = b.dtype() == a.dtype() ? b.detach() : to(b.detach(), a.dtype());
  const Tensor be = bc.shape() == a.shape() ? bc : expand(bc, a.shape());
  if (a.is_cpu()) cpu::binary(BinaryOp::add, a, be, a, alpha);
  else FORGE_ON_CUDA("add_", cuda::binary(BinaryOp::add, a, be, a, alpha));
  a.storage()->bump_version();
  return a;
}

Tensor& mul_(Tensor& a, double s) {
  check_inplace(a, "mul_");
  const Tensor be = expand(scalar_tensor(s, {.dtype = a.dtype(), .device = a.device()}), a.shape());
  if (a.is_cpu()) cpu::binary(BinaryOp::mul, a, be, a);
  else FORGE_ON_CUDA("mul_", cuda::binary(BinaryOp::mul, a, be, a));
  a.storage()->bump_version();
  return a;
}

}  // namespace forge::ops
