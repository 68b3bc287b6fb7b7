// parallel::make_hierarchical over real ranks (mpirun -np 1/2/4): the node-first reductions give
// every rank what the flat group gives it (exactly for integer-valued f64, where the summation
// order cannot matter; within rounding for bf16), for all_reduce, reduce_scatter and all_gather,
// with several operations in flight at once as the gradient buckets start them.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "forge/core/error.h"
#include "forge/ops/creation.h"
#include "forge/parallel/hierarchical_group.h"
#include "forge/parallel/paced_group.h"
#include "forge/parallel/world.h"

namespace forge::parallel {
namespace {

// Fresh integer-valued values in [-1000, 1000], different on every rank and call.
Tensor random_ints(int64_t n, uint32_t salt, DType dtype = DType::f64) {
  std::mt19937 gen(1000u * salt + static_cast<uint32_t>(world()->rank()) * 7919u + 17u);
  std::uniform_int_distribution<int> d(-1000, 1000);
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(gen);
  return from_vector(v, {n}, {.dtype = DType::f64}).to(Device::cpu(), dtype);
}

std::vector<double> values(const Tensor& t) { return t.to(Device::cpu(), DType::f64).to_vector<double>(); }

TEST(HierarchicalGroupMpi, OneNodeOrOneRankPerNodeIsTheFlatGroup) {
  const ProcessGroupPtr w = world();
  EXPECT_EQ(make_hierarchical(w, 1), w);
  EXPECT_EQ(make_hierarchical(w, w->size()), w);
}

TEST(HierarchicalGroupMpi, ANodeSizeThatDoesNotDivideTheGroupIsRefusedNamingTheSetting) {
  const ProcessGroupPtr w = world();
  if (w->size() != 4) GTEST_SKIP() << "needs 4 ranks (runs under parallel_mpi_np4)";
  try {
    make_hierarchical(w, 3);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dist.node_size"), std::string::npos) << e.what();
  }
}

class HierarchicalOnFourRanks : public ::testing::Test {
 protected:
  void SetUp() override {
    if (world()->size() != 4) GTEST_SKIP() << "needs 4 ranks (runs under parallel_mpi_np4)";
    flat_ = world();
    hier_ = make_hierarchical(flat_, 2);  // 2 nodes of 2
  }
  ProcessGroupPtr flat_, hier_;
};

TEST_F(HierarchicalOnFourRanks, IsNotTheFlatGroupAndKeepsItsRanks) {
  ASSERT_NE(hier_, flat_);
  EXPECT_EQ(hier_->rank(), flat_->rank());
  EXPECT_EQ(hier_->size(), 4);
  EXPECT_EQ(hier_->backend(), flat_->backend());
}

TEST_F(HierarchicalOnFourRanks, AllReduceEqualsTheFlatOneForEveryOpAndSize) {
  uint32_t salt = 1;
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min})
    for (int64_t n : {int64_t{1}, int64_t{2}, int64_t{7}, int64_t{8}, int64_t{1001}}) {
      SCOPED_TRACE(std::string(reduce_op_name(op)) + " n=" + std::to_string(n));
      const Tensor x = random_ints(n, salt++);
      Tensor a = x.clone(), b = x.clone();
      hier_->all_reduce(a, op)->wait();
      flat_->all_reduce(b, op)->wait();
      EXPECT_EQ(values(a), values(b));
    }
}

TEST_F(HierarchicalOnFourRanks, ReduceScatterGivesEachRankItsOwnSlice) {
  uint32_t salt = 100;
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max})
    for (int64_t s : {int64_t{1}, int64_t{3}, int64_t{256}}) {
      SCOPED_TRACE(std::string(reduce_op_name(op)) + " shard=" + std::to_string(s));
      const Tensor in = random_ints(4 * s, salt++);
      Tensor a = zeros({s}, {.dtype = DType::f64}), b = zeros({s}, {.dtype = DType::f64});
      hier_->reduce_scatter(a, in.clone(), op)->wait();
      flat_->reduce_scatter(b, in.clone(), op)->wait();
      EXPECT_EQ(values(a), values(b));
    }
}

TEST_F(HierarchicalOnFourRanks, AllGatherPutsEveryRanksSliceInRankOrder) {
  for (int64_t s : {int64_t{1}, int64_t{5}, int64_t{300}}) {
    SCOPED_TRACE("shard=" + std::to_string(s));
    const Tensor in = random_ints(s, 200 + static_cast<uint32_t>(s));
    Tensor a = zeros({4 * s}, {.dtype = DType::f64}), b = zeros({4 * s}, {.dtype = DType::f64});
    hier_->all_gather(a, in)->wait();
    flat_->all_gather(b, in)->wait();
    EXPECT_EQ(values(a), values(b));
  }
}

