// Tensor parallelism's building blocks over real ranks (mpirun -np 1/2/4, the world as the
// tensor-parallel group): every collective of Note [tensor-parallel collectives] forward and
// backward against what it must compute, and a column-parallel then row-parallel MLP against
// the same MLP in one piece (outputs, input gradient, and each rank's weight-gradient shards), in
// f64. Inputs are random and differ per rank where the collective combines ranks.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "forge/core/allocator.h"
#include "forge/core/env.h"
#include "forge/core/error.h"
#include "forge/forge.h"
#include "forge/nn/gpt.h"
#include "forge/nn/llama.h"
#include "forge/parallel/tensor_parallel.h"
#include "forge/parallel/world.h"
#include "testing/tiny_models.h"

namespace forge::parallel {
namespace {

constexpr double kTol = 1e-12;
const TensorOptions kF64{.dtype = DType::f64};

Tensor random(const Shape& s, uint64_t seed) {
  Generator gen(seed);
  return uniform(s, -1.0, 1.0, kF64, &gen);
}

// Rank r's tensor of a per-rank family (seed + r).
Tensor of_rank(const Shape& s, uint64_t seed, int r) { return random(s, seed + 1000 * static_cast<uint64_t>(r)); }

void expect_near(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what << ": undefined";
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const auto a = got.to_vector<double>(), b = want.to_vector<double>();
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], kTol * (1 + std::abs(b[i]))) << what << " [" << i << "]";
}

// Note [one collective per input]: linears fed the same tensor enter their region through one
// collective (the same output tensor, whose backward runs once on the summed gradient), also when
// the first linear kept nothing of it; another input, another grad mode or the other kind of entry
// gets its own; the memo holds only the last entry.
TEST(TensorParallelMpi, LinearsSharingAnInputShareOneCollective) {
  const auto g = world();
  const int W = g->size(), r = g->rank();
  for (const bool sp : {false, true}) {
    const std::string kind = sp ? "gather_sequence" : "copy_to_region";
    Tensor x = of_rank({2, 4, 3}, 5, r).requires_grad_();
    const tp::RegionEntry ea = tp::enter_column_region(x, g, sp);
    const tp::RegionEntry eb = tp::enter_column_region(x, g, sp);
    const Tensor a = ea.input, b = eb.input;
    if (W > 1) {  // (a group of one enters with the input itself)
      EXPECT_TRUE(a.is_same(b)) << kind << ": the second linear did not reuse the first one's entry";
      ASSERT_NE(ea.defer, nullptr) << kind << ": no queue for the region's weight gradients";
      EXPECT_EQ(ea.defer, eb.defer) << kind << ": linears sharing an entry share its queue";
      const Tensor other = tp::enter_column_region(x.detach().clone().requires_grad_(), g, sp).input;
      EXPECT_FALSE(other.is_same(a)) << kind;
      EXPECT_FALSE(tp::enter_column_region(x, g, !sp).input.is_same(a)) << kind;
      NoGradGuard no_grad;
      const tp::RegionEntry nograd = tp::enter_column_region(x, g, sp);
      EXPECT_FALSE(nograd.input.is_same(a)) << kind << ": a no-grad entry reused a recorded one";
      EXPECT_EQ(nograd.defer, nullptr) << kind << ": a queue nobody will run";
    }
    // Two users of the shared entry: the input's gradient is what two separate entries give.
    ops::add(ops::sum(ops::mul(a, a)), ops::sum(ops::mul(b, 3.0))).backward();
    Tensor y = x.detach().clone().requires_grad_();
    auto enter = [&] { return sp ? tp::gather_sequence(y, g) : tp::copy_to_region(y, g); };
    ops::add(ops::sum(ops::mul(enter(), enter())), ops::sum(ops::mul(enter(), 3.0))).backward();
    expect_near(x.grad(), y.grad(), kind + ": the gradient through the shared entry");
  }
  // As in a model: q's linear used the entry and kept nothing of it; k's linear, fed the same
  // input, still gets it. The next input's entry releases it.
  for (const bool sp : {false, true}) {
    Tensor x = of_rank({2, 4, 3}, 6, r).requires_grad_();
    const std::weak_ptr<TensorImpl> entry = tp::enter_column_region(x, g, sp).input.impl_ptr();
    if (W == 1) continue;
    ASSERT_FALSE(entry.expired()) << "the memo let the entry go before the input's other linears";
    EXPECT_EQ(tp::enter_column_region(x, g, sp).input.impl(), entry.lock().get()) << "a second entry for one input";
    Tensor next = of_rank({2, 4, 3}, 7, r).requires_grad_();
    tp::enter_column_region(next, g, sp);
    EXPECT_TRUE(entry.expired()) << "the memo kept an entry past the next input's";
  }
}

