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
// ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism"): 1F1B with each backward split into B,
// the input gradient (on the critical path: the stage before waits for it), and W, the weight
// gradients (nobody waits for them). Stage s runs B as soon as it can and lets W lag behind by s
// B passes: the later a stage, the sooner its B follows its forward, so the gradients travel back
// up the pipeline without waiting behind W, and the W passes it owes fill the time it would wait
// for the next activation. With F, B and W of costs f, b, w the bubble is (P - 1)(f + b - w),
// against 1F1B's (P - 1)(f + b + w): a third of it when they are equal. (The first version let W
// lag by the warm-up count, P - s - 1: the first stage's W waited and the last stage's B waited
// behind its W, and a timed simulation, PipelineSchedule.EveryScheduleReachesItsBubbleInTime,
// gives exactly 1F1B's bubble for it; on 2 x H200 it measured 0.85 of 1F1B's.) The activations in
// flight (forward to B) are 1F1B's, P - s; stage s also owes at most s + 1 W passes, each holding
// its linears' inputs and output gradients, so the W state sits on the later stages, which hold
// fewer activations. W is computed by the linears' queued weight gradients (Note [weight
// gradients behind the collective], autograd/deferred.h); the other parameters' (norms,
// embeddings) come with B.
// Interleaved 1F1B (Narayanan et al., Megatron-LM's virtual pipeline): each rank holds v model
// chunks, rank s chunk c being virtual stage c P + s of v P, so a micro-batch goes around the
// ranks v times. Forwards run in groups of P micro-batches per chunk (chunk 0 of micro-batches
// 0..P-1, chunk 1 of the same, ..., then the next P), backwards likewise with the chunks in
// reverse; a warm-up of (P - s - 1) 2 + (v - 1) P forwards, then one forward one backward. The
// bubble shrinks by v, for v times the point-to-point traffic. Needs K a multiple of P.
// GPipe, 1F1B and ZB-H1 run the backwards in micro-batch order 0..K-1.
#include <cstdint>
#include <utility>
#include <vector>

#include "forge/parallel/layout.h"

namespace forge::parallel::pp {

enum class Op { forward, backward, weight };
struct Action {
  Op op;
  int64_t micro;
  int chunk = 0;  // interleaved: the rank's model chunk (virtual stage chunk * stages + stage)
  friend bool operator==(const Action& a, const Action& b) {
    return a.op == b.op && a.micro == b.micro && a.chunk == b.chunk;
  }
};

// The actions of stage `stage` (0-based) of `stages` over `micro_batches` micro-batches; the
// interleaved schedule over `chunks` model chunks per rank (others: chunks = 1).
std::vector<Action> schedule(PipelineSchedule kind, int stages, int stage, int64_t micro_batches, int chunks = 1);

// The most micro-batches whose activations a stage holds at once under the schedule (from the
// forward to the backward), and (ZB-H1) the most whose W it owes at once (from B to W: the
// linears' inputs and output gradients).
int64_t max_in_flight(const std::vector<Action>& actions);
int64_t max_weights_owed(const std::vector<Action>& actions);

// Blocks [begin, end) of stage `stage` when `n_blocks` are split over `stages` consecutive stages:
// as even as possible, the first n_blocks % stages stages one block more. With `layers` (one
// count per stage, summing to n_blocks: dist.pp_layers) the given split instead.
std::pair<int64_t, int64_t> stage_blocks(int64_t n_blocks, int stages, int stage,
                                         const std::vector<int64_t>& layers = {});

}  // namespace forge::parallel::pp
