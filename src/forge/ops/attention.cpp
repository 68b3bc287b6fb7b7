// scaled_dot_product_attention: checks, output allocation, the kernels (CPU:
// backends/cpu/attention.h, CUDA: backends/cuda/attention.h) and the backward, which calls
// the kernel's backward with the saved output and row logsumexp; and the packed forms that
// take q, k and v from one projection: qkv_attention (GPT) and qkv_rope_attention (LLaMA).
//
// Layouts on CUDA: the kernels read q, k, v (and the upstream gradient) through their
// strides, so the permuted (B, T, H, D) views of a fused QKV projection are not copied. The
// output and the gradients are allocated dense in the memory order of q (resp. k, v), e.g.
// (B, T, H, D) for those views, and returned as (B, H, T, D) views: the usual
// transpose(1, 2).reshape(B, T, H*D) after attention, and the gradients' way back through
// the head split, are then views instead of copies. With grouped heads (H > Hkv) on the
// composed GEMM path the query side is allocated contiguous (B, H, T, D), the layout in which a
// group's heads stack; the fused kernels keep q's memory order for them too.
#include "forge/ops/attention.h"

#include <cmath>
#include <vector>

#include "forge/autograd/grad_mode.h"
#include "forge/autograd/node.h"
#include "forge/backends/cpu/attention.h"
#include "forge/backends/cpu/rope.h"
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

constexpr const char* kName = "scaled_dot_product_attention";
// The differentiable op this file defines (Note [op registry] in ops/registry.h).
[[maybe_unused]] const bool kRegisteredOps = register_ops({kName, "qkv_attention", "qkv_rope_attention"});

void check_inputs(const Tensor& q, const Tensor& k, const Tensor& v, double scale, const Tensor& mask) {
  FORGE_CHECK(q.defined() && k.defined() && v.defined(), kName, ": q, k and v must be defined tensors");
  detail::check_same_device(kName, {q, k, v, mask});
  FORGE_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, kName,
              ": expected 4-D q (B, H, T, D), k (B, Hkv, S, D), v (B, Hkv, S, Dv), got shapes ", q.shape(), ", ",
              k.shape(), ", ", v.shape());
  FORGE_CHECK(is_floating(q.dtype()) && q.dtype() == k.dtype() && q.dtype() == v.dtype(), kName,
              ": q, k, v must share one floating dtype (f32, f64, bf16, f16), got ", dtype_name(q.dtype()), ", ",
              dtype_name(k.dtype()), ", ", dtype_name(v.dtype()), " (shapes ", q.shape(), ", ", k.shape(), ", ",
              v.shape(), ")");
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3);
  const int64_t Hkv = k.size(1), S = k.size(2);
  FORGE_CHECK(k.size(0) == B && v.size(0) == B, kName, ": batch sizes differ: q ", q.shape(), ", k ", k.shape(),
              ", v ", v.shape());
  FORGE_CHECK(v.size(1) == Hkv && v.size(2) == S, kName, ": k and v must have the same (Hkv, S), got k ", k.shape(),
              " and v ", v.shape());
  FORGE_CHECK(k.size(3) == D, kName, ": q and k must have the same head dim D, got q ", q.shape(), " and k ",
              k.shape(), " (", D, " != ", k.size(3), ")");
  FORGE_CHECK(D > 0, kName, ": the head dim D must be positive, got q ", q.shape());
  FORGE_CHECK(Hkv > 0 && H % Hkv == 0, kName, ": the number of query heads H=", H,
              " must be a multiple of the number of key/value heads Hkv=", Hkv, " (q ", q.shape(), ", k ", k.shape(),
              ")");
  FORGE_CHECK(std::isfinite(scale), kName, ": scale must be finite, got ", scale, " (0 selects 1/sqrt(D))");
  if (mask.defined()) {
    FORGE_CHECK(mask.dtype() == DType::boolean, kName, ": mask must be bool (true = attend), got ",
                dtype_name(mask.dtype()), " of shape ", mask.shape(),
                "; for an additive float mask use ops::where / masked_fill on the scores");
    const Shape target{B, H, T, S};
    bool ok = mask.dim() <= 4;
    for (int64_t i = 0; ok && i < mask.dim(); ++i) {
      const int64_t m = mask.size(mask.dim() - 1 - i), t = target[static_cast<size_t>(3 - i)];
      ok = m == t || m == 1;
    }
    FORGE_CHECK(ok, kName, ": mask of shape ", mask.shape(), " cannot be broadcast to (B, H, T, S) = ", target,
                " (q ", q.shape(), ", k ", k.shape(), ")");
  }
}

