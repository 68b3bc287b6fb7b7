// The model-family registry (nn/model_registry.h): every family's validate() rejects each bad
// [model] key naming it and a fix, and the run config's validate() says exactly the same; shape()
// resolves kv-heads and the FFN width; build() gives the same parameters (names, shapes, values)
// as the modules constructed by hand; `forge plan`'s parameter count of a config equals the
// built module's; the config schema documents which type reads which key, and reports set keys
// a type ignores.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "forge/nn/causal_lm.h"
#include "forge/nn/gpt.h"
#include "forge/nn/linear.h"
#include "forge/nn/llama.h"
#include "forge/nn/model_registry.h"
#include "forge/plan/model_spec.h"
#include "forge/run/config.h"
#include "testing/tensor_testing.h"

namespace forge::nn {
namespace {

using forge::testing::error_of;
using forge::testing::vals;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

ModelConfig gpt_cfg() {
  ModelConfig m;
  m.type = "gpt";
  m.vocab_size = 300;
  m.block_size = 32;
  m.n_layer = 2;
  m.n_head = 4;
  m.n_embd = 32;
  return m;
}

ModelConfig llama_cfg() {
  ModelConfig m;
  m.type = "llama";
  m.vocab_size = 300;
  m.block_size = 32;
  m.n_layer = 2;
  m.n_head = 4;
  m.n_kv_head = 2;
  m.dim = 32;
  return m;
}

// ---------------------------------------------------------------- the table

TEST(ModelRegistry, ListsEveryFamilyAndNamesTheKnownTypesForAnUnknownOne) {
  std::vector<std::string> types;
  for (const auto& f : model_families()) {
    types.push_back(f.type);
    EXPECT_FALSE(f.doc.empty()) << f.type;
    EXPECT_NE(f.validate, nullptr) << f.type;
    EXPECT_EQ(f.shape == nullptr, f.build == nullptr) << f.type << ": a transformer family has both";
  }
  EXPECT_EQ(types, (std::vector<std::string>{"gpt", "llama", "lenet"}));
  EXPECT_TRUE(model_family("gpt").is_transformer());
  EXPECT_TRUE(model_family("llama").is_transformer());
  EXPECT_FALSE(model_family("lenet").is_transformer());
  EXPECT_EQ(find_model_family("bert"), nullptr);
  const std::string e = error_of([] { model_family("bert"); });
  EXPECT_TRUE(contains(e, "model.type = 'bert'")) << e;
  EXPECT_TRUE(contains(e, "\"gpt\", \"llama\" or \"lenet\"")) << e;
  EXPECT_EQ(model_type_list(true), "\"gpt\" or \"llama\"");
}

TEST(ModelRegistry, EachFamilyReadsItsOwnKeys) {
  const std::string types[] = {"gpt", "llama", "lenet"};  // lvalues: the families live in the registry
  const ModelFamily& gpt = model_family(types[0]);
  const ModelFamily& llama = model_family(types[1]);
  const ModelFamily& lenet = model_family(types[2]);
  for (const char* k : {"type", "vocab_size", "block_size", "n_layer", "n_head", "checkpoint_activations"}) {
    EXPECT_TRUE(gpt.reads(k)) << k;
    EXPECT_TRUE(llama.reads(k)) << k;
  }
  for (const char* k : {"n_embd", "dropout", "bias"}) {
    EXPECT_TRUE(gpt.reads(k)) << k;
    EXPECT_FALSE(llama.reads(k)) << k;
  }
  for (const char* k : {"n_kv_head", "dim", "ffn_hidden", "rope_theta", "norm_eps", "init_std"}) {
    EXPECT_TRUE(llama.reads(k)) << k;
    EXPECT_FALSE(gpt.reads(k)) << k;
  }
  EXPECT_TRUE(lenet.keys.empty());
  EXPECT_TRUE(lenet.reads("type"));
  EXPECT_FALSE(lenet.reads("n_layer"));
}

// ---------------------------------------------------------------- validate

struct BadKey {
  ModelConfig (*base)();
  std::function<void(ModelConfig&)> set;
  std::vector<std::string> named;  // what the message names
};

const std::vector<BadKey>& bad_keys() {
  const double inf = std::numeric_limits<double>::infinity();
  static const std::vector<BadKey> cases = {
      {gpt_cfg, [](ModelConfig& m) { m.vocab_size = -1; }, {"model.vocab_size"}},
      {gpt_cfg, [](ModelConfig& m) { m.block_size = 0; }, {"model.block_size"}},
      {gpt_cfg, [](ModelConfig& m) { m.n_layer = 0; }, {"model.n_layer"}},
      {gpt_cfg, [](ModelConfig& m) { m.n_head = 0; }, {"model.n_head"}},
      {gpt_cfg, [](ModelConfig& m) { m.n_embd = -32; }, {"model.n_embd"}},
      {gpt_cfg, [](ModelConfig& m) { m.n_head = 5; }, {"model.n_head = 5", "model.n_embd = 32"}},
      {gpt_cfg, [](ModelConfig& m) { m.dropout = 1.0; }, {"model.dropout"}},
      {gpt_cfg, [](ModelConfig& m) { m.dropout = -0.1; }, {"model.dropout"}},
      {llama_cfg, [](ModelConfig& m) { m.vocab_size = -1; }, {"model.vocab_size"}},
      {llama_cfg, [](ModelConfig& m) { m.block_size = -4; }, {"model.block_size"}},
      {llama_cfg, [](ModelConfig& m) { m.n_layer = 0; }, {"model.n_layer"}},
      {llama_cfg, [](ModelConfig& m) { m.n_head = 0; }, {"model.n_head"}},
      {llama_cfg, [](ModelConfig& m) { m.dim = 0; }, {"model.dim"}},
      {llama_cfg, [](ModelConfig& m) { m.n_head = 3, m.n_kv_head = 3; }, {"model.n_head = 3", "model.dim = 32"}},
      {llama_cfg, [](ModelConfig& m) { m.dim = 36, m.n_kv_head = 4; }, {"model.dim / model.n_head", "even"}},
      {llama_cfg, [](ModelConfig& m) { m.n_kv_head = 3; }, {"model.n_kv_head = 3", "model.n_head = 4"}},
      {llama_cfg, [](ModelConfig& m) { m.n_kv_head = -2; }, {"model.n_kv_head"}},
      {llama_cfg, [](ModelConfig& m) { m.ffn_hidden = -1; }, {"model.ffn_hidden"}},
      {llama_cfg, [](ModelConfig& m) { m.rope_theta = 0; }, {"model.rope_theta"}},
      {llama_cfg, [inf](ModelConfig& m) { m.rope_theta = inf; }, {"model.rope_theta"}},
      {llama_cfg, [](ModelConfig& m) { m.norm_eps = 0; }, {"model.norm_eps"}},
      {llama_cfg, [](ModelConfig& m) { m.init_std = -0.02; }, {"model.init_std"}},
  };
  return cases;
}

TEST(ModelRegistry, ValidateRejectsEachBadKeyNamingItAndTheFix) {
  validate_model(gpt_cfg());
  validate_model(llama_cfg());
  for (const auto& c : bad_keys()) {
    ModelConfig m = c.base();
    c.set(m);
    const std::string e = error_of([&] { model_family(m.type).validate(m); });
    ASSERT_FALSE(e.empty()) << m.type << ": accepted, expected an error naming " << c.named[0];
    for (const auto& part : c.named) EXPECT_TRUE(contains(e, part)) << m.type << ": " << e;
    EXPECT_TRUE(contains(e, "; ")) << "no fix in: " << e;  // "<problem>; <what to do>"
  }
}

TEST(ModelRegistry, LenetReadsNoModelKey) {
  ModelConfig m;
  m.type = "lenet";
  m.n_layer = 0;  // a language model's key: not lenet's
  m.dim = -1;
  validate_model(m);
  EXPECT_TRUE(contains(error_of([&] { transformer_shape(m); }), "model.type = 'lenet'"));
  EXPECT_TRUE(contains(error_of([&] { build_causal_lm(m, 1); }), "model.type = 'lenet'"));
}

// The run config's validate() runs the same rules: its message is the registry's, word for word.
TEST(ModelRegistry, RunConfigValidateSaysWhatTheRegistrySays) {
  for (const auto& c : bad_keys()) {
    train::RunConfig cfg;  // the [model] checks come first, before any other section's
    cfg.model = c.base();
    c.set(cfg.model);
    const std::string registry = error_of([&] { validate_model(cfg.model); });
    ASSERT_FALSE(registry.empty());
    EXPECT_EQ(error_of([&] { train::validate(cfg); }), registry);
  }
}

// The modules' own validate() runs the registry's rules too (plus a resolved vocabulary, kv-heads
// and FFN width).
TEST(ModelRegistry, ModuleConfigsValidateThroughTheRegistry) {
  GPTConfig g;
  g.n_head = 5;  // 768 % 5
  EXPECT_EQ(error_of([&] { g.validate(); }), error_of([&] { validate_model(model_config(g)); }));
  g = GPTConfig();
  g.vocab_size = 0;
  EXPECT_TRUE(contains(error_of([&] { GPT model(g); }), "model.vocab_size"));
  LlamaConfig l;
  l.n_kv_head = 5;  // 32 % 5
  EXPECT_EQ(error_of([&] { l.validate(); }), error_of([&] { validate_model(model_config(l)); }));
  l = LlamaConfig();
  l.ffn_hidden = 0;  // resolved in a module config
  EXPECT_TRUE(contains(error_of([&] { l.validate(); }), "model.ffn_hidden"));
  l = LlamaConfig();
  l.n_kv_head = 0;
  EXPECT_TRUE(contains(error_of([&] { l.validate(); }), "model.n_kv_head"));
}

// ---------------------------------------------------------------- shape

TEST(ModelRegistry, GptShape) {
  ModelConfig m = gpt_cfg();
  m.bias = false;
  const TransformerShape s = transformer_shape(m);
  EXPECT_EQ(s.arch, Arch::gpt);
  EXPECT_EQ(s.n_layer, 2);
  EXPECT_EQ(s.d_model, 32);
  EXPECT_EQ(s.n_head, 4);
  EXPECT_EQ(s.n_kv_head, 4);  // no grouped-query attention
  EXPECT_EQ(s.ffn_hidden, 128);
  EXPECT_EQ(s.vocab_size, 300);
  EXPECT_EQ(s.block_size, 32);
  EXPECT_FALSE(s.bias);
  EXPECT_TRUE(s.tied_head());
  EXPECT_TRUE(s.learned_positions());
  EXPECT_FALSE(s.gated_mlp());
  EXPECT_EQ(s.head_dim(), 8);
  EXPECT_EQ(default_ffn_hidden(Arch::gpt, 768), 3072);
}

TEST(ModelRegistry, LlamaShapeResolvesKvHeadsAndTheFfnDefault) {
  ModelConfig m = llama_cfg();
  m.dim = 100;
  m.n_head = 5;  // head dim 20
  m.n_kv_head = 0;
  m.ffn_hidden = 0;
  TransformerShape s = transformer_shape(m);
  EXPECT_EQ(s.arch, Arch::llama);
  EXPECT_EQ(s.d_model, 100);
  EXPECT_EQ(s.n_kv_head, 5);      // 0: n_head
  EXPECT_EQ(s.ffn_hidden, 288);   // 8 * 100 / 3 = 266, up to a multiple of 32
  EXPECT_FALSE(s.bias);
  EXPECT_FALSE(s.tied_head());
  EXPECT_TRUE(s.gated_mlp());
  EXPECT_FALSE(s.learned_positions());
  m.n_kv_head = 1;
  m.ffn_hidden = 176;
  s = transformer_shape(m);
  EXPECT_EQ(s.n_kv_head, 1);
  EXPECT_EQ(s.ffn_hidden, 176);
  // 8 * 4096 / 3 = 10922 -> 10944 (Meta rounds to 256: LLaMA-2 7B's 11008 is given explicitly)
  EXPECT_EQ(LlamaConfig::default_ffn_hidden(4096), 10944);
  EXPECT_EQ(default_ffn_hidden(Arch::llama, 4096), 10944);
  m.vocab_size = 0;  // not resolved yet: the shape says so
  EXPECT_EQ(transformer_shape(m).vocab_size, 0);
}

// ---------------------------------------------------------------- build

void expect_same_parameters(const Module& built, const Module& direct) {
  const auto a = built.named_parameters(), b = direct.named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_EQ(a[i].second.shape(), b[i].second.shape()) << a[i].first;
    EXPECT_EQ(vals(a[i].second), vals(b[i].second)) << a[i].first;
  }
}

TEST(ModelRegistry, BuildGivesTheGptConstructedByHand) {
  ModelConfig m = gpt_cfg();
  m.bias = false;
  m.dropout = 0.1;
  m.checkpoint_activations = true;
  const auto built = build_causal_lm(m, 7);
  GPTConfig c;
  c.vocab_size = 300, c.block_size = 32, c.n_layer = 2, c.n_head = 4, c.n_embd = 32;
  c.bias = false, c.dropout = 0.1, c.checkpoint_activations = true;
  const GPT direct(c, 7);
  expect_same_parameters(*built, direct);
  const auto* gpt = dynamic_cast<const GPT*>(built.get());
  ASSERT_NE(gpt, nullptr);
  EXPECT_DOUBLE_EQ(gpt->config.dropout, 0.1);
  EXPECT_TRUE(gpt->config.checkpoint_activations);
}

TEST(ModelRegistry, BuildGivesTheLlamaConstructedByHand) {
  ModelConfig m = llama_cfg();
  m.ffn_hidden = 0;  // 8 * 32 / 3 = 85 -> 96
  m.rope_theta = 500000.0;
  m.norm_eps = 1e-6;
  m.init_std = 0.01;
  const auto built = build_causal_lm(m, 3);
  LlamaConfig c;
  c.vocab_size = 300, c.block_size = 32, c.n_layer = 2, c.n_head = 4, c.n_kv_head = 2, c.dim = 32;
  c.ffn_hidden = 96, c.rope_theta = 500000.0, c.norm_eps = 1e-6, c.init_std = 0.01;
  const Llama direct(c, 3);
  expect_same_parameters(*built, direct);
  const auto* llama = dynamic_cast<const Llama*>(built.get());
  ASSERT_NE(llama, nullptr);
  EXPECT_DOUBLE_EQ(llama->config.rope_theta, 500000.0);
  EXPECT_DOUBLE_EQ(llama->config.norm_eps, 1e-6);
}

TEST(ModelRegistry, BuildTakesTheLayerSpec) {
  for (const ModelConfig& m : {gpt_cfg(), llama_cfg()}) {
    int linears = 0;
    LayerSpec spec;
    spec.linear = [&](int64_t in, int64_t out, bool bias, LinearRole) {
      ++linears;
      return std::make_shared<Linear>(in, out, bias);
    };
    const auto built = build_causal_lm(m, 1, spec);
    EXPECT_EQ(linears, m.type == "gpt" ? 2 * 4 : 2 * 7 + 1) << m.type;  // per block, + LLaMA's lm_head
    EXPECT_TRUE(static_cast<bool>(built->layer_spec.linear)) << m.type;
  }
}

// ---------------------------------------------------------------- plan counts what build builds

TEST(ModelRegistry, PlanCountsTheParametersBuildBuilds) {
  std::vector<ModelConfig> configs;
  for (bool bias : {true, false}) {
    ModelConfig m = gpt_cfg();
    m.bias = bias;
    configs.push_back(m);
  }
  ModelConfig wide = gpt_cfg();
  wide.n_layer = 3, wide.n_embd = 48, wide.n_head = 6, wide.vocab_size = 257, wide.block_size = 40;
  configs.push_back(wide);
  for (int64_t kv : {0, 1, 2, 4}) {
    ModelConfig m = llama_cfg();
    m.n_kv_head = kv;
    configs.push_back(m);
  }
  ModelConfig odd = llama_cfg();
  odd.dim = 100, odd.n_head = 5, odd.n_kv_head = 0, odd.ffn_hidden = 0, odd.n_layer = 3;  // ffn 288
  configs.push_back(odd);
  ModelConfig explicit_ffn = llama_cfg();
  explicit_ffn.ffn_hidden = 176;
  configs.push_back(explicit_ffn);
  for (const auto& m : configs) {
    plan::ModelSpec spec;
    static_cast<TransformerShape&>(spec) = transformer_shape(m);
    spec.seq_len = m.block_size;
    const auto built = build_causal_lm(m, 1);
    EXPECT_EQ(plan::count_parameters(spec).total, built->num_parameters()) << spec.describe();
    EXPECT_EQ(plan::summarize(spec, 1, true).total_params, built->num_parameters()) << spec.describe();
  }
}

// ---------------------------------------------------------------- the config schema

TEST(ModelRegistry, ConfigDocsSayWhichTypeReadsAKey) {
  auto doc = [](const std::string& key) {
    for (const auto& k : train::config_keys())
      if (k.key == key) return k.doc;
    return std::string();
  };
  EXPECT_EQ(doc("model.type"), "\"gpt\", \"llama\" or \"lenet\"");
  EXPECT_EQ(doc("model.n_embd").rfind("gpt: ", 0), 0u) << doc("model.n_embd");
  EXPECT_EQ(doc("model.dim").rfind("llama: ", 0), 0u) << doc("model.dim");
  EXPECT_EQ(doc("model.n_layer"), "transformer blocks");  // every language model reads it
}

TEST(ModelRegistry, IgnoredModelKeysAreTheSetOnesTheTypeDoesNotRead) {
  train::RunConfig cfg;
  EXPECT_TRUE(train::ignored_model_keys(cfg).empty());  // defaults
  cfg.model.dim = 256;
  cfg.model.n_embd = 64;  // read by gpt
  EXPECT_EQ(train::ignored_model_keys(cfg), (std::vector<std::string>{"model.dim = 256"}));
  cfg.model.type = "llama";
  cfg.model.dropout = 0.1;
  EXPECT_EQ(train::ignored_model_keys(cfg), (std::vector<std::string>{"model.n_embd = 64", "model.dropout = 0.1"}));
  cfg = train::RunConfig();
  cfg.model.type = "lenet";
  cfg.model.n_layer = 8;
  EXPECT_EQ(train::ignored_model_keys(cfg), (std::vector<std::string>{"model.n_layer = 8"}));
}

}  // namespace
}  // namespace forge::nn
