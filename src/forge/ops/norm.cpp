// layer_norm, add_layer_norm and rms_norm: argument checks, the kernels (backends/cpu/norm.h,
// backends/cuda/norm.h) and the backward, which is one fused kernel producing dx, dweight and
// dbias together.
#include "forge/ops/norm.h"

#include <cmath>

#include "forge/autograd/node.h"
#include "forge/backends/cpu/norm.h"
#include "forge/ops/binary.h"
#include "forge/ops/copy.h"
#include "forge/ops/creation.h"
#include "forge/ops/dispatch_device.h"
#include "forge/ops/grad_buffer.h"
#include "forge/ops/registry.h"

#ifdef FORGE_WITH_CUDA
#include "forge/backends/cuda/norm.h"
#endif

namespace forge::ops {

using autograd::GradMask;
using autograd::record;

// The differentiable ops this file defines (Note [op registry] in ops/registry.h).
[[maybe_unused]] const bool kRegisteredOps = register_ops({"layer_norm", "add_layer_norm", "rms_norm", "add_rms_norm"});

namespace {

// x (..., C) floating; each defined parameter (C) of x's dtype and device; eps >= 0.
void check_norm_args(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  FORGE_CHECK(x.defined(), op, ": x must be a defined tensor");
  detail::check_same_device(op, {x, weight, bias});
  FORGE_CHECK(is_floating(x.dtype()), op, ": x must be floating-point (f32, f64, bf16, f16), got ",
              dtype_name(x.dtype()), " of shape ", x.shape());
  FORGE_CHECK(x.dim() >= 1, op, ": x must have at least one dim (normalised over the last), got a 0-d tensor");
  const int64_t C = x.shape().back();
  auto check_param = [&](const Tensor& p, const char* what) {
    if (!p.defined()) return;
    FORGE_CHECK(p.shape() == Shape{C}, op, ": ", what, " must have shape [", C, "] (the last dim of x, shape ",
                x.shape(), "), got ", p.shape());
    FORGE_CHECK(p.dtype() == x.dtype(), op, ": ", what, " dtype ", dtype_name(p.dtype()), " (shape ", p.shape(),
                ") must match x's dtype ", dtype_name(x.dtype()), " (shape ", x.shape(), ")");
  };
  check_param(weight, "weight");
  check_param(bias, "bias");
  FORGE_CHECK(eps >= 0 && std::isfinite(eps), op, ": eps must be finite and >= 0, got ", eps, " (x shape ", x.shape(),
              ")");
}

// The residual of a fused add + norm: defined, on x's device, of x's shape and dtype.
void check_residual(const char* op, const Tensor& x, const Tensor& residual) {
  FORGE_CHECK(residual.defined(), op, ": residual must be a defined tensor");
  detail::check_same_device(op, {x, residual});
  FORGE_CHECK(residual.shape() == x.shape() && residual.dtype() == x.dtype(), op,
              ": x and residual must have one shape and dtype, got x ", x.shape(), " ", dtype_name(x.dtype()),
              " and residual ", residual.shape(), " ", dtype_name(residual.dtype()));
}

Tensor detached_contiguous(const Tensor& t) { return t.defined() ? contiguous(t.detach()) : Tensor(); }

int64_t rows_of(const Tensor& x) {
  int64_t r = 1;
  for (int64_t d = 0; d + 1 < x.dim(); ++d) r *= x.shape()[d];
  return r;
}

// Note [residual gradient in the norm backward]: a norm's input is the residual stream, which
// also reaches the rest of the model by the residual path (GPT's add_layer_norm h feeds the
// next add; LLaMA's x feeds its residual add). Its gradient is the norm's dx plus what came back
// along that path. On CUDA the norm node asks the engine for the part already accumulated
// (Note [pending input gradient], autograd/node.h) and the backward kernel adds it while it
// writes dx: the separate (R, C) addition of the two, one read of each and a write, disappears.
// The pending tensor is only read (it may be shared with another input's gradient).
// Takes the pending gradient of the norm's input into grads.dx_add when the CUDA kernel can read
// it; returns what must still be added to dx after the kernel (undefined when nothing).
Tensor fuse_pending_into(cpu::NormGrads& grads, const Tensor& xs) {
  if (!grads.dx.defined() || xs.is_cpu()) return Tensor();
  Tensor pending = autograd::take_pending_input_grad();
  if (!pending.defined()) return Tensor();
  if (pending.is_contiguous() && pending.shape() == xs.shape() && pending.dtype() == xs.dtype() &&
      pending.device() == xs.device()) {
    grads.dx_add = pending;
    return Tensor();
  }
  return pending;
}

// dx + rest (rest: what fuse_pending_into could not hand to the kernel).
Tensor with_rest(const Tensor& dx, const Tensor& rest) { return rest.defined() ? add(dx, rest) : dx; }

// Records y as the layer norm of `x` (the autograd input) with the forward's saved state: xs
// (x's values, contiguous), ws (the weight, contiguous or undefined), mean and rstd.
// Backward (fused, {cpu,cuda}::layer_norm_backward): with xhat = (x - mean) * rstd, g = dy * w,
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  dw = sum_rows dy * xhat,  db = sum_rows dy.
// `sums` (Note [column sums handed to the producer], autograd/node.h): the slot of the node that
// produced the fused add's residual (a linear with a bias), or null; the backward then computes
// the column sums of dx with it where the CUDA kernel can, and leaves them there.
void record_layer_norm(const char* name, Tensor& y, const Tensor& x, const Tensor& weight, const Tensor& bias,
                       const Tensor& xs, const Tensor& ws, const Tensor& mean, const Tensor& rstd,
                       std::shared_ptr<autograd::ColumnSumsSlot> sums = nullptr) {
  // The kernels overwrite dweight and dbias whole, so they may be the parameters' pre-allocated
  // gradient buffers (Note [claimed grad buffer], autograd/node.cpp).
  const Tensor w_leaf = detail::grad_buffer_owner(weight), b_leaf = detail::grad_buffer_owner(bias);
  record(name, y, {x, weight, bias}, [xs, ws, mean, rstd, w_leaf, b_leaf, sums](const Tensor& g, const GradMask& need) {
    const TensorOptions opt{.dtype = xs.dtype(), .device = xs.device()};
    const int64_t C = xs.shape().back();
    cpu::NormGrads grads;
    if (need[0]) grads.dx = empty(xs.shape(), opt);
    if (need[1]) grads.dweight = detail::grad_output(w_leaf, {C}, opt);
    if (need[2]) grads.dbias = detail::grad_output(b_leaf, {C}, opt);
    if (sums && need[0] && xs.is_cuda()) grads.dx_sums = empty({C}, opt);
    const Tensor gc = contiguous(g);
    const Tensor rest = fuse_pending_into(grads, xs);
    if (xs.is_cpu()) cpu::layer_norm_backward(gc, xs, ws, mean, rstd, grads);
    else FORGE_ON_CUDA("layer_norm", cuda::layer_norm_backward(gc, xs, ws, mean, rstd, grads));
    if (sums && grads.dx_sums_done && !rest.defined()) sums->leave(grads.dx, grads.dx_sums);  // of the dx returned
    return TensorList{with_rest(grads.dx, rest), grads.dweight, grads.dbias};
  }, {xs, ws, mean, rstd});
  if (y.grad_fn() && xs.is_cuda()) y.grad_fn()->fuse_input_grad = 0;  // Note [residual gradient in the norm backward]
}

}  // namespace

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  check_norm_args("layer_norm", x, weight, bias, eps);
  const int64_t R = rows_of(x);
  const DType sd = cpu::norm_stat_dtype(x.dtype());
  Tensor y = empty(x.shape(), {.dtype = x.dtype(), .device = x.device()});
  Tensor mean = empty({R}, {.dtype = sd, .device = x.device()});
  Tensor rstd = empty({R}, {.dtype = sd, .device = x.device()});
  const Tensor xs = contiguous(x.detach()), ws = detached_contiguous(weight), bs = detached_contiguous(bias);
  if (xs.is_cpu()) cpu::layer_norm_forward(xs, ws, bs, eps, y, mean, rstd);
  else FORGE_ON_CUDA("layer_norm", cuda::layer_norm_forward(xs, ws, bs, eps, y, mean, rstd));
  record_layer_norm("layer_norm", y, x, weight, bias, xs, ws, mean, rstd);
  return y;
}

