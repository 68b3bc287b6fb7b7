// parallel::Fp8GradReduce over real ranks (mpirun -np 1/2/4; Note [FP8 gradient reduction]):
// its all-reduce and reduce-scatter against a reference that every rank computes from all ranks'
// raw inputs with the FP8 recipes' CPU emulation (fp8::quantize rowwise, groups of 128: another
// implementation of the same rounding), over several steps of error feedback; flat and
// hierarchical (4 ranks as 2 nodes of 2); the error feedback's promise (the sum of the steps stays
// within one step's rounding of the exact sum); non-finite blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "forge/ops/creation.h"
#include "forge/ops/fp8.h"
#include "forge/parallel/fp8_reduce.h"
#include "forge/parallel/hierarchical_group.h"
#include "forge/parallel/world.h"

namespace forge::parallel {
namespace {

using Vec = std::vector<float>;

// Fresh values, different on every rank, call and block: each 128-block's magnitude drawn from
// 2^-8 .. 2^8 so that the blocks' scales differ.
Vec random_grads(int64_t n, uint32_t salt, int rank) {
  std::mt19937 gen(977u * salt + static_cast<uint32_t>(rank) * 7919u + 3u);
  std::uniform_real_distribution<float> u(-1, 1), e(-8, 8);
  Vec v(static_cast<size_t>(n));
  float mag = 1;
  for (int64_t i = 0; i < n; ++i) {
    if (i % 128 == 0) mag = std::exp2(e(gen));
    v[static_cast<size_t>(i)] = u(gen) * mag;
  }
  return v;
}

DpState one_bucket_state(const ProcessGroupPtr& g) {
  DpState st;
  st.group = g;
  st.device = Device::cpu();
  st.buckets.push_back(DpBucket{});
  return st;
}

// Every rank's vector, by rank.
std::vector<Vec> gather_all(const ProcessGroupPtr& g, const Vec& mine) {
  const int64_t n = static_cast<int64_t>(mine.size());
  Tensor out = zeros({g->size() * n});
  g->all_gather(out, from_vector(mine, {n}))->wait();
  const Vec all = out.to_vector<float>();
  std::vector<Vec> by_rank;
  for (int r = 0; r < g->size(); ++r) by_rank.emplace_back(all.begin() + r * n, all.begin() + (r + 1) * n);
  return by_rank;
}

// x rounded through the recipes' emulation: rows of 128, one e4m3 scale s each; decoded as the
// wire decodes, code x (1 / s) in f32.
Vec coded(const Vec& x) {
  const int64_t rows = static_cast<int64_t>(x.size()) / 128;
  const fp8::Quantized q = fp8::quantize(from_vector(x, {rows, 128}), fp8::Format::e4m3, fp8::Recipe::rowwise,
                                         fp8::Operand::activation);
  const std::vector<uint8_t> codes = q.codes.to_vector<uint8_t>();
  const Vec scales = q.scales.to_vector<float>();
  Vec out(x.size());
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<float>(fp8::decode(codes[i], fp8::Format::e4m3)) * (1.0f / scales[i / 128]);
  return out;
}

// Note [FP8 gradient reduction] steps 1-5 for W members with inputs x[r] (each of length W C),
// their error feedback (ew[r], eo[r]) carried in and out. Returns each member's result: the whole
// average (gather) or its own chunk (C).
std::vector<Vec> reference(const std::vector<Vec>& x, std::vector<Vec>& ew, std::vector<Vec>& eo, bool gather) {
  const int64_t W = static_cast<int64_t>(x.size()), L = static_cast<int64_t>(x[0].size()), C = L / W,
                Cp = (C + 127) / 128 * 128;
  std::vector<Vec> q(static_cast<size_t>(W));  // member r's coded chunks, (W, Cp)
  for (int64_t r = 0; r < W; ++r) {
    Vec m(static_cast<size_t>(L)), chunks(static_cast<size_t>(W * Cp), 0.0f);
    for (int64_t i = 0; i < L; ++i) m[i] = x[r][i] + (ew[r].empty() ? 0.0f : ew[r][i]);
    for (int64_t j = 0; j < W; ++j)
      for (int64_t i = 0; i < C; ++i) chunks[j * Cp + i] = m[j * C + i];
    q[r] = coded(chunks);
    ew[r].assign(static_cast<size_t>(L), 0.0f);
    for (int64_t j = 0; j < W; ++j)
      for (int64_t i = 0; i < C; ++i) ew[r][j * C + i] = m[j * C + i] - q[r][j * Cp + i];
  }
  std::vector<Vec> owned(static_cast<size_t>(W));  // what owner j sends: its chunk of the average
  for (int64_t j = 0; j < W; ++j) {
    Vec a(static_cast<size_t>(Cp), 0.0f);
    for (int64_t i = 0; i < Cp; ++i) {
      for (int64_t r = 0; r < W; ++r) a[i] += q[r][j * Cp + i];
      a[i] /= static_cast<float>(W);
    }
    if (!gather) {
      owned[j] = Vec(a.begin(), a.begin() + C);
      continue;
    }
    for (int64_t i = 0; i < Cp && !eo[j].empty(); ++i) a[i] += eo[j][i];
    const Vec g = coded(a);
    eo[j].resize(static_cast<size_t>(Cp));
    for (int64_t i = 0; i < Cp; ++i) eo[j][i] = a[i] - g[i];
    owned[j] = Vec(g.begin(), g.begin() + C);
  }
  if (!gather) return owned;
  Vec whole;
  for (const Vec& o : owned) whole.insert(whole.end(), o.begin(), o.end());
  return std::vector<Vec>(static_cast<size_t>(W), whole);
}

// |a - b| within `rel` of the larger magnitude of each 128-block of b (the sums are in another order).
void expect_close(const Vec& a, const Vec& b, double rel, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t lo = 0; lo < b.size(); lo += 128) {
    const size_t hi = std::min(b.size(), lo + 128);
    float big = 0;
    for (size_t i = lo; i < hi; ++i) big = std::max(big, std::fabs(b[i]));
    for (size_t i = lo; i < hi; ++i)
      ASSERT_LE(std::fabs(a[i] - b[i]), rel * big + 1e-30) << what << " at " << i << ": " << a[i] << " vs " << b[i];
  }
}

// The flat all-reduce, three steps: each rank's result is the reference's (the error feedback of
// both sides carried between the steps), and within e4m3's rounding of the exact average.
TEST(Fp8ReduceMpi, AllReduceIsTheReferencesCodedAverageStepAfterStep) {
  const ProcessGroupPtr w = world();
  const int W = w->size(), me = w->rank();
  const DpState st = one_bucket_state(w);
  Fp8GradReduce red(st);
  const int64_t n = 1000;  // not a multiple of W nor of 128: both paddings
  const int64_t L = (n + W - 1) / W * W;
  std::vector<Vec> ew(static_cast<size_t>(W)), eo(static_cast<size_t>(W));
  for (uint32_t step = 0; step < 3; ++step) {
    const Vec mine = random_grads(n, step, me);
    Tensor grads = from_vector(mine, {n});
    red.all_reduce(0, grads)->wait();
    const Vec got = grads.to_vector<float>();
    std::vector<Vec> x = gather_all(w, mine);
    Vec exact(static_cast<size_t>(n), 0.0f);
    for (auto& v : x) {
      for (int64_t i = 0; i < n; ++i) exact[i] += v[i] / static_cast<float>(W);
      v.resize(static_cast<size_t>(L), 0.0f);
    }
    const std::vector<Vec> want = reference(x, ew, eo, /*gather=*/true);
    if (W == 1) {
      expect_close(got, mine, 0, "one rank: its own gradients");
      continue;
    }
    expect_close(got, Vec(want[me].begin(), want[me].begin() + n), 1e-6, "against the reference");
    // (Later steps carry the earlier steps' rounding, of other magnitudes: not near this average.)
    if (step == 0) expect_close(got, exact, 0.2, "against the exact average");
  }
  if (W > 1) {  // f32 gradients: ~1.03 bytes a value for 4, plus the chunks' padding to 128
    EXPECT_GT(red.sent_fraction(), 0.25);
    EXPECT_LT(red.sent_fraction(), 0.3);
  }
}

// The error feedback's promise: the same gradients every step, and the sum of 40 steps' results
// stays within a couple of steps' rounding of 40 times the average (without it, the rounding of
// every step would add up: 40 times one step's).
TEST(Fp8ReduceMpi, TheErrorFeedbackKeepsTheSumWithinOneStepsRounding) {
  const ProcessGroupPtr w = world();
  if (w->size() == 1) GTEST_SKIP() << "one rank reduces nothing (runs under parallel_mpi_np2 and np4)";
  const DpState st = one_bucket_state(w);
  Fp8GradReduce red(st);
  const int64_t n = 640;
  const Vec mine = random_grads(n, 99, w->rank());
  std::vector<Vec> x = gather_all(w, mine);
  std::vector<double> exact(static_cast<size_t>(n), 0.0), sum(static_cast<size_t>(n), 0.0);
  for (const auto& v : x)
    for (int64_t i = 0; i < n; ++i) exact[i] += static_cast<double>(v[i]) / w->size();
  double first = 0;
  for (int step = 0; step < 40; ++step) {
    Tensor grads = from_vector(mine, {n});
    red.all_reduce(0, grads)->wait();
    const Vec got = grads.to_vector<float>();
    for (int64_t i = 0; i < n; ++i) {
      sum[i] += got[i];
      if (step == 0) first = std::max(first, std::fabs(got[i] - exact[i]));
    }
  }
  double drift = 0;
  for (int64_t i = 0; i < n; ++i) drift = std::max(drift, std::fabs(sum[i] - 40 * exact[i]));
  EXPECT_GT(first, 0) << "the test needs values e4m3 does not hold exactly";
  EXPECT_LT(drift, 3 * first) << "the sum of the steps drifts from the exact sum: the errors are not fed back";
}

// Reduce-scatter (ZeRO-2/3): this rank's slice of the reference's average (no second coding).
TEST(Fp8ReduceMpi, ReduceScatterIsTheReferencesSliceOfTheAverage) {
  const ProcessGroupPtr w = world();
  const int W = w->size(), me = w->rank();
  const DpState st = one_bucket_state(w);
  Fp8GradReduce red(st);
  const int64_t shard = 300;
  std::vector<Vec> ew(static_cast<size_t>(W)), eo(static_cast<size_t>(W));
  for (uint32_t step = 0; step < 2; ++step) {
    const Vec mine = random_grads(W * shard, 50 + step, me);
    Tensor out = zeros({shard});
    red.reduce_scatter(0, out, from_vector(mine, {W * shard}))->wait();
    const std::vector<Vec> want = reference(gather_all(w, mine), ew, eo, /*gather=*/false);
    if (W == 1) expect_close(out.to_vector<float>(), mine, 0, "one rank: its own gradients");
    else expect_close(out.to_vector<float>(), want[me], 1e-6, "against the reference");
  }
}

// Without the error feedback (dist.fp8_error_feedback = "auto" under ZeRO-2/3): every step is
// coded afresh, nothing carried (the reference with empty errors at each step).
TEST(Fp8ReduceMpi, ReduceScatterWithoutErrorFeedbackCodesEachStepAfresh) {
  const ProcessGroupPtr w = world();
  const int W = w->size(), me = w->rank();
  if (W == 1) GTEST_SKIP() << "one rank reduces nothing (runs under parallel_mpi_np2 and np4)";
  const DpState st = one_bucket_state(w);
  Fp8GradReduce red(st, Fp8Feedback{.all_reduce = true, .reduce_scatter = false});
  const int64_t shard = 300;
  for (uint32_t step = 0; step < 3; ++step) {
    const Vec mine = random_grads(W * shard, 60 + step, me);
    Tensor out = zeros({shard});
    red.reduce_scatter(0, out, from_vector(mine, {W * shard}))->wait();
    std::vector<Vec> ew(static_cast<size_t>(W)), eo(static_cast<size_t>(W));
    const std::vector<Vec> want = reference(gather_all(w, mine), ew, eo, /*gather=*/false);
    expect_close(out.to_vector<float>(), want[me], 1e-6, "against the reference without feedback");
  }
}

class Fp8ReduceHierarchical : public ::testing::Test {
 protected:
  void SetUp() override {
    if (world()->size() != 4) GTEST_SKIP() << "needs 4 ranks (runs under parallel_mpi_np4)";
    hier_ = make_hierarchical(world(), 2);  // 2 nodes of 2: ranks 0, 1 | 2, 3
  }
  // The node's exact average of every rank's vector (f32, as MPI's avg: the sum, then / 2).
  static Vec node_average(const std::vector<Vec>& x, int node) {
    Vec a(x[0].size());
    for (size_t i = 0; i < a.size(); ++i) a[i] = (x[2 * node][i] + x[2 * node + 1][i]) / 2.0f;
    return a;
  }
  ProcessGroupPtr hier_;
};

// Only the stage between nodes is coded: the node's exact average, then steps 1-5 between the two
// ranks of the same local index, each on its half of the bucket; then the node's all-gather.
TEST_F(Fp8ReduceHierarchical, AllReduceCodesOnlyTheStageBetweenNodes) {
  const DpState st = one_bucket_state(hier_);
  Fp8GradReduce red(st);
  const int me = world()->rank(), local = me % 2;
  const int64_t n = 1001, s = (n + 1) / 2 + ((n + 1) / 2) % 2;  // the node's slice, a multiple of 2 nodes
  std::vector<std::vector<Vec>> ew(2, std::vector<Vec>(2)), eo(2, std::vector<Vec>(2));  // [local][node]
  for (uint32_t step = 0; step < 3; ++step) {
    const Vec mine = random_grads(n, 20 + step, me);
    Tensor grads = from_vector(mine, {n});
    red.all_reduce(0, grads)->wait();
    std::vector<Vec> x = gather_all(world(), mine);
    for (auto& v : x) v.resize(static_cast<size_t>(2 * s), 0.0f);
    Vec want(static_cast<size_t>(2 * s));
    for (int l = 0; l < 2; ++l) {  // each local index's pair of nodes
      std::vector<Vec> slices;
      for (int node = 0; node < 2; ++node) {
        const Vec a = node_average(x, node);
        slices.emplace_back(a.begin() + l * s, a.begin() + (l + 1) * s);
      }
      const Vec r = reference(slices, ew[l], eo[l], /*gather=*/true)[0];
      std::copy(r.begin(), r.end(), want.begin() + l * s);
    }
    want.resize(static_cast<size_t>(n));
    expect_close(grads.to_vector<float>(), want, 1e-6, local == 0 ? "local 0" : "local 1");
  }
}

TEST_F(Fp8ReduceHierarchical, ReduceScatterKeepsTheHierarchicalGroupsSliceOrder) {
  const DpState st = one_bucket_state(hier_);
  Fp8GradReduce red(st);
  const int me = world()->rank();
  const int64_t shard = 200;
  const Vec mine = random_grads(4 * shard, 77, me);
  Tensor out = zeros({shard}), plain = zeros({shard});
  red.reduce_scatter(0, out, from_vector(mine, {4 * shard}))->wait();
  hier_->reduce_scatter(plain, from_vector(mine, {4 * shard}), ReduceOp::avg)->wait();
  // Rank n*2 + l holds slice n*2 + l: the node's exact average of it, coded between the nodes.
  const std::vector<Vec> x = gather_all(world(), mine);
  std::vector<Vec> ew(2), eo(2), slices;
  for (int node = 0; node < 2; ++node) {
    const Vec a = node_average(x, node);
    Vec mine_index;  // this local index's slices of every node, in node order (the coded group's input)
    for (int n2 = 0; n2 < 2; ++n2)
      mine_index.insert(mine_index.end(), a.begin() + (n2 * 2 + me % 2) * shard, a.begin() + (n2 * 2 + me % 2 + 1) * shard);
    slices.push_back(mine_index);
  }
  const Vec want = reference(slices, ew, eo, /*gather=*/false)[static_cast<size_t>(me / 2)];
  expect_close(out.to_vector<float>(), want, 1e-6, "against the reference");
  expect_close(out.to_vector<float>(), plain.to_vector<float>(), 0.2, "against the exact hierarchical average");
}

// A NaN in one rank's block: that block of the result is NaN on every rank (the step's non-finite
// check sees it), the others are not, and the next step, finite again, is finite everywhere
// (the NaN left in no error feedback).
TEST(Fp8ReduceMpi, ANonFiniteBlockIsNaNEverywhereAndIsNotCarriedToTheNextStep) {
  const ProcessGroupPtr w = world();
  if (w->size() == 1) GTEST_SKIP() << "one rank reduces nothing (runs under parallel_mpi_np2 and np4)";
  const DpState st = one_bucket_state(w);
  Fp8GradReduce red(st);
  const int64_t n = 128 * 2 * w->size();  // chunks of 256: blocks [0, 128), [128, 256) of each
  Vec mine = random_grads(n, 5, w->rank());
  if (w->rank() == 0) mine[130] = std::numeric_limits<float>::quiet_NaN();  // chunk 0's second block
  Tensor grads = from_vector(mine, {n});
  red.all_reduce(0, grads)->wait();
  const Vec got = grads.to_vector<float>();
  for (int64_t i = 0; i < n; ++i)
    EXPECT_EQ(std::isnan(got[i]), i >= 128 && i < 256) << "element " << i;
  Tensor next = from_vector(random_grads(n, 6, w->rank()), {n});
  red.all_reduce(0, next)->wait();
  for (float v : next.to_vector<float>()) ASSERT_TRUE(std::isfinite(v));
}

}  // namespace
}  // namespace forge::parallel
