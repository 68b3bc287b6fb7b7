// Pipeline schedules and stage boundaries (dist/pipeline_schedule.h): every micro-batch's forward
// once and its backward once after it, the backwards in micro-batch order, 1F1B's bound on the
// activations in flight, and the split of the blocks.
#include <gtest/gtest.h>

#include <set>

#include "forge/core/error.h"
#include "forge/dist/pipeline_schedule.h"

namespace forge::dist {
namespace {

void expect_valid(PipelineSchedule kind, int P, int s, int64_t K) {
  const auto a = pp::schedule(kind, P, s, K);
  const bool zb = kind == PipelineSchedule::zb_h1;
  ASSERT_EQ(static_cast<int64_t>(a.size()), (zb ? 3 : 2) * K);
  std::set<int64_t> fwd;
  int64_t next_bwd = 0, next_w = 0;
  for (const auto& x : a) {
    if (x.op == pp::Op::forward) {
      EXPECT_TRUE(fwd.insert(x.micro).second) << "forward of " << x.micro << " twice";
    } else if (x.op == pp::Op::backward) {
      EXPECT_EQ(x.micro, next_bwd++) << "backwards out of micro-batch order";
      EXPECT_TRUE(fwd.count(x.micro)) << "backward of " << x.micro << " before its forward";
    } else {
      EXPECT_TRUE(zb) << "a W pass outside ZB-H1";
      EXPECT_EQ(x.micro, next_w++) << "W passes out of micro-batch order";
      EXPECT_LT(x.micro, next_bwd) << "W of " << x.micro << " before its B";
    }
  }
  EXPECT_EQ(next_bwd, K);
  if (zb) {
    EXPECT_EQ(next_w, K);
  }
}

TEST(PipelineSchedule, EveryMicroBatchRunsForwardThenBackwardOnce) {
  for (auto kind : {PipelineSchedule::gpipe, PipelineSchedule::one_f_one_b, PipelineSchedule::zb_h1})
    for (int P : {1, 2, 4})
      for (int s = 0; s < P; ++s)
        for (int64_t K : {1, 2, 3, 8}) expect_valid(kind, P, s, K);
}

TEST(PipelineSchedule, OneFOneBHoldsAtMostTheStagesAheadGpipeAll) {
  for (int P : {2, 4})
    for (int s = 0; s < P; ++s) {
      EXPECT_EQ(pp::max_in_flight(pp::schedule(PipelineSchedule::one_f_one_b, P, s, 8)), P - s);
      EXPECT_EQ(pp::max_in_flight(pp::schedule(PipelineSchedule::gpipe, P, s, 8)), 8);
    }
  // Stage 0 of 4 over 8 micro-batches: 3 warm-up forwards, then one forward one backward.
  const auto a = pp::schedule(PipelineSchedule::one_f_one_b, 4, 0, 8);
  EXPECT_EQ(a[0], (pp::Action{pp::Op::forward, 0}));
  EXPECT_EQ(a[3], (pp::Action{pp::Op::forward, 3}));
  EXPECT_EQ(a[4], (pp::Action{pp::Op::backward, 0}));
  EXPECT_EQ(a.back(), (pp::Action{pp::Op::backward, 7}));
  // The last stage alternates from the start.
  const auto last = pp::schedule(PipelineSchedule::one_f_one_b, 4, 3, 8);
  EXPECT_EQ(last[1], (pp::Action{pp::Op::backward, 0}));
}

// ZB-H1: the F and B order of 1F1B; stage s's W passes lag its B by its warm-up count (P - s - 1)
// and the owed ones fill the drain; the last stage runs each W right after its B; in flight as 1F1B.
TEST(PipelineSchedule, ZeroBubbleH1DelaysTheWeightPassesIntoTheDrain) {
  for (int P : {2, 4})
    for (int s = 0; s < P; ++s) {
      const auto zb = pp::schedule(PipelineSchedule::zb_h1, P, s, 8);
      const auto f1b = pp::schedule(PipelineSchedule::one_f_one_b, P, s, 8);
      std::vector<pp::Action> no_w;
      for (const auto& x : zb)
        if (x.op != pp::Op::weight) no_w.push_back(x);
      EXPECT_EQ(no_w, f1b) << "stage " << s << " of " << P;
      EXPECT_EQ(pp::max_in_flight(zb), P - s);
      EXPECT_EQ(pp::max_weights_owed(zb), P - s);
    }
  const auto last = pp::schedule(PipelineSchedule::zb_h1, 4, 3, 8);
  EXPECT_EQ(last[1], (pp::Action{pp::Op::backward, 0}));
  EXPECT_EQ(last[2], (pp::Action{pp::Op::weight, 0}));
  // Stage 0 of 4: W(0) only after B(3), then one owed W after each drain B.
  const auto first = pp::schedule(PipelineSchedule::zb_h1, 4, 0, 8);
  size_t w0 = 0, b3 = 0;
  for (size_t i = 0; i < first.size(); ++i) {
    if (first[i] == pp::Action{pp::Op::weight, 0}) w0 = i;
    if (first[i] == pp::Action{pp::Op::backward, 3}) b3 = i;
  }
  EXPECT_EQ(w0, b3 + 1);
}

TEST(PipelineSchedule, BlocksSplitEvenlyOrAsGiven) {
  EXPECT_EQ(pp::stage_blocks(12, 4, 0), (std::pair<int64_t, int64_t>{0, 3}));
  EXPECT_EQ(pp::stage_blocks(12, 4, 3), (std::pair<int64_t, int64_t>{9, 12}));
  EXPECT_EQ(pp::stage_blocks(10, 4, 0), (std::pair<int64_t, int64_t>{0, 3}));
  EXPECT_EQ(pp::stage_blocks(10, 4, 1), (std::pair<int64_t, int64_t>{3, 6}));
  EXPECT_EQ(pp::stage_blocks(10, 4, 2), (std::pair<int64_t, int64_t>{6, 8}));
  EXPECT_EQ(pp::stage_blocks(10, 4, 3), (std::pair<int64_t, int64_t>{8, 10}));
  EXPECT_EQ(pp::stage_blocks(10, 2, 1, {7, 3}), (std::pair<int64_t, int64_t>{7, 10}));
  EXPECT_THROW(pp::stage_blocks(10, 2, 0, {7, 2}), Error);
  EXPECT_THROW(pp::stage_blocks(10, 2, 0, {10, 0}), Error);
  EXPECT_THROW(pp::stage_blocks(10, 3, 0, {5, 5}), Error);
}

}  // namespace
}  // namespace forge::dist
