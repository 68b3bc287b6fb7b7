// GPT and LLaMA behind train::LanguageModel (contracts in language_model.h).
#include "forge/train/language_model.h"

#include "forge/core/error.h"
#include "forge/nn/causal_lm.h"
#include "forge/nn/gpt.h"
#include "forge/nn/llama.h"

namespace forge::train {

LanguageModel build_language_model(const RunConfig& cfg) {
  const auto& m = cfg.model;
  FORGE_CHECK(m.vocab_size > 0, "build_language_model: model.vocab_size is not resolved (0)");
  const auto seed = static_cast<uint64_t>(cfg.run.seed);
  LanguageModel out;
  out.vocab_size = m.vocab_size;
  out.block_size = m.block_size;
  if (m.type == "gpt") {
    nn::GPTConfig c;
    c.vocab_size = m.vocab_size;
    c.block_size = m.block_size;
    c.n_layer = m.n_layer;
    c.n_head = m.n_head;
    c.n_embd = m.n_embd;
    c.dropout = m.dropout;
    c.bias = m.bias;
    c.checkpoint_activations = m.checkpoint_activations;
    auto gpt = std::make_shared<nn::GPT>(c, seed);
    out.forward = [g = gpt.get()](const Tensor& idx) { return g->forward(idx); };
    out.set_block_hooks = [g = gpt.get()](std::shared_ptr<nn::BlockHooks> h) { g->block_hooks = std::move(h); };
    out.block_of = &nn::GPT::block_of;
    out.module = gpt;
  } else if (m.type == "llama") {
    nn::LlamaConfig c;
    c.vocab_size = m.vocab_size;
    c.block_size = m.block_size;
    c.n_layer = m.n_layer;
    c.n_head = m.n_head;
    c.n_kv_head = m.n_kv_head == 0 ? m.n_head : m.n_kv_head;
    c.dim = m.dim;
    c.ffn_hidden = m.ffn_hidden > 0 ? m.ffn_hidden : nn::LlamaConfig::default_ffn_hidden(m.dim);
    c.norm_eps = m.norm_eps;
    c.rope_theta = m.rope_theta;
    c.init_std = m.init_std;
    c.checkpoint_activations = m.checkpoint_activations;
    auto llama = std::make_shared<nn::Llama>(c, seed);
    out.forward = [l = llama.get()](const Tensor& idx) { return l->forward(idx); };
    out.set_block_hooks = [l = llama.get()](std::shared_ptr<nn::BlockHooks> h) { l->block_hooks = std::move(h); };
    out.block_of = &nn::Llama::block_of;
    out.module = llama;
  } else {
    FORGE_THROW("model.type = '", m.type, "' is not a language model; use \"gpt\" or \"llama\"");
  }
  // The loss through the model's seam (Note [model seams]): its head computes it.
  auto lm = std::static_pointer_cast<nn::CausalLM>(out.module);
  out.loss = [lm = lm.get()](const Tensor& idx, const Tensor& targets) { return lm->loss(idx, targets); };
  return out;
}

int64_t matmul_parameters(const nn::Module& m) {
  int64_t n = 0;
  for (const auto& [name, p] : m.named_parameters())
    if (name.find("wpe.") == std::string::npos && name.find("embed_tokens.") == std::string::npos) n += p.numel();
  return n;
}

}  // namespace forge::train
