// LoRA adapters (nn/lora.h, Note [LoRA]): the trainable count of a model at rank r by formula,
// PEFT's initialisation, the adapted linear's f64 finite-difference gradients, its forward against
// the merged linear's, the names and the target errors.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "forge/forge.h"
#include "forge/nn/causal_lm.h"
#include "forge/nn/lora.h"
#include "forge/nn/model_registry.h"
#include "testing/gradcheck.h"
#include "testing/tensor_testing.h"
#include "testing/tiny_models.h"

namespace forge::nn {
namespace {

using forge::testing::error_of;
using forge::testing::vals;

Tensor rnd(const Shape& s, uint64_t seed, DType dt = DType::f64) {
  Generator g(seed);
  return randn(s, {.dtype = dt}, &g);
}

std::shared_ptr<CausalLM> lora_model(const ModelConfig& m, const LoraOptions& o, uint64_t seed = 7,
                                     LoraCounts* counts = nullptr) {
  auto lm = build_causal_lm(m, seed, lora_layer_spec({}, transformer_shape(m).arch, o));
  const LoraCounts n = attach_lora(*lm, seed);
  if (counts) *counts = n;
  return lm;
}

int64_t trainable_of(const Module& m) {
  int64_t n = 0;
  for (const auto& [name, p] : m.named_parameters()) n += p.requires_grad() ? p.numel() : 0;
  return n;
}

// A LoRA linear (in -> out) adapts with r (in + out) parameters: A (r, in) and B (out, r).
TEST(LoraCount, LlamaQVAtRankRHasTheFormulasCount) {
  const LlamaConfig c = forge::testing::tiny_llama_config(/*n_kv_head=*/2);  // dim 64, 8 heads of 8, 2 kv heads
  const int64_t r = 4, L = c.n_layer, dim = c.dim, q_out = c.n_head * (c.dim / c.n_head),
                kv_out = c.n_kv_head * (c.dim / c.n_head);
  // Per block: q (dim -> q_out) and v (dim -> kv_out) each r (in + out).
  const int64_t expected = L * (r * (dim + q_out) + r * (dim + kv_out));
  auto lm = lora_model(model_config(c), {.rank = r, .alpha = 8, .targets = {"q", "v"}});
  EXPECT_EQ(trainable_of(*lm), expected);
  EXPECT_EQ(expected, 2 * (4 * (64 + 64) + 4 * (64 + 16)));  // the formula, written out: 1664
  // Everything else frozen; the factors are the only trainable tensors.
  for (const auto& [name, p] : lm->named_parameters()) EXPECT_EQ(p.requires_grad(), is_lora_parameter(name)) << name;
}

TEST(LoraCount, GptEveryLinearAtRankRHasTheFormulasCount) {
  const GPTConfig c = forge::testing::tiny_gpt_config();  // n_embd 32, 2 layers
  const int64_t r = 2, L = c.n_layer, C = c.n_embd;
  // c_attn C -> 3C, attn.c_proj C -> C, c_fc C -> 4C, mlp.c_proj 4C -> C.
  const int64_t expected = L * r * ((C + 3 * C) + (C + C) + (C + 4 * C) + (4 * C + C));
  LoraCounts n;
  auto lm = lora_model(model_config(c), {.rank = r, .targets = {"c_attn", "c_proj", "c_fc"}}, 7, &n);
  EXPECT_EQ(trainable_of(*lm), expected);
  EXPECT_EQ(expected, 2 * 2 * (128 + 64 + 160 + 160));  // 2048
  EXPECT_EQ(n.trainable, expected);
  EXPECT_EQ(n.adapters, 4 * L);
  EXPECT_EQ(n.total, build_causal_lm(model_config(c), 7)->num_parameters() + expected);
}

// PEFT's names after base_model.model. and its layout: A (r, in), B (out, r), for GPT-2's Conv1D
// layers too.
TEST(LoraNames, FactorsAreNamedAndShapedAsPeftsAfterTheBaseNames) {
  const GPTConfig c = forge::testing::tiny_gpt_config();
  auto lm = lora_model(model_config(c), {.rank = 3, .targets = {"c_attn", "mlp.c_proj"}});
  std::map<std::string, Shape> shapes;
  for (const auto& [name, p] : lm->named_parameters()) shapes[name] = p.shape();
  EXPECT_EQ(shapes.at("transformer.h.0.attn.c_attn.weight"), (Shape{96, 32}));
  EXPECT_EQ(shapes.at("transformer.h.0.attn.c_attn.lora_A.weight"), (Shape{3, 32}));
  EXPECT_EQ(shapes.at("transformer.h.0.attn.c_attn.lora_B.weight"), (Shape{96, 3}));
  EXPECT_EQ(shapes.at("transformer.h.1.mlp.c_proj.lora_A.weight"), (Shape{3, 128}));
  EXPECT_EQ(shapes.at("transformer.h.1.mlp.c_proj.lora_B.weight"), (Shape{32, 3}));
  EXPECT_EQ(shapes.count("transformer.h.0.attn.c_proj.lora_A.weight"), 0u);
  // Every key of the model without LoRA is still there, in the same order.
  const auto plain = build_causal_lm(model_config(c), 7)->state_dict();
  std::vector<std::string> kept;
  for (const auto& [name, t] : lm->state_dict())
    if (!is_lora_parameter(name)) kept.push_back(name);
  ASSERT_EQ(kept.size(), plain.size());
  for (size_t i = 0; i < kept.size(); ++i) EXPECT_EQ(kept[i], plain[i].first);
}

// PEFT's default init: A ~ kaiming_uniform_(a = sqrt(5)) = U(-1/sqrt(in), 1/sqrt(in)), B = 0; the
// base's weights are those the seed gives without LoRA, so the model starts as the base model.
TEST(LoraInit, StartsAsTheBaseModelWithPeftsBounds) {
  const LlamaConfig c = forge::testing::tiny_llama_config(2);
  auto lm = lora_model(model_config(c), {.rank = 4, .targets = {"q", "k", "v", "o", "gate", "up", "down"}});
  auto base = build_causal_lm(model_config(c), 7);
  const auto lora_state = lm->state_dict();
  std::map<std::string, Tensor> by_name(lora_state.begin(), lora_state.end());
  for (const auto& [name, t] : base->state_dict()) EXPECT_EQ(vals(by_name.at(name)), vals(t)) << name;
  for (const auto& [path, l] : lora_linears(*lm)) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(l->in_features));
    double most = 0;
    for (double a : vals(l->lora_A->weight)) most = std::max(most, std::abs(a));
    EXPECT_LE(most, bound) << path;
    EXPECT_GT(most, 0.5 * bound) << path;  // (spread over the interval, not a narrow normal)
    for (double b : vals(l->lora_B->weight)) EXPECT_EQ(b, 0.0) << path;
  }
  const Tensor idx = from_vector(std::vector<int64_t>{1, 5, 9, 3, 7, 2}, {1, 6});
  EXPECT_EQ(vals(lm->forward(idx)), vals(base->forward(idx)));
}

