#pragma once
// GPT (the GPT-2 layout): token + learned position embeddings, n_layer pre-LN blocks
// (x += attn(ln_1(x)); x += mlp(ln_2(x))), a final LayerNorm and an LM head tied to the
// token embedding. Parameter names follow nanoGPT ("transformer.h.0.attn.c_attn.weight");
// Linear weights are (out, in) — io/ maps them to and from Hugging Face's Conv1D layout.
//
// Init (GPT-2): every Linear and Embedding weight ~ N(0, 0.02), biases 0, and the
// residual projections (attn.c_proj, mlp.c_proj) ~ N(0, 0.02 / sqrt(2 n_layer)).
//
// A CausalLM (nn/causal_lm.h): embed / blocks / head / head_loss are its seams, and its
// Stream carries the MLP output of the last block run as `pending` (Note [model seams]). Its
// linears and embeddings come from a LayerSpec (nn/layer_spec.h): wte is the token embedding
// and, through Embedding::attend, the tied head; wpe the position embedding.
#include <memory>
#include <string>
#include <vector>

#include "forge/nn/causal_lm.h"
#include "forge/nn/layers.h"

namespace forge::nn {

struct GPTConfig {
  int64_t vocab_size = 50304;
  int64_t block_size = 1024;  // maximum context
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_embd = 768;
  double dropout = 0.0;
  bool bias = true;
  bool checkpoint_activations = false;  // re-run each block's forward in backward
  // The MLP width: 4 * n_embd (the one copy of the rule; nn/model_registry's shape reads it).
  int64_t ffn_hidden() const { return 4 * n_embd; }
  // Throws forge::Error naming the model.<key> when the shape is impossible: the registry's
  // rules for model.type = "gpt" (nn/model_registry.h), and a resolved vocabulary.
  void validate() const;
};

class GPTBlock : public Module {
 public:
  // The block over a KV cache's keys and values of its attention (Note [KV cache]).
  Tensor forward_cached(const Tensor& x, Tensor& k_cache, Tensor& v_cache, const Tensor& key_mask = {}) const;
  explicit GPTBlock(const GPTConfig& c, const LayerSpec& spec = {});
  // (B, T, C) -> (B, T, C), the stream after the block; a packed batch's documents (nn/documents.h)
  Tensor forward(const Tensor& x, const Documents& documents = {}) const;
  std::shared_ptr<LayerNorm> ln_1, ln_2;
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<MLP> mlp;
};

class GPT : public CausalLM {
 public:
  explicit GPT(const GPTConfig& c, uint64_t seed = 0, const LayerSpec& spec = {});

  // drop(wte(idx) + wpe(0..T-1)); nothing pending.
  Tensor embed_input(const Tensor& idx, const Documents& documents) const override;
  // ln_f (fused with the pending add) and the head tied to wte: logits (B, T, vocab_size).
  Tensor head(const Stream& in) const override;
  Tensor forward_cached(const Tensor& idx, KvCache& cache, bool last_only = false) const override;
  int64_t num_blocks() const override { return config.n_layer; }
  int64_t vocab_size() const override { return config.vocab_size; }
  int64_t block_size() const override { return config.block_size; }
  int block_of_param(const std::string& param_name) const override { return block_of(param_name); }

  GPTConfig config;
  std::shared_ptr<Embedding> wte, wpe;
  std::vector<std::shared_ptr<GPTBlock>> h;
  std::shared_ptr<LayerNorm> ln_f;
  std::shared_ptr<Dropout> drop;
  // The block a parameter name belongs to ("transformer.h.<i>."), or -1.
  static int block_of(const std::string& param_name) { return block_of_parameter(param_name, "transformer.h."); }

 protected:
  // The block loop's pieces (Note [the block loop] in nn/causal_lm.h): block i's fused step on the
  // stream (its residual branch left pending), its plain forward (the checkpointed region).
  std::pair<Tensor, Tensor> block_step(int64_t i, const Tensor& x, const Tensor& pending,
                                       const Documents& documents) const override;
  Tensor block_forward(int64_t i, const Tensor& x, const Documents& documents) const override;
  bool checkpoints_activations() const override { return config.checkpoint_activations; }
  const char* family_name() const override { return "GPT"; }

 private:
  class Container;
};

}  // namespace forge::nn
