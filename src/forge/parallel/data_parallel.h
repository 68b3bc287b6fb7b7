#pragma once
// DataParallel: data-parallel training of one model replicated on every rank of a group,
// with the optimizer state optionally sharded (ZeRO stage 1), the gradients too (stage 2), the
// block parameters too (stage 3), and the sharded optimizer optionally on the CPU (offload).
// It composes three mechanisms over one shared state (dp_state.h), each in its own file:
//   GradientBuckets  (grad_buckets.h)       gradients into buckets, reduced while backward runs
//   ShardedOptimizer (sharded_optimizer.h)  the optimizer over whole parameters or owned slices,
//                                           offload, clipping, the all-gather of the new weights
//   BlockShards      (block_shards.h)       ZeRO-3: block parameters sharded, gathered per block
// DDP uses the first (and the second over whole parameters), ZeRO-1/2 the first two, ZeRO-3 all three.
//
//   parallel::DataParallel dp(named_params, groups, make_optimizer, world, {.sharding = parallel::Sharding::zero2()});
//   dp.broadcast_parameters();                      // rank 0's weights everywhere
//   for each step:
//     dp.set_lr(schedule.lr_at(step));
//     for k in micro-batches:
//       dp.begin_backward(/*sync=*/k == K - 1);
//       (loss_k / K).backward();                    // buckets reduce while backward runs
//       dp.end_backward();
//     Tensor norm = dp.grad_norm();                 // the global norm, on the device
//     dp.clip_grads(max_norm, norm);
//     dp.step(optim::found_non_finite(norm));       // sharded update + all-gather of the weights
//     dp.zero_grad();
//
// Note [gradient buckets] (dp_state.h, grad_buckets.h). The parameters are packed, in REVERSE
// order (roughly the order backward produces their gradients), into buckets of about bucket_mb
// megabytes (a parameter is never split); each bucket's flat buffer is padded to a multiple of
// the world size W so that rank r owns the slice [r*s, (r+1)*s). A bucket is reduced as soon as
// its gradients are in and every earlier bucket has started: all-reduced for stages 0/1 (on the
// last micro-step only, like DDP's no_sync()), reduce-scattered into the owned slice for
// stages 2/3 (every micro-step).
//
// Sharded optimizer (sharded_optimizer.h, Note [offloaded optimizer]). Stages 1-3 update only
// the owned slices ("pieces" of parameters) and all-gather the new weights; stage 0 holds the
// whole optimizer. Sharding changes no arithmetic: a ZeRO run computes DDP's update.
//
// Note [ZeRO-3] (block_shards.h). Stage 3 also shards the parameters of the model's blocks
// (each block one bucket): rank r keeps only its slice, and the model's block_hooks() gather a
// block's weights around its forward and its backward and release them after. Parameters
// outside the blocks (block_of = -1) are handled as in stage 2. Rank 0's parameters are
// broadcast before sharding; for_each_full_parameter() gathers the blocks one at a time for a
// checkpoint. Every rank must run every forward (evaluation included): the gathers are
// collectives.
//
// Requirements: every rank builds the same parameters (names, shapes, dtypes, order) on its
// device; the group's device must be the parameters'. A parameter that got no gradient in a
// step's backward contributes zeros (its bucket is reduced at end_backward).
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "forge/core/tensor.h"
#include "forge/nn/block_hooks.h"
#include "forge/optim/loss_scale.h"
#include "forge/optim/optimizer.h"
#include "forge/parallel/block_shards.h"
#include "forge/parallel/dp_state.h"
#include "forge/parallel/grad_buckets.h"
#include "forge/parallel/process_group.h"
#include "forge/parallel/sharded_optimizer.h"