TEST(TensorParallelMpi, CopyAndReduceAreInverseInTheBackward) {
  const auto g = world();
  const int W = g->size(), r = g->rank();
  // copy_to_region: forward identity, backward the sum of the ranks' gradients.
  Tensor x = random({3, 4}, 1).requires_grad_();
  Tensor y = tp::copy_to_region(x, g);
  expect_near(y, x.detach(), "copy forward");
  y.backward(of_rank({3, 4}, 2, r));
  Tensor want = zeros({3, 4}, kF64);
  for (int q = 0; q < W; ++q) want = want + of_rank({3, 4}, 2, q);
  expect_near(x.grad(), want, "copy backward");
  // reduce_from_region: forward the sum of the ranks' inputs, backward identity.
  Tensor a = of_rank({2, 5}, 3, r).requires_grad_();
  Tensor s = tp::reduce_from_region(a, g);
  Tensor sum = zeros({2, 5}, kF64);
  for (int q = 0; q < W; ++q) sum = sum + of_rank({2, 5}, 3, q);
  expect_near(s, sum, "reduce forward");
  const Tensor gs = random({2, 5}, 4);  // the same on every rank: what follows the reduction is replicated
  s.backward(gs);
  expect_near(a.grad(), gs, "reduce backward");
}

TEST(TensorParallelMpi, GatherAndScatterAlongTheLastDim) {
  const auto g = world();
  const int W = g->size(), r = g->rank();
  // gather: the ranks' slices side by side; backward: this rank's slice of the (common) gradient.
  Tensor x = of_rank({2, 3}, 10, r).requires_grad_();
  Tensor y = tp::gather_last_dim(x, g);
  TensorList parts;
  for (int q = 0; q < W; ++q) parts.push_back(of_rank({2, 3}, 10, q));
  expect_near(y, ops::cat(parts, -1), "gather forward");
  const Tensor gy = random({2, 3 * W}, 11);
  y.backward(gy);
  expect_near(x.grad(), ops::narrow(gy, 1, 3 * r, 3).contiguous(), "gather backward");
  // scatter: this rank's slice; backward: the ranks' gradients side by side.
  Tensor z = random({2, 2 * W}, 12).requires_grad_();
  Tensor zs = tp::scatter_last_dim(z, g);
  expect_near(zs, ops::narrow(z.detach(), 1, 2 * r, 2).contiguous(), "scatter forward");
  zs.backward(of_rank({2, 2}, 13, r));
  TensorList grads;
  for (int q = 0; q < W; ++q) grads.push_back(of_rank({2, 2}, 13, q));
  expect_near(z.grad(), ops::cat(grads, -1), "scatter backward");
}

