// GPT and LLaMA: parameter counts (GPT-2 124M exactly), names in nanoGPT / Hugging Face
// layout, forward shapes, initial loss, training on a fixed batch, the tied head, config
// validation, and activation checkpointing (same gradients, lower peak memory).
// Parity with PyTorch (values, gradients, AdamW steps) is checked by
// tests/python/model_reference.py.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "forge/core/allocator.h"
#include "forge/forge.h"
#include "forge/nn/gpt.h"
#include "forge/nn/llama.h"
#include "forge/core/env.h"
#include "testing/tensor_testing.h"
#include "testing/tiny_models.h"

namespace forge::nn {
namespace {

using forge::testing::error_of;
using forge::testing::vals;

// ---------------------------------------------------------------- closed-form counts

// nanoGPT / GPT-2 with a tied head and biases: wte + wpe + per block (2 LayerNorms,
// c_attn C->3C, attn c_proj C->C, c_fc C->4C, mlp c_proj 4C->C, all with biases) + ln_f.
int64_t gpt_param_formula(const GPTConfig& c) {
  const int64_t C = c.n_embd;
  const int64_t block = 2 * (2 * C) + (C * 3 * C + 3 * C) + (C * C + C) + (C * 4 * C + 4 * C) + (4 * C * C + C);
  return c.vocab_size * C + c.block_size * C + c.n_layer * block + 2 * C;
}

// LLaMA: embed_tokens + per block (q, o: C x C; k, v: C x (kv heads * head dim); SwiGLU
// 3 x C x F; two RMSNorm weights) + final norm + untied lm_head.
int64_t llama_param_formula(const LlamaConfig& c) {
  const int64_t C = c.dim, kv = c.n_kv_head * (c.dim / c.n_head);
  const int64_t block = 2 * C * C + 2 * C * kv + 3 * C * c.ffn_hidden + 2 * C;
  return c.vocab_size * C + c.n_layer * block + C + C * c.vocab_size;
}

GPTConfig tiny_gpt_config() {
  GPTConfig c;
  c.vocab_size = 61;
  c.block_size = 32;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 32;
  return c;
}

LlamaConfig tiny_llama_config() {
  LlamaConfig c;
  c.vocab_size = 61;
  c.block_size = 32;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.dim = 32;
  c.ffn_hidden = 80;
  return c;
}

// A fixed batch of token ids in [0, vocab) and its next-token targets.
std::pair<Tensor, Tensor> batch(int64_t vocab, int64_t B, int64_t T, uint64_t seed) {
  Generator gen(seed);
  Tensor tokens = randint(0, vocab, {B, T + 1}, {.dtype = DType::i64}, &gen);
  return {tokens.slice(1, 0, T).contiguous(), tokens.slice(1, 1, T + 1).contiguous()};
}

double rel_diff(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = vals(a), y = vals(b);
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num += (x[i] - y[i]) * (x[i] - y[i]);
    den += y[i] * y[i];
  }
  return std::sqrt(num) / std::sqrt(den);
}

// ---------------------------------------------------------------- GPT-2 124M

TEST(GPTModel, GPT2SmallHasExactly124439808Parameters) {
  GPTConfig c;  // the GPT-2 small shape
  c.vocab_size = 50257;
  c.block_size = 1024;
  c.n_layer = 12;
  c.n_head = 12;
  c.n_embd = 768;
  const auto t0 = std::chrono::steady_clock::now();
  GPT model(c, /*seed=*/1);  // ~500 MB of f32, a few seconds: built once
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ::testing::Test::RecordProperty("construction_seconds", std::to_string(secs));
  EXPECT_EQ(model.num_parameters(), 124439808);
  EXPECT_EQ(model.num_parameters(), gpt_param_formula(c));

  // Padding the vocabulary to 50304 (a multiple of 64) grows only the tied token table:
  // the only parameter with a vocab-sized dim is wte, and the blocks do not depend on it.
  int64_t per_block = 0;
  for (const auto& [name, p] : model.named_parameters()) {
    if (name.rfind("transformer.h.0.", 0) == 0) per_block += p.numel();
    if (name != "transformer.wte.weight") {
      for (int64_t d : p.shape()) EXPECT_NE(d, c.vocab_size) << name;
    }
  }
  EXPECT_EQ(model.wte->weight.shape(), (Shape{c.vocab_size, c.n_embd}));
  GPTConfig padded = c;
  padded.vocab_size = 50304;
  EXPECT_EQ(gpt_param_formula(padded) - gpt_param_formula(c), (50304 - 50257) * 768);
  // A real padded model, one block deep instead of twelve (a second 124M model would
  // double the test's time for the same information): its count plus the 11 blocks it
  // lacks, each counted on the model above, is the padded GPT-2's count.
  GPTConfig padded_one_block = padded;
  padded_one_block.n_layer = 1;
  GPT small(padded_one_block, 1);
  EXPECT_EQ(small.num_parameters() + (c.n_layer - 1) * per_block, 124439808 + (50304 - 50257) * 768);

  // The GPT-2 init: embeddings and weights ~ N(0, 0.02), residual projections scaled down.
  const auto stddev = [](const Tensor& t) { return std::sqrt(ops::var(t.detach()).item()); };
  EXPECT_NEAR(stddev(model.wte->weight), 0.02, 1e-4);
  EXPECT_NEAR(stddev(model.h[0]->attn->c_attn->weight), 0.02, 2e-4);
  EXPECT_NEAR(stddev(model.h[5]->mlp->c_proj->weight), 0.02 / std::sqrt(24.0), 1e-4);
  EXPECT_EQ(vals(model.h[3]->attn->c_attn->bias), std::vector<double>(3 * 768, 0.0));
  EXPECT_EQ(vals(model.ln_f->weight), std::vector<double>(768, 1.0));
}

// ---------------------------------------------------------------- names and counts

TEST(GPTModel, ParameterNamesFollowNanoGPT) {
  const GPTConfig c = tiny_gpt_config();
  GPT model(c, 3);
  const int64_t C = c.n_embd;
  std::vector<std::pair<std::string, Shape>> want{{"transformer.wte.weight", {c.vocab_size, C}},
                                                  {"transformer.wpe.weight", {c.block_size, C}}};
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string p = "transformer.h." + std::to_string(i) + ".";
    for (const auto& [n, s] : std::vector<std::pair<std::string, Shape>>{
             {"ln_1.weight", {C}}, {"ln_1.bias", {C}}, {"attn.c_attn.weight", {3 * C, C}},
             {"attn.c_attn.bias", {3 * C}}, {"attn.c_proj.weight", {C, C}}, {"attn.c_proj.bias", {C}},
             {"ln_2.weight", {C}}, {"ln_2.bias", {C}}, {"mlp.c_fc.weight", {4 * C, C}}, {"mlp.c_fc.bias", {4 * C}},
             {"mlp.c_proj.weight", {C, 4 * C}}, {"mlp.c_proj.bias", {C}}})
      want.emplace_back(p + n, s);
  }
  want.emplace_back("transformer.ln_f.weight", Shape{C});
  want.emplace_back("transformer.ln_f.bias", Shape{C});
  const NamedTensors got = model.named_parameters();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i].first);
    EXPECT_EQ(got[i].second.shape(), want[i].second) << got[i].first;
  }
  EXPECT_EQ(got[2].first, "transformer.h.0.ln_1.weight");
  EXPECT_EQ(got[4].first, "transformer.h.0.attn.c_attn.weight");
  EXPECT_EQ(model.num_parameters(), gpt_param_formula(c));
}

