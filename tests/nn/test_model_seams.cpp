// The model seams (nn/causal_lm.h) and the layer spec (nn/layer_spec.h) of GPT and LLaMA:
// - embed -> blocks [0, k) -> blocks [k, n) -> head / head_loss equals forward / loss bit for
//   bit on the CPU, values and every parameter's gradient, for every cut k, with and without
//   activation checkpointing, with the pending residual carried across the cut or
//   materialised there; block hooks run once per block, in order, as in forward;
// - a LayerSpec replaces every linear and embedding by its role without changing names,
//   initialisation or results; a spec that halves the heads / hidden width (as a column-
//   then row-parallel pair does) makes the layers compute the local heads, and two halves
//   sum to the whole layer; its loss replaces the cross-entropy;
// - errors name the role and the fix; block_of still maps names to blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

#include "forge/forge.h"
#include "forge/nn/gpt.h"
#include "forge/nn/llama.h"
#include "testing/tensor_testing.h"

namespace forge::nn {
namespace {

using forge::testing::error_of;
using forge::testing::vals;

GPTConfig gpt_config(bool bias, bool checkpoint = false) {
  GPTConfig c;
  c.vocab_size = 64;
  c.block_size = 16;
  c.n_layer = 3;
  c.n_head = 4;
  c.n_embd = 32;
  c.dropout = 0.0;
  c.bias = bias;
  c.checkpoint_activations = checkpoint;
  return c;
}

LlamaConfig llama_config(bool checkpoint = false) {
  LlamaConfig c;
  c.vocab_size = 64;
  c.block_size = 16;
  c.n_layer = 3;
  c.n_head = 4;
  c.n_kv_head = 2;  // grouped-query attention
  c.dim = 32;
  c.ffn_hidden = 48;
  c.checkpoint_activations = checkpoint;
  return c;
}

std::pair<Tensor, Tensor> batch(int64_t vocab, uint64_t seed) {
  Generator gen(seed);
  Tensor tokens = randint(0, vocab, {2, 13}, {.dtype = DType::i64}, &gen);
  return {tokens.slice(1, 0, 12).contiguous(), tokens.slice(1, 1, 13).contiguous()};
}

// Logits, loss and every parameter's gradient (by name) of one forward + backward.
struct Result {
  std::vector<double> logits;
  double loss = 0;
  std::vector<std::pair<std::string, std::vector<double>>> grads;
};

Result collect(const CausalLM& model, const Tensor& logits, const Tensor& loss) {
  loss.backward();
  Result r{vals(logits), loss.item(), {}};
  for (const auto& [name, p] : model.named_parameters()) {
    r.grads.emplace_back(name, p.grad().defined() ? vals(p.grad()) : std::vector<double>{});
    p.zero_grad();
  }
  return r;
}

Result run_whole(const CausalLM& model, const Tensor& x, const Tensor& y) {
  Tensor logits = model.forward(x);
  return collect(model, logits, model.loss(x, y));
}

// embed -> blocks [0, cut) -> blocks [cut, n) -> head, head_loss; `materialize` sends the
// stream across the cut as one tensor.
Result run_pieces(const CausalLM& model, const Tensor& x, const Tensor& y, int64_t cut, bool materialize) {
  const int64_t n = model.num_blocks();
  auto stages = [&] {
    Stream s = model.blocks(model.embed(x), 0, cut);
    if (materialize) s = Stream{s.materialize(), Tensor()};
    return model.blocks(s, cut, n);
  };
  Tensor logits = model.head(stages());
  return collect(model, logits, model.head_loss(stages(), y));
}

void expect_identical(const Result& a, const Result& b, const std::string& what) {
  EXPECT_TRUE(a.logits == b.logits) << what << ": logits differ";
  EXPECT_EQ(a.loss, b.loss) << what;
  ASSERT_EQ(a.grads.size(), b.grads.size()) << what;
  for (size_t i = 0; i < a.grads.size(); ++i) {
    EXPECT_EQ(a.grads[i].first, b.grads[i].first) << what;
    EXPECT_FALSE(a.grads[i].second.empty()) << what << ": " << a.grads[i].first << " got no gradient";
    EXPECT_TRUE(a.grads[i].second == b.grads[i].second) << what << ": gradient of " << a.grads[i].first << " differs";
  }
}

// Records the hook calls: "b<i>" before block i, "a<i>/<number of outputs>" after it.
class RecordingHooks : public BlockHooks {
 public:
  void before_block(int block) override { calls.push_back(std::string("b").append(std::to_string(block))); }
  TensorList after_block(int block, const TensorList& outputs) override {
    calls.push_back(std::string("a").append(std::to_string(block)).append("/").append(std::to_string(outputs.size())));
    return outputs;
  }
  std::vector<std::string> calls;
};

// Every cut k in [0, n], stream carried whole and (for k inside) materialised, against forward
// and loss; and the hooks see the same calls either way.
void expect_pieces_equal_whole(CausalLM& model, const std::string& name) {
  auto [x, y] = batch(model.vocab_size(), 3);
  const Result whole = run_whole(model, x, y);
  auto hooks = std::make_shared<RecordingHooks>();
  model.block_hooks = hooks;
  model.forward(x);
  const std::vector<std::string> whole_calls = hooks->calls;
  ASSERT_EQ(whole_calls.size(), 2 * static_cast<size_t>(model.num_blocks()));
  for (int64_t k = 0; k <= model.num_blocks(); ++k) {
    hooks->calls.clear();
    model.head(model.blocks(model.blocks(model.embed(x), 0, k), k, model.num_blocks()));
    EXPECT_EQ(hooks->calls, whole_calls) << name << " cut at " << k;
  }
  model.block_hooks = nullptr;
  for (int64_t k = 0; k <= model.num_blocks(); ++k) {
    const std::string what = name + " cut at block " + std::to_string(k);
    expect_identical(run_pieces(model, x, y, k, false), whole, what);
    expect_identical(run_pieces(model, x, y, k, true), whole, what + ", materialised");
  }
}

TEST(ModelSeams, GPTPiecesEqualForwardAtEveryCut) {
  for (bool bias : {true, false}) {
    GPT model(gpt_config(bias), 1);
    expect_pieces_equal_whole(model, bias ? "GPT with bias" : "GPT without bias");
  }
}

TEST(ModelSeams, GPTPiecesEqualForwardInF64) {
  GPT model(gpt_config(true), 2);
  model.to(DType::f64);
  expect_pieces_equal_whole(model, "GPT f64");
}

TEST(ModelSeams, LlamaPiecesEqualForwardAtEveryCut) {
  Llama model(llama_config(), 1);
  expect_pieces_equal_whole(model, "LLaMA");
}

TEST(ModelSeams, StreamCarriesThePendingResidual) {
  GPT model(gpt_config(true), 1);
  auto [x, y] = batch(64, 3);
  const Stream e = model.embed(x);
  EXPECT_FALSE(e.pending.defined());
  const Stream s = model.blocks(e, 0, 1);
  ASSERT_TRUE(s.pending.defined()) << "the MLP output of block 0 is added in block 1's ln_1";
  EXPECT_EQ(s.pending.shape(), s.x.shape());
  const Stream empty = model.blocks(s, 1, 1);
  EXPECT_TRUE(empty.x.is_same(s.x) && empty.pending.is_same(s.pending)) << "an empty range returns its stream";
  // LLaMA likewise (Note [fused residual + RMS norm in LLaMA]): its MLP output is added in the
  // next block's input_layernorm.
  Llama llama(llama_config(), 1);
  const Stream l = llama.blocks(llama.embed(x), 0, 2);
  ASSERT_TRUE(l.pending.defined());
  EXPECT_EQ(l.pending.shape(), l.x.shape());
}

TEST(ModelSeams, CheckpointedPiecesEqualForwardAndThePlainModel) {
  GPT gpt(gpt_config(true, true), 1);
  expect_pieces_equal_whole(gpt, "checkpointed GPT");
  Llama llama(llama_config(true), 1);
  expect_pieces_equal_whole(llama, "checkpointed LLaMA");
  // ... and the same numbers as without checkpointing, the checkpointed stream a plain tensor.
  auto [x, y] = batch(64, 3);
  EXPECT_FALSE(gpt.blocks(gpt.embed(x), 0, 2).pending.defined());
  GPT plain_gpt(gpt_config(true, false), 1);
  expect_identical(run_pieces(gpt, x, y, 1, false), run_whole(plain_gpt, x, y), "GPT checkpointed vs plain");
  Llama plain_llama(llama_config(false), 1);
  expect_identical(run_pieces(llama, x, y, 2, false), run_whole(plain_llama, x, y), "LLaMA checkpointed vs plain");
}

TEST(ModelSeams, BlockRangeErrorsNameTheRange) {
  GPT model(gpt_config(true), 1);
  auto [x, y] = batch(64, 3);
  const Stream s = model.embed(x);
  for (auto [b, e] : std::vector<std::pair<int64_t, int64_t>>{{-1, 2}, {2, 1}, {0, 4}}) {
    const std::string msg = error_of([&, b = b, e = e] { model.blocks(s, b, e); });
    EXPECT_NE(msg.find("GPT::blocks"), std::string::npos) << msg;
    EXPECT_NE(msg.find("3 blocks"), std::string::npos) << msg;
  }
  EXPECT_NE(error_of([&] { model.embed(zeros({4}, {.dtype = DType::i64})); }).find("(B, T)"), std::string::npos);
}

// ---------------------------------------------------------------- layer spec

// A Linear that counts its forward calls (and so replaces every role without changing the math).
class CountingLinear : public Linear {
 public:
  using Linear::Linear;
  Tensor forward(const Tensor& x) const override {
    ++calls;
    return Linear::forward(x);
  }
  mutable int calls = 0;
};

class CountingEmbedding : public Embedding {
 public:
  using Embedding::Embedding;
  Tensor forward(const Tensor& ids) const override {
    ++lookups;
    return Embedding::forward(ids);
  }
  Tensor attend(const Tensor& x) const override {
    ++attends;
    return Embedding::attend(x);
  }
  mutable int lookups = 0, attends = 0;
};

struct CountingSpec {
  LayerSpec spec;
  std::map<LinearRole, std::vector<std::shared_ptr<CountingLinear>>> linears;
  std::map<EmbeddingRole, std::vector<std::shared_ptr<CountingEmbedding>>> embeddings;
  int losses = 0;
  CountingSpec() {
    spec.linear = [this](int64_t in, int64_t out, bool bias, LinearRole role) {
      auto m = std::make_shared<CountingLinear>(in, out, bias);
      linears[role].push_back(m);
      return m;
    };
    spec.embedding = [this](int64_t num, int64_t dim, EmbeddingRole role) {
      auto m = std::make_shared<CountingEmbedding>(num, dim);
      embeddings[role].push_back(m);
      return m;
    };
    spec.loss = [this](const Tensor& logits, const Tensor& targets) {
      ++losses;
      return ops::cross_entropy(logits, targets);
    };
  }
};

std::vector<std::string> names_of(const Module& m) {
  std::vector<std::string> out;
  for (const auto& [name, p] : m.named_parameters()) out.push_back(name);
  return out;
}

void expect_same_parameters(const Module& a, const Module& b) {
  const NamedTensors pa = a.named_parameters(), pb = b.named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pa[i].first, pb[i].first);
    EXPECT_TRUE(vals(pa[i].second) == vals(pb[i].second)) << pa[i].first << " initialised differently";
  }
}

