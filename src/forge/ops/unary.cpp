#include "forge/ops/unary.h"

#include "forge/autograd/node.h"
#include "forge/backends/cpu/unary.h"
#include "forge/ops/copy.h"
#include "forge/ops/creation.h"
#include "forge/ops/dispatch_device.h"
#include "forge/ops/registry.h"

#ifdef FORGE_WITH_CUDA
#include "forge/backends/cuda/elementwise.h"
#endif

namespace forge::ops {

// The differentiable ops this file defines (Note [op registry] in ops/registry.h).
[[maybe_unused]] const bool kRegisteredOps = register_ops({"neg", "abs", "exp", "log", "sqrt", "rsqrt", "sin", "cos",
                                                           "tanh", "sigmoid", "relu", "gelu", "gelu_tanh", "silu",
                                                           "swiglu"});

namespace {

Tensor unary_backward(UnaryOp op, const Tensor& g, const Tensor& x, const Tensor& y) {
  Tensor out = empty(g.shape(), {.dtype = g.dtype(), .device = g.device()});
  const Tensor& xs = x.defined() ? x : g;
  const Tensor& ys = y.defined() ? y : g;
  if (g.is_cpu()) cpu::unary_backward(op, g, xs, ys, out);
  else FORGE_ON_CUDA(unary_name(op), cuda::unary_backward(op, g, xs, ys, out));
  return out;
}

Tensor unary(UnaryOp op, const Tensor& x) {
  const char* name = unary_name(op);
  FORGE_CHECK(x.dtype() != DType::boolean, name, ": not supported for bool tensors (shape ", x.shape(), ")");
  Tensor in = x;
  if (!is_floating(x.dtype()) && !unary_keeps_integers(op)) in = to(x, DType::f32);
  Tensor out = empty(in.shape(), {.dtype = in.dtype(), .device = in.device()});
  if (in.is_cpu()) cpu::unary(op, in, out);
  else FORGE_ON_CUDA(name, cuda::unary(op, in, out));
  if (is_floating(in.dtype())) {
    Tensor xs = unary_needs_x(op) ? in.detach() : Tensor();
    Tensor ys = unary_needs_y(op) ? out.detach() : Tensor();
    autograd::record(name, out, {in}, [op, xs, ys](const Tensor& g, const autograd::GradMask&) {
      return TensorList{unary_backward(op, g, xs, ys)};
    }, {xs, ys});
  }
  return out;
}

}  // namespace

Tensor neg(const Tensor& x) { return unary(UnaryOp::neg, x); }
Tensor abs(const Tensor& x) { return unary(UnaryOp::abs, x); }
Tensor exp(const Tensor& x) { return unary(UnaryOp::exp, x); }
Tensor log(const Tensor& x) { return unary(UnaryOp::log, x); }
Tensor sqrt(const Tensor& x) { return unary(UnaryOp::sqrt, x); }
Tensor rsqrt(const Tensor& x) { return unary(UnaryOp::rsqrt, x); }
Tensor sin(const Tensor& x) { return unary(UnaryOp::sin, x); }
Tensor cos(const Tensor& x) { return unary(UnaryOp::cos, x); }
Tensor tanh(const Tensor& x) { return unary(UnaryOp::tanh, x); }
Tensor sigmoid(const Tensor& x) { return unary(UnaryOp::sigmoid, x); }
Tensor relu(const Tensor& x) { return unary(UnaryOp::relu, x); }
Tensor gelu(const Tensor& x, bool approximate) { return unary(approximate ? UnaryOp::gelu_tanh : UnaryOp::gelu, x); }
Tensor silu(const Tensor& x) { return unary(UnaryOp::silu, x); }

// Note [fused SwiGLU]: LLaMA's MLP computes silu(gate_proj(x)) * up_proj(x). As two ops it
// keeps gate, silu(gate) and up (three (B T, f) tensors) and moves 5 f-wide tensors forward
// and 9 backward; fused it keeps gate and up and moves 3 forward and 5 backward (dgate reads
// g, gate, up; dup reads g, gate). In bf16 the result is rounded once instead of twice.
Tensor swiglu(const Tensor& gate, const Tensor& up) {
  FORGE_CHECK(gate.defined() && up.defined(), "swiglu: gate and up must be defined tensors");
  detail::check_same_device("swiglu", {gate, up});
  FORGE_CHECK(gate.shape() == up.shape() && gate.dtype() == up.dtype() && is_floating(gate.dtype()),
              "swiglu: gate and up must have one shape and floating dtype, got ", gate.shape(), " ",
              dtype_name(gate.dtype()), " and ", up.shape(), " ", dtype_name(up.dtype()));
  const Tensor a = gate.detach(), b = up.detach();
  Tensor out = empty(a.shape(), {.dtype = a.dtype(), .device = a.device()});
  if (a.is_cpu()) cpu::swiglu(a, b, out);
  else FORGE_ON_CUDA("swiglu", cuda::swiglu(a, b, out));
  autograd::record("swiglu", out, {gate, up}, [a, b](const Tensor& g, const autograd::GradMask& need) {
    const TensorOptions o{.dtype = a.dtype(), .device = a.device()};
    Tensor da = need[0] ? empty(a.shape(), o) : Tensor(), db = need[1] ? empty(b.shape(), o) : Tensor();
    if (a.is_cpu()) cpu::swiglu_backward(g, a, b, da, db);
    else FORGE_ON_CUDA("swiglu", cuda::swiglu_backward(g, a, b, da, db));
    return TensorList{da, db};
  }, {a, b});
  return out;
}

}  // namespace forge::ops