TEST(LlamaModel, ParameterNamesFollowHuggingFace) {
  const LlamaConfig c = tiny_llama_config();
  Llama model(c, 3);
  const int64_t C = c.dim, kv = c.n_kv_head * (c.dim / c.n_head), F = c.ffn_hidden;
  std::vector<std::pair<std::string, Shape>> want{{"model.embed_tokens.weight", {c.vocab_size, C}}};
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    for (const auto& [n, s] : std::vector<std::pair<std::string, Shape>>{
             {"self_attn.q_proj.weight", {C, C}}, {"self_attn.k_proj.weight", {kv, C}},
             {"self_attn.v_proj.weight", {kv, C}}, {"self_attn.o_proj.weight", {C, C}},
             {"mlp.gate_proj.weight", {F, C}}, {"mlp.up_proj.weight", {F, C}}, {"mlp.down_proj.weight", {C, F}},
             {"input_layernorm.weight", {C}}, {"post_attention_layernorm.weight", {C}}})
      want.emplace_back(p + n, s);
  }
  want.emplace_back("model.norm.weight", Shape{C});
  want.emplace_back("lm_head.weight", Shape{c.vocab_size, C});
  const NamedTensors got = model.named_parameters();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i].first);
    EXPECT_EQ(got[i].second.shape(), want[i].second) << got[i].first;
  }
  EXPECT_EQ(got[1].first, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(got.back().first, "lm_head.weight");
  EXPECT_EQ(model.num_parameters(), llama_param_formula(c));
  // Untied: the head is a tensor of its own.
  EXPECT_NE(model.lm_head->weight.storage(), model.embed_tokens->weight.storage());
}

