#pragma once
// DataParallel: data-parallel training of one model replicated on every rank of a group,
// with the optimizer state optionally sharded (ZeRO stage 1), the gradients too (stage 2),
// and the sharded optimizer optionally on the CPU (offload).
//
//   dist::DataParallel dp(named_params, groups, make_optimizer, world, {.zero_stage = 2});
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
// Buckets (Note [gradient buckets]). The parameters are packed, in REVERSE order (roughly
// the order backward produces their gradients), into buckets of about bucket_mb megabytes
// (a parameter is never split; one larger than the limit gets a bucket of its own). Each
// bucket is a flat buffer of numel rounded up to a multiple of the world size W, so that
// rank r owns the slice [r*s, (r+1)*s) of every bucket, s = padded / W. A post-accumulate
// hook on every parameter counts the bucket's ready gradients; when a bucket is complete and
// every earlier bucket has been started (so every rank starts the same collectives in the
// same order), its reduction starts at once, asynchronously, on the group's communication
// stream, overlapping the rest of backward.
//   stage 0 (DDP) and 1: each parameter's .grad is a view into its bucket (attached, zeroed,
//     before the first micro-step of a step), so backward accumulates straight into the
//     buckets; the bucket is all-reduced (avg) on the last micro-step only (begin_backward
//     with sync = false: no communication, like DDP's no_sync()).
//   stage 2: gradients are not kept: the hook copies a parameter's gradient into its bucket
//     (allocated when the bucket's first gradient arrives) and drops .grad; the complete
//     bucket is reduce-scattered (avg) and only the owned slice is kept, accumulated over
//     micro-steps (stage 2 communicates on every micro-step, as DeepSpeed does).
//
// Sharded optimizer (stages 1 and 2). The owned slice of each bucket is cut into "pieces",
// one per parameter it overlaps: a piece is a 1-D view of the parameter's elements
// [lo, hi) (row-major), and its gradient the matching view of the reduced gradient. The
// optimizer (any optim::Optimizer: AdamW, SGD; built by make_optimizer from groups of pieces
// that keep their parameter's group, so weight decay and lr are the same) updates only the
// pieces: f32 master weights and moments exist only for the owned 1/W of the model. After
// the update, each bucket's owned slice is all-gathered into every rank's parameters.
// AdamW and SGD are elementwise, so sharding changes no arithmetic: a ZeRO run computes the
// same update as DDP from the same reduced gradients.
//   offload_optimizer (Note [offloaded optimizer]): the pieces' optimizer runs on the CPU
//     (OpenMP) on f32 master weights that are views of one f32 CPU slice per bucket (pinned
//     next to a GPU). On a GPU, as soon as a bucket's reduced gradient is final (the last
//     micro-step), its owned slice is converted to f32 and copied down into a pinned buffer on a
//     side stream, overlapping the rest of backward; step() waits for those copies, updates on
//     the CPU, and sends each bucket's new slice up in one copy (its all-gather input; ZeRO-3:
//     its persistent shard). The CPU update itself cannot overlap backward: clipping needs the
//     global norm of every gradient first.
//   stage 0: every rank holds the whole optimizer (make_optimizer over the full parameters).
//
// The gradient norm is global: stages 0 and 1 compute it from the (identical, reduced)
// full gradients; stages 2 and 3 all-reduce the owned slices' sums of squares.
//
// Note [ZeRO-3]. Stage 3 also shards the parameters of the model's blocks. Each block is one
// bucket (never split by size), and its parameters become views of one flat storage of the
// bucket's padded size: rank r keeps only the slice r of it (`shard`, persistent; the
// optimizer's pieces are views of it), and the flat storage is released (Note [released
// storage]) except while the block computes. The model calls block_hooks() around every block:
//   before_block(i): all-gather block i's shards into its storage (unless a prefetch already
//     did), make the compute stream wait for it, and prefetch block i + 1;
//   after_block(i, outputs): release block i's storage, and record each output through an
//     identity node whose backward gathers block i again (and prefetches block i - 1) before
//     any of block i's backward runs (with activation checkpointing, before its recomputation);
//   once the last gradient of block i has arrived, its bucket is reduce-scattered as in stage 2
//     and its storage released.
// Parameters outside the blocks (block_of = -1) are handled as in stage 2: whole on every rank,
// gradients and optimizer state sharded, all-gathered after the step. Rank 0's parameters are
// broadcast by the constructor, before sharding. full_parameters() gathers the blocks one at a
// time for a checkpoint. Every rank must run every forward (evaluation included): the gathers
// are collectives.
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
#include "forge/dist/process_group.h"
#include "forge/nn/block_hooks.h"
#include "forge/optim/loss_scale.h"
#include "forge/optim/optimizer.h"