// Forward: one fused kernel (h and y). Backward: two nodes, as the unfused pair would record
// them: h = x + residual (gradient g to both) and y = layer_norm(h) (record_layer_norm), so the
// engine adds the layer norm's dx to whatever else flows into h before it reaches x and residual.
AddLayerNorm add_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, const Tensor& bias,
                            double eps) {
  constexpr const char* op = "add_layer_norm";
  check_norm_args(op, x, weight, bias, eps);
  check_residual(op, x, residual);
  const int64_t R = rows_of(x);
  const DType sd = cpu::norm_stat_dtype(x.dtype());
  const TensorOptions opt{.dtype = x.dtype(), .device = x.device()};
  AddLayerNorm out{empty(x.shape(), opt), empty(x.shape(), opt)};
  Tensor mean = empty({R}, {.dtype = sd, .device = x.device()});
  Tensor rstd = empty({R}, {.dtype = sd, .device = x.device()});
  const Tensor xs = contiguous(x.detach()), rs = contiguous(residual.detach());
  const Tensor ws = detached_contiguous(weight), bs = detached_contiguous(bias);
  if (xs.is_cpu()) cpu::add_layer_norm_forward(xs, rs, ws, bs, eps, out.h, out.y, mean, rstd);
  else FORGE_ON_CUDA(op, cuda::add_layer_norm_forward(xs, rs, ws, bs, eps, out.h, out.y, mean, rstd));
  const Tensor hs = out.h.detach();  // saved by the norm node (before out.h gets its grad_fn)
  // The residual's producer may take the column sums of its gradient from the norm's backward
  // (Note [column sums handed to the producer]: a slot only where FORGE_NORM_BIAS_GRAD=1).
  std::shared_ptr<autograd::ColumnSumsSlot> sums;
  if (residual.grad_fn() && xs.is_cuda()) sums = residual.grad_fn()->output_column_sums;
  record(op, out.h, {x, residual}, [](const Tensor& g, const GradMask& need) {
    return TensorList{need[0] ? g : Tensor(), need[1] ? g : Tensor()};
  });
  record_layer_norm(op, out.y, out.h, weight, bias, hs, ws, mean, rstd, std::move(sums));
  return out;
}

