#include "forge/ops/matmul.h"

#include <string>

#include "forge/autograd/node.h"
#include "forge/backends/cpu/binary.h"
#include "forge/backends/cpu/matmul.h"
#include "forge/backends/cpu/unary.h"
#include "forge/ops/creation.h"
#include "forge/ops/dispatch_device.h"
#include "forge/ops/grad_buffer.h"
#include "forge/ops/reduce.h"
#include "forge/ops/registry.h"
#include "forge/ops/view.h"

#ifdef FORGE_WITH_CUDA
#include "forge/backends/cuda/elementwise.h"
#include "forge/backends/cuda/matmul.h"
#endif

namespace forge::ops {

void set_allow_tf32(bool on) {
#ifdef FORGE_WITH_CUDA
  cuda::set_allow_tf32(on);
#else
  (void)on;
#endif
}

bool allow_tf32() {
#ifdef FORGE_WITH_CUDA
  return cuda::allow_tf32();
#else
  return false;
#endif
}

using autograd::GradMask;
using autograd::record;

// The differentiable ops this file defines (Note [op registry] in ops/registry.h).
[[maybe_unused]] const bool kRegisteredOps = register_ops({"matmul", "mm", "bmm", "linear", "linear_gelu"});

namespace {

// The product of two operands already brought to matrices: a1 (*ba, M, K), b1 (*bb, K, N)
// -> (*broadcast(ba, bb), M, N). No history is recorded here.
Tensor matmul_forward(const char* name, const Tensor& a1, const Tensor& b1, const Shape& a_shape,
                      const Shape& b_shape) {
  const int64_t M = a1.shape()[a1.dim() - 2], K = a1.shape()[a1.dim() - 1], N = b1.shape()[b1.dim() - 1];
  const Shape ba(a1.shape().begin(), a1.shape().end() - 2), bb(b1.shape().begin(), b1.shape().end() - 2);
  // (*batch, M, K) @ (K, N): fold the batch into M when a's layout allows a view, so that
  // the whole product is one GEMM (the common Linear-layer case).
  if (bb.empty() && !ba.empty()) {
    Strides st;
    if (view_strides(a1.shape(), a1.strides(), {shape_numel(ba) * M, K}, st)) {
      Tensor a2 = Tensor::make(a1.storage(), {shape_numel(ba) * M, K}, st, a1.offset(), a1.dtype());
      Tensor out = empty({shape_numel(ba) * M, N}, {.dtype = a1.dtype(), .device = a1.device()});
      if (out.is_cpu()) cpu::matmul(a2, b1, out);
      else FORGE_ON_CUDA(name, cuda::matmul(a2, b1, out));
      Shape os = ba;
      os.push_back(M);
      os.push_back(N);
      return Tensor::make(out.storage(), os, contiguous_strides(os), 0, out.dtype());
    }
  }
  Shape batch;
  {
    const size_t n = std::max(ba.size(), bb.size());
    batch.resize(n);
    for (size_t i = 0; i < n; ++i) {
      const int64_t da = i < n - ba.size() ? 1 : ba[i - (n - ba.size())];
      const int64_t db = i < n - bb.size() ? 1 : bb[i - (n - bb.size())];
      FORGE_CHECK(da == db || da == 1 || db == 1, name, ": the batch dims of shapes ", a_shape, " and ", b_shape,
                  " cannot be broadcast together (", ba, " vs ", bb, ")");
      batch[i] = da == 1 ? db : da;
    }
  }
  Shape sa = batch, sb = batch, so = batch;
  sa.insert(sa.end(), {M, K});
  sb.insert(sb.end(), {K, N});
  so.insert(so.end(), {M, N});
  // Broadcast views (stride 0 on broadcast batch dims); the kernel never materialises them.
  const Tensor ae = a1.shape() == sa ? a1 : expand(a1, sa);
  const Tensor be = b1.shape() == sb ? b1 : expand(b1, sb);
  Tensor out = empty(so, {.dtype = a1.dtype(), .device = a1.device()});
  if (out.is_cpu()) cpu::matmul(ae, be, out);
  else FORGE_ON_CUDA(name, cuda::matmul(ae, be, out));
  return out;
}

// torch.matmul semantics; `name` is the op reported in errors and the backward node.
Tensor matmul_impl(const char* name, const Tensor& a, const Tensor& b) {
  detail::check_same_device(name, {a, b});
  FORGE_CHECK(a.dtype() == b.dtype(), name, ": expected both operands to have the same dtype, got ",
              dtype_name(a.dtype()), " (shape ", a.shape(), ") and ", dtype_name(b.dtype()), " (shape ", b.shape(),
              "); convert one with .to()");
  FORGE_CHECK(a.dtype() != DType::boolean, name, ": not supported for bool tensors (shapes ", a.shape(), " and ",
              b.shape(), ")");
  FORGE_CHECK(a.dim() >= 1 && b.dim() >= 1, name, ": both operands must have at least 1 dim, got shapes ", a.shape(),
              " and ", b.shape());
  // 1-D operands become matrices: a (K) -> (1, K), b (K) -> (K, 1); the added dim is
  // removed from the result.
  const bool a_vec = a.dim() == 1, b_vec = b.dim() == 1;
  const Tensor ad = a.detach(), bd = b.detach();
  const Tensor a1 = a_vec ? unsqueeze(ad, 0) : ad;
  const Tensor b1 = b_vec ? unsqueeze(bd, 1) : bd;
  const int64_t ka = a1.shape()[a1.dim() - 1], kb = b1.shape()[b1.dim() - 2];
  FORGE_CHECK(ka == kb, name, ": shapes ", a.shape(), " and ", b.shape(), " cannot be multiplied (", ka, " != ", kb,
              ")");
  Tensor out1 = matmul_forward(name, a1, b1, a.shape(), b.shape());
  const Shape out1_shape = out1.shape();
  Shape out_shape = out1_shape;
  if (a_vec) out_shape.erase(out_shape.end() - 2);  // (*, 1, N) -> (*, N)
  if (b_vec) out_shape.erase(out_shape.end() - 1);  // (*, M, 1) -> (*, M)
  Tensor out = out_shape == out1_shape
                   ? out1
                   : Tensor::make(out1.storage(), out_shape, contiguous_strides(out_shape), 0, out1.dtype());
  if (!is_floating(out.dtype())) return out;

  // Save a only if b needs its gradient, and b only if a does.
  const Tensor a_saved = b.requires_grad() ? a1 : Tensor();
  const Tensor b_saved = a.requires_grad() ? b1 : Tensor();
  const Shape a_shape = a.shape(), b_shape = b.shape();
  record(name, out, {a, b}, [a_saved, b_saved, a_shape, b_shape, out1_shape](const Tensor& g, const GradMask& need) {
    // d(out1) = d(a1) b1 + a1 d(b1):  grad_a1 = g1 b1^T,  grad_b1 = a1^T g1, each summed
    // over the batch dims its operand was broadcast along.
    const Tensor g1 = reshape(g, out1_shape);
    Tensor ga, gb;
    if (need[0]) {
      const Tensor bt = transpose(b_saved, -1, -2);
      ga = matmul(g1, bt);
      Shape target = a_shape;
      if (target.size() == 1) target.insert(target.begin(), 1);
      ga = reshape(sum_to(ga, target), a_shape);
    }
    if (need[1]) {
      const int64_t K = a_saved.shape()[a_saved.dim() - 1], N = g1.shape()[g1.dim() - 1];
      const int64_t rows = shape_numel(Shape(a_saved.shape().begin(), a_saved.shape().end() - 1));
      Shape target = b_shape;
      if (target.size() == 1) target.push_back(1);
      if (target.size() == 2 && g1.dim() > 2) {
        // b was shared by every batch: one GEMM over the folded batch, (K, B*M) @ (B*M, N).
        gb = matmul(transpose(reshape(a_saved, {rows, K}), 0, 1), reshape(g1, {rows, N}));
      } else {
        gb = sum_to(matmul(transpose(a_saved, -1, -2), g1), target);
      }
      gb = reshape(gb, b_shape);
    }
    return TensorList{ga, gb};
  }, {a_saved, b_saved});
  return out;
}

// ---- linear ------------------------------------------------------------------------------
//
//   y = x W^T + b                   x (*, in) viewed as (M, in), W (out, in), b (out)
//   dx = dy W       dW = dy^T x      db = sum over rows of dy
// linear_gelu applies gelu_tanh to y and saves y (the pre-activation) for its backward,
// which first turns dL/d(gelu) into dL/dy.

void check_linear(const char* name, const Tensor& x, const Tensor& w, const Tensor& b) {
  FORGE_CHECK(x.defined() && w.defined(), name, ": x and weight must be defined tensors");
  detail::check_same_device(name, {x, w, b});
  FORGE_CHECK(is_floating(x.dtype()) && w.dtype() == x.dtype() && (!b.defined() || b.dtype() == x.dtype()), name,
              ": x, weight and bias must share one floating dtype, got ", dtype_name(x.dtype()), ", ",
              dtype_name(w.dtype()), b.defined() ? std::string(", ") + dtype_name(b.dtype()) : std::string(),
              " (shapes ", x.shape(), ", ", w.shape(), ")");
  FORGE_CHECK(w.dim() == 2, name, ": weight must be 2-D (out_features, in_features), got shape ", w.shape());
  FORGE_CHECK(x.dim() >= 1 && x.shape().back() == w.size(1), name, ": input of shape ", x.shape(),
              " does not end in in_features = ", w.size(1), " (weight ", w.shape(), ")");
  FORGE_CHECK(!b.defined() || (b.dim() == 1 && b.size(0) == w.size(0)), name, ": bias must have shape [", w.size(0),
              "] (out_features of weight ", w.shape(), "), got ", b.shape());
}

// out (M, N) = x (M, K) w^T + b, on the CPU.
void cpu_linear(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& out) {
  cpu::matmul(x, transpose(w, 0, 1), out);
  if (b.defined()) cpu::binary(BinaryOp::add, out, expand(b, out.shape()), out);
}

#ifdef FORGE_WITH_CUDA
void cuda_linear(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& out, Tensor& pre) {
  if (pre.defined()) cuda::linear_gelu_forward(x, w, b, out, pre);
  else cuda::linear_forward(x, w, b, out);
}
#endif

// dL/d(pre) = g * gelu_tanh'(pre).
Tensor gelu_tanh_backward(const Tensor& g, const Tensor& pre) {
  Tensor out = empty(pre.shape(), {.dtype = pre.dtype(), .device = pre.device()});
  if (pre.is_cpu()) cpu::unary_backward(UnaryOp::gelu_tanh, g, pre, pre, out);
  else FORGE_ON_CUDA("linear_gelu", cuda::unary_backward(UnaryOp::gelu_tanh, g, pre, pre, out));
  return out;
}

Tensor linear_impl(const char* name, const Tensor& x, const Tensor& weight, const Tensor& bias, bool gelu) {
  check_linear(name, x, weight, bias);
  const int64_t in = weight.size(1), out_features = weight.size(0);
  Shape y_shape(x.shape().begin(), x.shape().end() - 1);
  const int64_t M = shape_numel(y_shape);
  y_shape.push_back(out_features);
  const TensorOptions opt{.dtype = x.dtype(), .device = x.device()};
  const Tensor x2 = reshape(x.detach(), {M, in});  // a view unless x's strides forbid one
  const Tensor w = weight.detach(), b = bias.defined() ? bias.detach() : Tensor();
  Tensor y2 = empty({M, out_features}, opt);
  Tensor pre = gelu ? empty({M, out_features}, opt) : Tensor();
  if (x.is_cpu()) {
    if (gelu) {
      cpu_linear(x2, w, b, pre);
      cpu::unary(UnaryOp::gelu_tanh, pre, y2);
    } else {
      cpu_linear(x2, w, b, y2);
    }
  } else {
    FORGE_ON_CUDA(name, cuda_linear(x2, w, b, y2, pre));
  }
  Tensor y = Tensor::make(y2.storage(), y_shape, contiguous_strides(y_shape), 0, y2.dtype());

  // dW needs x, dx needs W; the GELU's derivative needs the pre-activation.
  const Tensor x_saved = weight.requires_grad() ? x2 : Tensor();
  const Tensor w_saved = x.requires_grad() ? w : Tensor();
  const Shape x_shape = x.shape();
  // The parameters themselves, for their pre-allocated gradient buffers (DDP's bucket views):
  // the weight-gradient GEMM writes straight into them (Note [claimed grad buffer]).
  const Tensor w_leaf = detail::grad_buffer_owner(weight), b_leaf = detail::grad_buffer_owner(bias);
  auto backward = [x_saved, w_saved, pre, x_shape, M, out_features, w_leaf, b_leaf](const Tensor& g,
                                                                                    const GradMask& need) {
    Tensor dy = reshape(g, {M, out_features});
    if (pre.defined()) dy = gelu_tanh_backward(dy, pre);
    Tensor dx, dw, db;
    if (need[0]) dx = reshape(matmul(dy, w_saved), x_shape);
    if (need[1] || need[2]) {
      if (dy.is_cpu()) {
        if (need[1]) {
          dw = detail::grad_output(w_leaf, {out_features, x_saved.size(1)}, {.dtype = dy.dtype()});
          cpu::matmul(transpose(dy, 0, 1), x_saved, dw);
        }
        if (need[2]) db = sum(dy, {0});
      } else {
        const TensorOptions o{.dtype = dy.dtype(), .device = dy.device()};
        if (need[1]) dw = detail::grad_output(w_leaf, {out_features, x_saved.size(1)}, o);
        if (need[2]) db = detail::grad_output(b_leaf, {out_features}, o);
        // The bias gradient in the weight gradient's GEMM (or on its own when dW is not needed).
        FORGE_ON_CUDA("linear", cuda::linear_backward_params(dy, x_saved, dw, db));
      }
    }
    return TensorList{dx, dw, db};
  };
  record(name, y, {x, weight, bias}, backward, {x_saved, w_saved, pre});
  return y;
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) { return matmul_impl("matmul", a, b); }

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return linear_impl("linear", x, weight, bias, false);
}

Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return linear_impl("linear_gelu", x, weight, bias, true);
}

Tensor mm(const Tensor& a, const Tensor& b) {
  FORGE_CHECK(a.dim() == 2 && b.dim() == 2, "mm: expected 2-D operands, got shapes ", a.shape(), " and ", b.shape(),
              " (use matmul for 1-D or batched operands)");
  return matmul_impl("mm", a, b);
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  FORGE_CHECK(a.dim() == 3 && b.dim() == 3, "bmm: expected 3-D operands (B, M, K) and (B, K, N), got shapes ",
              a.shape(), " and ", b.shape());
  FORGE_CHECK(a.shape()[0] == b.shape()[0], "bmm: batch sizes differ: shapes ", a.shape(), " and ", b.shape(),
              " (", a.shape()[0], " != ", b.shape()[0], "; use matmul to broadcast)");
  return matmul_impl("bmm", a, b);
}

}  // namespace forge::ops
