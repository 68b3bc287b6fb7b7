#pragma once
// BlockShards: the third of parallel::DataParallel's mechanisms (dp_state.h), ZeRO-3's parameter
// sharding (Note [ZeRO-3] in data_parallel.h). Each block is one bucket; its parameters become
// views of one flat storage of the bucket's padded size, of which rank r keeps only the slice
// r (`shard(bucket)`, persistent: the optimizer's pieces are views of it); the flat storage is
// released (Note [released storage]) except while the block computes. The model calls hooks()
// around every block:
//   before_block(i): all-gather block i's shards into its storage (unless a prefetch already
//     did), make the compute stream wait for it, and prefetch block i + 1;
//   after_block(i, outputs): release block i's storage, and record each output through an
//     identity node whose backward gathers block i again (and prefetches block i - 1) before any
//     of block i's backward runs (with activation checkpointing, before its recomputation);
//   once the last gradient of block i has arrived (GradientBuckets::on_all_grads_in), its
//   storage is released.
//
// Note [frozen block shards]: a block's parameters that are not trained (LoRA's frozen base,
// DataParallelOptions::frozen) are sharded the same way, in a second flat storage of the block
// (their own padded size and dtype), gathered and released with the block's trained ones: a LoRA
// run under ZeRO-3 holds 1/W of the base's blocks between uses, as a full fine-tune holds 1/W of
// its weights. They have no gradients, optimizer state or bucket; the block's trained
// parameters cannot tell when its backward is over (a frozen norm's backward runs after the first
// adapted linear's), so such a block is released when the previous block's backward starts (the
// autograd engine reaches that block's outputs only once everything after them has run) or at the
// end of backward.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "forge/nn/block_hooks.h"
#include "forge/parallel/dp_state.h"

namespace forge::parallel {

class BlockShards {
 public:
  // Broadcasts rank 0's parameters and shards every block bucket of `st` (collective).
  explicit BlockShards(DpState& st);

  std::shared_ptr<nn::BlockHooks> hooks() const { return hooks_; }
  // The persistent slice of a block bucket this rank holds (shard,).
  const Tensor& shard(int bucket) const { return units_[static_cast<size_t>(bucket)].param_shard; }
  // Releases a block bucket's gathered weights (a no-op for other buckets or released ones).
  void release(int bucket);
  // All of a block bucket's gradients are in (GradientBuckets::on_all_grads_in): its backward is
  // over unless the block has untrained parameters, whose backward may still run after the last
  // trained one's (a frozen norm before the first adapted linear): those are released when the
  // previous block's backward starts, or at the end of backward (Note [frozen block shards]).
  void release_after_grads(int bucket);
  void release_all();
  // Calls fn(name, parameter) for every parameter, each block gathered in turn and released after
  // (collective).
  void for_each_full_parameter(const std::function<void(const std::string&, const Tensor&)>& fn);

 private:
  class Hooks;
  struct Unit {
    std::shared_ptr<Storage> full;
    Tensor full_view;    // (padded,) over `full`
    Tensor param_shard;  // (shard,)
    enum class Gather { released, gathering, gathered } gather = Gather::released;
    WorkPtr gather_work;
    bool in_backward = false;  // gathered for backward: kept until its gradients are all in
    // Note [frozen block shards]: the block's untrained parameters (none: frozen_full is null).
    std::shared_ptr<Storage> frozen_full;
    Tensor frozen_view, frozen_shard;
    WorkPtr frozen_work;
  };
  void shard_frozen(int block, Unit& u);
  int bucket_of_block(int block) const;
  void gather_async(int bucket);
  void ensure_gathered(int bucket);
  void before_block(int block);
  TensorList after_block(int block, const TensorList& outputs);
  void before_block_backward(int block);

  DpState& st_;
  std::vector<Unit> units_;          // by bucket (only block buckets are used)
  std::vector<int> block_bucket_;    // block index -> its bucket
  std::shared_ptr<nn::BlockHooks> hooks_;
};

}  // namespace forge::parallel