// The tensor itself when the kernel can read it in place, else a contiguous copy.
Tensor readable(const Tensor& t) { return cpu::attention_rows_readable(t) ? t : contiguous(t); }

// Note [document masks]: document ids are (B, n) i32 on q's device.
void check_documents(const Tensor& ids, int64_t B, int64_t n, const Tensor& q, const char* what) {
  FORGE_CHECK(ids.dim() == 2 && ids.size(0) == B && ids.size(1) == n && ids.dtype() == DType::i32, kName, ": ", what,
              " must be i32 of shape (", B, ", ", n, "), got ", dtype_name(ids.dtype()), " ", ids.shape(), " (q ",
              q.shape(), ")");
  FORGE_CHECK(ids.device() == q.device(), kName, ": ", what, " are on ", ids.device().str(), ", q on ",
              q.device().str());
}

#ifdef FORGE_WITH_CUDA
Tensor attention_cuda(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double c, const Tensor& mask,
                      const cpu::AttentionDocuments& docs) {
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), S = k.size(2), Dv = v.size(3);
  const Tensor qd = q.detach(), kd = k.detach(), vd = v.detach();
  // Grouped heads (H > Hkv) want the query side contiguous (B, H, T, D) only on the composed
  // GEMM path, which stacks a group's heads; the fused kernels (Note [attention back-ends]) read
  // and write any row layout, so with them it stays in q's memory order and the head merge after
  // attention (and the gradient's way back) are views. Document ids go to the backend, which runs
  // them on the flash kernels where it can (Note [flash documents]).
  const bool fused = docs.q.defined() ? cuda::document_attention_applies(qd, kd, vd)
                                      : cuda::fused_attention_applies(qd, kd, vd, mask, causal);
  const bool grouped = H != k.size(1) && !fused;
  const Tensor md = mask.defined() ? expand(mask.detach(), {B, H, T, S}) : Tensor();
  const TensorOptions opt{.dtype = q.dtype(), .device = q.device()};
  Tensor out = grouped ? empty({B, H, T, Dv}, opt) : empty_in_order_of(qd, {B, H, T, Dv});
  Tensor lse = empty({B, H, T}, {.dtype = q.dtype() == DType::f64 ? DType::f64 : DType::f32, .device = q.device()});
  cuda::attention_forward(qd, kd, vd, md, causal, c, out, lse, docs.q, docs.k);

  const Tensor od = out.detach();
  record(kName, out, {q, k, v}, [qd, kd, vd, md, od, lse, causal, c, grouped, docs](const Tensor& g,
                                                                                   const GradMask& need) {
    const TensorOptions o{.dtype = qd.dtype(), .device = qd.device()};
    Tensor dq = need[0] ? (grouped ? empty(qd.shape(), o) : empty_in_order_of(qd, qd.shape())) : Tensor();
    Tensor dk = need[1] ? empty_in_order_of(kd, kd.shape()) : Tensor();
    Tensor dv = need[2] ? empty_in_order_of(vd, vd.shape()) : Tensor();
    cuda::attention_backward(g, qd, kd, vd, md, od, lse, causal, c, dq, dk, dv, docs.q, docs.k);
    return TensorList{dq, dk, dv};
  }, {qd, kd, vd, md, od, lse, docs.q, docs.k});
  return out;
}
#endif

}  // namespace

