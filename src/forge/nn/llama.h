#pragma once
// LLaMA: token embedding, n_layer pre-norm blocks (x += attn(rms(x)); x += swiglu(rms(x)))
// with rotary positions and grouped-query attention, a final RMSNorm and an untied LM
// head. Parameter names follow Hugging Face's LlamaForCausalLM ("model.layers.0.self_attn.
// q_proj.weight", "lm_head.weight"), so its safetensors load by name.
//
// A CausalLM (nn/causal_lm.h): embed / blocks / head / head_loss are its seams (its residual
// adds are unfused, so its Stream never carries pending). Its linears (lm_head included) and
// embed_tokens come from a LayerSpec (nn/layer_spec.h).
#include <memory>
#include <string>
#include <vector>

#include "forge/nn/causal_lm.h"
#include "forge/nn/layers.h"

namespace forge::nn {

struct LlamaConfig {
  int64_t vocab_size = 32000;
  int64_t block_size = 2048;  // maximum context
  int64_t n_layer = 32;
  int64_t n_head = 32;
  int64_t n_kv_head = 32;
  int64_t dim = 4096;
  int64_t ffn_hidden = 11008;
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  ops::RopeScaling rope_scaling;  // LLaMA-3's frequency scaling (backends/rope_functors.h); none by default
  double init_std = 0.02;
  bool checkpoint_activations = false;
  // Throws forge::Error naming the model.<key>: the registry's rules for model.type = "llama"
  // (nn/model_registry.h), and what a module needs resolved (vocab_size, n_kv_head, ffn_hidden > 0).
  void validate() const;
  // The SwiGLU width when none is given (model.ffn_hidden = 0): 8 * dim / 3 rounded up to a
  // multiple of 32. The one copy of the rule: the registry's shape() applies it for the trainer,
  // `forge plan`, the layout checks and the export.
  static int64_t default_ffn_hidden(int64_t dim) { return (8 * dim / 3 + 31) / 32 * 32; }
};

class LlamaBlock : public Module {
 public:
  // The block over a KV cache's keys and values of its attention (Note [KV cache]).
  Tensor forward_cached(const Tensor& x, Tensor& k_cache, Tensor& v_cache, const Tensor& key_mask = {},
                        const std::vector<int64_t>& pad = {}) const;
  explicit LlamaBlock(const LlamaConfig& c, const LayerSpec& spec = {});
  Tensor forward(const Tensor& x, const Documents& documents = {}) const;  // documents: nn/documents.h
  std::shared_ptr<RMSNorm> input_layernorm, post_attention_layernorm;
  std::shared_ptr<LlamaAttention> self_attn;
  std::shared_ptr<SwiGLU> mlp;
};

class Llama : public CausalLM {
 public:
  explicit Llama(const LlamaConfig& c, uint64_t seed = 0, const LayerSpec& spec = {});

  Tensor head(const Stream& in) const override;  // lm_head(norm(x)): (B, T, vocab_size)
  Tensor forward_cached(const Tensor& idx, KvCache& cache, bool last_only = false) const override;
  int64_t num_blocks() const override { return config.n_layer; }
  int64_t vocab_size() const override { return config.vocab_size; }
  int64_t block_size() const override { return config.block_size; }
  int block_of_param(const std::string& param_name) const override { return block_of(param_name); }

  LlamaConfig config;
  std::shared_ptr<Embedding> embed_tokens;
  std::vector<std::shared_ptr<LlamaBlock>> layers;
  std::shared_ptr<RMSNorm> norm;
  std::shared_ptr<Linear> lm_head;
  // The block a parameter name belongs to ("model.layers.<i>."), or -1.
  static int block_of(const std::string& param_name) { return block_of_parameter(param_name, "model.layers."); }

 protected:
  // The block loop's pieces (Note [the block loop] in nn/causal_lm.h): block i's fused step on the
  // stream (its residual branch left pending), its plain forward (the checkpointed region).
  Tensor embed_input(const Tensor& idx, const Documents& documents) const override;
  std::pair<Tensor, Tensor> block_step(int64_t i, const Tensor& x, const Tensor& pending,
                                       const Documents& documents) const override;
  Tensor block_forward(int64_t i, const Tensor& x, const Documents& documents) const override;
  bool checkpoints_activations() const override { return config.checkpoint_activations; }
  const char* family_name() const override { return "Llama"; }

 private:
  class Container;
};

}  // namespace forge::nn
