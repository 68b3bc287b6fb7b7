#include "forge/ops/matmul.h"

#include <string>

#include "forge/autograd/deferred.h"
#include "forge/autograd/node.h"
#include "forge/core/env.h"
#include "forge/backends/cpu/binary.h"
#include "forge/backends/cpu/matmul.h"
#include "forge/backends/cpu/unary.h"
#include "forge/ops/binary.h"
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

void set_gemm_tuning(bool on) {
#ifdef FORGE_WITH_CUDA
  cuda::set_gemm_tuning(on);
#else
  (void)on;
#endif
}

bool gemm_tuning() {
#ifdef FORGE_WITH_CUDA
  return cuda::gemm_tuning();
#else
  return false;
#endif
}

using autograd::GradMask;
using autograd::record;

// The differentiable ops this file defines (Note [op registry] in ops/registry.h).
[[maybe_unused]] const bool kRegisteredOps = register_ops({"matmul", "mm", "bmm", "linear", "linear_gelu", "gelu_mlp", "lora_linear"});

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
// lora_linear's forward on CUDA (Note [fused LoRA linear]): y = x w^T + b, h = scale x a^T, y += h bb^T.
void cuda_lora_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& a, const Tensor& bb,
                       double scale, Tensor& y, Tensor& h) {
  cuda::linear_forward(x, w, b, y);
  cuda::matmul(x, transpose(a, 0, 1), h);
  mul_(h, scale);
  cuda::matmul(h, transpose(bb, 0, 1), y, 1.0);
}
#endif

// dL/d(pre) = g * gelu_tanh'(pre).
Tensor gelu_tanh_backward(const Tensor& g, const Tensor& pre) {
  Tensor out = empty(pre.shape(), {.dtype = pre.dtype(), .device = pre.device()});
  if (pre.is_cpu()) cpu::unary_backward(UnaryOp::gelu_tanh, g, pre, pre, out);
  else FORGE_ON_CUDA("linear_gelu", cuda::unary_backward(UnaryOp::gelu_tanh, g, pre, pre, out));
  return out;
}

// linear_gelu's dL/d(pre) from g (M, N) and, when want_bias, the bias gradient with it in one pass
// on CUDA (Note [GELU and bias gradients in one pass]; FORGE_GELU_BIAS_GRAD=0: not): then db is set
// (b_leaf's claimed buffer or a new tensor). Otherwise db stays undefined, for the weight
// gradient's GEMM to compute.
Tensor gelu_backward(const Tensor& g, const Tensor& pre, const Tensor& b_leaf, bool want_bias, Tensor& db) {
#ifdef FORGE_WITH_CUDA
  static const bool one_pass = env::flag("FORGE_GELU_BIAS_GRAD");
  if (want_bias && one_pass && pre.is_cuda() && cuda::gelu_backward_column_sums_fit(g, pre)) {
    const TensorOptions o{.dtype = pre.dtype(), .device = pre.device()};
    Tensor dpre = empty(pre.shape(), o), dbias = detail::grad_output(b_leaf, {pre.size(1)}, o);
    FORGE_CHECK(cuda::gelu_backward_column_sums(g, pre, dpre, dbias), "linear_gelu backward: the one-pass GELU and "
                "bias gradient did not run for ", g.shape(), " (an internal error: please report it)");
    db = dbias;
    return dpre;
  }
#else
  (void)b_leaf;
  (void)want_bias;
  (void)db;
#endif
  return gelu_tanh_backward(g, pre);
}