TEST(LayerSpec, DefaultSpecKeepsNamesAndInitialisation) {
  expect_same_parameters(GPT(gpt_config(true), 5), GPT(gpt_config(true), 5, LayerSpec{}));
  expect_same_parameters(Llama(llama_config(), 5), Llama(llama_config(), 5, LayerSpec{}));
  const GPT gpt(gpt_config(true), 5);
  EXPECT_EQ(typeid(*gpt.h[0]->attn->c_attn), typeid(Linear));
  EXPECT_EQ(gpt.h[0]->attn->local_heads, 4);
  EXPECT_EQ(gpt.h[0]->mlp->local_hidden, 4 * 32);
}

TEST(LayerSpec, GPTBuildsEveryLinearAndEmbeddingFromTheSpec) {
  const GPTConfig c = gpt_config(true);
  CountingSpec counting;
  GPT custom(c, 5, counting.spec);
  GPT plain(c, 5);
  EXPECT_EQ(names_of(custom), names_of(plain));
  expect_same_parameters(custom, plain);
  for (LinearRole role :
       {LinearRole::attention_qkv, LinearRole::attention_out, LinearRole::mlp_up, LinearRole::mlp_down})
    EXPECT_EQ(counting.linears[role].size(), 3u) << to_string(role);
  EXPECT_EQ(counting.linears.size(), 4u) << "GPT has no q/k/v, gate or separate head linears";
  ASSERT_EQ(counting.embeddings[EmbeddingRole::token].size(), 1u);
  ASSERT_EQ(counting.embeddings[EmbeddingRole::position].size(), 1u);
  EXPECT_EQ(custom.h[1]->mlp->c_fc.get(), counting.linears[LinearRole::mlp_up][1].get());
  EXPECT_EQ(custom.wte.get(), counting.embeddings[EmbeddingRole::token][0].get());

  auto [x, y] = batch(c.vocab_size, 3);
  const Result a = run_whole(custom, x, y), b = run_whole(plain, x, y);
  expect_identical(a, b, "GPT built from a counting spec");
  for (const auto& [role, ms] : counting.linears)
    for (const auto& m : ms) EXPECT_EQ(m->calls, 2) << to_string(role) << ": one forward and one loss";
  const CountingEmbedding& wte = *counting.embeddings[EmbeddingRole::token][0];
  EXPECT_EQ(wte.lookups, 2);
  EXPECT_EQ(wte.attends, 2) << "the tied head goes through Embedding::attend";
  EXPECT_EQ(counting.embeddings[EmbeddingRole::position][0]->lookups, 2);
  EXPECT_EQ(counting.losses, 1) << "loss goes through the spec's loss";
}

