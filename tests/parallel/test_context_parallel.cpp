// Context parallelism's sequence layout (Note [context-parallel sequence layout]): each rank's
// positions and its part of a batch, one process (the attention over real ranks is in
// tests/parallel/mpi/test_context_parallel_mpi.cpp).
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "forge/core/error.h"
#include "forge/forge.h"
#include "forge/parallel/context_parallel.h"

namespace forge::parallel {
namespace {

TEST(ContextParallel, EachRankHoldsAnEarlyAndALateChunkAndTogetherEveryPosition) {
  for (int W : {1, 2, 3, 4}) {
    const int64_t T = 8 * W, t = T / W;
    std::set<int64_t> seen;
    for (int r = 0; r < W; ++r) {
      const auto ranges = cp::local_ranges(t, r, W);
      int64_t n = 0;
      for (const auto& p : ranges) {
        for (int64_t i = 0; i < p.length; ++i) EXPECT_TRUE(seen.insert(p.start + i).second) << "position twice";
        n += p.length;
      }
      EXPECT_EQ(n, t);
      if (W > 1) {  // chunks r and 2W-1-r: the causal work of the two adds up to the same for every rank
        ASSERT_EQ(ranges.size(), 2u);
        EXPECT_EQ(ranges[0].start, r * (t / 2));
        EXPECT_EQ(ranges[1].start, (2 * W - 1 - r) * (t / 2));
      }
    }
    EXPECT_EQ(static_cast<int64_t>(seen.size()), T);
    EXPECT_EQ(*seen.rbegin(), T - 1);
  }
}

TEST(ContextParallel, ARanksPartOfTheBatchIsItsPositionsTokens) {
  const int W = 3;
  const int64_t B = 2, T = 12;
  std::vector<int64_t> ids;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < T; ++s) ids.push_back(100 * b + s);
  const Tensor whole = from_vector(ids, {B, T});
  for (int r = 0; r < W; ++r) {
    const Tensor part = cp::local_sequence(whole, r, W);
    ASSERT_EQ(part.shape(), (Shape{B, T / W}));
    const auto got = part.to_vector<int64_t>();
    std::vector<int64_t> want;
    for (int64_t b = 0; b < B; ++b)
      for (const auto& p : cp::local_ranges(T / W, r, W))
        for (int64_t i = 0; i < p.length; ++i) want.push_back(100 * b + p.start + i);
    EXPECT_EQ(got, want) << "rank " << r;
  }
  try {
    (void)cp::local_sequence(from_vector(std::vector<int64_t>(10, 0), {1, 10}), 0, 3);
    FAIL() << "a sequence of 10 cut into 6 chunks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("train.seq_len a multiple of 6"), std::string::npos) << e.what();
  }
}

TEST(ContextParallel, KindsByName) {
  EXPECT_EQ(cp::kind_from_name("ring"), cp::Kind::ring);
  EXPECT_EQ(cp::kind_from_name("ulysses"), cp::Kind::ulysses);
  try {
    (void)cp::kind_from_name("zigzag");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dist.cp_kind = 'zigzag'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace forge::parallel