// ---------------------------------------------------------------- forward and loss

TEST(GPTModel, ForwardShapesAndInitialLossIsLogVocab) {
  const GPTConfig c = tiny_gpt_config();
  GPT model(c, 4);
  auto [x, y] = batch(c.vocab_size, 3, 16, 11);
  Tensor logits = model.forward(x);
  EXPECT_EQ(logits.shape(), (Shape{3, 16, c.vocab_size}));
  EXPECT_EQ(logits.dtype(), DType::f32);
  EXPECT_EQ(model.forward(x.slice(1, 0, 5).contiguous()).shape(), (Shape{3, 5, c.vocab_size}));
  EXPECT_EQ(model.forward(batch(c.vocab_size, 1, c.block_size, 12).first).shape(),
            (Shape{1, c.block_size, c.vocab_size}));
  // N(0, 0.02) weights give logits of order 0.02 * sqrt(C) * |ln_f(x)| ~ 0.1: nearly uniform.
  const double loss = model.loss(x, y).item();
  EXPECT_NEAR(loss, std::log(static_cast<double>(c.vocab_size)), 0.05);
  EXPECT_NE(error_of([&] { model.forward(batch(c.vocab_size, 1, c.block_size + 1, 13).first); })
                .find("model.block_size"),
            std::string::npos);
  EXPECT_NE(error_of([&] { model.forward(zeros({4}, {.dtype = DType::i64})); }).find("(B, T)"), std::string::npos);
}

TEST(LlamaModel, ForwardShapesAndInitialLossIsLogVocab) {
  const LlamaConfig c = tiny_llama_config();
  Llama model(c, 4);
  auto [x, y] = batch(c.vocab_size, 3, 16, 11);
  EXPECT_EQ(model.forward(x).shape(), (Shape{3, 16, c.vocab_size}));
  EXPECT_EQ(model.forward(x.slice(1, 0, 1).contiguous()).shape(), (Shape{3, 1, c.vocab_size}));
  const double loss = model.loss(x, y).item();
  EXPECT_NEAR(loss, std::log(static_cast<double>(c.vocab_size)), 0.05);
  EXPECT_NE(error_of([&] { model.forward(batch(c.vocab_size, 1, c.block_size + 1, 13).first); })
                .find("model.block_size"),
            std::string::npos);
}

// Causality: logits at position t depend on tokens <= t only.
template <class Model> void expect_causal(const Model& model, int64_t vocab) {
  auto [x, y] = batch(vocab, 2, 12, 21);
  Tensor x2 = x.clone();
  {
    NoGradGuard no_grad;
    const int64_t other = (x.select(0, 0).select(0, 7).item<int64_t>() + 1) % vocab;
    x2.slice(1, 7, 12).fill_(static_cast<double>(other));
  }
  Tensor a = model.forward(x), b = model.forward(x2);
  EXPECT_EQ(vals(a.slice(1, 0, 7)), vals(b.slice(1, 0, 7)));
  EXPECT_NE(vals(a.slice(1, 7, 12)), vals(b.slice(1, 7, 12)));
}