namespace {
std::string g_backend = "auto";
bool g_deterministic = false;
}  // namespace

bool is_attention_backend(const std::string& name) { return name == "auto" || name == "flash" || name == "composed"; }

void set_attention_backend(const std::string& name) {
  FORGE_CHECK(is_attention_backend(name), "attention back-end '", name,
              "' is not one of auto, flash, composed (run.attention)");
  g_backend = name;
#ifdef FORGE_WITH_CUDA
  cuda::set_attention_backend(name == "auto"    ? cuda::AttentionBackend::automatic
                              : name == "flash" ? cuda::AttentionBackend::flash
                                                : cuda::AttentionBackend::composed);
#endif
}

std::string attention_backend() { return g_backend; }

void set_deterministic(bool on) {
  g_deterministic = on;
#ifdef FORGE_WITH_CUDA
  cuda::set_deterministic_attention(on);
#endif
}

bool deterministic() { return g_deterministic; }

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
                                    const Tensor& mask, const Tensor& documents) {
  check_inputs(q, k, v, scale, mask);
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3), S = k.size(2), Dv = v.size(3);
  const double c = scale != 0.0 ? scale : 1.0 / std::sqrt(static_cast<double>(D));
  cpu::AttentionDocuments docs;
  if (documents.defined()) {
    FORGE_CHECK(!mask.defined(), kName, ": give a mask or document ids, not both (mask ", mask.shape(),
                ", documents ", documents.shape(), ")");
    check_documents(documents, B, S, q, "documents (the keys' document ids)");
    docs = {narrow(documents.detach(), 1, S - T, T).contiguous(), documents.detach().contiguous()};
  }
  if (!q.is_cpu()) FORGE_ON_CUDA(kName, return attention_cuda(q, k, v, causal, c, mask, docs));
  const Tensor qd = readable(q.detach()), kd = readable(k.detach()), vd = readable(v.detach());
  const Tensor md = mask.defined() ? expand(mask.detach(), {B, H, T, S}) : Tensor();
  Tensor out = empty({B, H, T, Dv}, {.dtype = q.dtype(), .device = q.device()});
  Tensor lse = empty({B, H, T}, {.dtype = q.dtype() == DType::f64 ? DType::f64 : DType::f32, .device = q.device()});
  cpu::attention_forward(qd, kd, vd, md, causal, c, out, lse, docs);

  const Tensor od = out.detach();
  record(kName, out, {q, k, v}, [qd, kd, vd, md, od, lse, causal, c, docs](const Tensor& g, const GradMask& need) {
    Tensor dq = need[0] ? empty(qd.shape(), {.dtype = qd.dtype(), .device = qd.device()}) : Tensor();
    Tensor dk = need[1] ? empty(kd.shape(), {.dtype = kd.dtype(), .device = kd.device()}) : Tensor();
    Tensor dv = need[2] ? empty(vd.shape(), {.dtype = vd.dtype(), .device = vd.device()}) : Tensor();
    cpu::attention_backward(readable(g), qd, kd, vd, md, od, lse, causal, c, dq, dk, dv, docs);
    return TensorList{dq, dk, dv};
  }, {qd, kd, vd, md, od, lse, docs.q, docs.k});
  return out;
}

// Note [attention blocks] (attention.h): a block's document ids, both or neither.
cpu::AttentionDocuments block_documents(const Tensor& q, const Tensor& k, const Tensor& doc_q, const Tensor& doc_k) {
  FORGE_CHECK(doc_q.defined() == doc_k.defined(), "attention blocks: give the document ids of both the queries and "
              "the keys, or neither");
  if (!doc_q.defined()) return {};
  check_documents(doc_q, q.size(0), q.size(2), q, "doc_q (the queries' document ids)");
  check_documents(doc_k, q.size(0), k.size(2), q, "doc_k (the keys' document ids)");
  return {doc_q.contiguous(), doc_k.contiguous()};
}

