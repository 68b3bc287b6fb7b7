// Pipeline schedules and stage boundaries (parallel/pipeline_schedule.h): every micro-batch's forward
// once and its backward once after it, the backwards in micro-batch order, 1F1B's bound on the
// activations in flight, and the split of the blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <set>
#include <tuple>
#include <vector>

#include "forge/core/error.h"
#include "forge/parallel/pipeline_schedule.h"

namespace forge::parallel {
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

// ZB-H1: the F and B order of 1F1B; stage s's W passes lag its B by s (Note [pipeline schedules]):
// the first stage runs each W right after its B, the last owes up to P; in flight as 1F1B.
TEST(PipelineSchedule, ZeroBubbleH1DelaysTheWeightPassesOfTheLaterStages) {
  for (int P : {2, 4})
    for (int s = 0; s < P; ++s) {
      const auto zb = pp::schedule(PipelineSchedule::zb_h1, P, s, 8);
      const auto f1b = pp::schedule(PipelineSchedule::one_f_one_b, P, s, 8);
      std::vector<pp::Action> no_w;
      for (const auto& x : zb)
        if (x.op != pp::Op::weight) no_w.push_back(x);
      EXPECT_EQ(no_w, f1b) << "stage " << s << " of " << P;
      EXPECT_EQ(pp::max_in_flight(zb), P - s);
      EXPECT_EQ(pp::max_weights_owed(zb), s + 1);
    }
  // Stage 0 of 4: each W right after its B.
  const auto first = pp::schedule(PipelineSchedule::zb_h1, 4, 0, 8);
  for (size_t i = 0; i + 1 < first.size(); ++i) {
    if (first[i].op == pp::Op::backward) {
      EXPECT_EQ(first[i + 1], (pp::Action{pp::Op::weight, first[i].micro})) << i;
    }
  }
  // The last stage of 4: F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 ...: W(0) only after B(3).
  const auto last = pp::schedule(PipelineSchedule::zb_h1, 4, 3, 8);
  EXPECT_EQ(last[1], (pp::Action{pp::Op::backward, 0}));
  EXPECT_EQ(last[2], (pp::Action{pp::Op::forward, 1}));
  EXPECT_EQ(last[8], (pp::Action{pp::Op::weight, 0}));
}

// What action `a` of rank s needs finished first, as (op, micro-batch, virtual stage) with op 0
// a forward, 1 a backward (B): a forward the forward of virtual stage j - 1 (on the rank before),
// a backward its own forward and the backward of j + 1, a W its B. V virtual stages in all.
using Pass = std::tuple<int, int64_t, int>;
std::vector<Pass> inputs_of(const pp::Action& a, int s, int P, int V) {
  const int j = a.chunk * P + s;
  std::vector<Pass> needs;
  if (a.op == pp::Op::forward && j > 0) needs.push_back({0, a.micro, j - 1});
  if (a.op == pp::Op::backward) {
    needs.push_back({0, a.micro, j});
    if (j < V - 1) needs.push_back({1, a.micro, j + 1});
  }
  if (a.op == pp::Op::weight) needs.push_back({1, a.micro, j});
  return needs;
}

// The step's time, simulated: each rank runs its actions in order, an action starting when its
// rank is free and what it needs has finished (a forward the forward of the stage before, a
// backward its forward and the backward of the stage after, a W its B), with costs f, b, w (1F1B
// and GPipe: a backward costs b + w; the interleaved schedule's chunks each 1 / v of that). The
// bubble is the time beyond K (f + b + w): (P - 1)(f + b + w) for GPipe and 1F1B, / v
// interleaved, (P - 1)(f + b - w) for ZB-H1 (Qi et al.).
double simulated_bubble(PipelineSchedule kind, int P, int64_t K, double f, double b, double w, int v = 1) {
  std::vector<std::vector<pp::Action>> plan;
  for (int s = 0; s < P; ++s) plan.push_back(pp::schedule(kind, P, s, K, v));
  const int V = P * v;  // virtual stages; a chunk's passes cost 1 / v of a stage's
  const bool split = kind == PipelineSchedule::zb_h1;
  std::map<Pass, double> end;  // (op, micro, virtual stage) -> finish time
  std::vector<double> free(static_cast<size_t>(P), 0.0);
  std::vector<size_t> next(static_cast<size_t>(P), 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < P; ++s) {
      auto& i = next[static_cast<size_t>(s)];
      if (i == plan[static_cast<size_t>(s)].size()) continue;
      const pp::Action& a = plan[static_cast<size_t>(s)][i];
      const int j = a.chunk * P + s;
      double start = free[static_cast<size_t>(s)];
      bool ready = true;
      for (const Pass& n : inputs_of(a, s, P, V)) {
        if (!end.count(n)) ready = false;
        else start = std::max(start, end.at(n));
      }
      if (!ready) continue;
      const double cost = (a.op == pp::Op::forward ? f : a.op == pp::Op::weight ? w : (split ? b : b + w)) / v;
      free[static_cast<size_t>(s)] = start + cost;
      end[{static_cast<int>(a.op), a.micro, j}] = start + cost;
      ++i;
      progress = true;
    }
  }
  double makespan = 0;
  for (double t : free) makespan = std::max(makespan, t);
  return makespan - static_cast<double>(K) * (f + b + w);
}