TEST(TensorParallelMpi, SequenceParallelGatherAndReduceScatter) {
  const auto g = world();
  const int W = g->size(), r = g->rank();
  // gather along the sequence dim (1 of (B, T, C)); backward: the sum over the ranks of their
  // gradients of this rank's rows.
  Tensor x = of_rank({2, 3, 4}, 20, r).requires_grad_();
  Tensor y = tp::gather_along(x, 1, g);
  TensorList parts;
  for (int q = 0; q < W; ++q) parts.push_back(of_rank({2, 3, 4}, 20, q));
  expect_near(y, ops::cat(parts, 1), "sequence gather forward");
  y.backward(of_rank({2, 3 * W, 4}, 21, r));
  Tensor want = zeros({2, 3, 4}, kF64);
  for (int q = 0; q < W; ++q) want = want + ops::narrow(of_rank({2, 3 * W, 4}, 21, q), 1, 3 * r, 3);
  expect_near(x.grad(), want.contiguous(), "sequence gather backward");
  // reduce-scatter along the sequence dim: this rank's rows of the sum; backward: the ranks'
  // gradients gathered.
  Tensor a = of_rank({2, 2 * W, 3}, 22, r).requires_grad_();
  Tensor s = tp::reduce_scatter_along(a, 1, g);
  Tensor sum = zeros({2, 2 * W, 3}, kF64);
  for (int q = 0; q < W; ++q) sum = sum + of_rank({2, 2 * W, 3}, 22, q);
  expect_near(s, ops::narrow(sum, 1, 2 * r, 2).contiguous(), "reduce-scatter forward");
  s.backward(of_rank({2, 2, 3}, 23, r));
  TensorList grads;
  for (int q = 0; q < W; ++q) grads.push_back(of_rank({2, 2, 3}, 23, q));
  expect_near(a.grad(), ops::cat(grads, 1), "reduce-scatter backward");
  // One sequence (nothing before the sequence dim: the input is already in rank order, no copy),
  // and along the first dim.
  for (const auto& [shape, dim] : {std::pair<Shape, int64_t>{{1, 2 * W, 3}, 1}, std::pair<Shape, int64_t>{{2 * W, 3}, 0}}) {
    const Tensor b = of_rank(shape, 24, r);
    Tensor total = zeros(shape, kF64);
    for (int q = 0; q < W; ++q) total = total + of_rank(shape, 24, q);
    expect_near(tp::reduce_scatter_along(b, dim, g), ops::narrow(total, dim, 2 * r, 2).contiguous(),
                "reduce-scatter forward, dim " + std::to_string(dim));
  }
}

// Note [sequence-parallel shards]: rank r's shard (B, T / W, C) is part r of the flattened whole.
Tensor shard_of(const Tensor& whole, int r, int W) {
  Shape part = whole.shape();
  part[1] /= W;
  const int64_t n = whole.numel() / W;
  return ops::narrow(whole.contiguous().reshape({-1}), 0, r * n, n).contiguous().reshape(part);
}

TEST(TensorParallelMpi, SequenceShardsGatherAndReduceScatterInPlace) {
  const auto g = world();
  const int W = g->size(), r = g->rank();
  for (const int64_t B : {1, 2, 3}) {
    const std::string what = "B = " + std::to_string(B);
    // The ranks' shards gathered are the whole, shard by shard; backward: the sum over the ranks
    // of their gradients' shard r.
    Tensor x = of_rank({B, 2, 3}, 40, r).requires_grad_();
    Tensor y = tp::gather_sequence(x, g);
    TensorList parts;
    for (int q = 0; q < W; ++q) parts.push_back(of_rank({B, 2, 3}, 40, q).reshape({-1}));
    expect_near(y, ops::cat(parts, 0).reshape({B, 2 * W, 3}), what + ": gather forward");
    y.backward(of_rank({B, 2 * W, 3}, 41, r));
    Tensor want = zeros({B, 2, 3}, kF64);
    for (int q = 0; q < W; ++q) want = want + shard_of(of_rank({B, 2 * W, 3}, 41, q), r, W);
    expect_near(x.grad(), want, what + ": gather backward");
    // reduce-scatter: shard r of the sum; backward: the ranks' gradients gathered.
    Tensor a = of_rank({B, 2 * W, 3}, 42, r).requires_grad_();
    Tensor s = tp::reduce_scatter_sequence(a, g);
    Tensor sum = zeros({B, 2 * W, 3}, kF64);
    for (int q = 0; q < W; ++q) sum = sum + of_rank({B, 2 * W, 3}, 42, q);
    expect_near(s, shard_of(sum, r, W), what + ": reduce-scatter forward");
    s.backward(of_rank({B, 2, 3}, 43, r));
    TensorList grads;
    for (int q = 0; q < W; ++q) grads.push_back(of_rank({B, 2, 3}, 43, q).reshape({-1}));
    expect_near(a.grad(), ops::cat(grads, 0).reshape({B, 2 * W, 3}), what + ": reduce-scatter backward");
  }
}