// As GradientBuckets starts them: several reductions in flight, waited for in order at the end,
// and one polled with is_completed() until it is done.
TEST_F(HierarchicalOnFourRanks, SeveralOperationsInFlightCompleteInOrder) {
  std::vector<Tensor> a, b;
  std::vector<WorkPtr> works;
  for (uint32_t i = 0; i < 5; ++i) {
    const Tensor x = random_ints(64 + 13 * i, 300 + i);
    a.push_back(x.clone());
    b.push_back(x.clone());
    works.push_back(hier_->all_reduce(a.back(), ReduceOp::avg));
  }
  while (!works[0]->is_completed()) {
  }
  for (auto& w : works) w->wait();
  for (auto& t : b) flat_->all_reduce(t, ReduceOp::avg)->wait();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(values(a[i]), values(b[i])) << "operation " << i;
}

// bf16 (values in [-1000, 1000]): each stage rounds its average to bf16 (8 significant bits, an
// error of at most 1000 x 2^-9 at the node stage, half that at the final one), so both groups'
// results stay within 2^-8 x 1000 of the exact f64 average; a wrong slice would be off by hundreds.
TEST_F(HierarchicalOnFourRanks, Bf16ReductionsStayWithinRoundingOfTheExactAverage) {
  const Tensor x = random_ints(4096, 400, DType::bf16);
  Tensor a = x.clone(), b = x.clone(), exact = x.to(Device::cpu(), DType::f64);
  hier_->all_reduce(a, ReduceOp::avg)->wait();
  flat_->all_reduce(b, ReduceOp::avg)->wait();
  flat_->all_reduce(exact, ReduceOp::avg)->wait();
  const std::vector<double> va = values(a), vb = values(b), ve = values(exact);
  for (size_t i = 0; i < va.size(); ++i) {
    ASSERT_NEAR(va[i], ve[i], 1000.0 / 256) << i;
    ASSERT_NEAR(vb[i], ve[i], 1000.0 / 256) << i;
  }
}

}  // namespace
}  // namespace forge::parallel