TEST(GPTModel, IsCausal) { expect_causal(GPT(tiny_gpt_config(), 5), tiny_gpt_config().vocab_size); }
TEST(LlamaModel, IsCausal) { expect_causal(Llama(tiny_llama_config(), 5), tiny_llama_config().vocab_size); }

// ---------------------------------------------------------------- training

template <class Model> std::vector<double> train_fixed_batch(Model& model, int64_t vocab, int steps) {
  auto [x, y] = batch(vocab, 4, 16, 31);
  optim::AdamW opt(optim::decay_groups(model.named_parameters(), 0.1), {.lr = 3e-3, .beta2 = 0.95});
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    Tensor loss = model.loss(x, y);
    losses.push_back(loss.item());
    loss.backward();
    opt.step();
    opt.zero_grad();
  }
  losses.push_back(model.loss(x, y).item());
  return losses;
}

TEST(GPTModel, LossDecreasesOver30AdamWSteps) {
  GPT model(tiny_gpt_config(), 6);
  const std::vector<double> l = train_fixed_batch(model, tiny_gpt_config().vocab_size, 30);
  for (double v : l) EXPECT_TRUE(std::isfinite(v));
  // From log(61) ~ 4.11: a 2-layer model memorises 64 targets well within 30 steps.
  EXPECT_LT(l.back(), l.front() - 1.0) << "first " << l.front() << " last " << l.back();
  EXPECT_LT(l[10], l.front());
  EXPECT_LT(l[20], l[10]);
}

TEST(LlamaModel, LossDecreasesOver30AdamWSteps) {
  Llama model(tiny_llama_config(), 6);
  const std::vector<double> l = train_fixed_batch(model, tiny_llama_config().vocab_size, 30);
  for (double v : l) EXPECT_TRUE(std::isfinite(v));
  EXPECT_LT(l.back(), l.front() - 1.0) << "first " << l.front() << " last " << l.back();
  EXPECT_LT(l[10], l.front());
  EXPECT_LT(l[20], l[10]);
}

// ---------------------------------------------------------------- tied head

TEST(GPTModel, HeadIsTiedToTokenEmbedding) {
  const GPTConfig c = tiny_gpt_config();
  GPT model(c, 7);
  // No separate head parameter: the only (vocab, C) tensor is wte.
  for (const auto& [name, p] : model.named_parameters()) {
    if (p.dim() == 2 && p.size(0) == c.vocab_size) {
      EXPECT_EQ(name, "transformer.wte.weight");
    }
  }
  // Tokens 0..29 only, so wte rows >= 30 are reached by the head alone.
  Generator gen(8);
  Tensor x = randint(0, 30, {2, 10}, {.dtype = DType::i64}, &gen);
  Tensor y = randint(0, c.vocab_size, {2, 10}, {.dtype = DType::i64}, &gen);
  model.loss(x, y).backward();
  const Tensor g = model.wte->weight.grad();
  ASSERT_TRUE(g.defined());
  double head_only = 0;
  for (double v : vals(g.slice(0, 30, c.vocab_size))) head_only += std::abs(v);
  EXPECT_GT(head_only, 0.0) << "rows of wte never embedded get no gradient: the head is not wte";
  // Writing into wte's storage moves the logits of that token: logits = ln_f(h) wte^T.
  Tensor before = model.forward(x);
  {
    NoGradGuard no_grad;
    model.wte->weight.narrow(0, 40, 1).mul_(3.0);
  }
  Tensor after = model.forward(x);
  EXPECT_EQ(vals(before.narrow(2, 0, 40)), vals(after.narrow(2, 0, 40)));
  EXPECT_NE(vals(before.narrow(2, 40, 1)), vals(after.narrow(2, 40, 1)));
  // ... and equals the head computed by hand from wte.
  Tensor h = ops::add(model.wte->forward(x), model.wpe->forward(arange(10)));
  for (const auto& b : model.h) h = b->forward(h);
  EXPECT_LT(rel_diff(after, ops::matmul(model.ln_f->forward(h), model.wte->weight.t())), 1e-6);
}

// ---------------------------------------------------------------- validation