// GPT's position table under sequence parallelism adds to each token of a shard the embedding of
// that token's position: shard r of (tokens + positions) over the whole, with its gradient, for
// batches W divides, batches smaller than W and batches neither (rows split across ranks).
TEST(TensorParallelMpi, SequenceShardPositionsAreTheTokensPositions) {
  const auto g = world();
  const int W = g->size(), r = g->rank();
  const int64_t C = 3, T = 2 * W;
  for (const int64_t B : {1, 2, 3, 4}) {
    const std::string what = "B = " + std::to_string(B);
    tp::SequenceShardEmbedding split(T, C, g);
    nn::Embedding whole(T, C);
    {
      NoGradGuard no_grad;
      const Tensor table = random({T, C}, 50);
      ops::copy_(split.weight, table);
      ops::copy_(whole.weight, table);
    }
    const Tensor tokens = random({B, T, C}, 51);
    const Tensor positions = arange(T, {.dtype = DType::i64});
    const Tensor want = whole.add_to(tokens, positions);
    const Tensor got = split.add_to(shard_of(tokens, r, W), positions);
    expect_near(got, shard_of(want, r, W), what + ": forward");
    // The table's gradient: each rank's part is from its tokens; their sum is the whole's.
    const Tensor gy = random({B, T, C}, 52);
    want.backward(gy);
    got.backward(shard_of(gy, r, W));
    Tensor summed = split.weight.grad().clone();
    g->all_reduce(summed, ReduceOp::sum)->wait();
    expect_near(summed, whole.weight.grad(), what + ": the table's gradient summed over the ranks");
  }
}

TEST(TensorParallelMpi, ColumnThenRowParallelMlpMatchesTheWholeMlp) {
  const auto g = world();
  const int W = g->size(), r = g->rank();
  const int64_t C = 8, H = 16;
  const Tensor w1 = random({H, C}, 30), b1 = random({H}, 31), w2 = random({C, H}, 32), b2 = random({C}, 33);
  const Tensor x0 = random({2, 3, C}, 34), gy = random({2, 3, C}, 35);
  // The whole MLP, in one process's arithmetic.
  Tensor x = x0.clone().requires_grad_();
  Tensor w1w = w1.clone().requires_grad_(), b1w = b1.clone().requires_grad_();
  Tensor w2w = w2.clone().requires_grad_(), b2w = b2.clone().requires_grad_();
  Tensor y = ops::linear(ops::gelu(ops::linear(x, w1w, b1w), true), w2w, b2w);
  y.backward(gy);
  // The same MLP split over the ranks.
  tp::ColumnParallelLinear up(C, H, true, g);
  tp::RowParallelLinear down(H, C, true, g);
  up.to(Device::cpu(), DType::f64);
  down.to(Device::cpu(), DType::f64);
  up.load_whole(w1, b1);
  down.load_whole(w2, b2);
  EXPECT_EQ(up.weight.shape(), (Shape{H / W, C}));
  EXPECT_EQ(down.weight.shape(), (Shape{C, H / W}));
  Tensor xt = x0.clone().requires_grad_();
  Tensor yt = down.forward(up.forward_gelu(xt));
  expect_near(yt, y.detach(), "output");
  yt.backward(gy);
  expect_near(xt.grad(), x.grad(), "input gradient");
  expect_near(up.weight.grad(), tp::shard(w1w.grad(), 0, r, W), "up weight gradient (this rank's rows)");
  expect_near(up.bias.grad(), tp::shard(b1w.grad(), 0, r, W), "up bias gradient");
  expect_near(down.weight.grad(), tp::shard(w2w.grad(), 1, r, W), "down weight gradient (this rank's columns)");
  expect_near(down.bias.grad(), b2w.grad(), "down bias gradient (whole on every rank)");
  // gather_output gives every rank the whole up projection.
  tp::ColumnParallelLinear whole(C, H, true, g, /*gather_output=*/true);
  whole.to(Device::cpu(), DType::f64);
  whole.load_whole(w1, b1);
  expect_near(whole.forward(x0), ops::linear(x0, w1, b1), "gathered column-parallel output");
}

