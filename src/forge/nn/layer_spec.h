#pragma once
// LayerSpec: which module GPT and LLaMA build for each linear and embedding, chosen by its role,
// so that a tensor-parallel layer (a ColumnParallelLinear / RowParallelLinear deriving from
// nn::Linear, a vocabulary-parallel embedding deriving from nn::Embedding) replaces the plain
// one without editing the models. The default spec (every member empty) builds plain layers:
// the same modules, parameter names, order and initialisation as a model built without a spec.
//
//   LayerSpec spec;
//   spec.linear = [&](int64_t in, int64_t out, bool bias, LinearRole role) -> std::shared_ptr<Linear> {
//     if (role == LinearRole::attention_qkv) return std::make_shared<ColumnParallelLinear>(in, out, bias, tp);
//     ...
//   };
//   nn::GPT model(config, seed, spec);
//
// Contract with the layers that call it (nn/layers.h):
// - The factory gets the full (unsharded) sizes and may return a module with other
//   out_features / in_features; the layer derives its local sizes from what it got: the
//   attention computes q/qkv out_features / head_dim heads (k/v out_features / head_dim
//   key-value heads), the MLPs are as wide as their up projection's out_features. The layer
//   checks the pieces fit (the output projection's in_features equals the attention's local
//   width, down's in_features equals up's out_features) and names the role when they do not.
// - A fused QKV projection (GPT's c_attn) returns [q | k | v] for its local heads, each
//   local_heads * head_dim wide, in that order.
// - Parameter names inside a returned module ("weight", "bias") become the model's names, so
//   a replacement that keeps Linear's members keeps the state dict's keys.
// - Modules are built while the model's SkipInitGuard is alive (nn/module.h); the model then
//   initialises every parameter from its seed in parameter order.
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "forge/core/tensor.h"

namespace forge::nn {

class Linear;
class Embedding;

enum class LinearRole {
  attention_qkv,  // GPT's fused c_attn: dim -> 3 dim
  attention_q,    // LLaMA q_proj: dim -> n_head * head_dim
  attention_k,    // LLaMA k_proj: dim -> n_kv_head * head_dim
  attention_v,    // LLaMA v_proj: dim -> n_kv_head * head_dim
  attention_out,  // GPT attn.c_proj, LLaMA o_proj: heads * head_dim -> dim
  mlp_up,         // GPT mlp.c_fc (followed by GELU), LLaMA up_proj
  mlp_gate,       // LLaMA gate_proj (followed by SiLU)
  mlp_down,       // GPT mlp.c_proj, LLaMA down_proj
  lm_head,        // LLaMA lm_head: dim -> vocab (GPT's head is tied to wte: Embedding::attend)
};

enum class EmbeddingRole {
  token,     // GPT transformer.wte (also its tied head), LLaMA model.embed_tokens: vocab -> dim
  position,  // GPT transformer.wpe: block_size -> dim
};

const char* to_string(LinearRole role);
const char* to_string(EmbeddingRole role);

// Context parallelism (parallel/context_parallel.h): a rank holds some positions of each
// sequence, as ranges of the whole sequence in the order the rank's tokens come.
struct PositionRange {
  int64_t start = 0, length = 0;
};

struct LayerSpec {
  // (in_features, out_features, bias, role) -> the linear to register under the role's name.
  using LinearFactory = std::function<std::shared_ptr<Linear>(int64_t in, int64_t out, bool bias, LinearRole role)>;
  // (num, dim, role) -> the embedding table to register.
  using EmbeddingFactory = std::function<std::shared_ptr<Embedding>(int64_t num, int64_t dim, EmbeddingRole role)>;
  // (the head's output, targets (B, T) i64) -> the mean cross-entropy over targets != -100.
  // A vocabulary-parallel head returns its rank's slice of the logits; its loss combines the
  // slices across the tensor-parallel group without gathering them.
  using LossFunction = std::function<Tensor(const Tensor& logits, const Tensor& targets)>;

  // (this rank's sequence length) -> the whole-sequence positions of its tokens, ranges in order.
  using PositionFunction = std::function<std::vector<PositionRange>(int64_t local_length)>;
  // Causal self-attention of this rank's positions against the whole sequence: q (B, H, t, D),
  // k and v (B, Hkv, t, D) of the rank's t positions (those of `positions`) -> (B, H, t, D). The
  // function gets the rest of the sequence's keys and values itself (a collective). `ids` (B, t)
  // i32: a packed batch's document ids of those positions (attention within each document), or
  // undefined (nn/documents.h).
  using AttentionFunction =
      std::function<Tensor(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& ids)>;

  LinearFactory linear;        // empty: nn::Linear
  EmbeddingFactory embedding;  // empty: nn::Embedding
  LossFunction loss;           // empty: ops::cross_entropy
  // Context parallelism: both set, or neither (the whole sequence on every rank: positions
  // 0..T-1 and the fused causal attention).
  PositionFunction positions;
  AttentionFunction attention;

  // What the models call: the factory's module (checked to exist), or the plain layer.
  std::shared_ptr<Linear> make_linear(int64_t in, int64_t out, bool bias, LinearRole role) const;
  std::shared_ptr<Embedding> make_embedding(int64_t num, int64_t dim, EmbeddingRole role) const;
  Tensor cross_entropy(const Tensor& logits, const Tensor& targets) const;
  // The positions of a local sequence of `length` tokens: positions(length), checked to cover
  // `length` tokens in all; {0, length} without context parallelism.
  std::vector<PositionRange> position_ranges(int64_t length) const;
  // The positions as a (length,) i64 tensor on `device`.
  Tensor position_ids(int64_t length, Device device) const;
};

}  // namespace forge::nn