namespace forge::parallel {

struct DataParallelOptions {
  Sharding sharding;               // DDP, ZeRO-1, 2, 3 (parallel/sharding.h)
  bool offload_optimizer = false;  // stages 1-3: the optimizer on the CPU
  double bucket_mb = 25.0;         // bucket size in MB (1e6 bytes) of gradients
  // Stage 3: the block (unit of sharding) of a parameter, by name; -1 keeps it whole on every
  // rank (embeddings, final norm, head). Required for stage 3 (nn::GPT::block_of, Llama::block_of).
  std::function<int(const std::string&)> block_of;
  // DDP and ZeRO-1: no gradient reduction at all (the run is WRONG): a diagnostic that measures
  // what the rest of data parallelism costs (the config's debug.skip_reductions; docs/dist.md).
  bool skip_reductions = false;
  // Tensor parallelism (Note [split gradient norm], parallel/tensor_parallel_state.h): the group
  // whose ranks hold the other parts of the model, and each parameter's weight in the global
  // gradient norm (by name). The norm is then summed over this group too; the f16 overflow flag
  // agreed over it. Not with offload_optimizer.
  ProcessGroupPtr norm_group;
  std::function<double(const std::string&)> norm_weight;
  // Stage 3: parameters that are not trained (LoRA's frozen base: nn/lora.h), by name in model
  // order. Those of a block (block_of >= 0) are sharded with the block's trained ones and gathered
  // and released with them (Note [frozen block shards] in block_shards.h); the others stay whole.
  // Ignored below stage 3.
  std::vector<std::pair<std::string, Tensor>> frozen;
  // DDP: the buckets' gradient memory released at zero_grad and taken again at the next step's
  // first backward (Note [gradient memory between steps] in grad_buckets.cpp), so that the
  // gradients do not add to the forward's peak. One process (Note [one process is a data-parallel
  // group of one]) sets it: its gradients lived only from backward to the update before.
  bool release_grads = false;
  // DDP: PowerSGD compression of the gradient reductions at this rank (0: off; Note [PowerSGD] in
  // parallel/powersgd.h; dist.grad_compression), its initial Q drawn from powersgd_seed.
  int powersgd_rank = 0;
  uint64_t powersgd_seed = 0;
  int64_t powersgd_start_step = 0;  // plain all-reduces before this optimizer step (PyTorch's start_powerSGD_iter)
  // The gradient reductions (all-reduces of DDP and ZeRO-1, reduce-scatters of ZeRO-2/3) sent in
  // FP8 with error feedback (Note [FP8 gradient reduction] in parallel/fp8_reduce.h;
  // dist.grad_compression = "fp8"). Not with powersgd_rank.
  bool fp8_reduce = false;
  // Error feedback of the coded all-reduces (DDP, ZeRO-1) and reduce-scatters (ZeRO-2/3): Note [FP8
  // gradient reduction] on its memory (dist.fp8_error_feedback: "auto" is {true, false}).
  bool fp8_feedback_all_reduce = true, fp8_feedback_reduce_scatter = false;
};

class DataParallel {
 public:
  // named_params: every trainable parameter, by name, in model order. groups: the optimizer's
  // parameter groups over the same tensors (optim::decay_groups), hyper-parameters set.
  DataParallel(std::vector<std::pair<std::string, Tensor>> named_params, std::vector<optim::ParamGroup> groups,
               const OptimizerFactory& make_optimizer, ProcessGroupPtr group, DataParallelOptions options);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // Copies rank 0's parameters to every rank (collective).
  void broadcast_parameters();

  // Before each micro-step's backward; sync = reduce this time (the last micro-step).
  void begin_backward(bool sync);
  // After each micro-step's backward: starts what the hooks did not, and (on a sync step)
  // waits until the reduced gradients may be used on the current stream.
  void end_backward();

