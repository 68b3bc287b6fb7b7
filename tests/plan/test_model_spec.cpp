// forge plan's model side: exact parameter counts (published figures and forge's own
// nn::GPT / nn::Llama), presets and their errors, config files, FLOPs, the per-module summary.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <vector>

#include "forge/core/error.h"
#include "forge/nn/gpt.h"
#include "forge/nn/llama.h"
#include "forge/plan/model_spec.h"
#include "forge/run/config.h"
#include "forge/run/run_model_spec.h"
#include "forge/train/trainer.h"

namespace forge::plan {
namespace {

// ---- the published counts ---------------------------------------------------------------------

TEST(PlanParams, Gpt2SmallIs124439808WithTiedHead) {
  const ModelSpec m = find_preset("gpt2").spec;
  EXPECT_EQ(m.vocab_size, 50257);
  const ParamCount c = count_parameters(m);
  EXPECT_EQ(c.total, 124439808);
  EXPECT_EQ(c.head, 0);  // tied to wte
  EXPECT_EQ(c.embedding, 50257 * 768);
  EXPECT_EQ(c.position, 1024 * 768);
  EXPECT_EQ(find_preset("gpt2-124m").spec.n_layer, 12);  // an alias
}

TEST(PlanParams, Gpt2FamilyMatchesHuggingFaceCounts) {
  EXPECT_EQ(count_parameters(find_preset("gpt2-medium").spec).total, 354823168);
  EXPECT_EQ(count_parameters(find_preset("gpt2-large").spec).total, 774030080);
  EXPECT_EQ(count_parameters(find_preset("gpt2-xl").spec).total, 1557611200);
}

TEST(PlanParams, LlamaCountsAreExact) {
  EXPECT_EQ(count_parameters(find_preset("llama2-7b").spec).total, 6738415616);
  EXPECT_EQ(count_parameters(find_preset("llama3-8b").spec).total, 8030261248);
  EXPECT_EQ(count_parameters(find_preset("llama2-70b").spec).total, 68976648192);
  EXPECT_EQ(count_parameters(find_preset("llama2-13b").spec).total, 13015864320);
  // LLaMA-3 70B: the 70B body with a 128,256-token vocabulary, embedding and head untied.
  EXPECT_EQ(count_parameters(find_preset("llama3-70b").spec).total,
            68976648192 + 2 * (128256 - 32000) * int64_t{8192});
}

// ---- against forge's modules --------------------------------------------------------------------

// Sums forge's named parameters under each module prefix of the summary's leaf rows.
void expect_summary_matches_module(const ModelSpec& spec, const nn::Module& model) {
  const Summary s = summarize(spec, 1, /*expand_blocks=*/true);
  EXPECT_EQ(s.total_params, model.num_parameters());
  std::map<std::string, int64_t> by_module;
  for (const auto& [name, p] : model.named_parameters()) by_module[name.substr(0, name.rfind('.'))] += p.numel();
  int64_t matched = 0;
  for (const auto& r : s.rows) {
    if (!r.leaf || r.params == 0) continue;
    EXPECT_EQ(by_module[r.name], r.params) << r.name;
    matched += r.params;
  }
  EXPECT_EQ(matched, model.num_parameters());
}

TEST(PlanParams, GptCountEqualsNnGpt) {
  for (bool bias : {true, false}) {
    nn::GPTConfig c;
    c.vocab_size = 300;
    c.block_size = 40;
    c.n_layer = 3;
    c.n_head = 4;
    c.n_embd = 48;
    c.bias = bias;
    nn::GPT model(c, 1);
    ModelSpec m;
    m.arch = Arch::gpt;
    m.n_layer = 3, m.d_model = 48, m.n_head = 4, m.n_kv_head = 4, m.ffn_hidden = 4 * 48;
    m.vocab_size = 300, m.block_size = 40, m.seq_len = 40, m.bias = bias;
    EXPECT_EQ(count_parameters(m).total, model.num_parameters()) << "bias " << bias;
    expect_summary_matches_module(m, model);
  }
}

TEST(PlanParams, LlamaCountEqualsNnLlamaWithGqa) {
  nn::LlamaConfig c;
  c.vocab_size = 300;
  c.block_size = 32;
  c.n_layer = 2;
  c.n_head = 8;
  c.n_kv_head = 2;
  c.dim = 64;
  c.ffn_hidden = 176;
  nn::Llama model(c, 1);
  ModelSpec m;
  m.arch = Arch::llama;
  m.n_layer = 2, m.d_model = 64, m.n_head = 8, m.n_kv_head = 2, m.ffn_hidden = 176;
  m.vocab_size = 300, m.block_size = 32, m.seq_len = 32, m.bias = false;
  EXPECT_EQ(count_parameters(m).total, model.num_parameters());
  expect_summary_matches_module(m, model);
}

// A [model] section read the way the trainer reads it (ffn_hidden = 0 rounds 8*dim/3 up to
// 32, n_kv_head = 0 is n_head) builds a model of exactly the planned size.
TEST(PlanParams, FromRunConfigAgreesWithTheTrainersModel) {
  for (const std::string type : {"gpt", "llama"}) {
    train::RunConfig cfg;
    cfg.model.type = type;
    cfg.model.vocab_size = 512;
    cfg.model.block_size = 48;
    cfg.model.n_layer = 2;
    cfg.model.n_head = 4;
    cfg.model.n_embd = 64;
    cfg.model.dim = 100;  // 8*100/3 = 266 -> 288
    cfg.model.n_head = type == "llama" ? 5 : 4;
    cfg.model.n_kv_head = 0;
    cfg.model.ffn_hidden = 0;
    cfg.train.seq_len = 32;
    const ModelSpec m = train::model_spec_of(cfg);
    if (type == "llama") {
      EXPECT_EQ(m.ffn_hidden, 288);
    }
    EXPECT_EQ(m.seq_len, 32);
    EXPECT_EQ(m.block_size, 48);
    const train::LanguageModel built = train::build_language_model(cfg);
    EXPECT_EQ(count_parameters(m).total, built.module->num_parameters()) << type;
  }
}

TEST(PlanParams, VocabularyFromTheDataSectionWhenModelSaysZero) {
  train::RunConfig cfg;
  cfg.model.vocab_size = 0;
  cfg.data.vocab_size = 1024;
  EXPECT_EQ(train::model_spec_of(cfg).vocab_size, 1024);
  cfg.model.type = "lenet";
  EXPECT_THROW(train::model_spec_of(cfg), Error);
}

TEST(PlanParams, StagesPartitionTheParameters) {
  const ModelSpec m = find_preset("llama2-7b").spec;
  const int64_t total = count_parameters(m).total;
  EXPECT_EQ(stage_parameters(m, 1, 1, 0), total);
  for (int64_t pp : {2, 4, 8}) {
    int64_t sum = 0;
    for (int64_t i = 0; i < pp; ++i) sum += stage_parameters(m, 1, pp, i);
    EXPECT_EQ(sum, total) << "pp " << pp;
  }
  // A tied head: the last stage keeps its own copy of the embedding.
  const ModelSpec g = find_preset("gpt2").spec;
  EXPECT_EQ(stage_parameters(g, 1, 2, 0) + stage_parameters(g, 1, 2, 1), count_parameters(g).total + 50257 * 768);
  // Tensor parallelism splits everything but norms and row-parallel biases.
  const int64_t tp2 = stage_parameters(g, 2, 1, 0);
  EXPECT_GT(tp2, count_parameters(g).total / 2);
  EXPECT_LT(tp2, count_parameters(g).total / 2 + 1024 * 768 + 12 * 6 * 768 + 2 * 768);
}

TEST(PlanParams, PipelineStagesAreBalancedByCostWithTheHeadOnTheLast) {
  // LLaMA 0.85B (configs/llama-0.85b.toml's shape): the head costs 1.2 blocks, so of 16 blocks
  // the last of two stages takes 7 (7 + 1.2 < 9), and the split is no longer even.
  ModelSpec m;
  m.arch = nn::Arch::llama, m.n_layer = 16, m.d_model = 2048, m.n_head = 32, m.n_kv_head = 8;
  m.ffn_hidden = 5632, m.vocab_size = 32000, m.block_size = 2048, m.seq_len = 2048, m.bias = false;
  const FlopsPerToken f = flops_per_token(m);
  ASSERT_GT(f.head_forward, f.layer_forward);
  ASSERT_LT(f.head_forward, 2 * f.layer_forward);
  EXPECT_EQ(stage_layers(m, 1), (std::vector<int64_t>{16}));
  EXPECT_EQ(stage_layers(m, 2), (std::vector<int64_t>{9, 7}));
  EXPECT_EQ(stage_layers(m, 4), (std::vector<int64_t>{5, 4, 4, 3}));
  // Every split covers the blocks, each stage at least one, and no other split of the same
  // shape (the last k, the others even) has a faster slowest stage.
  for (int64_t S = 1; S <= 16; ++S) {
    const std::vector<int64_t> v = stage_layers(m, S);
    ASSERT_EQ(static_cast<int64_t>(v.size()), S);
    int64_t sum = 0;
    for (int64_t n : v) {
      EXPECT_GE(n, 1);
      sum += n;
    }
    EXPECT_EQ(sum, 16);
    auto slowest = [&](const std::vector<int64_t>& w) {
      double most = 0;
      for (size_t i = 0; i < w.size(); ++i)
        most = std::max(most, static_cast<double>(w[i]) * f.layer_forward + (i + 1 == w.size() ? f.head_forward : 0.0));
      return most;
    };
    const double got = slowest(v);
    for (int64_t k = 1; S > 1 && k <= 16 - S + 1; ++k) {
      std::vector<int64_t> w(static_cast<size_t>(S), (16 - k) / (S - 1));
      for (int64_t i = 0; i < (16 - k) % (S - 1); ++i) ++w[static_cast<size_t>(i)];
      w.back() = k;
      EXPECT_LE(got, slowest(w) * (1 + 1e-12)) << "S " << S << " k " << k;
    }
  }
  // A head much cheaper than a block leaves the even split.
  m.vocab_size = 64;
  EXPECT_EQ(stage_layers(m, 2), (std::vector<int64_t>{8, 8}));
  EXPECT_EQ(stage_layers(m, 3), (std::vector<int64_t>{6, 5, 5}));
  // Interleaved: rank i holds virtual stages i, i + pp, ...
  m.vocab_size = 32000;
  const std::vector<int64_t> virt = stage_layers(m, 4);
  EXPECT_EQ(rank_layers(m, 2, 2), (std::vector<int64_t>{virt[0] + virt[2], virt[1] + virt[3]}));
  EXPECT_EQ(rank_layers(m, 2), stage_layers(m, 2));
  // The parameters of uneven stages still partition the model's.
  int64_t sum = 0;
  for (int64_t i = 0; i < 3; ++i) sum += stage_parameters(m, 1, 3, i);
  EXPECT_EQ(sum, count_parameters(m).total);
  EXPECT_THROW(stage_layers(m, 17), Error);
}

// ---- FLOPs and the summary ----------------------------------------------------------------------

TEST(PlanFlops, SixNPlusAttention) {
  const ModelSpec m = find_preset("gpt2").spec;
  const FlopsPerToken f = flops_per_token(m);
  const ParamCount c = count_parameters(m);
  // 6 x (block matmul weights + the head) + 12 * L * s * h.
  EXPECT_DOUBLE_EQ(f.model, 6.0 * static_cast<double>(c.matmul) + 12.0 * 12 * 1024 * 768);
  EXPECT_EQ(c.matmul, 12 * (12 * 768 * 768) + 50257 * 768);
  EXPECT_DOUBLE_EQ(f.six_n, 6.0 * 124439808);
}

TEST(PlanSummary, TotalsEqualTheParameterCountForEveryPreset) {
  for (const auto& p : presets()) {
    const Summary s = summarize(p.spec, 2);
    EXPECT_EQ(s.total_params, count_parameters(p.spec).total) << p.name;
    EXPECT_NEAR(s.total_flops, 2.0 * static_cast<double>(p.spec.seq_len) * flops_per_token(p.spec).forward,
                1e-9 * s.total_flops)
        << p.name;
    const Summary e = summarize(p.spec, 1, /*expand_blocks=*/true);
    EXPECT_EQ(e.total_params, s.total_params) << p.name;
  }
}

// ---- bad input ------------------------------------------------------------------------------------

TEST(PlanErrors, UnknownPresetSuggestsNearestNames) {
  try {
    find_preset("llama2-8b");
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("unknown model 'llama2-8b'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("did you mean"), std::string::npos) << msg;
    EXPECT_NE(msg.find("llama2-7b"), std::string::npos) << msg;
  }
  try {
    find_preset("llama3");
    FAIL() << "no error";
  } catch (const Error& e) {  // a prefix lists every preset it starts
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'llama3-8b' or 'llama3-70b'"), std::string::npos) << msg;
  }
}

TEST(PlanErrors, ImpossibleShapesNameTheField) {
  ModelSpec m = find_preset("llama2-7b").spec;
  m.n_head = 30;  // does not divide 4096
  EXPECT_THROW(m.validate(), Error);
  m = find_preset("llama2-70b").spec;
  m.n_kv_head = 6;
  try {
    m.validate();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kv-heads = 6"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace forge::plan