// Vocabulary parallelism: the embedding's lookup and tied head, and the cross-entropy over the
// ranks' slices of the logits, against the whole table and ops::cross_entropy.
TEST(TensorParallelMpi, VocabParallelEmbeddingHeadAndLossMatchTheWholeVocabulary) {
  const auto g = world();
  const int W = g->size(), r = g->rank();
  const int64_t V = 8, D = 3;
  const Tensor table = random({V, D}, 50);
  Generator gen(51);
  const Tensor ids = ops::mul(uniform({2, 5}, 0.0, 1.0, kF64, &gen), static_cast<double>(V)).to(DType::i64);
  std::vector<int64_t> tv = ops::mul(uniform({2, 5}, 0.0, 1.0, kF64, &gen), static_cast<double>(V)).to(DType::i64).to_vector<int64_t>();
  tv[3] = -100;  // an ignored target
  const Tensor targets = from_vector(tv, {2, 5});
  // Whole: embed, then the tied head, then the loss.
  Tensor tw = table.clone().requires_grad_();
  Tensor hw = ops::embedding(tw, ids);
  Tensor xw = ops::add(hw, random({2, 5, D}, 52));  // something between lookup and head
  Tensor logits = ops::matmul(xw, ops::transpose(tw, 0, 1));
  Tensor loss = ops::cross_entropy(logits, targets);
  loss.backward();
  // Split over the ranks.
  tp::VocabParallelEmbedding emb(V, D, g);
  emb.to(Device::cpu(), DType::f64);
  emb.load_whole(table);
  EXPECT_EQ(emb.weight.shape(), (Shape{V / W, D}));
  EXPECT_EQ(emb.vocab_start, r * (V / W));
  Tensor h = emb.forward(ids);
  expect_near(h, hw.detach(), "embedding lookup (whole on every rank)");
  Tensor x = ops::add(h, random({2, 5, D}, 52));
  Tensor local_logits = emb.attend(x);
  expect_near(local_logits, ops::narrow(logits.detach(), 2, r * (V / W), V / W).contiguous(), "tied head (this rank's classes)");
  Tensor l = tp::vocab_parallel_cross_entropy(local_logits, targets, emb.vocab_start, g);
  expect_near(l, loss.detach(), "loss");
  l.backward();
  expect_near(emb.weight.grad(), tp::shard(tw.grad(), 0, r, W), "table gradient (this rank's rows: lookup and head)");
}

// A whole model and the same model built with tp::layer_spec over the world, loaded from the whole
// one's state: the same loss, and each rank's gradients are its shards of the whole gradients.
template <class Model, class Config>
void expect_model_matches(const Config& cfg, const std::string& what, bool sequence_parallel = false,
                          int64_t head_dim = 0) {
  const auto g = world();
  Model whole(cfg, 7);
  whole.to(Device::cpu(), DType::f64);
  Model split(cfg, 7, tp::layer_spec(g, sequence_parallel, head_dim));
  split.to(Device::cpu(), DType::f64);
  std::map<std::string, Tensor> state;
  for (const auto& [n, t] : whole.state_dict()) state[n] = t;
  tp::load_whole_state(split, state);
  Generator gen(60);
  const Tensor idx = ops::mul(uniform({2, 8}, 0.0, 1.0, kF64, &gen), static_cast<double>(cfg.vocab_size)).to(DType::i64);
  const Tensor targets = ops::mul(uniform({2, 8}, 0.0, 1.0, kF64, &gen), static_cast<double>(cfg.vocab_size)).to(DType::i64);
  Tensor lw = whole.loss(idx, targets);
  lw.backward();
  Tensor ls = split.loss(idx, targets);
  expect_near(ls, lw.detach(), what + ": loss");
  ls.backward();
  tp::reduce_grads(split, g, sequence_parallel);
  // The whole model's gradients, cut the way the split model's parameters are.
  std::map<std::string, Tensor> grads;
  for (const auto& [n, p] : whole.named_parameters()) grads[n] = p.grad();
  Model expected(cfg, 7, tp::layer_spec(g, sequence_parallel, head_dim));
  expected.to(Device::cpu(), DType::f64);
  tp::load_whole_state(expected, grads);
  const auto want = expected.named_parameters();
  const auto got = split.named_parameters();
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < got.size(); ++i) expect_near(got[i].second.grad(), want[i].second.detach(), what + ": gradient of " + got[i].first);
}

TEST(TensorParallelMpi, GptSplitOverTheRanksMatchesTheWholeModel) {
  expect_model_matches<nn::GPT>(testing::tiny_gpt_config(), "GPT");
}