AttentionBlock attention_block_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
                                       const Tensor& doc_q, const Tensor& doc_k) {
  check_inputs(q, k, v, scale, Tensor());
  const cpu::AttentionDocuments docs = block_documents(q, k, doc_q, doc_k);
  NoGradGuard no_grad;
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3), Dv = v.size(3);
  const double c = scale != 0.0 ? scale : 1.0 / std::sqrt(static_cast<double>(D));
  const TensorOptions opt{.dtype = q.dtype(), .device = q.device()};
  AttentionBlock r;
  r.lse = empty({B, H, T}, {.dtype = q.dtype() == DType::f64 ? DType::f64 : DType::f32, .device = q.device()});
  r.out = empty({B, H, T, Dv}, opt);
  if (!q.is_cpu()) {
    FORGE_ON_CUDA("attention_block_forward",
                  cuda::attention_forward(q.detach(), k.detach(), v.detach(), Tensor(), causal, c, r.out, r.lse,
                                          docs.q, docs.k));
    return r;
  }
  cpu::attention_forward(readable(q.detach()), readable(k.detach()), readable(v.detach()), Tensor(), causal, c, r.out,
                         r.lse, docs);
  return r;
}

AttentionBlockGrads attention_block_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                             const Tensor& out, const Tensor& lse, bool causal, double scale,
                                             const Tensor& doc_q, const Tensor& doc_k) {
  check_inputs(q, k, v, scale, Tensor());
  const cpu::AttentionDocuments docs = block_documents(q, k, doc_q, doc_k);
  NoGradGuard no_grad;
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3), Dv = v.size(3);
  FORGE_CHECK(dout.shape() == Shape({B, H, T, Dv}) && out.shape() == dout.shape() && lse.shape() == Shape({B, H, T}),
              "attention_block_backward: dout ", dout.shape(), ", out ", out.shape(), " and lse ", lse.shape(),
              " do not fit q ", q.shape(), " and v ", v.shape());
  const double c = scale != 0.0 ? scale : 1.0 / std::sqrt(static_cast<double>(D));
  const DType lse_dtype = q.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const Tensor l = contiguous(lse.to(lse_dtype));
  const Tensor o = out.to(q.dtype());
  AttentionBlockGrads g;
  g.dq = empty(q.shape(), {.dtype = q.dtype(), .device = q.device()});
  g.dk = empty(k.shape(), {.dtype = k.dtype(), .device = k.device()});
  g.dv = empty(v.shape(), {.dtype = v.dtype(), .device = v.device()});
  if (!q.is_cpu()) {
    FORGE_ON_CUDA("attention_block_backward", cuda::attention_backward(dout.to(q.dtype()), q.detach(), k.detach(),
                                                                       v.detach(), Tensor(), o, l, causal, c, g.dq,
                                                                       g.dk, g.dv, docs.q, docs.k));
    return g;
  }
  cpu::attention_backward(readable(dout.to(q.dtype())), readable(q.detach()), readable(k.detach()),
                          readable(v.detach()), Tensor(), contiguous(o), l, causal, c, g.dq, g.dk, g.dv, docs);
  return g;
}

