// qkv_rope_attention: LLaMA's attention from one packed q/k/v projection.
//
// Note [packed LLaMA attention]
// LLaMA projects q, k and v with three linears. With grouped-query attention k and v are narrow
// (LLaMA 0.85B: 8 kv heads of 64 = 512 columns against q's 2048), and their GEMMs run far below
// the GPU's rate: 17 GFLOP each at M = 8192 tokens, forward, input gradient (accumulated into
// x's, beta = 1) and weight gradient (M = 512: too few output tiles for the SMs). One
// (H + 2 Hkv) D-wide GEMM runs all three at the rate of the wide ones. The obstacle is the
// gradient: three narrow views of the packed output would each build a zero-filled gradient of
// its full shape that the engine then adds up (Note [packed QKV attention] in attention.cpp,
// GPT's case). Here, as there, the views are taken without history and one node is recorded on
// the merged output; its backward allocates the packed gradient once and writes each part in
// place: dv straight from the attention backward on CUDA (its fused kernels write any row
// layout), dq and dk through the inverse rotation, whose kernel writes strided outputs. Saved
// for the backward: the rotated q and k and a dense copy of v (as the unfused path saves), not
// the packed input, whose unrotated q and k nobody needs again.
// Values: the same kernels as the unfused path (ops::rope, scaled_dot_product_attention) on the
// same inputs, so the same values; only the projection's GEMM differs (one instead of three).
#include <cmath>

#include "forge/autograd/node.h"
#include "forge/backends/cpu/attention.h"
#include "forge/backends/cpu/rope.h"
#include "forge/ops/attention.h"
#include "forge/ops/copy.h"
#include "forge/ops/creation.h"
#include "forge/ops/dispatch_device.h"
#include "forge/ops/registry.h"
#include "forge/ops/view.h"

#ifdef FORGE_WITH_CUDA
#include "forge/backends/cuda/attention.h"
#include "forge/backends/cuda/rope.h"
#endif

