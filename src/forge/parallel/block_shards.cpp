// ZeRO-3's sharded block parameters (contract in block_shards.h).
#include "forge/parallel/block_shards.h"

#include <algorithm>

#include "forge/autograd/grad_mode.h"
#include "forge/autograd/node.h"
#include "forge/core/error.h"
#include "forge/core/storage.h"
#include "forge/ops/creation.h"

namespace forge::parallel {

// What the model calls around its blocks; inert once the DataParallel is gone.
class BlockShards::Hooks final : public nn::BlockHooks {
 public:
  Hooks(BlockShards* s, std::weak_ptr<int> alive) : s_(s), alive_(std::move(alive)) {}
  void before_block(int block) override {
    if (alive_.lock()) s_->before_block(block);
  }
  TensorList after_block(int block, const TensorList& outputs) override {
    return alive_.lock() ? s_->after_block(block, outputs) : outputs;
  }

 private:
  BlockShards* s_;
  std::weak_ptr<int> alive_;
};

// Note [ZeRO-3]: rank 0's weights everywhere, then each block's parameters are moved into one
// flat storage per bucket (in bucket order, padding zero), this rank's slice copied out as its
// persistent shard, the parameters re-pointed at the flat storage, and the storage released.
BlockShards::BlockShards(DpState& st) : st_(st), units_(st.buckets.size()) {
  NoGradGuard no_grad;
  {
    std::vector<WorkPtr> works;
    for (auto& p : st_.params) works.push_back(st_.group->broadcast(p.t.detach(), 0));
    for (auto& f : st_.frozen) works.push_back(st_.group->broadcast(f.t.detach(), 0));
    for (auto& w : works) w->wait();
  }
  const int64_t r = st_.rank();
  for (size_t bi = 0; bi < st_.buckets.size(); ++bi) {
    const DpBucket& b = st_.buckets[bi];
    if (b.block < 0) continue;
    if (static_cast<size_t>(b.block) >= block_bucket_.size()) block_bucket_.resize(static_cast<size_t>(b.block) + 1, -1);
    FORGE_CHECK(block_bucket_[static_cast<size_t>(b.block)] < 0, "DataParallel: the parameters of block ", b.block,
                " are not consecutive in parameter order (parameter '", st_.params[static_cast<size_t>(b.params.front())].name,
                "' comes after another block's); ZeRO-3 needs each block's parameters together");
    block_bucket_[static_cast<size_t>(b.block)] = static_cast<int>(bi);
    Unit& u = units_[bi];
    Tensor flat = zeros({b.padded}, {.dtype = b.dtype, .device = st_.device});
    for (int pi : b.params) {
      DpParam& p = st_.params[static_cast<size_t>(pi)];
      flat.narrow(0, p.offset, p.numel).copy_(p.t.detach().reshape({-1}));
    }
    u.param_shard = flat.narrow(0, r * b.shard, b.shard).clone();
    u.full = flat.storage();
    u.full_view = flat;
    for (int pi : b.params) {
      DpParam& p = st_.params[static_cast<size_t>(pi)];
      const Shape shape = p.t.shape();
      p.t.set_data(Tensor::make(u.full, shape, contiguous_strides(shape), p.offset, b.dtype));
    }
    u.full->release();
    u.gather = Unit::Gather::released;
    shard_frozen(b.block, u);
  }
  for (const DpFrozen& f : st_.frozen)
    FORGE_CHECK(static_cast<size_t>(f.block) < block_bucket_.size() && block_bucket_[static_cast<size_t>(f.block)] >= 0,
                "DataParallel: ZeRO-3 found the untrained parameter '", f.name, "' in block ", f.block,
                ", which trains nothing; every block needs a trained parameter to shard it with (LoRA: adapt a "
                "linear of every block)");
  for (size_t i = 0; i < block_bucket_.size(); ++i)
    FORGE_CHECK(block_bucket_[i] >= 0, "DataParallel: ZeRO-3 found parameters of block ", block_bucket_.size() - 1,
                " but none of block ", i, "; blocks must be numbered 0, 1, ... without gaps");
  hooks_ = std::make_shared<Hooks>(this, st_.alive);
}

// Note [frozen block shards]: the block's untrained parameters into one flat storage, this rank's
// slice kept, the parameters re-pointed at the storage, the storage released.
void BlockShards::shard_frozen(int block, Unit& u) {
  std::vector<DpFrozen*> mine;
  for (DpFrozen& f : st_.frozen)
    if (f.block == block) mine.push_back(&f);
  if (mine.empty()) return;
  const DType dtype = mine.front()->t.dtype();
  int64_t numel = 0;
  for (DpFrozen* f : mine) {
    FORGE_CHECK(f->t.dtype() == dtype, "DataParallel: ZeRO-3 shards block ", block, "'s untrained parameters as one "
                "storage, but '", f->name, "' is ", dtype_name(f->t.dtype()), " and '", mine.front()->name, "' ",
                dtype_name(dtype));
    f->offset = numel;
    numel += f->numel;
  }
  const int64_t W = st_.world(), r = st_.rank();
  const int64_t padded = (std::max<int64_t>(numel, 1) + W - 1) / W * W, shard = padded / W;
  Tensor flat = zeros({padded}, {.dtype = dtype, .device = st_.device});
  for (DpFrozen* f : mine) flat.narrow(0, f->offset, f->numel).copy_(f->t.detach().reshape({-1}));
  u.frozen_shard = flat.narrow(0, r * shard, shard).clone();
  u.frozen_full = flat.storage();
  u.frozen_view = flat;
  for (DpFrozen* f : mine) {
    const Shape shape = f->t.shape();
    f->t.set_data(Tensor::make(u.frozen_full, shape, contiguous_strides(shape), f->offset, dtype));
  }
  u.frozen_full->release();
}

int BlockShards::bucket_of_block(int block) const {
  FORGE_CHECK(block >= 0 && static_cast<size_t>(block) < block_bucket_.size(), "DataParallel: block ", block,
              " has no sharded parameters (ZeRO-3 knows blocks 0..", static_cast<int>(block_bucket_.size()) - 1, ")");
  return block_bucket_[static_cast<size_t>(block)];
}

void BlockShards::gather_async(int bucket) {
  Unit& u = units_[static_cast<size_t>(bucket)];
  if (u.gather != Unit::Gather::released) return;
  NoGradGuard no_grad;
  u.full->reallocate();
  u.gather_work = st_.group->all_gather(u.full_view, u.param_shard);
  if (u.frozen_full) {
    u.frozen_full->reallocate();
    u.frozen_work = st_.group->all_gather(u.frozen_view, u.frozen_shard);
  }
  u.gather = Unit::Gather::gathering;
}

void BlockShards::ensure_gathered(int bucket) {
  gather_async(bucket);
  Unit& u = units_[static_cast<size_t>(bucket)];
  if (u.gather == Unit::Gather::gathering) {
    u.gather_work->wait();  // the compute stream waits for the gather (NCCL); the host for MPI
    u.gather_work = nullptr;
    if (u.frozen_work) {
      u.frozen_work->wait();
      u.frozen_work = nullptr;
    }
    u.gather = Unit::Gather::gathered;
  }
}

void BlockShards::release(int bucket) {
  if (st_.buckets[static_cast<size_t>(bucket)].block < 0) return;
  Unit& u = units_[static_cast<size_t>(bucket)];
  if (u.gather == Unit::Gather::released) return;
  if (u.gather_work) {
    u.gather_work->wait();
    u.gather_work = nullptr;
  }
  if (u.frozen_work) {
    u.frozen_work->wait();
    u.frozen_work = nullptr;
  }
  u.full->release();  // stream-ordered: kernels already queued on it still see the memory
  if (u.frozen_full) u.frozen_full->release();
  u.gather = Unit::Gather::released;
  u.in_backward = false;
}

void BlockShards::release_after_grads(int bucket) {
  if (st_.buckets[static_cast<size_t>(bucket)].block < 0 || units_[static_cast<size_t>(bucket)].frozen_full) return;
  release(bucket);
}

void BlockShards::release_all() {
  for (int i = 0; i < st_.num_buckets(); ++i) release(i);
}

void BlockShards::before_block(int block) {
  ensure_gathered(bucket_of_block(block));
  if (static_cast<size_t>(block) + 1 < block_bucket_.size()) gather_async(bucket_of_block(block + 1));
}

TensorList BlockShards::after_block(int block, const TensorList& outputs) {
  const int bucket = bucket_of_block(block);
  TensorList out = outputs;
  if (autograd::any_requires_grad(outputs)) {
    for (Tensor& t : out) {
      if (!t.defined() || !t.requires_grad()) continue;
      Tensor y = t.detach();
      autograd::record("zero3_gather", y, {t},
                       [this, block, alive = std::weak_ptr<int>(st_.alive)](const Tensor& g, const autograd::GradMask&) {
                         if (alive.lock()) before_block_backward(block);
                         return TensorList{g};
                       });
      t = y;
    }
  }
  // The last block is the first one backward needs: a training forward keeps it (step()
  // releases it before the weights change).
  const bool last = static_cast<size_t>(block) + 1 == block_bucket_.size();
  if (!units_[static_cast<size_t>(bucket)].in_backward && !(last && autograd::any_requires_grad(outputs)))
    release(bucket);
  return out;
}

void BlockShards::before_block_backward(int block) {
  const int bucket = bucket_of_block(block);
  ensure_gathered(bucket);
  units_[static_cast<size_t>(bucket)].in_backward = true;
  // Note [frozen block shards]: block + 1's backward is over (its outputs' gradients reached here).
  if (static_cast<size_t>(block) + 1 < block_bucket_.size()) {
    const int next = bucket_of_block(block + 1);
    if (units_[static_cast<size_t>(next)].frozen_full && units_[static_cast<size_t>(next)].in_backward) release(next);
  }
  if (block > 0) gather_async(bucket_of_block(block - 1));
}

void BlockShards::for_each_full_parameter(const std::function<void(const std::string&, const Tensor&)>& fn) {
  NoGradGuard no_grad;
  for (auto& p : st_.params)
    if (p.block < 0) fn(p.name, p.t.detach());  // (untrained parameters outside blocks are the model's, whole)
  for (size_t blk = 0; blk < block_bucket_.size(); ++blk) {
    const int bucket = block_bucket_[blk];
    const bool was_released = units_[static_cast<size_t>(bucket)].gather == Unit::Gather::released;
    ensure_gathered(bucket);
    for (int pi : st_.buckets[static_cast<size_t>(bucket)].params)
      fn(st_.params[static_cast<size_t>(pi)].name, st_.params[static_cast<size_t>(pi)].t.detach());
    for (const DpFrozen& f : st_.frozen)
      if (f.block == static_cast<int>(blk)) fn(f.name, f.t.detach());
    if (was_released) release(bucket);
  }
}

}  // namespace forge::parallel
