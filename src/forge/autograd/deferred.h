#pragma once
// DeferredGrads: weight gradients computed later than their node's backward, so that a
// collective on the input gradient can run while they are computed.
//
// Note [weight gradients behind the collective]
// ---------------------------------------------
// A tensor-parallel column-parallel linear's backward computes dX = dY W and dW = dY^T X; the
// region's entry then all-reduces dX (reduce-scatters it under sequence parallelism) before the
// layer below can continue. Computed in that order, the collective waits for both GEMMs and the
// GPUs wait for the collective. Megatron-LM starts the collective as soon as dX exists and
// computes dW while it runs. Here: a linear given a DeferredGrads (ops::linear's `defer`)
// returns dX only and queues its dW (and db) GEMMs; the region's entry node starts its
// collective asynchronously, runs the queue (each weight gradient handed to autograd as its own
// backward would have: accumulated into .grad, then the leaf's hooks, so DDP's buckets see it),
// and then waits for the collective. The values are the same as without the queue, bit for bit:
// the same GEMMs on the same operands, accumulated in the same way.
//
// The queue must be run by whoever owns it, in the same backward pass (a linear defers only when
// its input's gradient goes to the node that runs the queue).
//
// A queue may also provide the linears' input (provides_input()): under sequence parallelism the
// region's input is the all-gathered sequence, which the linears would otherwise save for their
// weight gradients, one whole-sequence copy per region. Then they save nothing; the entry keeps
// its own input (this rank's slice of the sequence), gathers it again in backward and sets it
// here while the queue runs: Megatron's sequence-parallel memory (Korthikanti et al.), one extra
// all-gather per region in backward. That all-gather starts when the first linear queues its
// weight gradient (on_first_push), so it runs behind the region's input-gradient GEMMs instead of
// in front of the weight-gradient ones (2 x H200: sp was 4% slower than tp without it).
#include <functional>
#include <memory>
#include <vector>

#include "forge/core/tensor.h"

namespace forge::autograd {

class DeferredGrads {
 public:
  DeferredGrads() = default;
  explicit DeferredGrads(bool provides_input) : provides_input_(provides_input) {}
  void push(std::function<void()> work) {
    if (work_.empty() && first_push_) {  // (one-shot)
      auto f = std::move(first_push_);
      first_push_ = nullptr;
      f();
    }
    work_.push_back(std::move(work));
  }
  // Called once, when the first work is queued: the region's backward has reached its linears,
  // so what the queue will need can be started (the sequence-parallel entry's all-gather, Note
  // [weight gradients behind the collective]).
  void on_first_push(std::function<void()> f) { first_push_ = std::move(f); }
  // Runs the queued work in the order it was queued, and empties the queue; `input` is what
  // input() returns meanwhile (when the queue provides it).
  void run(const Tensor& input = Tensor());
  bool empty() const { return work_.empty(); }
  bool provides_input() const { return provides_input_; }
  // While run() runs: the linears' input. Throws when the queue does not provide it.
  const Tensor& input() const;

 private:
  std::vector<std::function<void()>> work_;
  std::function<void()> first_push_;
  bool provides_input_ = false;
  Tensor input_;
};

// While alive, the linears recorded on this thread without a queue of their own (ops::linear)
// queue their weight gradients on `queue`: a pipeline stage's forward under ZB-H1, whose W pass
// runs the queue after the B pass (Note [pipeline schedules], parallel/pipeline_schedule.h).
class DeferWeightGrads {
 public:
  explicit DeferWeightGrads(std::shared_ptr<DeferredGrads> queue);
  ~DeferWeightGrads();
  DeferWeightGrads(const DeferWeightGrads&) = delete;
  DeferWeightGrads& operator=(const DeferWeightGrads&) = delete;

 private:
  std::shared_ptr<DeferredGrads> previous_;
};
// The queue of the innermost DeferWeightGrads alive on this thread (null when none).
const std::shared_ptr<DeferredGrads>& current_weight_grad_queue();

// Hands `grad` to the leaf `param` as its node in the graph would (AccumulateGrad: into
// param.grad, or the claimed gradient buffer, then the leaf's gradient hooks).
void accumulate_leaf_grad(const Tensor& param, const Tensor& grad);

}  // namespace forge::autograd