// Note [input gradient accumulated in the GEMM]: when one activation feeds several linears
// (LLaMA's normed stream into q_proj, k_proj and v_proj, and into gate_proj and up_proj), its
// gradient is the sum of theirs. On CUDA each linear node asks the engine for what the others
// have accumulated already (Note [pending input gradient], autograd/node.h) and, when that
// tensor is its alone (no other handle on it or its memory), adds its dy W into it with the GEMM
// itself (beta = 1): no separate (M, in) addition, no new buffer. Otherwise dy W is computed into
// a new tensor and the pending gradient added to it.
Tensor input_gradient(const Tensor& dy, const Tensor& w, const Shape& x_shape) {
  Tensor pending = dy.is_cpu() ? Tensor() : autograd::take_pending_input_grad();
  if (pending.defined()) {
    const bool exclusive = pending.impl_ptr().use_count() == 1 && pending.storage().use_count() == 1;
    if (exclusive && pending.is_contiguous() && pending.shape() == x_shape && pending.dtype() == dy.dtype() &&
        pending.device() == dy.device()) {
      Tensor acc = reshape(pending, {dy.size(0), w.size(1)});  // a view: pending is contiguous
      FORGE_ON_CUDA("linear", cuda::matmul(dy, w, acc, 1.0));
      return pending;
    }
    return add(reshape(matmul(dy, w), x_shape), pending);
  }
  return reshape(matmul(dy, w), x_shape);
}

Tensor linear_impl(const char* name, const Tensor& x, const Tensor& weight, const Tensor& bias, bool gelu,
                   std::shared_ptr<autograd::DeferredGrads> defer = nullptr) {
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
  // (A queue that provides the input gives it to the weight gradient instead: Note [weight
  // gradients behind the collective].)
  // The parameters themselves, for their pre-allocated gradient buffers (DDP's bucket views):
  // the weight-gradient GEMM writes straight into them (Note [claimed grad buffer]).
  const Tensor w_leaf = detail::grad_buffer_owner(weight), b_leaf = detail::grad_buffer_owner(bias);
  const bool input_later = defer && defer->provides_input() && (!weight.requires_grad() || w_leaf.defined()) &&
                           (!bias.defined() || !bias.requires_grad() || b_leaf.defined());
  const Tensor x_saved = weight.requires_grad() && !input_later ? x2 : Tensor();
  const Tensor w_saved = x.requires_grad() ? w : Tensor();
  const Shape x_shape = x.shape();
  // dW (and db) from dy: written into the parameters' claimed gradient buffers where they have them.
  auto param_grads = [x_saved, w_leaf, b_leaf, out_features, in, M, q = defer.get(), input_later](
                         const Tensor& dy, bool want_w, bool want_b) {
    const Tensor x_saved_or_given = input_later ? reshape(q->input(), {M, in}) : x_saved;
    Tensor dw, db;
    if (dy.is_cpu()) {
      if (want_w) {
        dw = detail::grad_output(w_leaf, {out_features, in}, {.dtype = dy.dtype()});
        cpu::matmul(transpose(dy, 0, 1), x_saved_or_given, dw);
      }
      if (want_b) db = sum(dy, {0});
    } else {
      const TensorOptions o{.dtype = dy.dtype(), .device = dy.device()};
      if (want_w) dw = detail::grad_output(w_leaf, {out_features, in}, o);
      if (want_b) db = detail::grad_output(b_leaf, {out_features}, o);
      // The bias gradient in the weight gradient's GEMM (or on its own when dW is not needed).
      FORGE_ON_CUDA("linear", cuda::linear_backward_params(dy, x_saved_or_given, dw, db));
    }
    return std::make_pair(dw, db);
  };
  // Note [column sums handed to the producer] (autograd/node.h): where the output's consumer can
  // compute the bias gradient with a kernel of its own (GPT's add_layer_norm), it leaves it here
  // (FORGE_NORM_BIAS_GRAD=1; otherwise no slot, nothing allocated).
  auto sums = !gelu && bias.defined() && bias.requires_grad() && x.is_cuda() && env::flag("FORGE_NORM_BIAS_GRAD")
                  ? std::make_shared<autograd::ColumnSumsSlot>()
                  : nullptr;
  auto backward = [w_saved, pre, x_shape, M, out_features, w_leaf, b_leaf, param_grads, defer, sums](
                      const Tensor& g, const GradMask& need) {
    Tensor dy = reshape(g, {M, out_features});
    // The GELU's gradient; on CUDA with the bias gradient in the same pass (Note [GELU and bias
    // gradients in one pass], backends/cuda/matmul.cu), so that the GEMM below computes dW only.
    // Or the bias gradient from the consumer (above), when it is of this very gradient.
    Tensor db_done;
    if (pre.defined()) dy = gelu_backward(dy, pre, need[2] ? b_leaf : Tensor(), need[2], db_done);
    else if (sums && need[2]) db_done = sums->take_for(g);
    Tensor dx;
    if (need[0]) dx = input_gradient(dy, w_saved, x_shape);
    const bool want_b = need[2] && !db_done.defined();
    // Note [weight gradients behind the collective] (autograd/deferred.h): dW and db queued, to
    // be computed while a collective on dx runs; handed to the leaves when computed.
    const bool deferred = defer && (need[1] || need[2]) && (!need[1] || w_leaf.defined()) &&
                          (!need[2] || b_leaf.defined());
    if (deferred) {
      defer->push([dy, w_leaf, b_leaf, param_grads, want_w = need[1], want_b, db_done] {
        const auto [dw, db] = param_grads(dy, want_w, want_b);
        autograd::accumulate_leaf_grad(w_leaf, dw);
        autograd::accumulate_leaf_grad(b_leaf, db_done.defined() ? db_done : db);
      });
      return TensorList{dx, Tensor(), Tensor()};
    }
    auto [dw, db] = need[1] || want_b ? param_grads(dy, need[1], want_b) : std::make_pair(Tensor(), Tensor());
    return TensorList{dx, dw, db_done.defined() ? db_done : db};
  };
  record(name, y, {x, weight, bias}, backward, {x_saved, w_saved, pre});
  // Note [input gradient accumulated in the GEMM]
  if (y.grad_fn() && !x.is_cpu() && x.requires_grad()) y.grad_fn()->fuse_input_grad = 0;
  if (y.grad_fn()) y.grad_fn()->output_column_sums = std::move(sums);
  return y;
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) { return matmul_impl("matmul", a, b); }

