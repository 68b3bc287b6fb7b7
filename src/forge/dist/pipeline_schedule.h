#pragma once
// Pipeline parallelism's schedules and stage boundaries (issue 17; DESIGN.md "Parallelism"):
// which micro-batch a stage runs forward or backward next, and which blocks it owns.
//
//   for (const pp::Action& a : pp::schedule(PipelineSchedule::one_f_one_b, P, stage, K))
//     a.op == pp::Op::forward ? run_forward(a.micro) : run_backward(a.micro);
//
// Note [pipeline schedules]
// -------------------------
// GPipe: every micro-batch's forward, then every backward. Simple, and every stage holds the
// activations of all K micro-batches at once.
// 1F1B (PipeDream-Flush, Megatron-LM's default): stage s runs min(P - s - 1, K) forwards to fill
// the pipeline, then alternates one forward and one backward, then drains the remaining
// backwards. The bubble is the same as GPipe's, (P - 1) / (K + P - 1) of the step, but a stage
// holds at most P - s micro-batches' activations at once (at most P), not K.
// Both run the backwards in micro-batch order 0..K-1, so the last backward of a step is micro-
// batch K - 1's on every stage (data parallelism reduces the gradients then).
#include <cstdint>
#include <utility>
#include <vector>

#include "forge/dist/layout.h"

namespace forge::dist::pp {

enum class Op { forward, backward };
struct Action {
  Op op;
  int64_t micro;
  friend bool operator==(const Action& a, const Action& b) { return a.op == b.op && a.micro == b.micro; }
};

// The actions of stage `stage` (0-based) of `stages` over `micro_batches` micro-batches.
std::vector<Action> schedule(PipelineSchedule kind, int stages, int stage, int64_t micro_batches);

// The most micro-batches whose activations a stage holds at once under the schedule.
int64_t max_in_flight(const std::vector<Action>& actions);

// Blocks [begin, end) of stage `stage` when `n_blocks` are split over `stages` consecutive stages:
// as even as possible, the first n_blocks % stages stages one block more. With `layers` (one
// count per stage, summing to n_blocks: dist.pp_layers) the given split instead.
std::pair<int64_t, int64_t> stage_blocks(int64_t n_blocks, int stages, int stage,
                                         const std::vector<int64_t>& layers = {});

}  // namespace forge::dist::pp