// y = base(x) + (x A^T) B^T alpha / r equals the merged linear x (W + alpha / r B A)^T + b.
TEST(LoraLinearTest, ForwardEqualsTheMergedLinearsForward) {
  auto base = std::make_shared<Linear>(6, 5, true);
  base->to(DType::f64);
  LoraLinear l(base, {.rank = 3, .alpha = 6, .targets = {"q"}});
  Generator gen(3);
  l.attach(gen);
  {
    NoGradGuard no_grad;
    l.lora_B->weight.copy_(rnd({5, 3}, 11));  // (B = 0 would hide the branch)
  }
  const Tensor x = rnd({2, 4, 6}, 12);
  const Tensor merged = ops::linear(x, l.merged_weight(), l.bias);
  const std::vector<double> got = vals(l.forward(x)), want = vals(merged);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-12);
  // The branch is there: unmerged, the base alone differs.
  EXPECT_NE(vals(base->forward(x)), want);
}

// The project's f64 finite-difference check (testing/gradcheck.h) of the adapted linear: the
// input's and both factors' gradients; the frozen base gets none.
TEST(LoraLinearTest, GradientsMatchFiniteDifferencesInF64) {
  auto base = std::make_shared<Linear>(5, 4, true);
  base->to(DType::f64);
  LoraLinear l(base, {.rank = 2, .alpha = 3, .targets = {"q"}});
  Generator gen(5);
  l.attach(gen);
  {
    NoGradGuard no_grad;
    l.lora_B->weight.copy_(rnd({4, 2}, 21));
  }
  l.weight.requires_grad_(false);
  l.bias.requires_grad_(false);
  const Tensor x = rnd({3, 5}, 22).requires_grad_();
  const auto r = forge::testing::gradcheck([&](const TensorList& in) { return l.forward(in[0]); },
                                           {x, l.lora_A->weight, l.lora_B->weight});
  EXPECT_TRUE(r.ok) << r.message;
  EXPECT_FALSE(l.weight.grad().defined());
  EXPECT_FALSE(l.bias.grad().defined());
}

TEST(LoraTargets, ErrorsNameTheKeyAndTheFix) {
  EXPECT_NE(error_of([] { lora_roles(Arch::gpt, {"q"}); }).find("'q' is a LLaMA linear and matches no linear of a GPT"),
            std::string::npos);
  EXPECT_NE(error_of([] { lora_roles(Arch::llama, {"qq"}); }).find("lora.targets: 'qq' is not a linear"),
            std::string::npos);
  EXPECT_NE(error_of([] { lora_roles(Arch::llama, {}); }).find("lora.targets is empty"), std::string::npos);
  EXPECT_NE(error_of([] { validate_lora({.rank = 0, .targets = {"q"}}, Arch::llama); }).find("lora.rank must be > 0"),
            std::string::npos);
  LoraOptions off;  // (no targets: LoRA off, the values still checked)
  off.rank = -2;
  EXPECT_NE(error_of([&] { validate_lora(off, Arch::llama); }).find("lora.rank must be > 0"), std::string::npos);
  EXPECT_NE(error_of([] { validate_lora({.alpha = 0, .targets = {"q"}}, Arch::llama); }).find("lora.alpha must be > 0"),
            std::string::npos);
  EXPECT_NE(error_of([] { validate_lora({.dropout = 1, .targets = {"q"}}, Arch::llama); }).find("lora.dropout"),
            std::string::npos);
}

TEST(LoraTargets, PeftTargetModules) {
  EXPECT_EQ(peft_target_modules(Arch::llama, {"v", "q_proj", "q"}), (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_EQ(peft_target_modules(Arch::gpt, {"c_fc", "c_attn"}), (std::vector<std::string>{"c_attn", "c_fc"}));
  EXPECT_EQ(peft_target_modules(Arch::gpt, {"attn.c_proj", "mlp.c_proj"}), (std::vector<std::string>{"c_proj"}));
  EXPECT_EQ(peft_target_modules(Arch::gpt, {"attn.c_proj"}), (std::vector<std::string>{"attn.c_proj"}));
}

}  // namespace
}  // namespace forge::nn
