#pragma once
// The state parallel::DataParallel's three mechanisms share (data_parallel.h): the trainable
// parameters, their gradient buckets, the group, the options. Each mechanism keeps its own
// per-bucket fields; this holds only what all of them read.
//
//   GradientBuckets  (grad_buckets.h)       gradients into buckets, reduced while backward runs
//   ShardedOptimizer (sharded_optimizer.h)  the optimizer over whole parameters (DDP) or over the
//                                           owned slices (ZeRO-1/2/3), offload, the weights' all-gather
//   BlockShards      (block_shards.h)       ZeRO-3: each block's parameters sharded, gathered around it
//
// Layout (Note [gradient buckets]): parameters are packed in REVERSE order into buckets of about
// bucket_mb megabytes (a block is one bucket under ZeRO-3); a bucket's flat buffer has
// numel rounded up to a multiple of the world size W, and rank r owns [r*shard, (r+1)*shard).
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "forge/core/tensor.h"
#include "forge/parallel/process_group.h"
#include "forge/parallel/sharding.h"

namespace forge::parallel {

// One contiguous part of a parameter's flattened elements held by this rank's optimizer.
struct ShardPiece {
  std::string param;  // the parameter's name
  int64_t lo = 0;     // [lo, hi) of its row-major elements
  int64_t hi = 0;
};

struct DpParam {
  std::string name;
  Tensor t;
  int bucket = -1;
  int block = -1;      // stage 3: its block (a sharded unit), or -1
  int64_t offset = 0;  // element offset in its bucket
  int64_t numel = 0;
};

struct DpBucket {
  std::vector<int> params;  // indices into DpState::params
  int64_t numel = 0;        // sum of the parameters' numel
  int64_t padded = 0;       // numel rounded up to a multiple of W
  int64_t shard = 0;        // padded / W
  DType dtype = DType::f32;
  int block = -1;           // stage 3: the block this bucket holds, or -1
};

// Stage 3: a parameter that is not trained but sharded with its block (Note [frozen block shards]).
struct DpFrozen {
  std::string name;
  Tensor t;
  int block = -1;
  int64_t offset = 0;  // element offset in its block's frozen storage
  int64_t numel = 0;
};

struct DpState {
  std::vector<DpParam> params;
  std::vector<DpFrozen> frozen;
  std::vector<DpBucket> buckets;
  ProcessGroupPtr group;
  Sharding sharding;
  bool offload = false;
  bool skip_reductions = false;
  bool release_grads = false;  // DataParallelOptions::release_grads
  int powersgd_rank = 0;       // DataParallelOptions::powersgd_rank (0: off)
  uint64_t powersgd_seed = 0;
  bool fp8_reduce = false;     // DataParallelOptions::fp8_reduce
  bool fp8_feedback_all_reduce = true, fp8_feedback_reduce_scatter = false;  // DataParallelOptions::fp8_feedback
  // Tensor parallelism (DataParallelOptions::norm_group): the gradient norm's other group and
  // each parameter's weight in it; unset: the norm is this group's alone.
  ProcessGroupPtr norm_group;
  std::function<double(const std::string&)> norm_weight;
  Device device;
  // Expires when the DataParallel is destroyed: hooks on the parameters and autograd nodes
  // outlive it and check it before calling in.
  std::shared_ptr<int> alive = std::make_shared<int>(0);
  int64_t rank() const { return group->rank(); }
  int64_t world() const { return group->size(); }
  int num_buckets() const { return static_cast<int>(buckets.size()); }
};

// Packs st.params into st.buckets (Note [gradient buckets]); bucket_mb as in DataParallelOptions.
void build_buckets(DpState& st, double bucket_mb);


}  // namespace forge::parallel