namespace forge::dist {

struct DataParallelOptions {
  int zero_stage = 0;              // 0 (DDP), 1, 2, 3
  bool offload_optimizer = false;  // stages 1-3: the optimizer on the CPU
  double bucket_mb = 25.0;         // bucket size in MB (1e6 bytes) of gradients
  // Stage 3: the block (unit of sharding) of a parameter, by name; -1 keeps it whole on every
  // rank (embeddings, final norm, head). Required for stage 3 (nn::GPT::block_of, Llama::block_of).
  std::function<int(const std::string&)> block_of;
  // DDP and ZeRO-1: no gradient reduction at all (the run is WRONG): a diagnostic that measures
  // what the rest of data parallelism costs (the config's debug.skip_reductions; docs/dist.md).
  bool skip_reductions = false;
};

// Builds the optimizer over the given groups (their hyper-parameters already set).
using OptimizerFactory = std::function<std::unique_ptr<optim::Optimizer>(std::vector<optim::ParamGroup>)>;

// One contiguous part of a parameter's flattened elements held by this rank's optimizer.
struct ShardPiece {
  std::string param;  // the parameter's name
  int64_t lo = 0;     // [lo, hi) of its row-major elements
  int64_t hi = 0;
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
  // f16 (optim/loss_scale.h): divides the gradients the optimizer will read by the loss scale
  // and returns their global L2 norm (0-d f32, inf/NaN on an overflow); the scaler's overflow
  // flag is the same on every rank (ZeRO-2/3 all-reduce it with the norm). Not with offload.
  Tensor unscale_grads(optim::LossScaler& scaler);
  // Scales the gradients the optimizer will read by max_norm / (norm + 1e-6) when norm > max_norm.
  void clip_grads(double max_norm, const Tensor& norm);
  // The optimizer step (skipped where the one-element skip_if is non-zero), then, for ZeRO,
  // the all-gather of the updated weights.
  void step(const Tensor& skip_if);
  // Drops the gradients (and, for ZeRO-2, the owned gradient slices).
  void zero_grad();
  // Sets every param group's lr.
  void set_lr(double lr);

  // Stage 3: the hooks the model must call around its blocks (Note [ZeRO-3]); null otherwise.
  std::shared_ptr<nn::BlockHooks> block_hooks() const { return hooks_; }
  // Calls fn(name, parameter) for every parameter, with a sharded block's parameters gathered
  // (one block at a time, released after). Collective for stage 3.
  void for_each_full_parameter(const std::function<void(const std::string&, const Tensor&)>& fn);

  // The optimizer state this rank holds, by piece: ranged_state()[i] belongs to pieces()[i].
  // Names: the optimizer's state names ("exp_avg", "exp_avg_sq", "master", "momentum_buffer");
  // each tensor is 1-D with hi - lo elements. steps()[i] is the piece's update count.
  const std::vector<ShardPiece>& pieces() const { return pieces_; }
  std::vector<std::map<std::string, Tensor>> piece_state() const;
  std::vector<int64_t> piece_steps() const;
  // Restores the state of every piece from `lookup(piece, state_name) -> 1-D tensor or
  // undefined` and `step_of(piece)`; the state names are the optimizer's. Throws if a required
  // state is missing.
  void load_piece_state(const std::function<Tensor(const ShardPiece&, const std::string&)>& lookup,
                        const std::function<int64_t(const ShardPiece&)>& step_of);
  // Number of optimizer step() calls (skipped ones included).
  int64_t step_count() const { return step_count_; }
  void set_step_count(int64_t n) { step_count_ = n; }

  const DataParallelOptions& options() const { return options_; }
  const ProcessGroupPtr& group() const { return group_; }
  int num_buckets() const { return static_cast<int>(buckets_.size()); }
  // Bytes of optimizer state and gradients this rank holds (for reports and tests).
  int64_t optimizer_state_bytes() const;

 private:
  struct Bucket;
  struct Param;
  class Hooks;
  struct OffloadStream;  // CUDA side stream of the gradient downloads (Note [offloaded optimizer])
  void start_grad_download(Bucket& b);
  friend class Hooks;
  void shard_parameters();
  Bucket& unit_bucket(int block);
  void gather_async(Bucket& b);
  void ensure_gathered(Bucket& b);
  void release_unit(Bucket& b);
  void before_block(int block);
  TensorList after_block(int block, const TensorList& outputs);
  void before_block_backward(int block);
  void on_grad_ready(int param_index);
  void launch_ready_buckets();
  void launch(Bucket& b);
  void finish_bucket(Bucket& b);
  void build_buckets();
  Tensor stage2_buffer(int index);
  void build_pieces(const std::vector<optim::ParamGroup>& groups, const OptimizerFactory& make_optimizer);
  void attach_bucket_grads();
  void zero_pending_grads(Bucket& b);
  std::vector<Tensor> norm_tensors() const;

  std::vector<Param> params_;
  std::vector<std::unique_ptr<Bucket>> buckets_;
  ProcessGroupPtr group_;
  DataParallelOptions options_;
  Device device_;
  // The optimizer over pieces (stages 1, 2) or over the parameters (stage 0); null when this
  // rank owns no element (more ranks than elements in every bucket).
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::vector<ShardPiece> pieces_;
  std::vector<Tensor> piece_params_;  // what the optimizer updates (views, or CPU masters when offloaded)
  std::vector<Tensor> piece_views_;   // views of the parameters (== piece_params_ unless offloaded)
  std::vector<Tensor> piece_grad_views_;  // views of the reduced gradients (stage 0/1: into buckets; 2: into owned slices)
  Tensor staging_[2];  // ZeRO-2/3: Note [ZeRO-2 staging buffers]
  std::vector<int> block_bucket_;  // stage 3: block index -> its bucket
  std::shared_ptr<nn::BlockHooks> hooks_;
  bool sync_ = false;
  bool last_micro_step_ = false;  // the current backward is the step's last micro-step
  std::pair<double, Tensor> offload_clip_;  // offload: clip_grads' (max_norm, norm), applied by step()
  std::unique_ptr<OffloadStream> offload_stream_;
  bool in_backward_ = false;
  bool grads_attached_ = false;
  int next_to_launch_ = 0;
  int64_t step_count_ = 0;
  // Expires when this object is destroyed: the parameters' hooks outlive it and check it.
  std::shared_ptr<int> alive_ = std::make_shared<int>(0);
};

}  // namespace forge::dist
