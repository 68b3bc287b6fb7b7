#include "forge/nn/layers.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <typeinfo>
#include <utility>

#include "forge/core/env.h"
#include "forge/ops/attention.h"
#include "forge/ops/binary.h"
#include "forge/ops/conv.h"
#include "forge/ops/copy.h"
#include "forge/ops/creation.h"
#include "forge/ops/dropout.h"
#include "forge/ops/embedding.h"
#include "forge/ops/join.h"
#include "forge/ops/matmul.h"
#include "forge/ops/norm.h"
#include "forge/ops/rope.h"
#include "forge/ops/unary.h"
#include "forge/ops/view.h"

namespace forge::nn {

Embedding::Embedding(int64_t n, int64_t d, Generator* gen) : num(n), dim(d) {
  FORGE_CHECK(n > 0 && d > 0, "Embedding: sizes must be positive, got ", n, " x ", d);
  weight = register_parameter("weight", default_init_enabled() ? randn({n, d}, {}, gen) : empty({n, d}));
}
Tensor Embedding::forward(const Tensor& ids) const { return ops::embedding(weight, ids); }
Tensor Embedding::attend(const Tensor& x) const { return ops::matmul(x, ops::transpose(weight, 0, 1)); }
Tensor Embedding::add_to(const Tensor& x, const Tensor& positions) const { return ops::add(x, forward(positions)); }

LayerNorm::LayerNorm(int64_t dim, double eps, bool with_bias) : eps(eps) {
  weight = register_parameter("weight", ones({dim}));
  if (with_bias) bias = register_parameter("bias", zeros({dim}));
}
Tensor LayerNorm::forward(const Tensor& x) const { return ops::layer_norm(x, weight, bias, eps); }

RMSNorm::RMSNorm(int64_t dim, double eps) : eps(eps) { weight = register_parameter("weight", ones({dim})); }
Tensor RMSNorm::forward(const Tensor& x) const { return ops::rms_norm(x, weight, eps); }

Tensor Dropout::forward(const Tensor& x) const { return ops::dropout(x, p, is_training()); }

// Checks that a linear from the spec has the size the layer feeds it (want_in) or reads from it
// (want_out); `what` says why the layer expects it.
namespace {
void check_in_features(const Linear& l, int64_t want_in, const char* layer, LinearRole role, const char* what) {
  FORGE_CHECK(l.in_features == want_in, layer, ": the ", to_string(role),
              " linear from the layer spec has in_features = ", l.in_features, ", but ", what, " is ", want_in,
              "; make the spec's factory return a linear of that width");
}
void check_out_features(const Linear& l, int64_t want_out, const char* layer, LinearRole role, const char* what) {
  FORGE_CHECK(l.out_features == want_out, layer, ": the ", to_string(role),
              " linear from the layer spec has out_features = ", l.out_features, ", but ", what, " is ", want_out,
              "; make the spec's factory return a linear of that width");
}
// The number of heads of head_dim channels in a projection's out_features (divided by
// `parts`: 3 for a fused QKV).
int64_t heads_of(const Linear& l, int64_t parts, int64_t head_dim, const char* layer, LinearRole role) {
  FORGE_CHECK(l.out_features % (parts * head_dim) == 0, layer, ": the ", to_string(role),
              " linear from the layer spec has out_features = ", l.out_features, ", not a multiple of ",
              parts == 1 ? "" : (std::to_string(parts) + " x "), "the head size ", head_dim,
              "; a sharded projection must hold whole heads");
  return l.out_features / (parts * head_dim);
}
}  // namespace

MLP::MLP(int64_t dim, int64_t hidden, bool bias, double dropout, const LayerSpec& spec) {
  c_fc = register_module("c_fc", spec.make_linear(dim, hidden, bias, LinearRole::mlp_up));
  c_proj = register_module("c_proj", spec.make_linear(hidden, dim, bias, LinearRole::mlp_down));
  drop = register_module("dropout", std::make_shared<Dropout>(dropout));
  local_hidden = c_fc->out_features;
  check_in_features(*c_fc, dim, "MLP", LinearRole::mlp_up, "the model width");
  check_in_features(*c_proj, local_hidden, "MLP", LinearRole::mlp_down, "the mlp_up linear's out_features");
  check_out_features(*c_proj, dim, "MLP", LinearRole::mlp_down, "the model width");
}

// c_fc's GELU is Linear::forward_gelu: for a plain Linear on CUDA one GEMM with a GELU
// epilogue (ops::linear_gelu), on the CPU linear then gelu.
// With FORGE_GELU_MLP=1, two plain Linears on CUDA run as ops::gelu_mlp (Note [GELU gradient in
// the GEMM], ops/matmul.cpp): one op whose backward folds the GELU's gradient into the down
// projection's GEMM. Off by default until the step is measured with and without it in one
// session (docs/performance.md).
Tensor MLP::forward(const Tensor& x) const {
  const bool plain = typeid(*c_fc) == typeid(Linear) && typeid(*c_proj) == typeid(Linear);
  if (plain && x.is_cuda() && !c_fc->fp8_active() && !c_proj->fp8_active() && env::flag("FORGE_GELU_MLP"))
    return drop->forward(ops::gelu_mlp(x, c_fc->weight, c_fc->bias, c_proj->weight, c_proj->bias));
  return drop->forward(c_proj->forward(c_fc->forward_gelu(x)));
}

SwiGLU::SwiGLU(int64_t dim, int64_t hidden, const LayerSpec& spec) {
  gate_proj = register_module("gate_proj", spec.make_linear(dim, hidden, false, LinearRole::mlp_gate));
  up_proj = register_module("up_proj", spec.make_linear(dim, hidden, false, LinearRole::mlp_up));
  down_proj = register_module("down_proj", spec.make_linear(hidden, dim, false, LinearRole::mlp_down));
  local_hidden = up_proj->out_features;
  check_in_features(*gate_proj, dim, "SwiGLU", LinearRole::mlp_gate, "the model width");
  check_in_features(*up_proj, dim, "SwiGLU", LinearRole::mlp_up, "the model width");
  check_out_features(*gate_proj, local_hidden, "SwiGLU", LinearRole::mlp_gate, "the mlp_up linear's out_features");
  check_in_features(*down_proj, local_hidden, "SwiGLU", LinearRole::mlp_down, "the mlp_up linear's out_features");
  check_out_features(*down_proj, dim, "SwiGLU", LinearRole::mlp_down, "the model width");
}
Tensor SwiGLU::forward(const Tensor& x) const {
  return down_proj->forward(ops::swiglu(gate_proj->forward(x), up_proj->forward(x)));  // Note [fused SwiGLU]
}

CausalSelfAttention::CausalSelfAttention(int64_t dim, int64_t n_head, bool bias, double dropout, const LayerSpec& spec)
    : dim(dim), n_head(n_head) {
  FORGE_CHECK(n_head > 0 && dim % n_head == 0, "CausalSelfAttention: n_head = ", n_head,
              " must divide the width n_embd = ", dim);
  head_dim = dim / n_head;
  c_attn = register_module("c_attn", spec.make_linear(dim, 3 * dim, bias, LinearRole::attention_qkv));
  c_proj = register_module("c_proj", spec.make_linear(dim, dim, bias, LinearRole::attention_out));
  resid_drop = register_module("resid_dropout", std::make_shared<Dropout>(dropout));
  local_heads = heads_of(*c_attn, 3, head_dim, "CausalSelfAttention", LinearRole::attention_qkv);
  attention = spec.attention;
  check_in_features(*c_attn, dim, "CausalSelfAttention", LinearRole::attention_qkv, "the model width");
  check_in_features(*c_proj, local_heads * head_dim, "CausalSelfAttention", LinearRole::attention_out,
                    "the attention's output width (its local heads x head size)");
  check_out_features(*c_proj, dim, "CausalSelfAttention", LinearRole::attention_out, "the model width");
}

Tensor CausalSelfAttention::forward(const Tensor& x, const Documents& documents) const {
  const int64_t H = local_heads;
  // Context parallelism: the spec's attention over the whole sequence; a packed batch: attention
  // within each document (Note [document masks]).
  if (attention || documents.packed()) {
    const Tensor qkv = c_attn->forward(x);
    const int64_t B = qkv.size(0), T = qkv.size(1), D = head_dim;
    auto heads = [&](int64_t part) {
      return ops::transpose(ops::reshape(ops::narrow(qkv, 2, part * H * D, H * D), {B, T, H, D}), 1, 2);
    };
    const Tensor y = attention ? attention(heads(0), heads(1), heads(2), documents.ids)
                               : ops::scaled_dot_product_attention(heads(0), heads(1), heads(2), true, 0.0, {},
                                                                   documents.ids);  // (B, H, T, D)
    return resid_drop->forward(c_proj->forward(ops::reshape(ops::transpose(y, 1, 2), {B, T, H * D})));
  }
  // q, k, v heads straight from the fused projection (Note [packed QKV attention]).
  const Tensor y = ops::qkv_attention(c_attn->forward(x), H, true);  // (B, T, 3 H D) -> (B, T, H D)
  return resid_drop->forward(c_proj->forward(y));
}

namespace {
// Appends `t` (B, H, T, D) to `cache` along the positions and returns the whole (a new tensor:
// the cache grows by one concatenation per call, fine for decoding one token at a time).
Tensor grow(Tensor& cache, const Tensor& t) {
  cache = cache.defined() ? ops::cat({cache, t}, 2) : ops::contiguous(t);
  return cache;
}
}  // namespace

Tensor CausalSelfAttention::forward_cached(const Tensor& x, Tensor& k_cache, Tensor& v_cache,
                                           const Tensor& key_mask) const {
  const Tensor qkv = c_attn->forward(x);  // (B, T, 3 H D)
  const int64_t B = qkv.size(0), T = qkv.size(1), H = local_heads, D = head_dim;
  auto heads = [&](int64_t part) {
    return ops::transpose(ops::reshape(ops::narrow(qkv, 2, part * H * D, H * D), {B, T, H, D}), 1, 2);
  };
  const Tensor k = grow(k_cache, heads(1)), v = grow(v_cache, heads(2));
  // causal: the T queries are the last T of the S positions (bottom-right, ops/attention.h).
  const Tensor y = ops::scaled_dot_product_attention(ops::contiguous(heads(0)), k, v, true, 0.0, key_mask);  // (B, H, T, D)
  return resid_drop->forward(c_proj->forward(ops::reshape(ops::transpose(y, 1, 2), {B, T, H * D})));
}

LlamaAttention::LlamaAttention(int64_t dim, int64_t n_head, int64_t n_kv_head, double rope_theta,
                               const LayerSpec& spec, const ops::RopeScaling& rope_scaling)
    : dim(dim), n_head(n_head), n_kv_head(n_kv_head), head_dim(n_head > 0 ? dim / n_head : 0), rope_theta(rope_theta),
      rope_scaling(rope_scaling) {
  FORGE_CHECK(n_head > 0 && dim % n_head == 0, "LlamaAttention: n_head = ", n_head, " must divide dim = ", dim);
  FORGE_CHECK(n_kv_head > 0 && n_head % n_kv_head == 0, "LlamaAttention: n_kv_head = ", n_kv_head,
              " must divide n_head = ", n_head);
  FORGE_CHECK(head_dim % 2 == 0, "LlamaAttention: the head size dim / n_head = ", head_dim,
              " must be even for rotary embeddings");
  q_proj = register_module("q_proj", spec.make_linear(dim, n_head * head_dim, false, LinearRole::attention_q));
  k_proj = register_module("k_proj", spec.make_linear(dim, n_kv_head * head_dim, false, LinearRole::attention_k));
  v_proj = register_module("v_proj", spec.make_linear(dim, n_kv_head * head_dim, false, LinearRole::attention_v));
  o_proj = register_module("o_proj", spec.make_linear(n_head * head_dim, dim, false, LinearRole::attention_out));
  const char* layer = "LlamaAttention";
  local_heads = heads_of(*q_proj, 1, head_dim, layer, LinearRole::attention_q);
  local_kv_heads = heads_of(*k_proj, 1, head_dim, layer, LinearRole::attention_k);
  for (const auto& [proj, role] : {std::pair{q_proj.get(), LinearRole::attention_q},
                                   std::pair{k_proj.get(), LinearRole::attention_k},
                                   std::pair{v_proj.get(), LinearRole::attention_v}})
    check_in_features(*proj, dim, layer, role, "the model width");
  check_out_features(*v_proj, k_proj->out_features, layer, LinearRole::attention_v,
                     "the attention_k linear's out_features");
  FORGE_CHECK(local_kv_heads > 0 && local_heads % local_kv_heads == 0, layer, ": the layer spec gives ", local_heads,
              " query heads over ", local_kv_heads,
              " key-value heads; the key-value heads must divide the query heads (shard both by the same factor)");
  check_in_features(*o_proj, local_heads * head_dim, layer, LinearRole::attention_out,
                    "the attention's output width (its local heads x head size)");
  check_out_features(*o_proj, dim, layer, LinearRole::attention_out, "the model width");
  FORGE_CHECK(static_cast<bool>(spec.positions) == static_cast<bool>(spec.attention), layer,
              ": a layer spec sets both positions and attention (context parallelism) or neither");
  context.positions = spec.positions;
  context.attention = spec.attention;
}

// With FORGE_PACKED_QKV=1, three plain Linears without bias (not split by tensor parallelism)
// run as one GEMM over their weights concatenated for the step, and rope + attention as
// ops::qkv_rope_attention, which writes the packed gradient in place (Note [packed LLaMA
// attention]): the narrow k and v GEMMs run at the rate of the wide one. The weights stay three
// parameters (names, checkpoints, tensor-parallel splits). The concatenation is saved for the
// backward: under ZeRO-3 that keeps the gathered q/k/v weights of every block until its
// backward. Off by default until the step is measured with and without it in one session.
bool LlamaAttention::packed_qkv() const {
  auto plain = [](const std::shared_ptr<Linear>& l) {
    return typeid(*l) == typeid(Linear) && !l->bias.defined() && !l->fp8_active();
  };
  return env::flag("FORGE_PACKED_QKV") && plain(q_proj) && plain(k_proj) && plain(v_proj);
}

Tensor LlamaAttention::forward(const Tensor& x, int64_t position_offset, const Documents& documents) const {
  if (context.attention) {  // context parallelism: rope at the whole sequence's positions
    const Tensor qp = q_proj->forward(x);
    const int64_t B = qp.size(0), T = qp.size(1);
    const std::vector<PositionRange> ranges = context.position_ranges(T);
    auto rotate = [&](const Tensor& t) {  // (B, h, T, D)
      if (documents.packed()) {  // each token's place in its document (Note [packed documents])
        int64_t whole = 0;       // the whole sequence's length: the positions stay below it
        for (const PositionRange& r : ranges) whole = std::max(whole, r.start + r.length);
        return ops::rope(t, documents.positions, whole, rope_theta, rope_scaling);
      }
      if (ranges.size() == 1) return ops::rope(t, position_offset + ranges[0].start, rope_theta, rope_scaling);
      TensorList parts;
      int64_t at = 0;
      for (const PositionRange& r : ranges) {
        parts.push_back(ops::rope(ops::narrow(t, 2, at, r.length), position_offset + r.start, rope_theta, rope_scaling));
        at += r.length;
      }
      return ops::cat(parts, 2);
    };
    auto heads = [&](const Tensor& t, int64_t h) { return ops::transpose(ops::reshape(t, {B, T, h, head_dim}), 1, 2); };
    const Tensor q = rotate(heads(qp, local_heads));
    const Tensor k = rotate(heads(k_proj->forward(x), local_kv_heads));
    const Tensor v = heads(v_proj->forward(x), local_kv_heads);
    const Tensor y = context.attention(q, k, v, documents.ids);  // (B, H, T, D)
    return o_proj->forward(ops::reshape(ops::transpose(y, 1, 2), {B, T, local_heads * head_dim}));
  }
  if (documents.packed()) {  // each document's positions, attention within it (Note [packed documents])
    FORGE_CHECK(position_offset == 0, "LlamaAttention: a packed batch starts at position 0, got an offset of ",
                position_offset);
    const Tensor qp = q_proj->forward(x);
    const int64_t B = qp.size(0), T = qp.size(1);
    auto heads = [&](const Tensor& t, int64_t h) { return ops::transpose(ops::reshape(t, {B, T, h, head_dim}), 1, 2); };
    const Tensor q = ops::rope(heads(qp, local_heads), documents.positions, T, rope_theta, rope_scaling);
    const Tensor k = ops::rope(heads(k_proj->forward(x), local_kv_heads), documents.positions, T, rope_theta,
                               rope_scaling);
    const Tensor v = heads(v_proj->forward(x), local_kv_heads);
    const Tensor y = ops::scaled_dot_product_attention(q, k, v, true, 0.0, {}, documents.ids);  // (B, H, T, D)
    return o_proj->forward(ops::reshape(ops::transpose(y, 1, 2), {B, T, local_heads * head_dim}));
  }
  if (packed_qkv()) {
    const Tensor w = ops::cat({q_proj->weight, k_proj->weight, v_proj->weight}, 0);
    const Tensor y = ops::qkv_rope_attention(ops::linear(x, w), local_heads, local_kv_heads, position_offset,
                                             rope_theta, rope_scaling);
    return o_proj->forward(y);
  }
  // T from the projections, not x: a sequence-parallel projection gathers the sequence that x
  // holds a slice of (parallel/tensor_parallel.h).
  const Tensor qp = q_proj->forward(x);
  const int64_t B = qp.size(0), T = qp.size(1);
  auto heads = [&](const Tensor& t, int64_t h) { return ops::transpose(ops::reshape(t, {B, T, h, head_dim}), 1, 2); };
  Tensor q = ops::rope(heads(qp, local_heads), position_offset, rope_theta, rope_scaling);
  Tensor k = ops::rope(heads(k_proj->forward(x), local_kv_heads), position_offset, rope_theta, rope_scaling);
  Tensor v = heads(v_proj->forward(x), local_kv_heads);
  Tensor y = ops::scaled_dot_product_attention(q, k, v, true);  // (B, H, T, D)
  return o_proj->forward(ops::reshape(ops::transpose(y, 1, 2), {B, T, local_heads * head_dim}));
}

Tensor LlamaAttention::forward_cached(const Tensor& x, Tensor& k_cache, Tensor& v_cache, const Tensor& key_mask,
                                      const std::vector<int64_t>& pad) const {
  const int64_t offset = k_cache.defined() ? k_cache.size(2) : 0;
  const Tensor qp = q_proj->forward(x);
  const int64_t B = qp.size(0), T = qp.size(1);
  auto heads = [&](const Tensor& t, int64_t h) { return ops::transpose(ops::reshape(t, {B, T, h, head_dim}), 1, 2); };
  // Rotary positions: the cache's, less each row's padding (Note [padded prompts]); a row's
  // padding columns are left unrotated (masked: nobody attends to them).
  auto rotate = [&](const Tensor& t) {  // (B, h, T, D)
    bool padded = false;
    for (int64_t p : pad) padded = padded || p != 0;
    if (!padded) return ops::rope(t, offset, rope_theta, rope_scaling);
    FORGE_CHECK(static_cast<int64_t>(pad.size()) == B, "LlamaAttention: ", pad.size(), " rows of padding for a batch of ", B);
    TensorList rows;
    for (int64_t b = 0; b < B; ++b) {
      const Tensor row = ops::narrow(t, 0, b, 1);
      const int64_t start = std::clamp<int64_t>(pad[static_cast<size_t>(b)] - offset, 0, T);  // first real column
      TensorList parts;
      if (start > 0) parts.push_back(ops::narrow(row, 2, 0, start));
      if (start < T)
        parts.push_back(ops::rope(ops::narrow(row, 2, start, T - start), offset + start - pad[static_cast<size_t>(b)],
                                  rope_theta, rope_scaling));
      rows.push_back(parts.size() == 1 ? parts.front() : ops::cat(parts, 2));
    }
    return ops::cat(rows, 0);
  };
  const Tensor q = rotate(heads(qp, local_heads));
  const Tensor k = grow(k_cache, rotate(heads(k_proj->forward(x), local_kv_heads)));
  const Tensor v = grow(v_cache, heads(v_proj->forward(x), local_kv_heads));
  const Tensor y = ops::scaled_dot_product_attention(q, k, v, true, 0.0, key_mask);  // (B, H, T, D)
  return o_proj->forward(ops::reshape(ops::transpose(y, 1, 2), {B, T, local_heads * head_dim}));
}

Conv2d::Conv2d(int64_t in_ch, int64_t out_ch, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride,
               std::array<int64_t, 2> padding, bool with_bias, Generator* gen)
    : stride(stride), padding(padding) {
  FORGE_CHECK(in_ch > 0 && out_ch > 0 && kernel[0] > 0 && kernel[1] > 0, "Conv2d: invalid sizes in=", in_ch,
              " out=", out_ch, " kernel=", kernel[0], "x", kernel[1]);
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_ch * kernel[0] * kernel[1]));
  weight = register_parameter("weight", uniform({out_ch, in_ch, kernel[0], kernel[1]}, -bound, bound, {}, gen));
  if (with_bias) bias = register_parameter("bias", uniform({out_ch}, -bound, bound, {}, gen));
}
Tensor Conv2d::forward(const Tensor& x) const { return ops::conv2d(x, weight, bias, stride, padding); }

Tensor MaxPool2d::forward(const Tensor& x) const { return ops::max_pool2d(x, kernel, stride); }

}  // namespace forge::nn