// Note [packed QKV attention]
// GPT's c_attn writes q, k and v side by side, (B, T, 3C). Splitting it into three narrow views
// records one view node per piece, and each piece's backward builds a gradient of qkv's full
// shape (zeros, then its slice copied in) which the engine then adds up: for GPT-2 124M at
// batch 16, three 75 MB zero-fills, three copies and two 75 MB additions per layer. Here the
// views are taken without history, the node is recorded on the merged (B, T, C) output, and
// the backward allocates the (B, T, 3C) gradient once and lets the attention kernel write dq,
// dk and dv through the same views of it: qkv's gradient costs no extra pass over memory on
// CUDA. (The CPU kernel writes dense gradients, copied into the views: the CPU is the
// reference, not the fast path.)
Tensor qkv_attention(const Tensor& qkv, int64_t n_head, bool causal, double scale) {
  constexpr const char* name = "qkv_attention";
  FORGE_CHECK(qkv.defined() && qkv.dim() == 3, name, ": expected qkv of shape (B, T, 3 C), got ",
              qkv.defined() ? qkv.shape() : Shape{});
  FORGE_CHECK(is_floating(qkv.dtype()), name, ": qkv must be floating point, got ", dtype_name(qkv.dtype()));
  const int64_t B = qkv.size(0), T = qkv.size(1), C3 = qkv.size(2);
  FORGE_CHECK(n_head > 0 && C3 % (3 * n_head) == 0, name, ": the last dim of qkv ", qkv.shape(),
              " must be 3 x n_head x head_dim with n_head = ", n_head);
  FORGE_CHECK(std::isfinite(scale), name, ": scale must be finite, got ", scale, " (0 selects 1/sqrt(D))");
  const int64_t C = C3 / 3, H = n_head, D = C / H;
  const double c = scale != 0.0 ? scale : 1.0 / std::sqrt(static_cast<double>(D));
  // The (B, H, T, D) head views of the three parts of a (B, T, 3C) tensor.
  auto heads = [=](const Tensor& t, int64_t part) {
    return transpose(reshape(narrow(t, 2, part * C, C), {B, T, H, D}), 1, 2);
  };
  const Tensor x = qkv.detach();
  const Tensor q = heads(x, 0), k = heads(x, 1), v = heads(x, 2);
  const TensorOptions opt{.dtype = qkv.dtype(), .device = qkv.device()};
  Tensor lse = empty({B, H, T}, {.dtype = qkv.dtype() == DType::f64 ? DType::f64 : DType::f32, .device = qkv.device()});
  Tensor y;  // (B, T, C)
  Tensor out4;  // (B, H, T, D), what the backward reads
  if (qkv.is_cpu()) {
    const Tensor qr = readable(q), kr = readable(k), vr = readable(v);
    out4 = empty({B, H, T, D}, opt);
    cpu::attention_forward(qr, kr, vr, Tensor(), causal, c, out4, lse);
    y = reshape(transpose(out4, 1, 2), {B, T, C});
  } else {
#ifdef FORGE_WITH_CUDA
    Tensor dense = empty({B, T, H, D}, opt);  // written in (B, T, H, D) order: y is a view
    out4 = transpose(dense, 1, 2);
    cuda::attention_forward(q, k, v, Tensor(), causal, c, out4, lse);
    y = reshape(dense, {B, T, C});
#else
    FORGE_THROW(name, ": ", qkv.device().str(), " tensors need forge built with CUDA");
#endif
  }
  record(name, y, {qkv}, [x, out4, lse, causal, c, B, T, C, H, D, heads](const Tensor& g, const GradMask&) {
    Tensor grad = empty({B, T, 3 * C}, {.dtype = x.dtype(), .device = x.device()});
    Tensor dq = heads(grad, 0), dk = heads(grad, 1), dv = heads(grad, 2);
    const Tensor q = heads(x, 0), k = heads(x, 1), v = heads(x, 2);
    const Tensor g4 = transpose(reshape(g, {B, T, H, D}), 1, 2);
    if (x.is_cpu()) {
      const TensorOptions o{.dtype = x.dtype(), .device = x.device()};
      Tensor gq = empty(q.shape(), o), gk = empty(k.shape(), o), gv = empty(v.shape(), o);
      cpu::attention_backward(readable(g4), readable(q), readable(k), readable(v), Tensor(), out4, lse, causal, c, gq,
                              gk, gv);
      dq.copy_(gq);
      dk.copy_(gk);
      dv.copy_(gv);
    } else {
#ifdef FORGE_WITH_CUDA
      cuda::attention_backward(g4, q, k, v, Tensor(), out4, lse, causal, c, dq, dk, dv);
#endif
    }
    return TensorList{grad};
  }, {x, out4, lse});
  return y;
}