namespace {

// Records y as the RMS norm of `x` (the autograd input) with the forward's saved state: xs
// (x's values, contiguous), ws (the weight, contiguous or undefined) and rstd.
// Backward (fused, {cpu,cuda}::rms_norm_backward): with xhat = x * rstd and g = dy * w,
//   dx = rstd * (g - xhat * mean(g * xhat)),  dw = sum_rows dy * xhat.
void record_rms_norm(const char* name, Tensor& y, const Tensor& x, const Tensor& weight, const Tensor& xs,
                     const Tensor& ws, const Tensor& rstd) {
  const Tensor w_leaf = detail::grad_buffer_owner(weight);
  record(name, y, {x, weight}, [xs, ws, rstd, w_leaf](const Tensor& g, const GradMask& need) {
    const TensorOptions opt{.dtype = xs.dtype(), .device = xs.device()};
    cpu::NormGrads grads;
    if (need[0]) grads.dx = empty(xs.shape(), opt);
    // dweight may be the weight's pre-allocated gradient buffer (Note [claimed grad buffer]).
    if (need[1]) grads.dweight = detail::grad_output(w_leaf, {xs.shape().back()}, opt);
    const Tensor gc = contiguous(g);
    const Tensor rest = fuse_pending_into(grads, xs);
    if (xs.is_cpu()) cpu::rms_norm_backward(gc, xs, ws, rstd, grads);
    else FORGE_ON_CUDA("rms_norm", cuda::rms_norm_backward(gc, xs, ws, rstd, grads));
    return TensorList{with_rest(grads.dx, rest), grads.dweight};
  }, {xs, ws, rstd});
  if (y.grad_fn() && xs.is_cuda()) y.grad_fn()->fuse_input_grad = 0;  // Note [residual gradient in the norm backward]
}

}  // namespace

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  check_norm_args("rms_norm", x, weight, Tensor(), eps);
  const int64_t R = rows_of(x);
  Tensor y = empty(x.shape(), {.dtype = x.dtype(), .device = x.device()});
  Tensor rstd = empty({R}, {.dtype = cpu::norm_stat_dtype(x.dtype()), .device = x.device()});
  const Tensor xs = contiguous(x.detach()), ws = detached_contiguous(weight);
  if (xs.is_cpu()) cpu::rms_norm_forward(xs, ws, eps, y, rstd);
  else FORGE_ON_CUDA("rms_norm", cuda::rms_norm_forward(xs, ws, eps, y, rstd));
  record_rms_norm("rms_norm", y, x, weight, xs, ws, rstd);
  return y;
}

// As add_layer_norm: one fused forward kernel; backward as the add node and the RMS norm node
// the unfused pair would record.
AddRmsNorm add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, double eps) {
  constexpr const char* op = "add_rms_norm";
  check_norm_args(op, x, weight, Tensor(), eps);
  check_residual(op, x, residual);
  const int64_t R = rows_of(x);
  const TensorOptions opt{.dtype = x.dtype(), .device = x.device()};
  AddRmsNorm out{empty(x.shape(), opt), empty(x.shape(), opt)};
  Tensor rstd = empty({R}, {.dtype = cpu::norm_stat_dtype(x.dtype()), .device = x.device()});
  const Tensor xs = contiguous(x.detach()), rs = contiguous(residual.detach()), ws = detached_contiguous(weight);
  if (xs.is_cpu()) cpu::add_rms_norm_forward(xs, rs, ws, eps, out.h, out.y, rstd);
  else FORGE_ON_CUDA(op, cuda::add_rms_norm_forward(xs, rs, ws, eps, out.h, out.y, rstd));
  const Tensor hs = out.h.detach();  // saved by the norm node (before out.h gets its grad_fn)
  record(op, out.h, {x, residual}, [](const Tensor& g, const GradMask& need) {
    return TensorList{need[0] ? g : Tensor(), need[1] ? g : Tensor()};
  });
  record_rms_norm(op, out.y, out.h, weight, hs, ws, rstd);
  return out;
}

}  // namespace forge::ops
