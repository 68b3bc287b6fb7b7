#include "forge/nn/layers.h"

#include <cmath>
#include <string>

#include "forge/core/env.h"
#include "forge/ops/attention.h"
#include "forge/ops/binary.h"
#include "forge/ops/conv.h"
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

LayerNorm::LayerNorm(int64_t dim, double eps, bool with_bias) : eps(eps) {
  weight = register_parameter("weight", ones({dim}));
  if (with_bias) bias = register_parameter("bias", zeros({dim}));
}
Tensor LayerNorm::forward(const Tensor& x) const { return ops::layer_norm(x, weight, bias, eps); }

RMSNorm::RMSNorm(int64_t dim, double eps) : eps(eps) { weight = register_parameter("weight", ones({dim})); }
Tensor RMSNorm::forward(const Tensor& x) const { return ops::rms_norm(x, weight, eps); }

Tensor Dropout::forward(const Tensor& x) const { return ops::dropout(x, p, is_training()); }

MLP::MLP(int64_t dim, int64_t hidden, bool bias, double dropout) {
  c_fc = register_module("c_fc", std::make_shared<Linear>(dim, hidden, bias));
  c_proj = register_module("c_proj", std::make_shared<Linear>(hidden, dim, bias));
  drop = register_module("dropout", std::make_shared<Dropout>(dropout));
}
// On CUDA, c_fc and its GELU are one GEMM (ops::linear_gelu: cuBLASLt's GELU epilogue
// writes the activation and the saved pre-activation together, saving the separate GELU
// pass over the (tokens, hidden) activation). FORGE_GELU_FUSION=0 (core/env.h) turns it off
// (to measure it, or to match the unfused rounding exactly); the CPU always runs linear, then gelu.
Tensor MLP::forward(const Tensor& x) const {
  const Tensor h = x.is_cuda() && env::flag("FORGE_GELU_FUSION") ? ops::linear_gelu(x, c_fc->weight, c_fc->bias)
                                                                 : ops::gelu(c_fc->forward(x), true);
  return drop->forward(c_proj->forward(h));
}

SwiGLU::SwiGLU(int64_t dim, int64_t hidden) {
  gate_proj = register_module("gate_proj", std::make_shared<Linear>(dim, hidden, false));
  up_proj = register_module("up_proj", std::make_shared<Linear>(dim, hidden, false));
  down_proj = register_module("down_proj", std::make_shared<Linear>(hidden, dim, false));
}
Tensor SwiGLU::forward(const Tensor& x) const {
  return down_proj->forward(ops::mul(ops::silu(gate_proj->forward(x)), up_proj->forward(x)));
}

CausalSelfAttention::CausalSelfAttention(int64_t dim, int64_t n_head, bool bias, double dropout)
    : dim(dim), n_head(n_head) {
  FORGE_CHECK(n_head > 0 && dim % n_head == 0, "CausalSelfAttention: n_head = ", n_head,
              " must divide the width n_embd = ", dim);
  c_attn = register_module("c_attn", std::make_shared<Linear>(dim, 3 * dim, bias));
  c_proj = register_module("c_proj", std::make_shared<Linear>(dim, dim, bias));
  resid_drop = register_module("resid_dropout", std::make_shared<Dropout>(dropout));
}

Tensor CausalSelfAttention::forward(const Tensor& x) const {
  const int64_t B = x.size(0), T = x.size(1), D = dim / n_head;
  Tensor qkv = c_attn->forward(x);                                  // (B, T, 3C)
  TensorList parts = ops::split(qkv, dim, -1);                      // 3 x (B, T, C)
  auto heads = [&](const Tensor& t) { return ops::transpose(ops::reshape(t, {B, T, n_head, D}), 1, 2); };
  Tensor y = ops::scaled_dot_product_attention(heads(parts[0]), heads(parts[1]), heads(parts[2]), true);  // (B, H, T, D)
  y = ops::reshape(ops::transpose(y, 1, 2), {B, T, dim});
  return resid_drop->forward(c_proj->forward(y));
}

LlamaAttention::LlamaAttention(int64_t dim, int64_t n_head, int64_t n_kv_head, double rope_theta)
    : dim(dim), n_head(n_head), n_kv_head(n_kv_head), head_dim(n_head > 0 ? dim / n_head : 0), rope_theta(rope_theta) {
  FORGE_CHECK(n_head > 0 && dim % n_head == 0, "LlamaAttention: n_head = ", n_head, " must divide dim = ", dim);
  FORGE_CHECK(n_kv_head > 0 && n_head % n_kv_head == 0, "LlamaAttention: n_kv_head = ", n_kv_head,
              " must divide n_head = ", n_head);
  FORGE_CHECK(head_dim % 2 == 0, "LlamaAttention: the head size dim / n_head = ", head_dim,
              " must be even for rotary embeddings");
  q_proj = register_module("q_proj", std::make_shared<Linear>(dim, n_head * head_dim, false));
  k_proj = register_module("k_proj", std::make_shared<Linear>(dim, n_kv_head * head_dim, false));
  v_proj = register_module("v_proj", std::make_shared<Linear>(dim, n_kv_head * head_dim, false));
  o_proj = register_module("o_proj", std::make_shared<Linear>(n_head * head_dim, dim, false));
}

Tensor LlamaAttention::forward(const Tensor& x, int64_t position_offset) const {
  const int64_t B = x.size(0), T = x.size(1);
  auto heads = [&](const Tensor& t, int64_t h) { return ops::transpose(ops::reshape(t, {B, T, h, head_dim}), 1, 2); };
  Tensor q = ops::rope(heads(q_proj->forward(x), n_head), position_offset, rope_theta);
  Tensor k = ops::rope(heads(k_proj->forward(x), n_kv_head), position_offset, rope_theta);
  Tensor v = heads(v_proj->forward(x), n_kv_head);
  Tensor y = ops::scaled_dot_product_attention(q, k, v, true);  // (B, H, T, D)
  return o_proj->forward(ops::reshape(ops::transpose(y, 1, 2), {B, T, n_head * head_dim}));
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