TEST(PipelineSchedule, EveryScheduleReachesItsBubbleInTime) {
  for (const auto& [f, b, w] : {std::tuple{1.0, 1.0, 1.0}, std::tuple{1.0, 1.3, 0.8}, std::tuple{1.0, 1.5, 0.6}})
    for (int P : {2, 3, 4})
      for (int64_t K : {4, 8, 16}) {
        const std::string what = "P " + std::to_string(P) + " K " + std::to_string(K) + " f b w " +
                                 std::to_string(f) + " " + std::to_string(b) + " " + std::to_string(w);
        EXPECT_NEAR(simulated_bubble(PipelineSchedule::one_f_one_b, P, K, f, b, w), (P - 1) * (f + b + w), 1e-9) << what;
        EXPECT_NEAR(simulated_bubble(PipelineSchedule::gpipe, P, K, f, b, w), (P - 1) * (f + b + w), 1e-9) << what;
        EXPECT_NEAR(simulated_bubble(PipelineSchedule::zb_h1, P, K, f, b, w), (P - 1) * (f + b - w), 1e-9) << what;
        // Interleaved: v chunks per rank, each pass 1 / v of the stage's; the fill and drain / v.
        for (int v : {2, 3}) {
          if (K % P != 0) continue;
          EXPECT_NEAR(simulated_bubble(PipelineSchedule::interleaved, P, K, f, b, w, v), (P - 1) * (f + b + w) / v, 1e-9)
              << what << " v " << v;
        }
      }
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
}  // namespace forge::parallel

namespace forge::parallel {
namespace {

// Every rank runs its schedule in order; an action runs once what it needs has run (inputs_of).
// The whole pipeline must finish (no rank waits forever), and on
// every link the messages of each direction must arrive in the order they were sent (point to
// point without tags matches in order: Note [pipeline links]).
void expect_runs_to_completion(PipelineSchedule kind, int P, int64_t K, int v) {
  std::vector<std::vector<pp::Action>> plan;
  for (int s = 0; s < P; ++s) plan.push_back(pp::schedule(kind, P, s, K, v));
  const int V = P * v;  // virtual stages
  std::set<Pass> done;  // (op, micro, virtual stage)
  std::vector<size_t> next(static_cast<size_t>(P), 0);
  // Per link (from, to) and kind (0 activations, 1 gradients): the order of sends and receives.
  std::map<std::tuple<int, int, int>, std::vector<std::pair<int64_t, int>>> sent, received;
  bool progress = true;
  while (progress) {
    progress = false;
    for (int s = 0; s < P; ++s) {
      auto& i = next[static_cast<size_t>(s)];
      if (i == plan[static_cast<size_t>(s)].size()) continue;
      const pp::Action& a = plan[static_cast<size_t>(s)][i];
      const int j = a.chunk * P + s;
      const auto needs = inputs_of(a, s, P, V);
      if (!std::all_of(needs.begin(), needs.end(), [&](const Pass& n) { return done.count(n) > 0; })) continue;
      done.insert({static_cast<int>(a.op), a.micro, j});
      if (a.op == pp::Op::forward && j > 0) received[{(s - 1 + P) % P, s, 0}].push_back({a.micro, j});
      if (a.op == pp::Op::forward && j < V - 1) sent[{s, (s + 1) % P, 0}].push_back({a.micro, j + 1});
      if (a.op == pp::Op::backward && j < V - 1) received[{(s + 1) % P, s, 1}].push_back({a.micro, j});
      if (a.op == pp::Op::backward && j > 0) sent[{s, (s - 1 + P) % P, 1}].push_back({a.micro, j - 1});
      ++i;
      progress = true;
    }
  }
  for (int s = 0; s < P; ++s)
    EXPECT_EQ(next[static_cast<size_t>(s)], plan[static_cast<size_t>(s)].size())
        << schedule_name(kind) << " P " << P << " K " << K << " v " << v << ": stage " << s << " stuck";
  EXPECT_EQ(sent, received) << schedule_name(kind) << " P " << P << " K " << K << " v " << v
                            << ": a link's messages arrive in another order than they were sent";
}

TEST(PipelineSchedule, EverySchedulesPipelineRunsToCompletionWithMessagesInOrder) {
  for (int P : {2, 3, 4})
    for (int64_t K : {1, 2, 4, 8}) {
      for (auto kind : {PipelineSchedule::gpipe, PipelineSchedule::one_f_one_b, PipelineSchedule::zb_h1})
        expect_runs_to_completion(kind, P, K, 1);
      if (K % P == 0)
        for (int v : {2, 3}) expect_runs_to_completion(PipelineSchedule::interleaved, P, K, v);
    }
}

// Interleaved: every (micro-batch, chunk) forward then backward once; a smaller bubble than 1F1B
// in the simulation's unit (each pass one tick): v chunks per rank, the fill and drain shrink.
TEST(PipelineSchedule, InterleavedRunsEveryChunkOfEveryMicroBatch) {
  const auto a = pp::schedule(PipelineSchedule::interleaved, 4, 1, 8, 2);
  ASSERT_EQ(a.size(), 2u * 8 * 2);
  std::set<std::pair<int64_t, int>> f, b;
  for (const auto& x : a) (x.op == pp::Op::forward ? f : b).insert({x.micro, x.chunk});
  EXPECT_EQ(f.size(), 16u);
  EXPECT_EQ(b.size(), 16u);
  EXPECT_EQ(a.front(), (pp::Action{pp::Op::forward, 0, 0}));
  EXPECT_THROW(pp::schedule(PipelineSchedule::interleaved, 4, 0, 6, 2), Error);  // K not a multiple of P
  EXPECT_THROW(pp::schedule(PipelineSchedule::interleaved, 4, 0, 8, 1), Error);  // one chunk
}

}  // namespace
}  // namespace forge::parallel