TEST(LayerSpec, LlamaBuildsEveryLinearAndEmbeddingFromTheSpec) {
  const LlamaConfig c = llama_config();
  CountingSpec counting;
  Llama custom(c, 5, counting.spec);
  Llama plain(c, 5);
  EXPECT_EQ(names_of(custom), names_of(plain));
  expect_same_parameters(custom, plain);
  for (LinearRole role : {LinearRole::attention_q, LinearRole::attention_k, LinearRole::attention_v,
                          LinearRole::attention_out, LinearRole::mlp_gate, LinearRole::mlp_up, LinearRole::mlp_down})
    EXPECT_EQ(counting.linears[role].size(), 3u) << to_string(role);
  ASSERT_EQ(counting.linears[LinearRole::lm_head].size(), 1u);
  EXPECT_EQ(custom.lm_head.get(), counting.linears[LinearRole::lm_head][0].get());
  EXPECT_EQ(counting.linears.size(), 8u);
  ASSERT_EQ(counting.embeddings[EmbeddingRole::token].size(), 1u);
  EXPECT_EQ(counting.embeddings.size(), 1u);

  auto [x, y] = batch(c.vocab_size, 3);
  expect_identical(run_whole(custom, x, y), run_whole(plain, x, y), "LLaMA built from a counting spec");
  for (const auto& [role, ms] : counting.linears)
    for (const auto& m : ms) EXPECT_EQ(m->calls, 2) << to_string(role);
  EXPECT_EQ(counting.embeddings[EmbeddingRole::token][0]->lookups, 2);
  EXPECT_EQ(counting.losses, 1);
}

