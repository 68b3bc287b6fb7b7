#pragma once
// GradientBuckets: the first of parallel::DataParallel's mechanisms (dp_state.h, data_parallel.h):
// every parameter's gradient lands in its bucket, and a bucket is reduced over the group as soon
// as its last gradient has arrived and every earlier bucket has been started (so every rank
// starts the same collectives in the same order), on the group's communication stream,
// overlapping the rest of backward.
//   stage 0 (DDP) and 1: each parameter's .grad is a view into its bucket (attached before the
//     first micro-step of a step; backward writes into it, Note [claimed grad buffer]); the
//     bucket is all-reduced (avg) on the last micro-step only (sync = false: no communication).
//   stage 2 and 3: the hook copies a gradient into its bucket (a staging buffer, Note [ZeRO-2
//     staging buffers]) and drops .grad; the full bucket is reduce-scattered (avg) and only the
//     owned slice `owned(b)` is kept, accumulated over micro-steps (stages 2/3 communicate on
//     every micro-step, as DeepSpeed does).
// debug.skip_reductions (stages 0, 1): nothing is reduced (a diagnostic; the run is wrong).
// PowerSGD (DDP, powersgd_rank > 0): a bucket is reduced compressed when it is ready, backward
// waiting (Note [PowerSGD] in powersgd.h). FP8 (fp8_reduce): every reduction sent in FP8 with
// error feedback, still overlapping backward (Note [FP8 gradient reduction] in fp8_reduce.h).
#include <functional>
#include <vector>

#include <memory>

#include "forge/parallel/dp_state.h"
#include "forge/parallel/fp8_reduce.h"
#include "forge/parallel/powersgd.h"

namespace forge::parallel {

class GradientBuckets {
 public:
  explicit GradientBuckets(DpState& st);
  ~GradientBuckets();  // waits for reductions in flight

  // Called when a bucket's reduced gradient is final for this step (the last micro-step; the
  // offloaded optimizer starts its download here), and when every gradient of a bucket has
  // arrived in a micro-step (ZeRO-3 releases the block's gathered weights).
  std::function<void(int bucket)> on_final;
  std::function<void(int bucket)> on_all_grads_in;
  // Called first thing in end_backward (ZeRO-3: release blocks whose gradients did not all arrive).
  std::function<void()> on_end_backward;

  void begin_backward(bool sync);
  void end_backward();
  void zero_grad();

  // The full bucket (stages 0/1: the reduced gradients after the last micro-step) and the owned,
  // reduced slice (stages 2/3), as (padded,) and (shard,) tensors.
  const Tensor& full(int bucket) const { return state_[static_cast<size_t>(bucket)].grads; }
  const Tensor& owned(int bucket) const { return state_[static_cast<size_t>(bucket)].owned; }
  // The gradient slice this rank owns (stage 1: its part of the full bucket; 2/3: `owned`).
  Tensor owned_slice(int bucket) const;
  // Stages 1-3: allocates the buffers the optimizer's gradient views point into (the full
  // buckets for stage 1, the owned slices for 2/3).
  void allocate_for_sharded_optimizer();
  double compression_sent_fraction() const {
    return powersgd_ ? powersgd_->sent_fraction() : fp8_ ? fp8_->sent_fraction() : 1.0;
  }
  // Whether this step's reductions are compressed (PowerSGD: not before its start step).
  void set_compression(bool on) { compress_ = on; }

 private:
  struct Bucket {
    Tensor grads;             // (padded,): stages 0/1 persistent; stages 2/3 while filling
    Tensor rs_out;            // stages 2/3: this micro-step's reduce-scattered slice (shard,)
    Tensor owned;             // stages 2/3: the owned slice accumulated over micro-steps (shard,)
    bool owned_fresh = true;  // the next reduced slice replaces `owned` (first micro-step)
    int ready = 0;
    bool launched = false;
    WorkPtr work;
  };
  void on_grad_ready(int param_index);
  void attach_bucket_grads();
  void zero_pending_grads(int bucket);
  Tensor staging_buffer(int bucket);
  void launch_ready_buckets();
  void launch(int bucket);
  void finish(int bucket);

  DpState& st_;
  std::vector<Bucket> state_;
  Tensor staging_[2];  // stages 2/3: Note [ZeRO-2 staging buffers]
  bool sync_ = false;
  bool last_micro_step_ = false;
  bool in_backward_ = false;
  bool grads_attached_ = false;
  int next_to_launch_ = 0;
  std::unique_ptr<PowerSgd> powersgd_;  // DDP with dist.grad_compression = "powersgd"
  std::unique_ptr<Fp8GradReduce> fp8_;  // dist.grad_compression = "fp8"
  bool compress_ = true;
};

}  // namespace forge::parallel