namespace forge::ops {

using autograd::GradMask;
using autograd::record;

namespace {

constexpr const char* kName = "qkv_rope_attention";
// The differentiable op this file defines (Note [op registry] in ops/registry.h).
[[maybe_unused]] const bool kRegisteredOps = register_ops({kName});

// The rotation (or its inverse) of x (B, h, T, D) written into out (its shape; on CUDA any
// layout with a unit last stride, on the CPU through a dense copy where out is not contiguous).
void rotate_into(const Tensor& x, Tensor& out, int64_t offset, double theta, const RopeScaling& scaling,
                 bool inverse) {
  if (x.is_cpu()) {
    if (out.is_contiguous()) {
      cpu::rope(x, out, offset, theta, scaling, inverse);
    } else {
      Tensor dense = empty(out.shape(), {.dtype = out.dtype(), .device = out.device()});
      cpu::rope(x, dense, offset, theta, scaling, inverse);
      out.copy_(dense);
    }
    return;
  }
  FORGE_ON_CUDA(kName, cuda::rope(x, out, offset, theta, scaling, inverse));
}

Tensor readable_rows(const Tensor& t) { return cpu::attention_rows_readable(t) ? t : contiguous(t); }

}  // namespace

Tensor qkv_rope_attention(const Tensor& qkv, int64_t n_head, int64_t n_kv_head, int64_t position_offset,
                          double theta, const RopeScaling& scaling, bool causal) {
  FORGE_CHECK(qkv.defined() && qkv.dim() == 3, kName, ": expected qkv of shape (B, T, (H + 2 Hkv) D), got ",
              qkv.defined() ? qkv.shape() : Shape{});
  FORGE_CHECK(is_floating(qkv.dtype()), kName, ": qkv must be floating point, got ", dtype_name(qkv.dtype()));
  FORGE_CHECK(n_head > 0 && n_kv_head > 0 && n_head % n_kv_head == 0, kName, ": n_head = ", n_head,
              " must be a positive multiple of n_kv_head = ", n_kv_head);
  const int64_t B = qkv.size(0), T = qkv.size(1), W = qkv.size(2), H = n_head, Hk = n_kv_head;
  FORGE_CHECK(W % (H + 2 * Hk) == 0 && (W / (H + 2 * Hk)) % 2 == 0, kName, ": the last dim of qkv ", qkv.shape(),
              " must be (n_head + 2 n_kv_head) x D with D even, n_head = ", H, ", n_kv_head = ", Hk);
  FORGE_CHECK(position_offset >= 0, kName, ": position_offset must be >= 0, got ", position_offset);
  const int64_t D = W / (H + 2 * Hk);
  const double c = 1.0 / std::sqrt(static_cast<double>(D));
  // The (B, heads, T, D) view of `heads` heads starting at head `first` of a (B, T, W) tensor.
  auto part = [=](const Tensor& t, int64_t first, int64_t heads) {
    return transpose(reshape(narrow(t, 2, first * D, heads * D), {B, T, heads, D}), 1, 2);
  };
  const Tensor x = qkv.detach();
  const bool cpu = x.is_cpu();
  const TensorOptions opt{.dtype = x.dtype(), .device = x.device()};
  // Rotated q and k: on CUDA in the projection's memory order ((B, T, h, D)), so attention's
  // output and the head merge stay views; on the CPU dense.
  auto rotated = [&](const Tensor& t) {
    Tensor out = cpu ? empty(t.shape(), opt) : empty_in_order_of(t, t.shape());
    rotate_into(t, out, position_offset, theta, scaling, false);
    return out;
  };
  const Tensor qr = rotated(part(x, 0, H)), kr = rotated(part(x, H, Hk));
  Tensor vd = cpu ? contiguous(part(x, H + Hk, Hk)) : empty_in_order_of(part(x, H + Hk, Hk), {B, Hk, T, D});
  if (!cpu) vd.copy_(part(x, H + Hk, Hk));
  Tensor lse = empty({B, H, T}, {.dtype = x.dtype() == DType::f64 ? DType::f64 : DType::f32, .device = x.device()});
  Tensor out4;  // (B, H, T, D), what the backward reads
  bool fused = false;
  if (cpu) {
    out4 = empty({B, H, T, D}, opt);
    cpu::attention_forward(qr, kr, vd, Tensor(), causal, c, out4, lse);
  } else {
#ifdef FORGE_WITH_CUDA
    // As attention_cuda: grouped heads on the composed GEMM path want a dense (B, H, T, D) output.
    fused = cuda::fused_attention_applies(qr, kr, vd, Tensor(), causal);
    out4 = H != Hk && !fused ? empty({B, H, T, D}, opt) : empty_in_order_of(qr, {B, H, T, D});
    cuda::attention_forward(qr, kr, vd, Tensor(), causal, c, out4, lse);
#else
    FORGE_THROW(kName, ": ", x.device().str(), " tensors need forge built with CUDA");
#endif
  }
  Tensor y = reshape(transpose(out4, 1, 2), {B, T, H * D});
  record(kName, y, {qkv}, [=](const Tensor& g, const GradMask&) {
    Tensor grad = empty({B, T, W}, opt);
    Tensor dq = part(grad, 0, H), dk = part(grad, H, Hk), dv = part(grad, H + Hk, Hk);
    const Tensor g4 = transpose(reshape(g, {B, T, H, D}), 1, 2);
    Tensor gq, gk;
    if (cpu) {
      gq = empty({B, H, T, D}, opt);
      gk = empty({B, Hk, T, D}, opt);
      Tensor gv = empty({B, Hk, T, D}, opt);
      cpu::attention_backward(readable_rows(g4), qr, kr, vd, Tensor(), out4, lse, causal, c, gq, gk, gv);
      dv.copy_(gv);
    } else {
#ifdef FORGE_WITH_CUDA
      gq = H != Hk && !fused ? empty({B, H, T, D}, opt) : empty_in_order_of(qr, qr.shape());
      gk = empty_in_order_of(kr, kr.shape());
      // The fused kernels write dv's rows through its strides, in place in the packed gradient.
      Tensor gv = fused ? dv : empty_in_order_of(vd, vd.shape());
      cuda::attention_backward(g4, qr, kr, vd, Tensor(), out4, lse, causal, c, gq, gk, gv);
      if (!fused) dv.copy_(gv);
#endif
    }
    rotate_into(gq, dq, position_offset, theta, scaling, true);
    rotate_into(gk, dk, position_offset, theta, scaling, true);
    return TensorList{grad};
  }, {qr, kr, vd, out4, lse});
  return y;
}

}  // namespace forge::ops