// A spec that gives each attention / MLP one half of its heads / hidden units, as a
// column-parallel linear (out / 2) followed by a row-parallel one (in / 2) does on 2 ranks.
LayerSpec half_spec() {
  LayerSpec spec;
  spec.linear = [](int64_t in, int64_t out, bool bias, LinearRole role) -> std::shared_ptr<Linear> {
    switch (role) {
      case LinearRole::attention_qkv:
      case LinearRole::attention_q:
      case LinearRole::attention_k:
      case LinearRole::attention_v:
      case LinearRole::mlp_up:
      case LinearRole::mlp_gate: return std::make_shared<Linear>(in, out / 2, bias);
      case LinearRole::attention_out:
      case LinearRole::mlp_down: return std::make_shared<Linear>(in / 2, out, bias);
      case LinearRole::lm_head: return std::make_shared<Linear>(in, out, bias);
    }
    return nullptr;
  };
  return spec;
}

TEST(LayerSpec, HalvedProjectionsComputeTheLocalHeads) {
  GPT gpt(gpt_config(true), 5, half_spec());
  EXPECT_EQ(gpt.h[0]->attn->n_head, 4);
  EXPECT_EQ(gpt.h[0]->attn->local_heads, 2);
  EXPECT_EQ(gpt.h[0]->attn->head_dim, 8);
  EXPECT_EQ(gpt.h[0]->mlp->local_hidden, 64);
  EXPECT_EQ(gpt.h[0]->attn->c_attn->weight.shape(), (Shape{48, 32}));
  Llama llama(llama_config(), 5, half_spec());
  EXPECT_EQ(llama.layers[0]->self_attn->local_heads, 2);
  EXPECT_EQ(llama.layers[0]->self_attn->local_kv_heads, 1);
  EXPECT_EQ(llama.layers[0]->mlp->local_hidden, 24);
  auto [x, y] = batch(64, 3);
  for (const CausalLM* m : {static_cast<const CausalLM*>(&gpt), static_cast<const CausalLM*>(&llama)}) {
    EXPECT_EQ(m->forward(x).shape(), (Shape{2, 12, 64}));
    Tensor loss = m->loss(x, y);
    loss.backward();
    EXPECT_TRUE(std::isfinite(loss.item()));
  }
}