  // The global L2 norm of the (reduced) gradients: a 0-d f32 tensor on the device.
  Tensor grad_norm();
  // After end_backward of the last micro-step: (name, gradient) of every gradient the update
  // reads, whole parameters (DDP, ZeRO-1) or this rank's reduced pieces (ZeRO-2/3), in the same
  // order on every rank that holds the same parameters; writes into them reach the update.
  std::vector<std::pair<std::string, Tensor>> named_grads() const;
  // f16 (optim/loss_scale.h): divides the gradients the optimizer will read by the loss scale
  // and returns their global L2 norm (0-d f32, inf/NaN on an overflow); the scaler's overflow
  // flag is the same on every rank (ZeRO-2/3 all-reduce it with the norm). Not with offload.
  Tensor unscale_grads(optim::LossScaler& scaler);
  // Scales the gradients the optimizer will read by max_norm / (norm + 1e-6) when norm > max_norm.
  // DDP hands this to the next step() (Optimizer::clip_next_step, Note [clipping inside the
  // update]): AdamW on a GPU scales them as it loads them, leaving the gradients unclipped.
  void clip_grads(double max_norm, const Tensor& norm);
  // The optimizer step (skipped where the one-element skip_if is non-zero), then, for ZeRO,
  // the all-gather of the updated weights.
  void step(const Tensor& skip_if);
  // Drops the gradients (and, for ZeRO-2, the owned gradient slices).
  void zero_grad();
  // Sets every param group's lr.
  void set_lr(double lr);

  // Stage 3: the hooks the model must call around its blocks (Note [ZeRO-3]); null otherwise.
  std::shared_ptr<nn::BlockHooks> block_hooks() const { return shards_ ? shards_->hooks() : nullptr; }
  // Calls fn(name, parameter) for every parameter, with a sharded block's parameters gathered
  // (one block at a time, released after). Collective for stage 3.
  void for_each_full_parameter(const std::function<void(const std::string&, const Tensor&)>& fn);

  // The optimizer state this rank holds, by piece: ranged_state()[i] belongs to pieces()[i].
  // Names: the optimizer's state names ("exp_avg", "exp_avg_sq", "master", "momentum_buffer");
  // each tensor is 1-D with hi - lo elements. steps()[i] is the piece's update count.
  const std::vector<ShardPiece>& pieces() const { return optimizer_->pieces(); }
  std::vector<std::map<std::string, Tensor>> piece_state() const;
  std::vector<int64_t> piece_steps() const;
  // Restores the state of every piece from `lookup(piece, state_name) -> 1-D tensor or
  // undefined` and `step_of(piece)`; the state names are the optimizer's. Throws if a required
  // state is missing.
  void load_piece_state(const std::function<Tensor(const ShardPiece&, const std::string&)>& lookup,
                        const std::function<int64_t(const ShardPiece&)>& step_of);
  // Before the first step: the f32 masters of this rank's pieces from f32_of(parameter name)
  // (ShardedOptimizer::seed_masters; Note [masters from the f32 initial weights], train/strategy.h).
  void seed_masters(const std::function<Tensor(const std::string&)>& f32_of) { optimizer_->seed_masters(f32_of); }
  // Number of optimizer step() calls (skipped ones included).
  int64_t step_count() const { return step_count_; }
  void set_step_count(int64_t n) { step_count_ = n; }
  // CUDA graphs (train/graphed_step.h; DDP only): the optimizer over this rank's parameters or
  // pieces (null when it owns none), and the host's count of a step replayed from a graph.
  optim::Optimizer* local_optimizer() const { return optimizer_->local_optimizer(); }
  void count_replayed_step() { ++step_count_; }

  const DataParallelOptions& options() const { return options_; }
  const ProcessGroupPtr& group() const { return st_.group; }
  int num_buckets() const { return st_.num_buckets(); }
  // PowerSGD: values sent per step over a plain all-reduce's (1 without compression).
  double compression_sent_fraction() const { return buckets_->compression_sent_fraction(); }
  // Bytes of optimizer state and gradients this rank holds (for reports and tests).
  int64_t optimizer_state_bytes() const;

 private:
  DpState st_;
  DataParallelOptions options_;
  std::unique_ptr<GradientBuckets> buckets_;
  std::unique_ptr<BlockShards> shards_;        // stage 3 only
  std::unique_ptr<ShardedOptimizer> optimizer_;
  int64_t step_count_ = 0;
};

}  // namespace forge::parallel