// Under sequence parallelism with the queue (Note [weight gradients behind the collective]), the
// linears keep no gathered copy of their input for backward: the entry keeps its slice and
// gathers it again. What a forward leaves for backward is then smaller than without the queue.
TEST(TensorParallelMpi, SequenceParallelLinearsKeepOnlyTheirSliceForBackward) {
  const auto g = world();
  if (g->size() == 1) GTEST_SKIP() << "one rank gathers nothing";
  std::vector<int64_t> held;
  for (const char* overlap : {"1", "0"}) {
    env::Override o("FORGE_TP_OVERLAP", std::string(overlap));
    nn::Llama m(testing::tiny_llama_config(4), 7, tp::layer_spec(g, true, 8));
    m.to(Device::cpu(), DType::f64);
    Generator gen(62);
    const Tensor idx = ops::mul(uniform({2, 16}, 0.0, 1.0, kF64, &gen), 64.0).to(DType::i64);
    const int64_t before = cpu_memory_stats().allocated;
    Tensor loss = m.loss(idx, idx);
    held.push_back(cpu_memory_stats().allocated - before);
    loss.backward();
  }
  // Per block, two regions (attention, MLP), each a (2, 16, 64) f64 gathered input where the
  // slice (2, 16 / W, 64) is kept instead.
  const int W = g->size();
  const int64_t saved = 2 * 2 * (2 * 16 * 64 * 8) * (W - 1) / W;
  EXPECT_LE(held[0], held[1] - saved) << "with the queue " << held[0] << " bytes, without " << held[1];
}

// Note [fused vocabulary-parallel cross-entropy]: the loss over a rank's slice of the logits keeps
// what cross_entropy over the same slice keeps (the slice and a few values per row), makes no
// (N, V / W) temporary in forward, and has its backward write dlogits with cross_entropy's kernel:
// the peak of a forward and backward is within a few per-row vectors of cross_entropy's, the
// slice and its gradient. (The first, composed version kept f32 copies of the slice and made more.)
TEST(TensorParallelMpi, VocabParallelCrossEntropyKeepsWhatCrossEntropyKeeps) {
  const auto g = world();
  const int W = g->size(), r = g->rank();
  const int64_t N = 256, V = 512 * W, local = V / W;
  Generator gen(70);
  const Tensor whole = uniform({N, V}, -3.0, 3.0, {.dtype = DType::f32}, &gen);
  std::vector<int64_t> tv = ops::mul(uniform({N}, 0.0, 1.0, kF64, &gen), static_cast<double>(V)).to(DType::i64).to_vector<int64_t>();
  tv[5] = -100;
  const Tensor targets = from_vector(tv, {N});
  const Tensor slice = ops::narrow(whole, 1, r * local, local).contiguous();
  std::vector<int64_t> lv(tv);
  for (int64_t& t : lv) t = t < 0 ? t : t % local;
  const Tensor local_targets = from_vector(lv, {N});
  auto measure = [&](bool parallel, Tensor* loss_out, Tensor* grad_out) {
    Tensor logits = slice.clone().requires_grad_();
    // A non-leaf, as a head's output, which the loss may overwrite with its gradient.
    Tensor head = ops::mul(logits, 1.0);
    const int64_t before = cpu_memory_stats().allocated;
    reset_cpu_peak_memory();
    Tensor loss = parallel ? tp::vocab_parallel_cross_entropy(head, targets, r * local, g)
                           : ops::cross_entropy(head, local_targets);
    head = Tensor();
    const int64_t kept = cpu_memory_stats().allocated - before;
    loss.backward();
    const int64_t peak = cpu_memory_stats().peak_allocated - before;
    if (loss_out) *loss_out = loss.detach();
    if (grad_out) *grad_out = logits.grad();
    return std::pair<int64_t, int64_t>{kept, peak};
  };
  Tensor loss, grad;
  const auto [vp_kept, vp_peak] = measure(true, &loss, &grad);
  // cross_entropy over the same slice (targets folded into it).
  const auto [ce_kept, ce_peak] = measure(false, nullptr, nullptr);
  const int64_t slice_bytes = N * local * 4, per_row = N * 8;
  EXPECT_LE(vp_kept, ce_kept + 8 * per_row) << "kept " << vp_kept << " vs cross_entropy's " << ce_kept;
  EXPECT_LE(vp_peak, ce_peak + 8 * per_row) << "peak " << vp_peak << " vs cross_entropy's " << ce_peak;
  EXPECT_LE(vp_peak, 2 * slice_bytes + 8 * per_row) << "peak " << vp_peak << " for a slice of " << slice_bytes << " bytes";
  // And the numbers: the whole vocabulary's loss and this rank's columns of its gradient.
  Tensor wl = whole.clone().requires_grad_();
  Tensor want = ops::cross_entropy(wl, targets);
  want.backward();
  EXPECT_NEAR(loss.item<double>(), want.item<double>(), 1e-5);
  const Tensor want_grad = ops::narrow(wl.grad(), 1, r * local, local).contiguous();
  EXPECT_LT(ops::amax(ops::abs(ops::sub(grad, want_grad)), {0, 1}, false).item<double>(), 1e-6);
}

