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
#include "forge/interop/sample.h"
#include "testing/tiny_models.h"

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

// The shared tiny models (testing/tiny_models.h) with this file's vocabulary and context.
GPTConfig tiny_gpt(int64_t vocab = 61, int64_t block = 16) {
  GPTConfig c = testing::tiny_gpt_config();
  c.vocab_size = vocab;
  c.block_size = block;
  return c;
}
LlamaConfig tiny_llama(int64_t vocab = 61, int64_t block = 16, int64_t kv = 2) {
  LlamaConfig c = testing::tiny_llama_config(kv);
  c.vocab_size = vocab;
  c.block_size = block;
  return c;
}
// A model as forge sample sees it.
template <class M> train::LanguageModel language_model(std::shared_ptr<M> m) {
  train::LanguageModel lm;
  lm.module = m;
  lm.forward = [m](const Tensor& x) { return m->forward(x); };
  lm.vocab_size = m->vocab_size();
  lm.block_size = m->block_size();
  return lm;
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
  // The last position alone (what decoding reads): forward_last, and forward_cached(last_only),
  // which still caches every position.
  auto expect_last = [&](const Tensor& got, const Tensor& whole, const char* what) {
    ASSERT_EQ(got.shape(), (Shape{whole.size(0), 1, whole.size(2)})) << what;
    const auto g = got.to_vector<double>();
    const auto w = ops::narrow(whole, 1, whole.size(1) - 1, 1).to_vector<double>();
    for (size_t i = 0; i < g.size(); ++i) ASSERT_NEAR(g[i], w[i], 2e-5) << what << " element " << i;
  };
  expect_last(m.forward_last(from_vector(ids, {1, n})), full, "forward_last");
  KvCache last_cache;
  const Tensor prompt = from_vector(std::vector<int64_t>(ids.begin(), ids.begin() + 9), {1, 9});
  expect_last(m.forward_cached(prompt, last_cache, /*last_only=*/true), ops::narrow(full, 1, 0, 9),
              "forward_cached(last_only)");
  EXPECT_EQ(last_cache.length, 9);
  expect_last(m.forward_cached(from_vector(std::vector<int64_t>{ids[9]}, {1, 1}), last_cache), ops::narrow(full, 1, 0, 10),
              "the next token after a last-only prefill");
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
  const GPTConfig c = tiny_gpt(97, 32);
  GPT m(c, 7);
  m.eval();
  expect_cache_matches(m, c.vocab_size);
}

TEST(KvCache, LlamaDecodingMatchesTheWholeSequence) {
  for (int64_t kv : {2, 8}) {  // grouped-query and multi-head
    const LlamaConfig c = tiny_llama(97, 32, kv);
    Llama m(c, 7);
    m.eval();
    expect_cache_matches(m, c.vocab_size);
  }
}

TEST(KvCache, GenerateGivesTheSameTokensWithAndWithoutTheCache) {
  const train::LanguageModel lm = language_model(std::make_shared<Llama>(tiny_llama(), 11));
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
  const train::LanguageModel lm = language_model(std::make_shared<GPT>(tiny_gpt(), 13));
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

// Note [padded prompts]: prompts of different lengths, left-padded in one batch, give each row's
// logits as that row alone (prefill, then one token at a time), for GPT (learned positions) and
// LLaMA (rotary positions per row, grouped-query heads); and generate_batch gives each prompt's
// tokens alone, also past block_size where each row's window slides.
template <class Model> void expect_padded_rows_match(const Model& m, int64_t vocab) {
  NoGradGuard ng;
  const std::vector<int64_t> lengths = {7, 3, 1, 5};
  const int64_t L = 7, B = static_cast<int64_t>(lengths.size());
  std::vector<std::vector<int64_t>> rows;
  std::vector<int64_t> window, pad;
  for (int64_t b = 0; b < B; ++b) {
    rows.push_back(tokens(lengths[static_cast<size_t>(b)] + 3, vocab, 11 + static_cast<uint64_t>(b)));
    pad.push_back(L - lengths[static_cast<size_t>(b)]);
    window.insert(window.end(), static_cast<size_t>(pad.back()), 0);
    window.insert(window.end(), rows.back().begin(), rows.back().begin() + lengths[static_cast<size_t>(b)]);
  }
  KvCache cache;
  cache.pad = pad;
  std::vector<Tensor> steps = {ops::select(m.forward_cached(from_vector(window, {B, L}), cache), 1, L - 1)};
  for (int64_t t = 0; t < 3; ++t) {  // three more tokens per row, one at a time
    std::vector<int64_t> next;
    for (int64_t b = 0; b < B; ++b) next.push_back(rows[static_cast<size_t>(b)][static_cast<size_t>(lengths[static_cast<size_t>(b)] + t)]);
    steps.push_back(ops::select(m.forward_cached(from_vector(next, {B, 1}), cache), 1, 0));
  }
  for (int64_t b = 0; b < B; ++b) {
    const auto& r = rows[static_cast<size_t>(b)];
    const int64_t n = lengths[static_cast<size_t>(b)] + 3;
    const Tensor alone = m.forward(from_vector(std::vector<int64_t>(r.begin(), r.begin() + n), {1, n}));  // (1, n, V)
    for (int64_t s = 0; s < 4; ++s) {
      const auto got = ops::select(steps[static_cast<size_t>(s)], 0, b).to_vector<double>();
      const auto want = ops::select(ops::select(alone, 0, 0), 0, lengths[static_cast<size_t>(b)] - 1 + s).to_vector<double>();
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_NEAR(got[i], want[i], 2e-5) << "row " << b << " step " << s << " element " << i;
    }
  }
}

TEST(KvCache, PromptsOfDifferentLengthsLeftPaddedGiveEachRowsLogits) {
  expect_padded_rows_match(GPT(tiny_gpt(), 13), 61);
  expect_padded_rows_match(Llama(tiny_llama(), 13), 61);
}

TEST(KvCache, ABatchOfPromptsOfDifferentLengthsDecodesAsEachAlone) {
  const train::LanguageModel lm = language_model(std::make_shared<Llama>(tiny_llama(), 17));
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3, 4, 5, 6}, {9}, {30, 31, 2}};
  const std::vector<uint64_t> seeds = {5, 6, 7};
  for (double temperature : {0.0, 0.8}) {
    const train::Sampling how{temperature, 0, 1.0, true};
    const auto batch = train::generate_batch(lm, prompts, 14, how, seeds);  // row 0 passes block_size 16
    ASSERT_EQ(batch.size(), 3u);
    for (size_t k = 0; k < 3; ++k)
      EXPECT_EQ(batch[k], train::generate(lm, prompts[k], 14, how, seeds[k])) << "row " << k << " temperature " << temperature;
    EXPECT_EQ(batch[0].size(), 20u);
  }
}

}  // namespace
}  // namespace forge::nn
