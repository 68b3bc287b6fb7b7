#pragma once
// ShardedOptimizer: the second of parallel::DataParallel's mechanisms (dp_state.h): the optimizer
// over the whole parameters (stage 0, DDP: every rank holds all of it) or over "pieces" (ZeRO-1/2/3):
// the owned slice [r*shard, (r+1)*shard) of every bucket, cut at parameter boundaries, each piece
// a 1-D view of the parameter's elements [lo, hi) (row-major) whose gradient is the matching view
// of the reduced gradient (GradientBuckets::owned_slice). The optimizer (any optim::Optimizer,
// built by the factory from groups of pieces that keep their parameter's group, so weight decay
// and lr carry over) updates only the pieces: f32 master weights and moments exist only for the
// owned 1/W of the model. After the update each bucket's owned slice is all-gathered into every
// rank's parameters (ZeRO-3 blocks: the shard is the weights; the next forward gathers it).
// AdamW and SGD are elementwise, so sharding changes no arithmetic.
//
// Note [offloaded optimizer]: with offload the pieces' optimizer runs on the CPU (OpenMP) on f32
// master weights that are views of one f32 CPU slice per bucket (pinned next to a GPU). On a GPU,
// as soon as a bucket's reduced gradient is final (the last micro-step), its owned slice is
// converted to f32 and copied down into a pinned buffer on a side stream, overlapping the rest
// of backward; step() waits for those copies, updates on the CPU, and sends each bucket's new
// slice up in one copy (its all-gather input; ZeRO-3: its persistent shard). The CPU update
// itself cannot overlap backward: clipping needs the global norm of every gradient first.
//
// The gradient norm is global: stages 0 and 1 compute it from the (identical, reduced) full
// gradients; stages 2 and 3 all-reduce the owned slices' sums of squares. Clipping at stage 0
// is handed to the optimizer (Optimizer::clip_next_step, Note [clipping inside the update]):
// AdamW on a GPU applies it inside its update and leaves the gradients unclipped; the other
// stages clip the gradients themselves before the update.
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "forge/optim/loss_scale.h"
#include "forge/optim/optimizer.h"
#include "forge/parallel/dp_state.h"
#include "forge/parallel/grad_buckets.h"

namespace forge::parallel {

// Builds the optimizer over the given groups (their hyper-parameters already set).
using OptimizerFactory = std::function<std::unique_ptr<optim::Optimizer>(std::vector<optim::ParamGroup>)>;

class ShardedOptimizer {
 public:
  // block_shard(bucket): ZeRO-3's persistent shard of a block bucket (BlockShards::shard).
  ShardedOptimizer(DpState& st, GradientBuckets& grads, const std::vector<optim::ParamGroup>& groups,
                   const OptimizerFactory& make_optimizer, std::function<Tensor(int)> block_shard);
  ~ShardedOptimizer();

  Tensor grad_norm();
  Tensor unscale_grads(optim::LossScaler& scaler);
  void clip_grads(double max_norm, const Tensor& norm);
  // The update (skipped where skip_if is non-zero), then the all-gather of the updated weights.
  void step(const Tensor& skip_if);
  void set_lr(double lr);
  // Offload: starts the download of a bucket's final gradient slice (GradientBuckets::on_final).
  void start_grad_download(int bucket);

  const std::vector<ShardPiece>& pieces() const { return pieces_; }
  // (name, gradient) of every gradient the update reads, in the same order on every rank of a
  // tensor-parallel group: whole parameters (stages 0/1) or this rank's pieces (2/3).
  std::vector<std::pair<std::string, Tensor>> named_grads() const;
  std::vector<std::map<std::string, Tensor>> piece_state() const;
  std::vector<int64_t> piece_steps() const;
  void load_piece_state(const std::function<Tensor(const ShardPiece&, const std::string&)>& lookup,
                        const std::function<int64_t(const ShardPiece&)>& step_of, int64_t step_count);

  // The optimizer over this rank's pieces (null when it owns none): CUDA graph hooks (train/graphed_step.h).
  optim::Optimizer* local_optimizer() const { return optimizer_.get(); }
  // Note [masters from the f32 initial weights] (train/strategy.h): before the first step, the
  // f32 master of every owned piece from f32_of(name) (the parameter's f32 values, whole
  // local tensor, any device; undefined: leave the piece alone): the optimizer's state of a
  // 16-bit piece, or, offloaded, the CPU master itself.
  void seed_masters(const std::function<Tensor(const std::string&)>& f32_of);

 private:
  struct OffloadSlice {
    Tensor cpu_master;       // the owned slice's f32 master weights on the CPU (shard,)
    Tensor cpu_grad;         // the owned slice's gradients, f32 on the CPU (shard,)
    bool grad_down = false;  // this step's download of cpu_grad was queued
  };
  struct OffloadStream;  // CUDA side stream of the gradient downloads
  std::vector<Tensor> norm_tensors() const;
  // Their names (the parameters', or the pieces' parameters').
  std::vector<std::string> norm_names() const;
  // Note [split gradient norm] (parallel/tensor_parallel_state.h): the sum over norm_tensors() of
  // norm_weight(name) * |g|^2 (0-d f32; this rank's part only).
  Tensor weighted_square_norm() const;
  // The squared norm summed over the ranks that hold parts of it (the data-parallel group for
  // ZeRO-2/3, then norm_group), and its square root.
  Tensor global_norm(Tensor square) const;

  DpState& st_;
  GradientBuckets& grads_;
  std::function<Tensor(int)> block_shard_;
  // Null when this rank owns no element (more ranks than elements in every bucket).
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::vector<ShardPiece> pieces_;
  std::vector<Tensor> piece_params_;      // what the optimizer updates (views, or CPU masters when offloaded)
  std::vector<Tensor> piece_views_;       // views of the parameters (== piece_params_ unless offloaded)
  std::vector<Tensor> piece_grad_views_;  // views of the reduced gradients
  std::vector<OffloadSlice> offload_;     // by bucket (offload only)
  std::pair<double, Tensor> offload_clip_;  // clip_grads' (max_norm, norm), applied by step() when offloaded
  bool clip_in_update_ = false;  // stage 0: the optimizer spans every parameter, so clip_grads uses clip_next_step
  std::unique_ptr<OffloadStream> offload_stream_;
};

}  // namespace forge::parallel
