#include "forge/nn/gpt.h"

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

void GPTConfig::validate() const {
  FORGE_CHECK(vocab_size > 0, "model.vocab_size must be > 0 (resolved) to build a GPT, got ", vocab_size);
  validate_model(model_config(*this));
}

// Holds modules under a name without a forward of its own (nanoGPT's `transformer`
// ModuleDict and its `h` ModuleList).
class GPT::Container : public Module {
 public:
  template <class M> std::shared_ptr<M> add(const std::string& name, std::shared_ptr<M> m) {
    return register_module(name, std::move(m));
  }
};

GPTBlock::GPTBlock(const GPTConfig& c, const LayerSpec& spec) {
  ln_1 = register_module("ln_1", std::make_shared<LayerNorm>(c.n_embd, 1e-5, c.bias));
  attn = register_module("attn", std::make_shared<CausalSelfAttention>(c.n_embd, c.n_head, c.bias, c.dropout, spec));
  ln_2 = register_module("ln_2", std::make_shared<LayerNorm>(c.n_embd, 1e-5, c.bias));
  mlp = register_module("mlp", std::make_shared<MLP>(c.n_embd, c.ffn_hidden(), c.bias, c.dropout, spec));
}

// Note [fused residual + layer norm in GPT]: every residual add of the stream is followed by a
// LayerNorm (ln_2 after the attention's add; the next block's ln_1, or ln_f, after the MLP's
// add), so each pair runs as one ops::add_layer_norm: one pass over memory instead of two, the
// values and gradients of add + layer_norm (bit for bit on the CPU: tests/ops/
// test_add_layer_norm.cpp). Parameters and their names are untouched. GPTBlock::forward
// fuses the add after attention with ln_2; GPT::blocks also carries the MLP output of each
// block as a pending residual into the next block's ln_1 (or, in GPT::head, ln_f), except
// with activation checkpointing, whose regions take and return the stream itself. The
// pending residual crosses GPT::blocks calls in its Stream (Note [model seams] in
// nn/causal_lm.h), so a model cut into block ranges fuses exactly as the whole does.
namespace {

ops::AddLayerNorm add_norm(const LayerNorm& ln, const Tensor& x, const Tensor& residual) {
  return ops::add_layer_norm(x, residual, ln.weight, ln.bias, ln.eps);
}

// The block on the stream x + pending (pending undefined: x alone); returns the new stream as
// {h, mlp output}, whose sum the caller fuses with the next LayerNorm.
std::pair<Tensor, Tensor> block_pending(const GPTBlock& b, const Tensor& x, const Tensor& pending,
                                        const Documents& documents) {
  Tensor stream = x, a;
  if (pending.defined()) {
    ops::AddLayerNorm r = add_norm(*b.ln_1, x, pending);
    stream = r.h;
    a = r.y;
  } else {
    a = b.ln_1->forward(x);
  }
  ops::AddLayerNorm r = add_norm(*b.ln_2, stream, b.attn->forward(a, documents));
  return {r.h, b.mlp->forward(r.y)};
}

}  // namespace

Tensor GPTBlock::forward(const Tensor& x, const Documents& documents) const {
  auto [h, m] = block_pending(*this, x, Tensor(), documents);
  return ops::add(h, m);
}

Tensor GPTBlock::forward_cached(const Tensor& x, Tensor& k_cache, Tensor& v_cache, const Tensor& key_mask) const {
  const Tensor h = ops::add(x, attn->forward_cached(ln_1->forward(x), k_cache, v_cache, key_mask));
  return ops::add(h, mlp->forward(ln_2->forward(h)));
}

