// Note [KV cache] (nn/causal_lm.h): GPT and LLaMA (grouped-query and multi-head) decoding over a
// KV cache give the logits of forward() on the whole sequence: a prefill of several tokens, then
// one token at a time, then several at once; and forge's generate gives the same tokens with and
// without the cache, also past block_size where the window slides.
#include <gtest/gtest.h>

#include <memory>

#include "forge/autograd/grad_mode.h"
#include "forge/core/error.h"
#include "forge/nn/gpt.h"
#include "forge/nn/llama.h"
#include "forge/ops/creation.h"
#include "forge/ops/view.h"
#include "forge/train/sample.h"

namespace forge::nn {
namespace {

std::vector<int64_t> tokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::vector<int64_t> t(static_cast<size_t>(n));
  for (auto& x : t) {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    x = static_cast<int64_t>((seed >> 33) % static_cast<uint64_t>(vocab));
  }
  return t;
}

void expect_cache_matches(const CausalLM& m, int64_t vocab) {
  NoGradGuard ng;
  const int64_t n = 20;
  const auto ids = tokens(n, vocab, 3);
  const Tensor full = m.forward(from_vector(ids, {1, n}));  // (1, n, V)
  KvCache cache;
  std::vector<Tensor> parts;
  auto run = [&](int64_t from, int64_t count) {
    parts.push_back(m.forward_cached(from_vector(std::vector<int64_t>(ids.begin() + from, ids.begin() + from + count),
                                                 {1, count}),
                                     cache));
  };
  run(0, 9);                                   // the prompt
  for (int64_t t = 9; t < 15; ++t) run(t, 1);  // one at a time
  run(15, 5);                                  // several after a cache
  EXPECT_EQ(cache.length, n);
  int64_t at = 0;
  for (const Tensor& p : parts) {
    const auto got = p.to_vector<double>();
    const auto want = ops::narrow(full, 1, at, p.size(1)).to_vector<double>();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 2e-5) << "position " << at << " element " << i;
    at += p.size(1);
  }
  // Past the context: refused, naming the fix.
  KvCache full_cache;
  m.forward_cached(from_vector(tokens(m.block_size(), vocab, 5), {1, m.block_size()}), full_cache);
  try {
    m.forward_cached(from_vector(std::vector<int64_t>{1}, {1, 1}), full_cache);
    ADD_FAILURE() << "no error past block_size";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("start a new cache"), std::string::npos) << e.what();
  }
}

TEST(KvCache, GptDecodingMatchesTheWholeSequence) {
  GPTConfig c;
  c.vocab_size = 97;
  c.block_size = 32;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 32;
  GPT m(c, 7);
  m.eval();
  expect_cache_matches(m, c.vocab_size);
}

TEST(KvCache, LlamaDecodingMatchesTheWholeSequence) {
  for (int64_t kv : {2, 4}) {  // grouped-query and multi-head
    LlamaConfig c;
    c.vocab_size = 97;
    c.block_size = 32;
    c.n_layer = 2;
    c.n_head = 4;
    c.n_kv_head = kv;
    c.dim = 32;
    c.ffn_hidden = 64;
    Llama m(c, 7);
    m.eval();
    expect_cache_matches(m, c.vocab_size);
  }
}

TEST(KvCache, GenerateGivesTheSameTokensWithAndWithoutTheCache) {
  LlamaConfig c;
  c.vocab_size = 61;
  c.block_size = 16;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.dim = 32;
  c.ffn_hidden = 64;
  auto m = std::make_shared<Llama>(c, 11);
  train::LanguageModel lm;
  lm.module = m;
  lm.forward = [m](const Tensor& x) { return m->forward(x); };
  lm.vocab_size = c.vocab_size;
  lm.block_size = c.block_size;
  const std::vector<int32_t> prompt = {5, 9, 2, 40, 7};
  for (double temperature : {0.0, 1.0}) {
    train::Sampling with{temperature, 0, 0.95, true}, without{temperature, 0, 0.95, false};
    // 30 new tokens: past block_size (16), where the window slides.
    const auto a = train::generate(lm, prompt, 30, with, 3), b = train::generate(lm, prompt, 30, without, 3);
    EXPECT_EQ(a, b) << "temperature " << temperature;
    EXPECT_EQ(a.size(), prompt.size() + 30);
  }
}

// Prompts of one length decode as one batch over one cache: each row gets the tokens it gets
// alone from its own seed, a stop ends its row only, and past block_size the window slides.
TEST(KvCache, ABatchOfPromptsDecodesAsEachAlone) {
  GPTConfig c;
  c.vocab_size = 61;
  c.block_size = 16;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 32;
  auto m = std::make_shared<GPT>(c, 13);
  train::LanguageModel lm;
  lm.module = m;
  lm.forward = [m](const Tensor& x) { return m->forward(x); };
  lm.vocab_size = c.vocab_size;
  lm.block_size = c.block_size;
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3, 4}, {9, 8, 7, 6}, {30, 31, 2, 5}};
  const std::vector<uint64_t> seeds = {5, 6, 7};
  for (double temperature : {0.0, 0.8}) {
    const train::Sampling how{temperature, 0, 1.0, true};
    // Row 1 stops once it has drawn 6 tokens.
    auto stop = [](size_t k, const std::vector<int32_t>& ids) { return k == 1 && ids.size() >= 10; };
    const auto batch = train::generate_batch(lm, prompts, 20, how, seeds, stop);
    ASSERT_EQ(batch.size(), 3u);
    for (size_t k = 0; k < 3; ++k) {
      auto alone = train::generate(lm, prompts[k], k == 1 ? 6 : 20, how, seeds[k]);
      EXPECT_EQ(batch[k], alone) << "row " << k << " temperature " << temperature;
    }
    EXPECT_EQ(batch[1].size(), 10u);
    EXPECT_EQ(batch[0].size(), 24u);  // 4 + 20: past block_size 16
  }
}

}  // namespace
}  // namespace forge::nn
