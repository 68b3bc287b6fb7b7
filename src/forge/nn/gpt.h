#pragma once
// GPT (the GPT-2 layout): token + learned position embeddings, n_layer pre-LN blocks
// (x += attn(ln_1(x)); x += mlp(ln_2(x))), a final LayerNorm and an LM head tied to the
// token embedding. Parameter names follow nanoGPT ("transformer.h.0.attn.c_attn.weight");
// Linear weights are (out, in) — io/ maps them to and from Hugging Face's Conv1D layout.
//
// Init (GPT-2): every Linear and Embedding weight ~ N(0, 0.02), biases 0, and the
// residual projections (attn.c_proj, mlp.c_proj) ~ N(0, 0.02 / sqrt(2 n_layer)).
//
// Its linears and embeddings come from a LayerSpec (nn/layer_spec.h): wte is the token
// embedding and, through Embedding::attend, the tied head; wpe the position embedding.
#include <memory>
#include <vector>

#include "forge/nn/block_hooks.h"
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
  // Throws forge::Error naming the key when the shape is impossible.
  void validate() const;
};

class GPTBlock : public Module {
 public:
  explicit GPTBlock(const GPTConfig& c, const LayerSpec& spec = {});
  Tensor forward(const Tensor& x) const;
  std::shared_ptr<LayerNorm> ln_1, ln_2;
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<MLP> mlp;
};

class GPT : public Module {
 public:
  explicit GPT(const GPTConfig& c, uint64_t seed = 0, const LayerSpec& spec = {});
  // idx (B, T) i64 token ids -> logits (B, T, vocab_size).
  Tensor forward(const Tensor& idx) const;
  // Mean cross-entropy of forward(idx) against targets (B, T) (ignore_index -100).
  Tensor loss(const Tensor& idx, const Tensor& targets) const;

  GPTConfig config;
  std::shared_ptr<Embedding> wte, wpe;
  std::vector<std::shared_ptr<GPTBlock>> h;
  std::shared_ptr<LayerNorm> ln_f;
  std::shared_ptr<Dropout> drop;
  // Called around every block's forward when set (nn/block_hooks.h; ZeRO-3).
  std::shared_ptr<BlockHooks> block_hooks;
  // The block a parameter name belongs to ("transformer.h.<i>."), or -1.
  static int block_of(const std::string& param_name) { return block_of_parameter(param_name, "transformer.h."); }

 private:
  class Container;
};

}  // namespace forge::nn