Tensor GPT::forward_cached(const Tensor& idx, KvCache& cache, bool last_only) const {
  FORGE_CHECK(idx.dim() == 2, "GPT: expects token ids of shape (B, T), got ", idx.shape());
  const int64_t T = idx.size(1);
  FORGE_CHECK(cache.length + T <= config.block_size, "GPT: a KV cache of ", cache.length, " positions and ", T,
              " more exceed model.block_size = ", config.block_size, "; start a new cache");
  if (cache.k.empty()) cache.k.resize(h.size()), cache.v.resize(h.size());
  FORGE_CHECK(cache.pad.empty() || static_cast<int64_t>(cache.pad.size()) == idx.size(0), "GPT: the KV cache pads ",
              cache.pad.size(), " rows, the batch has ", idx.size(0));
  // Each row's positions (Note [padded prompts]): the cache's, less its padding.
  Tensor x;
  if (cache.padded()) {
    x = drop->forward(ops::add(wte->forward(idx), wpe->forward(cache.positions(T, idx.device()))));
  } else {
    const Tensor pos = arange(cache.length, cache.length + T, 1, {.dtype = DType::i64, .device = idx.device()});
    x = drop->forward(wpe->add_to(wte->forward(idx), pos));
  }
  const Tensor mask = cache.key_mask(T, idx.device());
  for (size_t i = 0; i < h.size(); ++i) x = h[i]->forward_cached(x, cache.k[i], cache.v[i], mask);
  cache.length += T;
  if (last_only) x = ops::contiguous(ops::narrow(x, 1, T - 1, 1));
  return wte->attend(ln_f->forward(x));
}

GPT::GPT(const GPTConfig& c, uint64_t seed, const LayerSpec& spec) : CausalLM(spec), config(c) {
  c.validate();
  SkipInitGuard skip_default_init;  // every parameter is initialised below
  auto transformer = register_module("transformer", std::make_shared<Container>());
  wte = transformer->add("wte", spec.make_embedding(c.vocab_size, c.n_embd, EmbeddingRole::token));
  wpe = transformer->add("wpe", spec.make_embedding(c.block_size, c.n_embd, EmbeddingRole::position));
  for (const auto& [table, role] :
       {std::pair{wte.get(), EmbeddingRole::token}, std::pair{wpe.get(), EmbeddingRole::position}})
    FORGE_CHECK(table->dim == c.n_embd, "GPT: the ", to_string(role), " embedding from the layer spec has dim = ",
                table->dim, ", but model.n_embd = ", c.n_embd, "; return a table of n_embd columns");
  drop = transformer->add("drop", std::make_shared<Dropout>(c.dropout));
  auto list = transformer->add("h", std::make_shared<Container>());
  for (int64_t i = 0; i < c.n_layer; ++i)
    h.push_back(list->add(std::to_string(i), std::make_shared<GPTBlock>(c, spec)));
  ln_f = transformer->add("ln_f", std::make_shared<LayerNorm>(c.n_embd, 1e-5, c.bias));

  // GPT-2 initialisation, from one seeded generator in parameter order.
  Generator gen(seed);
  NoGradGuard no_grad;
  const double resid_std = 0.02 / std::sqrt(2.0 * static_cast<double>(c.n_layer));
  for (auto& [name, p] : named_parameters()) {
    const bool is_bias = name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    const bool is_norm = name.find(".ln_") != std::string::npos;
    if (is_norm) continue;  // LayerNorm: weight 1, bias 0 already
    if (is_bias) {
      p.zero_();
      continue;
    }
    const bool resid = name.find("c_proj.weight") != std::string::npos;
    p.copy_(normal(p.shape(), 0.0, resid ? resid_std : 0.02, {.dtype = p.dtype()}, &gen));
  }
}

Tensor GPT::embed_input(const Tensor& idx, const Documents& documents) const {
  const int64_t T = idx.size(1);
  FORGE_CHECK(T <= config.block_size, "GPT: sequence length ", T, " exceeds model.block_size = ", config.block_size);
  // Each document's own positions (Note [packed documents]); context parallelism: the rank's.
  const Tensor pos = documents.packed() ? documents.positions : layer_spec.position_ids(T, idx.device());
  return drop->forward(wpe->add_to(wte->forward(idx), pos));  // (B, T, C)
}

std::pair<Tensor, Tensor> GPT::block_step(int64_t i, const Tensor& x, const Tensor& pending,
                                          const Documents& documents) const {
  return block_pending(*h[static_cast<size_t>(i)], x, pending, documents);
}

Tensor GPT::block_forward(int64_t i, const Tensor& x, const Documents& documents) const {
  return h[static_cast<size_t>(i)]->forward(x, documents);
}

Tensor GPT::head(const Stream& in) const {
  const Tensor y = in.pending.defined() ? add_norm(*ln_f, in.x, in.pending).y : ln_f->forward(in.x);
  return wte->attend(y);  // tied head: (B, T, V)
}

}  // namespace forge::nn