TEST(GPTModel, ConfigErrorsNameTheKey) {
  GPTConfig c = tiny_gpt_config();
  c.n_head = 5;  // 32 % 5 != 0
  std::string e = error_of([&] { GPT m(c); });
  EXPECT_NE(e.find("model.n_head"), std::string::npos) << e;
  EXPECT_NE(e.find("model.n_embd"), std::string::npos) << e;
  c = tiny_gpt_config();
  c.vocab_size = 0;
  e = error_of([&] { GPT m(c); });
  EXPECT_NE(e.find("model.vocab_size"), std::string::npos) << e;
  c = tiny_gpt_config();
  c.dropout = 1.0;
  e = error_of([&] { GPT m(c); });
  EXPECT_NE(e.find("model.dropout"), std::string::npos) << e;
}

TEST(LlamaModel, ConfigErrorsNameTheKey) {
  LlamaConfig c = tiny_llama_config();
  c.n_head = 3;  // 32 % 3 != 0
  c.n_kv_head = 3;
  std::string e = error_of([&] { Llama m(c); });
  EXPECT_NE(e.find("model.n_head"), std::string::npos) << e;
  c = tiny_llama_config();
  c.n_kv_head = 3;  // 4 % 3 != 0
  e = error_of([&] { Llama m(c); });
  EXPECT_NE(e.find("model.n_kv_head"), std::string::npos) << e;
  c = tiny_llama_config();
  c.dim = 36;  // head dim 9: odd, no rotary pairs
  c.n_head = 4;
  c.n_kv_head = 4;
  e = error_of([&] { Llama m(c); });
  EXPECT_NE(e.find("model.dim / model.n_head"), std::string::npos) << e;
  EXPECT_NE(e.find("even"), std::string::npos) << e;
  c = tiny_llama_config();
  c.ffn_hidden = 0;
  e = error_of([&] { Llama m(c); });
  EXPECT_NE(e.find("model.ffn_hidden"), std::string::npos) << e;
  c = tiny_llama_config();
  c.block_size = 0;
  e = error_of([&] { Llama m(c); });
  EXPECT_NE(e.find("model.block_size"), std::string::npos) << e;
  c = tiny_llama_config();
  c.rope_theta = -1.0;
  e = error_of([&] { Llama m(c); });
  EXPECT_NE(e.find("model.rope_theta"), std::string::npos) << e;
  c = tiny_llama_config();
  c.norm_eps = -1e-5;
  e = error_of([&] { Llama m(c); });
  EXPECT_NE(e.find("model.norm_eps"), std::string::npos) << e;
}

// ---------------------------------------------------------------- checkpointing

struct GradRun {
  double loss = 0;
  std::vector<std::pair<std::string, std::vector<double>>> grads;
  int64_t peak = 0;  // bytes above the allocation level at the start
};

template <class Model> GradRun grad_run(const Model& model, const Tensor& x, const Tensor& y) {
  GradRun r;
  const int64_t base = cpu_memory_stats().allocated;
  reset_cpu_peak_memory();
  {
    Tensor loss = model.loss(x, y);
    r.loss = loss.item();
    loss.backward();
  }
  r.peak = cpu_memory_stats().peak_allocated - base;
  for (const auto& [name, p] : model.named_parameters()) {
    r.grads.emplace_back(name, vals(p.grad()));
    p.zero_grad();
  }
  return r;
}

template <class Model, class Config> void expect_checkpointing_equivalent(Config c) {
  c.checkpoint_activations = false;
  Model plain(c, 9);
  c.checkpoint_activations = true;
  Model ckpt(c, 9);
  auto [x, y] = batch(c.vocab_size, 4, 64, 41);
  const GradRun a = grad_run(plain, x, y), b = grad_run(ckpt, x, y);
  EXPECT_EQ(a.loss, b.loss);
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) {
    EXPECT_EQ(a.grads[i].first, b.grads[i].first);
    EXPECT_TRUE(a.grads[i].second == b.grads[i].second) << a.grads[i].first << " differs with checkpointing";
  }
  EXPECT_LT(b.peak, a.peak) << "checkpointing did not lower the peak (" << b.peak << " vs " << a.peak << " bytes)";
  // Per block, only its input is kept instead of every intermediate: well under 3/4.
  EXPECT_LT(static_cast<double>(b.peak), 0.75 * static_cast<double>(a.peak));
  ::testing::Test::RecordProperty("peak_plain_bytes", std::to_string(a.peak));
  ::testing::Test::RecordProperty("peak_checkpointed_bytes", std::to_string(b.peak));
}