// Copies rows (dim 0) or columns (dim 1) [part * n / 2, (part + 1) * n / 2) of each of `chunks`
// equal chunks of `from` along dim into `to`: a rank's shard of a column- or row-parallel weight.
void copy_half(Tensor to, const Tensor& from, int64_t dim, int64_t chunks, int64_t part) {
  NoGradGuard no_grad;
  TensorList pieces;
  const int64_t chunk = from.size(dim) / chunks;
  for (int64_t c = 0; c < chunks; ++c) pieces.push_back(from.narrow(dim, c * chunk + part * chunk / 2, chunk / 2));
  to.copy_(ops::cat(pieces, dim));
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = vals(a), y = vals(b);
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}

// The two halves of each layer, given the matching shards of the whole layer's weights, sum
// to the whole layer: each half computes exactly its heads (its kv groups) or hidden units.
TEST(LayerSpec, TwoHalvesSumToTheWholeLayer) {
  Generator gen(9);
  const Tensor x = normal({2, 6, 32}, 0.0, 1.0, {.dtype = DType::f64}, &gen);
  const LayerSpec half = half_spec();
  auto randomize = [&](Module& m) {
    NoGradGuard no_grad;
    for (auto& [name, p] : m.named_parameters()) p.copy_(normal(p.shape(), 0.0, 0.2, {.dtype = DType::f64}, &gen));
  };
  {
    CausalSelfAttention whole(32, 4, false, 0.0);
    whole.to(DType::f64);
    randomize(whole);
    Tensor sum;
    for (int64_t part : {0, 1}) {
      CausalSelfAttention shard(32, 4, false, 0.0, half);
      shard.to(DType::f64);
      copy_half(shard.c_attn->weight, whole.c_attn->weight, 0, 3, part);  // [q | k | v] rows
      copy_half(shard.c_proj->weight, whole.c_proj->weight, 1, 1, part);
      const Tensor y = shard.forward(x);
      sum = sum.defined() ? ops::add(sum, y) : y;
    }
    EXPECT_LT(max_abs_diff(sum, whole.forward(x)), 1e-12) << "CausalSelfAttention";
  }
  {
    LlamaAttention whole(32, 4, 2, 10000.0);
    whole.to(DType::f64);
    randomize(whole);
    Tensor sum;
    for (int64_t part : {0, 1}) {
      LlamaAttention shard(32, 4, 2, 10000.0, half);
      shard.to(DType::f64);
      copy_half(shard.q_proj->weight, whole.q_proj->weight, 0, 1, part);
      copy_half(shard.k_proj->weight, whole.k_proj->weight, 0, 1, part);
      copy_half(shard.v_proj->weight, whole.v_proj->weight, 0, 1, part);
      copy_half(shard.o_proj->weight, whole.o_proj->weight, 1, 1, part);
      const Tensor y = shard.forward(x);
      sum = sum.defined() ? ops::add(sum, y) : y;
    }
    EXPECT_LT(max_abs_diff(sum, whole.forward(x)), 1e-12) << "LlamaAttention (GQA)";
  }
  {
    MLP whole(32, 128, false);
    SwiGLU whole_glu(32, 48);
    for (Module* m : {static_cast<Module*>(&whole), static_cast<Module*>(&whole_glu)}) {
      m->to(DType::f64);
      randomize(*m);
    }
    Tensor sum, sum_glu;
    for (int64_t part : {0, 1}) {
      MLP shard(32, 128, false, 0.0, half);
      SwiGLU shard_glu(32, 48, half);
      shard.to(DType::f64);
      shard_glu.to(DType::f64);
      copy_half(shard.c_fc->weight, whole.c_fc->weight, 0, 1, part);
      copy_half(shard.c_proj->weight, whole.c_proj->weight, 1, 1, part);
      copy_half(shard_glu.gate_proj->weight, whole_glu.gate_proj->weight, 0, 1, part);
      copy_half(shard_glu.up_proj->weight, whole_glu.up_proj->weight, 0, 1, part);
      copy_half(shard_glu.down_proj->weight, whole_glu.down_proj->weight, 1, 1, part);
      const Tensor y = shard.forward(x), y_glu = shard_glu.forward(x);
      sum = sum.defined() ? ops::add(sum, y) : y;
      sum_glu = sum_glu.defined() ? ops::add(sum_glu, y_glu) : y_glu;
    }
    EXPECT_LT(max_abs_diff(sum, whole.forward(x)), 1e-12) << "MLP";
    EXPECT_LT(max_abs_diff(sum_glu, whole_glu.forward(x)), 1e-12) << "SwiGLU";
  }
}