// Note [packed LLaMA attention]
// LLaMA projects q, k and v with three linears. With grouped-query attention k and v are narrow
// (LLaMA 0.85B: 8 kv heads of 64 = 512 columns against q's 2048), and their GEMMs run far below
// the GPU's rate: 17 GFLOP each at M = 8192 tokens, forward, input gradient (accumulated into
// x's, beta = 1) and weight gradient (M = 512: too few output tiles for the SMs). One
// (H + 2 Hkv) D-wide GEMM runs all three at the rate of the wide ones. The obstacle is the
// gradient: three narrow views of the packed output would each build a zero-filled gradient of
// its full shape that the engine then adds up (Note [packed QKV attention] above,
// GPT's case). Here, as there, the views are taken without history and one node is recorded on
// the merged output; its backward allocates the packed gradient once and writes each part in
// place: dv straight from the attention backward on CUDA (its fused kernels write any row
// layout), dq and dk through the inverse rotation, whose kernel writes strided outputs. Saved
// for the backward: the rotated q and k and a dense copy of v (as the unfused path saves), not
// the packed input, whose unrotated q and k nobody needs again.
// Values: the same kernels as the unfused path (ops::rope, scaled_dot_product_attention) on the
// same inputs, so the same values; only the projection's GEMM differs (one instead of three).
namespace {

constexpr const char* kRopeName = "qkv_rope_attention";

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
  FORGE_ON_CUDA(kRopeName, cuda::rope(x, out, offset, theta, scaling, inverse));
}

}  // namespace

Tensor qkv_rope_attention(const Tensor& qkv, int64_t n_head, int64_t n_kv_head, int64_t position_offset,
                          double theta, const RopeScaling& scaling, bool causal) {
  FORGE_CHECK(qkv.defined() && qkv.dim() == 3, kRopeName, ": expected qkv of shape (B, T, (H + 2 Hkv) D), got ",
              qkv.defined() ? qkv.shape() : Shape{});
  FORGE_CHECK(is_floating(qkv.dtype()), kRopeName, ": qkv must be floating point, got ", dtype_name(qkv.dtype()));
  FORGE_CHECK(n_head > 0 && n_kv_head > 0 && n_head % n_kv_head == 0, kRopeName, ": n_head = ", n_head,
              " must be a positive multiple of n_kv_head = ", n_kv_head);
  const int64_t B = qkv.size(0), T = qkv.size(1), W = qkv.size(2), H = n_head, Hk = n_kv_head;
  FORGE_CHECK(W % (H + 2 * Hk) == 0 && (W / (H + 2 * Hk)) % 2 == 0, kRopeName, ": the last dim of qkv ", qkv.shape(),
              " must be (n_head + 2 n_kv_head) x D with D even, n_head = ", H, ", n_kv_head = ", Hk);
  FORGE_CHECK(position_offset >= 0, kRopeName, ": position_offset must be >= 0, got ", position_offset);
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
  [[maybe_unused]] bool fused = false;
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
    FORGE_THROW(kRopeName, ": ", x.device().str(), " tensors need forge built with CUDA");
#endif
  }
  Tensor y = reshape(transpose(out4, 1, 2), {B, T, H * D});
  record(kRopeName, y, {qkv}, [=](const Tensor& g, const GradMask&) {
    Tensor grad = empty({B, T, W}, opt);
    Tensor dq = part(grad, 0, H), dk = part(grad, H, Hk), dv = part(grad, H + Hk, Hk);
    const Tensor g4 = transpose(reshape(g, {B, T, H, D}), 1, 2);
    Tensor gq, gk;
    if (cpu) {
      gq = empty({B, H, T, D}, opt);
      gk = empty({B, Hk, T, D}, opt);
      Tensor gv = empty({B, Hk, T, D}, opt);
      cpu::attention_backward(readable(g4), qr, kr, vd, Tensor(), out4, lse, causal, c, gq, gk, gv);
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