namespace forge::parallel {
namespace {

double seconds_of(const std::function<void()>& f) {
  world()->barrier()->wait();
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Note [paced link]: an operation on a paced group completes no earlier than the link's time for
// the bytes its ring sends, and operations queue on the link one after another; the values are
// the inner group's. (The upper bounds are loose: 4 ranks share 2 cores here.)
TEST(PacedGroupMpi, OperationsTakeTheLinksTimeAndQueueOnIt) {
  const ProcessGroupPtr w = world();
  if (w->size() < 2) GTEST_SKIP() << "needs 2 or more ranks";
  const int W = w->size();
  const LinkPace pace{.gbps = 1.0, .latency_us = 100, .share = 1};
  const ProcessGroupPtr g = make_paced(w, pace);
  const int64_t n = 1 << 20;  // 4 MB of f32
  const double want = paced_seconds(pace, 2.0 * (W - 1) / W * n * 4, 2 * (W - 1));
  EXPECT_NEAR(want, 2.0 * (W - 1) / W * 4 * 8 * n / 1e9 + 2 * (W - 1) * 100e-6, 1e-12);
  Tensor a = random_ints(n, 500, DType::f32), b = a.clone();
  const double one = seconds_of([&] { g->all_reduce(a, ReduceOp::sum)->wait(); });
  w->all_reduce(b, ReduceOp::sum)->wait();
  EXPECT_EQ(values(a), values(b));
  EXPECT_GE(one, want);
  EXPECT_LT(one, 3 * want + 0.2);
  const double two = seconds_of([&] {
    WorkPtr x = g->all_reduce(a, ReduceOp::sum), y = g->all_reduce(b, ReduceOp::sum);
    x->wait();
    y->wait();
  });
  EXPECT_GE(two, 2 * want);  // the second waited for the link
}

// On 2 simulated nodes of 2 with the same link, the hierarchical all-reduce sends each node's bytes
// once over it (2 (N-1)/N S = S, shared by the 2 inter-node groups) where the flat ring sends
// 2 (W-1)/W S = 1.5 S: the paced times differ by that ratio.
TEST(PacedGroupMpi, HierarchicalReductionCrossesTheLinkWithFewerBytesThanTheFlatRing) {
  const ProcessGroupPtr w = world();
  if (w->size() != 4) GTEST_SKIP() << "needs 4 ranks (runs under parallel_mpi_np4)";
  // (0.25 Gb/s: the link's time, 0.2 s flat, dwarfs the unpaced intra-node stages even when ctest
  // runs other jobs beside these 4 ranks on 2 cores.)
  const NodeLayout flat_nodes{.node_size = 2, .hierarchical = false, .link = {.gbps = 0.25, .latency_us = 0}};
  NodeLayout hier_nodes = flat_nodes;
  hier_nodes.hierarchical = true;
  const std::vector<int> ranks = {0, 1, 2, 3};
  const ProcessGroupPtr flat = node_aware_group(w, ranks, flat_nodes), hier = node_aware_group(w, ranks, hier_nodes);
  ASSERT_NE(flat, w);
  const int64_t n = 1 << 20;
  const double S = 4.0 * n, rate = 0.25e9 / 8;
  Tensor a = random_ints(n, 600, DType::f32), b = a.clone();
  const double t_flat = seconds_of([&] { flat->all_reduce(a, ReduceOp::avg)->wait(); });
  const double t_hier = seconds_of([&] { hier->all_reduce(b, ReduceOp::avg)->wait(); });
  EXPECT_EQ(values(a), values(b));  // (integer values: exact either way)
  EXPECT_GE(t_flat, 1.5 * S / rate);
  EXPECT_GE(t_hier, 1.0 * S / rate);
  EXPECT_LT(t_hier, t_flat - 0.2 * S / rate);  // (a third of the link's time saved; a fifth asked)
}

}  // namespace
}  // namespace forge::parallel

#include "forge/parallel/powersgd.h"

namespace forge::parallel {
namespace {

// Note [PowerSGD] on real ranks: a rank no smaller than the matrices' makes P span the averaged
// gradient's columns, so the compressed reduction is the average (to f32 rounding); a vector goes
// uncompressed, exactly. At rank 1 the result is rank 1, and what it left out stays as this rank's
// error feedback: the steps after it (zero gradients) send the leftovers, until the sum of what
// was sent is the average.
DpState powersgd_state(const ProcessGroupPtr& g, std::vector<Tensor>& params) {
  DpState st;
  st.group = g;
  st.device = Device::cpu();
  params = {zeros({24, 16}), zeros({16}), zeros({16, 40})};
  DpBucket b;
  int64_t off = 0;
  const char* names[] = {"p0", "p1", "p2"};
  for (size_t i = 0; i < params.size(); ++i) {
    st.params.push_back({names[i], params[i], 0, -1, off, params[i].numel()});
    b.params.push_back(static_cast<int>(i));
    off += params[i].numel();
  }
  b.numel = b.padded = off;
  st.buckets.push_back(b);
  return st;
}

TEST(PowerSgdMpi, AtFullRankTheCompressedReductionIsTheAverage) {
  const ProcessGroupPtr w = world();
  std::vector<Tensor> params;
  const DpState st = powersgd_state(w, params);
  PowerSgd psgd(st, /*rank=*/16, /*seed=*/7, /*compress_all=*/true);
  const int64_t n = st.buckets[0].numel;
  Tensor grads = random_ints(n, 700, DType::f32), want = grads.clone();
  w->all_reduce(want, ReduceOp::avg)->wait();
  psgd.reduce(0, grads);
  const std::vector<double> got = values(grads), exp = values(want);
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], exp[i], 1e-3 * (1 + std::abs(exp[i]))) << i;
  // The vector (24 x 16 = 384 .. 399) went uncompressed: exact.
  for (size_t i = 384; i < 400; ++i) EXPECT_EQ(got[i], exp[i]) << i;
}

TEST(PowerSgdMpi, AtRankOneTheErrorFeedbackSendsWhatWasLeftOut) {
  const ProcessGroupPtr w = world();
  std::vector<Tensor> params;
  const DpState st = powersgd_state(w, params);
  PowerSgd psgd(st, /*rank=*/1, /*seed=*/7);
  EXPECT_LT(psgd.sent_fraction(), 0.2);  // (24 + 16 + 16 + 16 + 40) of 400 + 640 values
  const int64_t n = st.buckets[0].numel;
  Tensor g1 = random_ints(n, 800, DType::f32), want = g1.clone();
  w->all_reduce(want, ReduceOp::avg)->wait();
  Tensor step1 = g1.clone();
  psgd.reduce(0, step1);
  // Steps with zero gradients send only the error feedback: the average of what is left, projected
  // out of the leftovers one direction per step, so the sum of the steps converges to the average.
  Tensor sum = step1.clone();
  for (int k = 0; k < 40; ++k) {
    Tensor step = zeros({n});
    psgd.reduce(0, step);
    sum.add_(step);
  }
  auto dist = [&](const Tensor& a) {
    const std::vector<double> x = values(a), y = values(want);
    double s = 0;
    for (size_t i = 0; i < x.size(); ++i) s += (x[i] - y[i]) * (x[i] - y[i]);
    return std::sqrt(s);
  };
  EXPECT_GT(dist(step1), 1.0);  // rank 1 left most of it out at first
  EXPECT_LT(dist(sum), 0.02 * dist(step1)) << "the error feedback did not send what the first step left out";
}

}  // namespace
}  // namespace forge::parallel
