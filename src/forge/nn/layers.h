#pragma once
// The building blocks of GPT, LLaMA and the CNN: each a Module with torch.nn's parameter
// names and layouts, so state dicts line up with PyTorch's. The attention and MLP layers get
// their linears from a LayerSpec (nn/layer_spec.h; the default builds plain Linears) and
// derive their local sizes (heads, hidden width) from what it returned.
#include <array>

#include "forge/core/generator.h"
#include "forge/nn/documents.h"
#include "forge/nn/layer_spec.h"
#include "forge/nn/linear.h"
#include "forge/nn/module.h"
#include "forge/ops/rope.h"

namespace forge::nn {

// weight (num, dim) ~ N(0, 1) like torch.nn.Embedding (models re-initialise). Virtual, so a
// vocabulary-parallel table (one slice of the rows per rank) can derive from it.
class Embedding : public Module {
 public:
  Embedding(int64_t num, int64_t dim, Generator* gen = nullptr);
  virtual Tensor forward(const Tensor& ids) const;  // (*) i64 -> (*, dim)
  // The table used as an output layer (a head tied to the embedding): x W^T, (*, dim) -> (*, num).
  virtual Tensor attend(const Tensor& x) const;
  // x + forward(positions): a position table added to the token embeddings x (*, T, dim) of
  // positions (T). A sequence-parallel table looks up the positions of the tokens x holds
  // (Note [sequence-parallel shards] in parallel/tensor_parallel.h).
  virtual Tensor add_to(const Tensor& x, const Tensor& positions) const;
  int64_t num, dim;
  Tensor weight;
};

// Over the last dim; weight = 1, bias = 0.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, double eps = 1e-5, bool bias = true);
  Tensor forward(const Tensor& x) const;
  double eps;
  Tensor weight, bias;
};

class RMSNorm : public Module {
 public:
  explicit RMSNorm(int64_t dim, double eps = 1e-6);
  Tensor forward(const Tensor& x) const;
  double eps;
  Tensor weight;
};

// Inverted dropout; identity in eval mode or with p = 0.
class Dropout : public Module {
 public:
  explicit Dropout(double p) : p(p) {}
  Tensor forward(const Tensor& x) const;
  double p;
};

// GPT-2's MLP: c_proj(gelu_tanh(c_fc(x))), hidden = 4 * dim by default; c_fc has role
// mlp_up (its GELU runs through Linear::forward_gelu), c_proj mlp_down. local_hidden is
// c_fc's out_features (hidden unless the spec shards it).
class MLP : public Module {
 public:
  MLP(int64_t dim, int64_t hidden, bool bias = true, double dropout = 0.0, const LayerSpec& spec = {});
  Tensor forward(const Tensor& x) const;
  int64_t local_hidden;
  std::shared_ptr<Linear> c_fc, c_proj;
  std::shared_ptr<Dropout> drop;
};

// LLaMA's MLP: down_proj(silu(gate_proj(x)) * up_proj(x)), no biases; roles mlp_gate, mlp_up,
// mlp_down. local_hidden is up_proj's out_features.
class SwiGLU : public Module {
 public:
  SwiGLU(int64_t dim, int64_t hidden, const LayerSpec& spec = {});
  Tensor forward(const Tensor& x) const;
  int64_t local_hidden;
  std::shared_ptr<Linear> gate_proj, up_proj, down_proj;
};

// GPT-2 attention: one fused QKV projection (c_attn, role attention_qkv, dim -> 3 dim), causal
// SDPA, output projection c_proj (role attention_out). n_head is the model's head count; the
// layer computes local_heads = c_attn's out_features / (3 head_dim) of them (n_head unless the
// spec shards c_attn).
class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(int64_t dim, int64_t n_head, bool bias = true, double dropout = 0.0,
                      const LayerSpec& spec = {});
  // (B, T, C) -> (B, T, C); a packed batch attends within its documents (nn/documents.h)
  Tensor forward(const Tensor& x, const Documents& documents = {}) const;
  // Incremental decoding (Note [KV cache], causal_lm.h): attends x's T new positions over the
  // cached keys and values (B, H, S, D) and appends theirs to k_cache / v_cache (undefined =
  // empty). Inference only (no autograd history is kept for the cache). key_mask: (B, 1, 1, S)
  // bool, the keys past each row's padding (Note [padded prompts], causal_lm.h), or undefined.
  Tensor forward_cached(const Tensor& x, Tensor& k_cache, Tensor& v_cache, const Tensor& key_mask = {}) const;
  int64_t dim, n_head, head_dim, local_heads;
  std::shared_ptr<Linear> c_attn, c_proj;
  std::shared_ptr<Dropout> resid_drop;
  // Context parallelism: the spec's attention over the whole sequence (empty: the fused
  // attention of the local sequence, which is then the whole).
  LayerSpec::AttentionFunction attention;
};

// LLaMA attention: q/k/v/o projections without bias (roles attention_q/k/v/out),
// grouped-query heads (n_kv_head divides n_head), rotary position embedding on q and k. The
// layer computes local_heads = q_proj's out_features / head_dim query heads over
// local_kv_heads = k_proj's out_features / head_dim key-value heads (n_head and n_kv_head
// unless the spec shards them). `rope_scaling`: LLaMA-3's frequency scaling (backends/rope_functors.h).
class LlamaAttention : public Module {
 public:
  LlamaAttention(int64_t dim, int64_t n_head, int64_t n_kv_head, double rope_theta, const LayerSpec& spec = {},
                 const ops::RopeScaling& rope_scaling = ops::RopeScaling::none());
  // (B, T, C) -> (B, T, C); a packed batch: each document's positions, attention within it
  Tensor forward(const Tensor& x, int64_t position_offset = 0, const Documents& documents = {}) const;
  // As CausalSelfAttention::forward_cached; the new positions start at the cache's length,
  // less each row's padding `pad` (empty: none; Note [padded prompts]).
  Tensor forward_cached(const Tensor& x, Tensor& k_cache, Tensor& v_cache, const Tensor& key_mask = {},
                        const std::vector<int64_t>& pad = {}) const;
  int64_t dim, n_head, n_kv_head, head_dim, local_heads, local_kv_heads;
  double rope_theta;
  ops::RopeScaling rope_scaling;
  std::shared_ptr<Linear> q_proj, k_proj, v_proj, o_proj;
  // Context parallelism: the spec's positions and attention (LayerSpec; empty: the whole
  // sequence is local, from position_offset).
  LayerSpec context;
  // Whether forward runs q, k and v as one GEMM and ops::qkv_rope_attention (FORGE_PACKED_QKV,
  // plain Linears without bias: Note [packed LLaMA attention]).
  bool packed_qkv() const;
};

class Conv2d : public Module {
 public:
  Conv2d(int64_t in_ch, int64_t out_ch, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride = {1, 1},
         std::array<int64_t, 2> padding = {0, 0}, bool bias = true, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) const;  // (N, Cin, H, W) -> (N, Cout, H', W')
  std::array<int64_t, 2> stride, padding;
  Tensor weight, bias;
};

class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride = {0, 0})
      : kernel(kernel), stride(stride) {}
  Tensor forward(const Tensor& x) const;
  std::array<int64_t, 2> kernel, stride;
};

}  // namespace forge::nn
