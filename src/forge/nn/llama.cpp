#include "forge/nn/llama.h"

#include <cmath>
#include <utility>

#include "forge/autograd/grad_mode.h"
#include "forge/nn/model_registry.h"
#include "forge/ops/binary.h"
#include "forge/ops/copy.h"
#include "forge/ops/creation.h"
#include "forge/ops/norm.h"
#include "forge/ops/view.h"

namespace forge::nn {

void LlamaConfig::validate() const {
  FORGE_CHECK(vocab_size > 0, "model.vocab_size must be > 0 (resolved) to build a LLaMA, got ", vocab_size);
  FORGE_CHECK(n_kv_head > 0, "model.n_kv_head must be > 0 (resolved: 0 means n_head only in a config) to build a "
              "LLaMA, got ", n_kv_head);
  FORGE_CHECK(ffn_hidden > 0, "model.ffn_hidden must be > 0 (resolved: LlamaConfig::default_ffn_hidden(dim)) to "
              "build a LLaMA, got ", ffn_hidden);
  validate_model(model_config(*this));
}

class Llama::Container : public Module {
 public:
  template <class M> std::shared_ptr<M> add(const std::string& name, std::shared_ptr<M> m) {
    return register_module(name, std::move(m));
  }
};

LlamaBlock::LlamaBlock(const LlamaConfig& c, const LayerSpec& spec) {
  self_attn = register_module("self_attn",
                              std::make_shared<LlamaAttention>(c.dim, c.n_head, c.n_kv_head, c.rope_theta, spec,
                                                                               c.rope_scaling));
  mlp = register_module("mlp", std::make_shared<SwiGLU>(c.dim, c.ffn_hidden, spec));
  input_layernorm = register_module("input_layernorm", std::make_shared<RMSNorm>(c.dim, c.norm_eps));
  post_attention_layernorm = register_module("post_attention_layernorm", std::make_shared<RMSNorm>(c.dim, c.norm_eps));
}

// Note [fused residual + RMS norm in LLaMA]: as GPT's (Note [fused residual + layer norm in
// GPT]), every residual add of the stream is followed by an RMSNorm (post_attention_layernorm
// after the attention's add; the next block's input_layernorm, or the final norm, after the
// MLP's add), so each pair runs as one ops::add_rms_norm: one pass over memory instead of two,
// the values and gradients of add + rms_norm bit for bit (tests/ops/test_add_rms_norm.cpp).
// Llama::blocks carries each block's MLP output as a pending residual into the next block (or
// Llama::head) through the Stream, except under activation checkpointing, whose regions take
// and return the stream itself. On an H200 the 32 separate residual adds of the 0.85B LLaMA's
// step were 0.85 ms (26.6 us each, 100 MB a call): the fused kernel reads and writes 67 MB less
// per pair.
namespace {

ops::AddRmsNorm add_norm(const RMSNorm& n, const Tensor& x, const Tensor& residual) {
  return ops::add_rms_norm(x, residual, n.weight, n.eps);
}

// The block on the stream x + pending (pending undefined: x alone); returns the new stream as
// {h, mlp output}, whose sum the caller fuses with the next RMSNorm.
std::pair<Tensor, Tensor> block_pending(const LlamaBlock& b, const Tensor& x, const Tensor& pending,
                                        const Documents& documents) {
  Tensor stream = x, a;
  if (pending.defined()) {
    ops::AddRmsNorm r = add_norm(*b.input_layernorm, x, pending);
    stream = r.h;
    a = r.y;
  } else {
    a = b.input_layernorm->forward(x);
  }
  ops::AddRmsNorm r = add_norm(*b.post_attention_layernorm, stream, b.self_attn->forward(a, 0, documents));
  return {r.h, b.mlp->forward(r.y)};
}

}  // namespace

Tensor LlamaBlock::forward(const Tensor& x, const Documents& documents) const {
  auto [h, m] = block_pending(*this, x, Tensor(), documents);
  return ops::add(h, m);
}

Tensor LlamaBlock::forward_cached(const Tensor& x, Tensor& k_cache, Tensor& v_cache, const Tensor& key_mask,
                                  const std::vector<int64_t>& pad) const {
  Tensor h = ops::add(x, self_attn->forward_cached(input_layernorm->forward(x), k_cache, v_cache, key_mask, pad));
  return ops::add(h, mlp->forward(post_attention_layernorm->forward(h)));
}

Tensor Llama::forward_cached(const Tensor& idx, KvCache& cache, bool last_only) const {
  FORGE_CHECK(idx.dim() == 2, "Llama: expects token ids of shape (B, T), got ", idx.shape());
  FORGE_CHECK(cache.length + idx.size(1) <= config.block_size, "Llama: a KV cache of ", cache.length, " positions and ",
              idx.size(1), " more exceed model.block_size = ", config.block_size, "; start a new cache");
  if (cache.k.empty()) cache.k.resize(layers.size()), cache.v.resize(layers.size());
  FORGE_CHECK(cache.pad.empty() || static_cast<int64_t>(cache.pad.size()) == idx.size(0), "Llama: the KV cache pads ",
              cache.pad.size(), " rows, the batch has ", idx.size(0));
  Tensor x = embed_tokens->forward(idx);
  const Tensor mask = cache.key_mask(idx.size(1), idx.device());  // (Note [padded prompts])
  for (size_t i = 0; i < layers.size(); ++i) x = layers[i]->forward_cached(x, cache.k[i], cache.v[i], mask, cache.pad);
  cache.length += idx.size(1);
  if (last_only) x = ops::contiguous(ops::narrow(x, 1, idx.size(1) - 1, 1));
  return lm_head->forward(norm->forward(x));
}

Llama::Llama(const LlamaConfig& c, uint64_t seed, const LayerSpec& spec) : CausalLM(spec), config(c) {
  c.validate();
  SkipInitGuard skip_default_init;  // every parameter is initialised below
  auto model = register_module("model", std::make_shared<Container>());
  embed_tokens = model->add("embed_tokens", spec.make_embedding(c.vocab_size, c.dim, EmbeddingRole::token));
  FORGE_CHECK(embed_tokens->dim == c.dim, "Llama: the token embedding from the layer spec has dim = ",
              embed_tokens->dim, ", but model.dim = ", c.dim, "; return a table of model.dim columns");
  auto list = model->add("layers", std::make_shared<Container>());
  for (int64_t i = 0; i < c.n_layer; ++i)
    layers.push_back(list->add(std::to_string(i), std::make_shared<LlamaBlock>(c, spec)));
  norm = model->add("norm", std::make_shared<RMSNorm>(c.dim, c.norm_eps));
  lm_head = register_module("lm_head", spec.make_linear(c.dim, c.vocab_size, false, LinearRole::lm_head));
  FORGE_CHECK(lm_head->in_features == c.dim, "Llama: the lm_head linear from the layer spec has in_features = ",
              lm_head->in_features, ", but model.dim = ", c.dim, "; return a head that reads the whole width");

  // Hugging Face's LLaMA init: N(0, init_std) for every Linear and Embedding weight.
  Generator gen(seed);
  NoGradGuard no_grad;
  for (auto& [name, p] : named_parameters()) {
    if (name.find("layernorm") != std::string::npos || name == "model.norm.weight") continue;
    p.copy_(normal(p.shape(), 0.0, c.init_std, {.dtype = p.dtype()}, &gen));
  }
}

Tensor Llama::embed_input(const Tensor& idx, const Documents&) const {
  FORGE_CHECK(idx.size(1) <= config.block_size, "Llama: sequence length ", idx.size(1),
              " exceeds model.block_size = ", config.block_size);
  return embed_tokens->forward(idx);  // (B, T, C)
}

std::pair<Tensor, Tensor> Llama::block_step(int64_t i, const Tensor& x, const Tensor& pending,
                                            const Documents& documents) const {
  return block_pending(*layers[static_cast<size_t>(i)], x, pending, documents);
}

Tensor Llama::block_forward(int64_t i, const Tensor& x, const Documents& documents) const {
  return layers[static_cast<size_t>(i)]->forward(x, documents);
}

Tensor Llama::head(const Stream& in) const {
  const Tensor y = in.pending.defined() ? add_norm(*norm, in.x, in.pending).y : norm->forward(in.x);
  return lm_head->forward(y);
}

}  // namespace forge::nn