// (A thread's DeferWeightGrads queue, when no queue is given: ZB-H1's W passes.)
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return linear_impl("linear", x, weight, bias, false, autograd::current_weight_grad_queue());
}

Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return linear_impl("linear_gelu", x, weight, bias, true, autograd::current_weight_grad_queue());
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias,
              const std::shared_ptr<autograd::DeferredGrads>& defer) {
  return linear_impl("linear", x, weight, bias, false, defer ? defer : autograd::current_weight_grad_queue());
}

// Note [fused LoRA linear]: y = x W^T + b + scale (x A^T) B^T as one node. Composed of linear,
// mul and add, the adapter's branch keeps three (M, out) tensors per layer alive until the
// backward (the scaled product saved by mul, both addends saved by add: a 1B LLaMA's blocks held
// 2.9x their activations in LoRA). Here the forward writes x W^T + b, then adds the rank-r
// product into it with the GEMM's beta = 1 (h = scale x A^T is (M, r), scaled in place), and the
// node keeps x, W, A, B and h: what the frozen linear keeps, plus (M, r). The backward, from dy:
//   g_h = scale dy B (M, r)      dA = g_h^T x      dB = dy^T h      dx = dy W + g_h A
// (dx's second term added by a GEMM with beta = 1 into the first; dW and db only for a base that
// trains). h and g_h carry the scale (both (M, r): scaling them is free). Gradient buffers are written in
// place where claimed (DDP's buckets).
Tensor lora_linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& A, const Tensor& B,
                   double scale) {
  constexpr const char* name = "lora_linear";
  check_linear(name, x, weight, bias);
  detail::check_same_device(name, {x, A, B});
  const int64_t in = weight.size(1), out_features = weight.size(0);
  FORGE_CHECK(A.defined() && B.defined() && A.dim() == 2 && B.dim() == 2 && A.size(1) == in &&
                  B.size(0) == out_features && B.size(1) == A.size(0) && A.dtype() == x.dtype() && B.dtype() == x.dtype(),
              name, ": the adapter must be A (r, ", in, ") and B (", out_features, ", r) of dtype ", dtype_name(x.dtype()),
              ", got ", A.defined() ? A.shape() : Shape{}, " and ", B.defined() ? B.shape() : Shape{});
  const int64_t r = A.size(0);
  Shape y_shape(x.shape().begin(), x.shape().end() - 1);
  const int64_t M = shape_numel(y_shape);
  y_shape.push_back(out_features);
  const TensorOptions opt{.dtype = x.dtype(), .device = x.device()};
  const Tensor x2 = reshape(x.detach(), {M, in});
  const Tensor w = weight.detach(), b = bias.defined() ? bias.detach() : Tensor(), a = A.detach(), bb = B.detach();
  Tensor y2 = empty({M, out_features}, opt), h = empty({M, r}, opt);
  if (x.is_cpu()) {
    cpu_linear(x2, w, b, y2);
    cpu::matmul(x2, transpose(a, 0, 1), h);
    mul_(h, scale);
    Tensor d = empty({M, out_features}, opt);
    cpu::matmul(h, transpose(bb, 0, 1), d);
    cpu::binary(BinaryOp::add, y2, d, y2);
  } else {
    FORGE_ON_CUDA(name, cuda_lora_forward(x2, w, b, a, bb, scale, y2, h));
  }
  Tensor y = Tensor::make(y2.storage(), y_shape, contiguous_strides(y_shape), 0, y2.dtype());

  const Tensor w_leaf = detail::grad_buffer_owner(weight), b_leaf = detail::grad_buffer_owner(bias);
  const Tensor a_leaf = detail::grad_buffer_owner(A), b2_leaf = detail::grad_buffer_owner(B);
  const bool adapter_grads = A.requires_grad() || B.requires_grad();
  const Tensor x_saved = weight.requires_grad() || A.requires_grad() ? x2 : Tensor();
  const Tensor w_saved = x.requires_grad() ? w : Tensor();
  const Tensor a_saved = x.requires_grad() ? a : Tensor();
  const Tensor b_saved = x.requires_grad() || adapter_grads ? bb : Tensor();
  const Tensor h_saved = B.requires_grad() ? h : Tensor();
  const Shape x_shape = x.shape();
  auto backward = [x_saved, w_saved, a_saved, b_saved, h_saved, w_leaf, b_leaf, a_leaf, b2_leaf, x_shape, M, in,
                   out_features, r, scale](const Tensor& g, const GradMask& need) {
    const Tensor dy = reshape(g, {M, out_features});
    const TensorOptions o{.dtype = dy.dtype(), .device = dy.device()};
    Tensor gh;  // dy B, (M, r)
    if (need[0] || need[3]) {
      gh = empty({M, r}, o);
      if (dy.is_cpu()) cpu::matmul(dy, b_saved, gh);
      else FORGE_ON_CUDA("lora_linear", cuda::matmul(dy, b_saved, gh));
      mul_(gh, scale);
    }
    Tensor dx, dw, db, da, dbb;
    if (need[0]) {
      dx = input_gradient(dy, w_saved, x_shape);  // contiguous, ours (Note [input gradient accumulated in the GEMM])
      Tensor dx2 = reshape(dx, {M, in});
      if (dy.is_cpu()) {
        Tensor t = empty({M, in}, o);
        cpu::matmul(gh, a_saved, t);
        cpu::binary(BinaryOp::add, dx2, t, dx2);
      } else {
        FORGE_ON_CUDA("lora_linear", cuda::matmul(gh, a_saved, dx2, 1.0));
      }
    }
    if (need[3]) {
      da = detail::grad_output(a_leaf, {r, in}, o);
      if (dy.is_cpu()) cpu::matmul(transpose(gh, 0, 1), x_saved, da);
      else FORGE_ON_CUDA("lora_linear", cuda::matmul(transpose(gh, 0, 1), x_saved, da));
    }
    if (need[4]) {
      dbb = detail::grad_output(b2_leaf, {out_features, r}, o);
      if (dy.is_cpu()) cpu::matmul(transpose(dy, 0, 1), h_saved, dbb);
      else FORGE_ON_CUDA("lora_linear", cuda::matmul(transpose(dy, 0, 1), h_saved, dbb));
    }
    if (need[1] || need[2]) {  // a base that trains too
      if (need[1]) dw = detail::grad_output(w_leaf, {out_features, in}, o);
      if (dy.is_cpu()) {
        if (need[1]) cpu::matmul(transpose(dy, 0, 1), x_saved, dw);
        if (need[2]) db = sum(dy, {0});
      } else {
        if (need[2]) db = detail::grad_output(b_leaf, {out_features}, o);
        FORGE_ON_CUDA("lora_linear", cuda::linear_backward_params(dy, x_saved, dw, db));
      }
    }
    return TensorList{dx, dw, db, da, dbb};
  };
  record(name, y, {x, weight, bias, A, B}, backward, {x_saved, w_saved, a_saved, b_saved, h_saved});
  // Note [input gradient accumulated in the GEMM]
  if (y.grad_fn() && !x.is_cpu() && x.requires_grad()) y.grad_fn()->fuse_input_grad = 0;
  return y;
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

// Note [GELU gradient in the GEMM]: GPT's MLP backward, unfused, runs the down projection's
// input-gradient GEMM (dh = dy W_proj), an elementwise GELU backward (dpre = dh * gelu'(pre):
// reads dh and pre, writes dpre) and the up projection's bias gradient (a column sum of dpre,
// a separate cuBLASLt kernel). As one node, the GEMM's DGELU_BGRAD epilogue writes dpre and
// its column sums directly: dh never exists, and two passes over an (M, 4C) tensor go. Where
// cuBLASLt has no algorithm (or on the CPU) the three steps run as before, with the same
// values to rounding.
Tensor gelu_mlp(const Tensor& x, const Tensor& w_fc, const Tensor& b_fc, const Tensor& w_proj, const Tensor& b_proj) {
  constexpr const char* name = "gelu_mlp";
  check_linear(name, x, w_fc, b_fc);
  FORGE_CHECK(w_proj.defined() && w_proj.dim() == 2 && w_proj.size(1) == w_fc.size(0) && w_proj.dtype() == x.dtype(),
              name, ": the down projection's weight must be (out, ", w_fc.size(0), ") of ", dtype_name(x.dtype()),
              ", got ", w_proj.defined() ? w_proj.shape() : Shape{});
  detail::check_same_device(name, {x, w_proj, b_proj});
  FORGE_CHECK(!b_proj.defined() || (b_proj.dim() == 1 && b_proj.size(0) == w_proj.size(0) &&
                                    b_proj.dtype() == x.dtype()),
              name, ": the down projection's bias must be (", w_proj.size(0), "), got ", b_proj.shape());
  const int64_t in = w_fc.size(1), hidden = w_fc.size(0), out_f = w_proj.size(0);
  Shape y_shape(x.shape().begin(), x.shape().end() - 1);
  const int64_t M = shape_numel(y_shape);
  y_shape.push_back(out_f);
  const TensorOptions opt{.dtype = x.dtype(), .device = x.device()};
  const Tensor x2 = reshape(x.detach(), {M, in});
  const Tensor w1 = w_fc.detach(), b1 = b_fc.defined() ? b_fc.detach() : Tensor();
  const Tensor w2 = w_proj.detach(), b2 = b_proj.defined() ? b_proj.detach() : Tensor();
  Tensor pre = empty({M, hidden}, opt), h = empty({M, hidden}, opt), y2 = empty({M, out_f}, opt);
  if (x.is_cpu()) {
    cpu_linear(x2, w1, b1, pre);
    cpu::unary(UnaryOp::gelu_tanh, pre, h);
    cpu_linear(h, w2, b2, y2);
  } else {
    FORGE_ON_CUDA(name, cuda::linear_gelu_forward(x2, w1, b1, h, pre); cuda::linear_forward(h, w2, b2, y2));
  }
  Tensor y = Tensor::make(y2.storage(), y_shape, contiguous_strides(y_shape), 0, y2.dtype());
  const Tensor w1_leaf = detail::grad_buffer_owner(w_fc), b1_leaf = detail::grad_buffer_owner(b_fc);
  const Tensor w2_leaf = detail::grad_buffer_owner(w_proj), b2_leaf = detail::grad_buffer_owner(b_proj);
  const Shape x_shape = x.shape();
  auto backward = [x2, w1, w2, pre, h, x_shape, M, hidden, out_f, w1_leaf, b1_leaf, w2_leaf, b2_leaf](
                      const Tensor& g, const GradMask& need) {
    const TensorOptions o{.dtype = pre.dtype(), .device = pre.device()};
    const Tensor dy = reshape(g, {M, out_f});
    Tensor dx, dw1, db1, dw2, db2;
    // The down projection's parameters.
    if (need[3]) dw2 = detail::grad_output(w2_leaf, {out_f, hidden}, o);
    if (need[4]) db2 = detail::grad_output(b2_leaf, {out_f}, o);
    if (need[3] || need[4]) {
      if (dy.is_cpu()) {
        if (need[3]) cpu::matmul(transpose(dy, 0, 1), h, dw2);
        if (need[4]) db2 = sum(dy, {0});
      } else {
        FORGE_ON_CUDA("gelu_mlp", cuda::linear_backward_params(dy, h, dw2, db2));
      }
    }
    if (!need[0] && !need[1] && !need[2]) return TensorList{dx, dw1, db1, dw2, db2};
    // d(pre), and the up projection's bias gradient with it where the epilogue runs.
    Tensor dpre = empty({M, hidden}, o);
    bool have_db1 = false;
    if (!dy.is_cpu()) {
#ifdef FORGE_WITH_CUDA
      Tensor db1_out = need[2] ? detail::grad_output(b1_leaf, {hidden}, o) : empty({hidden}, o);
      if (cuda::gelu_input_gradient(dy, w2, pre, dpre, db1_out)) {
        have_db1 = true;
        if (need[2]) db1 = db1_out;
      } else {
        dpre = gelu_tanh_backward(matmul(dy, w2), pre);
      }
#endif
    } else {
      dpre = gelu_tanh_backward(matmul(dy, w2), pre);
    }
    // The up projection's weight (and bias, where the epilogue did not give it).
    if (need[1]) dw1 = detail::grad_output(w1_leaf, {hidden, x2.size(1)}, o);
    if (need[2] && !have_db1) db1 = detail::grad_output(b1_leaf, {hidden}, o);
    if (need[1] || (need[2] && !have_db1)) {
      Tensor db1_todo = have_db1 ? Tensor() : db1;
      if (dpre.is_cpu()) {
        if (need[1]) cpu::matmul(transpose(dpre, 0, 1), x2, dw1);
        if (db1_todo.defined()) db1 = sum(dpre, {0});
      } else {
        FORGE_ON_CUDA("gelu_mlp", cuda::linear_backward_params(dpre, x2, dw1, db1_todo));
      }
    }
    if (need[0]) dx = input_gradient(dpre, w1, x_shape);
    return TensorList{dx, dw1, db1, dw2, db2};
  };
  record(name, y, {x, w_fc, b_fc, w_proj, b_proj}, backward, {x2, w1, w2, pre, h});
  if (y.grad_fn() && !x.is_cpu() && x.requires_grad()) y.grad_fn()->fuse_input_grad = 0;  // Note [input gradient accumulated in the GEMM]
  return y;
}

}  // namespace forge::ops