TEST(LayerSpec, MismatchedLinearsAreRejectedNamingTheRole) {
  LayerSpec only_qkv;
  only_qkv.linear = [](int64_t in, int64_t out, bool bias, LinearRole role) {
    return std::make_shared<Linear>(in, role == LinearRole::attention_qkv ? out / 2 : out, bias);
  };
  std::string e = error_of([&] { GPT m(gpt_config(true), 1, only_qkv); });
  EXPECT_NE(e.find("attention_out"), std::string::npos) << e;
  EXPECT_NE(e.find("in_features = 32"), std::string::npos) << e;

  LayerSpec odd_heads;
  odd_heads.linear = [](int64_t in, int64_t out, bool bias, LinearRole role) {
    return std::make_shared<Linear>(in, role == LinearRole::attention_q ? out - 4 : out, bias);
  };
  e = error_of([&] { Llama m(llama_config(), 1, odd_heads); });
  EXPECT_NE(e.find("attention_q"), std::string::npos) << e;
  EXPECT_NE(e.find("whole heads"), std::string::npos) << e;

  LayerSpec none;
  none.linear = [](int64_t, int64_t, bool, LinearRole) { return std::shared_ptr<Linear>(); };
  e = error_of([&] { Llama m(llama_config(), 1, none); });
  EXPECT_NE(e.find("returned no module"), std::string::npos) << e;

  LayerSpec narrow_table;
  narrow_table.embedding = [](int64_t num, int64_t dim, EmbeddingRole) {
    return std::make_shared<Embedding>(num, dim / 2);
  };
  e = error_of([&] { GPT m(gpt_config(true), 1, narrow_table); });
  EXPECT_NE(e.find("token embedding"), std::string::npos) << e;
  EXPECT_NE(e.find("model.n_embd"), std::string::npos) << e;
}

// ---------------------------------------------------------------- block_of

// Every parameter: the virtual block_of_param agrees with the static block_of that other code
// takes the address of, names the block in its path, and counts params_per_block per block.
void expect_block_of(const CausalLM& model, const std::function<int(const std::string&)>& block_of,
                     int params_per_block) {
  int in_blocks = 0;
  for (const auto& [name, p] : model.named_parameters()) {
    const int b = model.block_of_param(name);
    EXPECT_EQ(b, block_of(name)) << name;
    if (b < 0) continue;
    ++in_blocks;
    EXPECT_LT(b, model.num_blocks()) << name;
    EXPECT_NE(name.find(std::string(".").append(std::to_string(b)).append(".")), std::string::npos) << name;
  }
  EXPECT_EQ(in_blocks, model.num_blocks() * params_per_block);
}

TEST(ModelSeams, BlockOfParamMatchesTheStaticBlockOf) {
  GPT gpt(gpt_config(true), 1);
  Llama llama(llama_config(), 1);
  expect_block_of(gpt, &GPT::block_of, 12);     // 2 LayerNorms and 4 Linears, each with a bias
  expect_block_of(llama, &Llama::block_of, 9);  // 7 Linears and 2 RMSNorms
  EXPECT_EQ(gpt.block_of_param("transformer.h.2.mlp.c_fc.weight"), 2);
  EXPECT_EQ(gpt.block_of_param("transformer.wte.weight"), -1);
  EXPECT_EQ(llama.block_of_param("model.layers.1.self_attn.k_proj.weight"), 1);
  EXPECT_EQ(llama.block_of_param("lm_head.weight"), -1);
  EXPECT_EQ(gpt.num_blocks(), 3);
  EXPECT_EQ(gpt.vocab_size(), 64);
  EXPECT_EQ(llama.block_size(), 16);
}

}  // namespace
}  // namespace forge::nn