// Note [weight gradients behind the collective]: the weight gradients queued behind the region's
// collective (FORGE_TP_OVERLAP, on by default) are those computed in order, bit for bit.
TEST(TensorParallelMpi, WeightGradientsBehindTheCollectiveAreTheSameBits) {
  const auto g = world();
  for (const bool sp : {false, true}) {
    std::vector<std::vector<double>> runs;
    for (const char* overlap : {"1", "0"}) {
      env::Override o("FORGE_TP_OVERLAP", std::string(overlap));
      nn::Llama m(testing::tiny_llama_config(4), 7, tp::layer_spec(g, sp, 8));
      m.to(Device::cpu(), DType::f64);
      Generator gen(61);
      const Tensor idx = ops::mul(uniform({2, 8}, 0.0, 1.0, kF64, &gen), 64.0).to(DType::i64);
      m.loss(idx, idx).backward();
      tp::reduce_grads(m, g, sp);
      std::vector<double> all;
      for (const auto& [n, p] : m.named_parameters()) {
        ASSERT_TRUE(p.grad().defined()) << n << (overlap[0] == '1' ? " (overlap on)" : " (overlap off)");
        for (double v : p.grad().to_vector<double>()) all.push_back(v);
      }
      runs.push_back(all);
    }
    ASSERT_EQ(runs[0].size(), runs[1].size());
    for (size_t i = 0; i < runs[0].size(); ++i) ASSERT_EQ(runs[0][i], runs[1][i]) << (sp ? "sp " : "") << "element " << i;
  }
}

TEST(TensorParallelMpi, LlamaSplitOverTheRanksMatchesTheWholeModel) {
  const int64_t head_dim = 8;  // tiny_llama_config: 64 wide, 8 heads
  expect_model_matches<nn::Llama>(testing::tiny_llama_config(4), "LLaMA, 8 query heads over 4 key-value heads");
  // At 4 ranks: fewer key-value heads than ranks, replicated (the spec is given the head size).
  expect_model_matches<nn::Llama>(testing::tiny_llama_config(2), "LLaMA, 8 query heads over 2 key-value heads", false,
                                  head_dim);
  expect_model_matches<nn::Llama>(testing::tiny_llama_config(1), "LLaMA, one key-value head (multi-query)", false,
                                  head_dim);
  expect_model_matches<nn::Llama>(testing::tiny_llama_config(1), "LLaMA, one key-value head, sequence parallel", true,
                                  head_dim);
}

// Sequence parallelism: norms, residual adds and (GPT) the position embedding on T / W positions
// per rank; the same loss and, once the whole parameters' partial gradients are summed, the same
// gradients.
TEST(TensorParallelMpi, SequenceParallelGptAndLlamaMatchTheWholeModel) {
  expect_model_matches<nn::GPT>(testing::tiny_gpt_config(), "GPT, sequence parallel", true);
  expect_model_matches<nn::Llama>(testing::tiny_llama_config(4), "LLaMA, sequence parallel", true);
}

TEST(TensorParallelMpi, SizesTpDoesNotDivideAreRefusedWithTheirName) {
  const auto g = world();
  if (g->size() == 1) GTEST_SKIP() << "every size divides by 1";
  try {
    tp::ColumnParallelLinear bad(8, 2 * g->size() + 1, false, g);
    FAIL() << "an out_features tp does not divide must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out_features"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not divisible by the tensor-parallel size"), std::string::npos) << e.what();
  }
  EXPECT_THROW(tp::RowParallelLinear(2 * g->size() + 1, 8, false, g), Error);
  // Fewer key-value heads than ranks and no head size given to the spec: refused, naming the linear.
  try {
    nn::Llama m(testing::tiny_llama_config(1), 7, tp::layer_spec(g));
    FAIL() << "one key-value head over " << g->size() << " ranks must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("attention_k"), std::string::npos) << e.what();
  }
  EXPECT_THROW(tp::shard(random({5, 2}, 40), 0, 0, 2), Error);
}

}  // namespace
}  // namespace forge::parallel