TEST(GPTModel, ActivationCheckpointingGivesIdenticalGradientsAndLowerPeak) {
  GPTConfig c = tiny_gpt_config();
  c.vocab_size = 17;  // keep the logits small next to the blocks' activations
  c.n_layer = 4;
  c.block_size = 64;
  c.dropout = 0.0;
  expect_checkpointing_equivalent<GPT>(c);
}

TEST(LlamaModel, ActivationCheckpointingGivesIdenticalGradientsAndLowerPeak) {
  LlamaConfig c = tiny_llama_config();
  c.vocab_size = 17;
  c.n_layer = 4;
  c.block_size = 64;
  expect_checkpointing_equivalent<Llama>(c);
}

}  // namespace
}  // namespace forge::nn

namespace forge {
namespace {

TEST(BlockOfParameter, ParsesTheBlockIndexAfterThePrefix) {
  EXPECT_EQ(nn::GPT::block_of("transformer.h.0.attn.c_attn.weight"), 0);
  EXPECT_EQ(nn::GPT::block_of("transformer.h.17.ln_1.weight"), 17);
  EXPECT_EQ(nn::GPT::block_of("transformer.wte.weight"), -1);
  EXPECT_EQ(nn::GPT::block_of("transformer.h.x.weight"), -1);
  EXPECT_EQ(nn::GPT::block_of("transformer.h.3"), -1);
  EXPECT_EQ(nn::Llama::block_of("model.layers.31.mlp.down_proj.weight"), 31);
  EXPECT_EQ(nn::Llama::block_of("lm_head.weight"), -1);
  EXPECT_EQ(nn::Llama::block_of("model.norm.weight"), -1);
}

}  // namespace
}  // namespace forge

namespace forge {
namespace {

// FORGE_PACKED_QKV (Note [packed LLaMA attention]): one GEMM over the concatenated q/k/v weights
// and ops::qkv_rope_attention give the loss and every parameter's gradient of the three
// projections, grouped-query and multi-head, in f64 (only the GEMMs' summation order differs).
TEST(LlamaPackedQkv, GivesTheLossAndGradientsOfThreeProjections) {
  for (int64_t kv : {2, 8}) {
    nn::LlamaConfig c = testing::tiny_llama_config(kv);
    auto run = [&](const char* packed) {
      env::Override o("FORGE_PACKED_QKV", std::string(packed));
      nn::Llama m(c, 11);
      m.to(Device::cpu(), DType::f64);
      Generator g(5);
      const Tensor idx = randint(0, c.vocab_size, {2, 12}, {.dtype = DType::i64}, &g);
      const Tensor tgt = randint(0, c.vocab_size, {2, 12}, {.dtype = DType::i64}, &g);
      const Tensor loss = m.loss(idx, tgt);
      loss.backward();
      std::vector<std::pair<std::string, std::vector<double>>> out{{"loss", loss.to_vector<double>()}};
      for (const auto& [name, p] : m.named_parameters()) out.emplace_back(name, p.grad().to_vector<double>());
      EXPECT_EQ(m.layers[0]->self_attn->packed_qkv(), std::string(packed) == "1");
      return out;
    };
    const auto packed = run("1"), plain = run("0");
    ASSERT_EQ(packed.size(), plain.size());
    for (size_t i = 0; i < packed.size(); ++i) {
      ASSERT_EQ(packed[i].first, plain[i].first);
      const auto& a = packed[i].second;
      const auto& b = plain[i].second;
      ASSERT_EQ(a.size(), b.size()) << a.size();
      double num = 0, den = 0;
      for (size_t j = 0; j < a.size(); ++j) num += (a[j] - b[j]) * (a[j] - b[j]), den += b[j] * b[j];
      EXPECT_LE(std::sqrt(num / std::max(den, 1e-300)), 1e-12) << packed[i].first << " (kv heads " << kv << ")";
    }
  }
}

}  // namespace
}  // namespace forge
