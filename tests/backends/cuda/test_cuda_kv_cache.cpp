// Note [KV cache] on CUDA: a LLaMA (grouped-query) and a GPT decoding over a KV cache on the GPU
// give the logits of the whole-sequence forward on the GPU (bf16 and f32), and the CPU's.
#include <gtest/gtest.h>

#include <cmath>

#include "backends/cuda/cuda_testing.h"
#include "forge/forge.h"
#include "forge/nn/gpt.h"
#include "forge/nn/llama.h"

namespace forge::nn {
namespace {

std::vector<int64_t> tokens(int64_t n, int64_t vocab) {
  std::vector<int64_t> t(static_cast<size_t>(n));
  uint64_t s = 17;
  for (auto& x : t) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    x = static_cast<int64_t>((s >> 33) % static_cast<uint64_t>(vocab));
  }
  return t;
}

// Prefill 11 tokens, then 9 one at a time: every row against forward() of all 20 on the GPU.
void check(CausalLM& m, int64_t vocab, DType dt, double tol) {
  NoGradGuard ng;
  m.eval();
  m.to(Device::cuda(0), dt);
  const auto ids = tokens(20, vocab);
  const Device g = Device::cuda(0);
  const auto full = m.forward(from_vector(ids, {1, 20}).to(g)).to(Device::cpu(), DType::f64).to_vector<double>();
  KvCache cache;
  std::vector<double> got =
      m.forward_cached(from_vector(std::vector<int64_t>(ids.begin(), ids.begin() + 11), {1, 11}).to(g), cache)
          .to(Device::cpu(), DType::f64).to_vector<double>();
  for (int64_t t = 11; t < 20; ++t) {
    const auto row = m.forward_cached(from_vector(std::vector<int64_t>{ids[static_cast<size_t>(t)]}, {1, 1}).to(g), cache)
                         .to(Device::cpu(), DType::f64).to_vector<double>();
    got.insert(got.end(), row.begin(), row.end());
  }
  ASSERT_EQ(got.size(), full.size());
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - full[i]));
  EXPECT_LT(worst, tol) << dtype_name(dt);
}

// Note [padded prompts] on the GPU: rows of lengths 9, 4 and 1 left-padded in one batch (the
// attention's key mask with its causal mask), then three tokens each: every row's last logits as
// the row alone on the GPU.
void check_padded(CausalLM& m, int64_t vocab, DType dt, double tol) {
  NoGradGuard ng;
  m.eval();
  const Device g = Device::cuda(0);
  m.to(g, dt);
  const std::vector<int64_t> lengths = {9, 4, 1};
  const int64_t L = 9, B = 3;
  const auto all = tokens(40, vocab);
  std::vector<std::vector<int64_t>> rows;
  std::vector<int64_t> window;
  KvCache cache;
  for (int64_t b = 0; b < B; ++b) {
    rows.emplace_back(all.begin() + 10 * b, all.begin() + 10 * b + lengths[static_cast<size_t>(b)] + 3);
    cache.pad.push_back(L - lengths[static_cast<size_t>(b)]);
    window.insert(window.end(), static_cast<size_t>(cache.pad.back()), 0);
    window.insert(window.end(), rows.back().begin(), rows.back().begin() + lengths[static_cast<size_t>(b)]);
  }
  std::vector<Tensor> steps = {m.forward_cached(from_vector(window, {B, L}).to(g), cache).select(1, L - 1)};
  for (int64_t t = 0; t < 3; ++t) {
    std::vector<int64_t> next;
    for (int64_t b = 0; b < B; ++b) next.push_back(rows[static_cast<size_t>(b)][static_cast<size_t>(lengths[static_cast<size_t>(b)] + t)]);
    steps.push_back(m.forward_cached(from_vector(next, {B, 1}).to(g), cache).select(1, 0));
  }
  double worst = 0;
  for (int64_t b = 0; b < B; ++b) {
    const auto& r = rows[static_cast<size_t>(b)];
    const auto n = static_cast<int64_t>(r.size());
    const Tensor alone = m.forward(from_vector(r, {1, n}).to(g)).select(0, 0);  // (n, V)
    for (int64_t s = 0; s < 4; ++s) {
      const auto got = steps[static_cast<size_t>(s)].select(0, b).to(Device::cpu(), DType::f64).to_vector<double>();
      const auto want =
          alone.select(0, lengths[static_cast<size_t>(b)] - 1 + s).to(Device::cpu(), DType::f64).to_vector<double>();
      for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]));
    }
  }
  EXPECT_LT(worst, tol) << dtype_name(dt);
}

// A grouped-query LLaMA and a GPT, in f32 and bf16, through `run`.
template <class Check> void each_model(Check run) {
  for (auto [dt, tol] : {std::pair{DType::f32, 1e-4}, std::pair{DType::bf16, 0.08}}) {
    LlamaConfig c;
    c.vocab_size = 128;
    c.block_size = 64;
    c.n_layer = 2;
    c.n_head = 4;
    c.n_kv_head = 2;
    c.dim = 64;
    c.ffn_hidden = 128;
    Llama llama(c, 5);
    run(llama, c.vocab_size, dt, tol);
    GPTConfig g;
    g.vocab_size = 128;
    g.block_size = 64;
    g.n_layer = 2;
    g.n_head = 4;
    g.n_embd = 64;
    GPT gpt(g, 5);
    run(gpt, g.vocab_size, dt, tol);
  }
}

TEST(CudaKvCache, LlamaAndGptDecodeAsTheWholeSequence) {
  FORGE_SKIP_WITHOUT_GPU();
  each_model(check);
}

TEST(CudaKvCache, PromptsOfDifferentLengthsLeftPaddedGiveEachRowsLogits) {
  FORGE_SKIP_WITHOUT_GPU();
  each_model(check_padded);
}

}  // namespace
}  // namespace forge::nn
