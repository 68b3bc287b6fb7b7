#include "forge/dist/data_parallel.h"

#include <algorithm>
#include <cstdlib>
#include <set>
#include <unordered_map>

#include "forge/autograd/grad_mode.h"
#include "forge/autograd/node.h"
#include "forge/core/error.h"
#include "forge/ops/creation.h"
#include "forge/optim/clip.h"

#ifdef FORGE_WITH_CUDA
#include "forge/backends/cuda/stream.h"
#include "forge/backends/cuda/tensor_kernels.h"
#endif

namespace forge::dist {

struct DataParallel::Param {
  std::string name;
  Tensor t;
  int bucket = -1;
  int block = -1;      // stage 3: its block (a sharded unit), or -1
  int64_t offset = 0;  // element offset in its bucket
  int64_t numel = 0;
};

struct DataParallel::Bucket {
  std::vector<int> params;  // indices into params_
  int64_t numel = 0;        // sum of the parameters' numel
  int64_t padded = 0;       // numel rounded up to a multiple of W
  int64_t shard = 0;        // padded / W
  DType dtype = DType::f32;
  Tensor grads;             // (padded,): stages 0/1 persistent; stage 2 while filling
  Tensor rs_out;            // stage 2: this micro-step's reduce-scattered slice (shard,)
  Tensor owned;             // stage 2: the owned slice accumulated over micro-steps (shard,)
  bool owned_fresh = true;  // stage 2: the next reduced slice replaces `owned` (first micro-step)
  Tensor cpu_master;        // offload: the owned slice's f32 master weights on the CPU (shard,)
  Tensor cpu_grad;          // offload: the owned slice's gradients, f32 on the CPU (shard,)
  bool grad_down = false;   // offload: this step's download of cpu_grad was queued
  int ready = 0;
  bool launched = false;
  WorkPtr work;
  // Stage 3, a block's bucket (Note [ZeRO-3]): its parameters are views of `full`, released
  // outside the block's forward and backward; `shard` is this rank's persistent slice.
  int block = -1;
  std::shared_ptr<Storage> full;
  Tensor full_view;  // (padded,) over `full`
  Tensor param_shard;  // (shard,)
  enum class Gather { released, gathering, gathered } gather = Gather::released;
  WorkPtr gather_work;
  bool in_backward = false;  // gathered for backward: kept until its gradients are all in
};

struct DataParallel::OffloadStream {
#ifdef FORGE_WITH_CUDA
  explicit OffloadStream(int device) : stream(cuda::Stream::create(device)) {}
  cuda::Stream stream;
#endif
};

// What the model calls around its blocks (Note [ZeRO-3]); inert once the DataParallel is gone.
class DataParallel::Hooks final : public nn::BlockHooks {
 public:
  Hooks(DataParallel* dp, std::weak_ptr<int> alive) : dp_(dp), alive_(std::move(alive)) {}
  void before_block(int block) override {
    if (alive_.lock()) dp_->before_block(block);
  }
  TensorList after_block(int block, const TensorList& outputs) override {
    return alive_.lock() ? dp_->after_block(block, outputs) : outputs;
  }

 private:
  DataParallel* dp_;
  std::weak_ptr<int> alive_;
};

namespace {

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

Tensor zeros_like_device(int64_t n, DType dtype, Device device) {
  return zeros({n}, {.dtype = dtype, .device = device});
}

}  // namespace

DataParallel::DataParallel(std::vector<std::pair<std::string, Tensor>> named_params,
                           std::vector<optim::ParamGroup> groups, const OptimizerFactory& make_optimizer,
                           ProcessGroupPtr group, DataParallelOptions options)
    : group_(std::move(group)), options_(options) {
  FORGE_CHECK(group_ != nullptr, "DataParallel: no process group");
  FORGE_CHECK(options_.zero_stage >= 0 && options_.zero_stage <= 3, "DataParallel: zero_stage = ", options_.zero_stage,
              " is not supported; use 0 (DDP), 1, 2 or 3");
  FORGE_CHECK(!options_.offload_optimizer || options_.zero_stage >= 1,
              "DataParallel: offload_optimizer needs zero_stage = 1, 2 or 3 (the offloaded optimizer is the sharded one)");
  FORGE_CHECK(options_.zero_stage != 3 || options_.block_of != nullptr,
              "DataParallel: zero_stage = 3 needs options.block_of (which block each parameter belongs to)");
  FORGE_CHECK(options_.bucket_mb > 0, "DataParallel: bucket_mb must be > 0, got ", options_.bucket_mb);
  FORGE_CHECK(!named_params.empty(), "DataParallel: no parameters");
  device_ = named_params.front().second.device();
  FORGE_CHECK(group_->device() == device_, "DataParallel: the parameters are on ", device_.str(), " but the ",
              group_->backend(), " group communicates ", group_->device().str(), " tensors");
  for (auto& [name, t] : named_params) {
    FORGE_CHECK(t.device() == device_, "DataParallel: parameter '", name, "' is on ", t.device().str(), ", not ",
                device_.str());
    FORGE_CHECK(t.is_contiguous(), "DataParallel: parameter '", name, "' is not contiguous");
    const int block = options_.zero_stage == 3 ? options_.block_of(name) : -1;
    params_.push_back({name, t, -1, block, 0, t.numel()});
  }
  FORGE_CHECK(!options_.skip_reductions || options_.zero_stage <= 1,
              "DataParallel: skip_reductions (debug.skip_reductions, a diagnostic) works with DDP and ZeRO-1 only");
  build_buckets();
  if (options_.zero_stage == 3) shard_parameters();
  // Hooks: fire when a parameter's gradient is final for this backward. They hold the
  // parameter index only; a destroyed DataParallel must not be called, so the hooks check
  // the registry below.
  for (size_t i = 0; i < params_.size(); ++i) {
    const int idx = static_cast<int>(i);
    params_[i].t.register_grad_hook([this, idx, alive = std::weak_ptr<int>(alive_)](Tensor&) {
      if (alive.lock()) on_grad_ready(idx);
    });
  }
  build_pieces(groups, make_optimizer);
}

DataParallel::~DataParallel() {
  alive_.reset();
  for (auto& b : buckets_)
    if (b->work) b->work->synchronize();
#ifdef FORGE_WITH_CUDA
  if (offload_stream_) offload_stream_->stream.synchronize();
#endif
}

void DataParallel::build_buckets() {
  const int64_t W = group_->size();
  const auto cap = static_cast<int64_t>(options_.bucket_mb * 1e6);
  auto open = [&] {
    buckets_.push_back(std::make_unique<Bucket>());
    return buckets_.back().get();
  };
  Bucket* cur = nullptr;
  int64_t bytes = 0;
  for (int i = static_cast<int>(params_.size()) - 1; i >= 0; --i) {
    Param& p = params_[static_cast<size_t>(i)];
    const auto pb = static_cast<int64_t>(p.t.nbytes());
    // Stage 3: a block is one bucket, whatever its size, and shares it with nothing else.
    const bool split = p.block >= 0 ? false : bytes > 0 && bytes + pb > cap;
    if (cur == nullptr || split || cur->dtype != p.t.dtype() || cur->block != p.block) {
      FORGE_CHECK(cur == nullptr || p.block < 0 || cur->block != p.block,
                  "DataParallel: block ", p.block, " mixes dtypes (parameter '", p.name, "' is ",
                  dtype_name(p.t.dtype()), "); ZeRO-3 needs one dtype per block");
      cur = open();
      cur->dtype = p.t.dtype();
      cur->block = p.block;
      bytes = 0;
    }
    p.bucket = static_cast<int>(buckets_.size()) - 1;
    p.offset = cur->numel;
    cur->params.push_back(i);
    cur->numel += p.numel;
    bytes += pb;
  }
  for (auto& b : buckets_) {
    b->padded = round_up(std::max<int64_t>(b->numel, 1), W);
    b->shard = b->padded / W;
  }
  if (options_.zero_stage >= 2) {  // Note [ZeRO-2 staging buffers]
    const DType dt = buckets_.front()->dtype;
    int64_t most = 0;
    for (const auto& b : buckets_)
      if (b->dtype == dt) most = std::max(most, b->padded);
    for (auto& st : staging_) st = empty({most}, {.dtype = dt, .device = device_});
  }
}

void DataParallel::build_pieces(const std::vector<optim::ParamGroup>& groups, const OptimizerFactory& make_optimizer) {
  NoGradGuard no_grad;
  std::unordered_map<const TensorImpl*, int> index_of;
  for (size_t i = 0; i < params_.size(); ++i) index_of[params_[i].t.impl()] = static_cast<int>(i);
  std::vector<optim::ParamGroup> piece_groups;
  if (options_.zero_stage == 0) {
    // DDP: the whole optimizer on every rank, over the parameters themselves.
    for (const auto& g : groups) {
      optim::ParamGroup pg = g;
      for (const Tensor& t : g.params) {
        auto it = index_of.find(t.impl());
        FORGE_CHECK(it != index_of.end(), "DataParallel: an optimizer parameter of shape ", t.shape(),
                    " is not among the named parameters");
        const Param& p = params_[static_cast<size_t>(it->second)];
        pieces_.push_back({p.name, 0, p.numel});
        piece_params_.push_back(p.t);
        piece_views_.push_back(p.t);
      }
      piece_groups.push_back(std::move(pg));
    }
    optimizer_ = make_optimizer(std::move(piece_groups));
    return;
  }
  // ZeRO: the owned slice [r*s, (r+1)*s) of every bucket, cut at parameter boundaries.
  const int64_t r = group_->rank();
  std::unordered_map<int, std::vector<int>> pieces_of_param;  // param index -> piece indices
  std::vector<int> param_order;
  for (auto& bp : buckets_) {
    Bucket& b = *bp;
    const int64_t lo = r * b.shard, hi = lo + b.shard;
    for (int pi : b.params) {
      const Param& p = params_[static_cast<size_t>(pi)];
      const int64_t a = std::max(lo, p.offset), e = std::min(hi, p.offset + p.numel);
      if (a >= e) continue;
      ShardPiece piece{p.name, a - p.offset, e - p.offset};
      // Stage 3 blocks: the persistent shard holds the weights (the parameter's storage is released).
      Tensor view = b.block >= 0 ? b.param_shard.narrow(0, a - lo, e - a)
                                 : p.t.detach().reshape({-1}).narrow(0, piece.lo, piece.hi - piece.lo);
      pieces_of_param[pi].push_back(static_cast<int>(pieces_.size()));
      pieces_.push_back(piece);
      piece_views_.push_back(view);
      if (options_.offload_optimizer) {
        // Note [offloaded optimizer]: the master weights are views of the bucket's f32 slice on
        // the CPU (pinned next to a GPU), their gradients views of its f32 gradient slice, so
        // each step moves one block per bucket each way instead of one per piece.
        Bucket& mb = *bp;
        if (!mb.cpu_master.defined()) {
          mb.cpu_master = zeros({mb.shard}, {.dtype = DType::f32});
          mb.cpu_grad = zeros({mb.shard}, {.dtype = DType::f32});
          if (device_.is_cuda()) {
            mb.cpu_master = mb.cpu_master.pin_memory();
            mb.cpu_grad = mb.cpu_grad.pin_memory();
          }
        }
        const int64_t at = a - lo;
        Tensor master = mb.cpu_master.narrow(0, at, e - a);
        master.copy_(view.to(Device::cpu(), DType::f32));
        master.set_grad(mb.cpu_grad.narrow(0, at, e - a));
        piece_params_.push_back(master);
      } else {
        piece_params_.push_back(view);
      }
    }
  }
  // Groups of pieces in the order of the caller's groups (so weight decay and lr carry over);
  // within a group, the order of its parameters. The optimizer's slot k is the k-th piece so
  // listed: remember the mapping.
  std::vector<int> order;
  for (const auto& g : groups) {
    optim::ParamGroup pg = g;
    pg.params.clear();
    for (const Tensor& t : g.params) {
      auto it = index_of.find(t.impl());
      FORGE_CHECK(it != index_of.end(), "DataParallel: an optimizer parameter of shape ", t.shape(),
                  " is not among the named parameters");
      for (int k : pieces_of_param[it->second]) {
        pg.params.push_back(piece_params_[static_cast<size_t>(k)]);
        order.push_back(k);
      }
    }
    if (!pg.params.empty()) piece_groups.push_back(std::move(pg));
  }
  FORGE_CHECK(order.size() == pieces_.size(), "DataParallel: ", pieces_.size() - order.size(),
              " owned parameter piece(s) belong to no optimizer group");
  // Reorder the pieces into the optimizer's slot order.
  auto permute = [&](auto& v) {
    auto old = v;
    for (size_t k = 0; k < order.size(); ++k) v[k] = old[static_cast<size_t>(order[k])];
  };
  permute(pieces_);
  permute(piece_params_);
  permute(piece_views_);
  if (!piece_groups.empty()) optimizer_ = make_optimizer(std::move(piece_groups));
  // Gradient views of the pieces (stage 1: into the buckets; stage 2: into the owned slices).
  std::unordered_map<std::string, int> param_by_name;
  for (size_t i = 0; i < params_.size(); ++i) param_by_name[params_[i].name] = static_cast<int>(i);
  for (auto& bp : buckets_) {
    Bucket& b = *bp;
    if (options_.zero_stage == 1) b.grads = zeros_like_device(b.padded, b.dtype, device_);
    else b.owned = zeros_like_device(b.shard, b.dtype, device_);
  }
  for (size_t k = 0; k < pieces_.size(); ++k) {
    const Param& p = params_[static_cast<size_t>(param_by_name.at(pieces_[k].param))];
    Bucket& b = *buckets_[static_cast<size_t>(p.bucket)];
    const int64_t n = pieces_[k].hi - pieces_[k].lo;
    Tensor g = options_.zero_stage == 1 ? b.grads.narrow(0, p.offset + pieces_[k].lo, n)
                                        : b.owned.narrow(0, p.offset + pieces_[k].lo - r * b.shard, n);
    piece_grad_views_.push_back(g);
    piece_views_[k].set_grad(g);
  }
}

void DataParallel::broadcast_parameters() {
  NoGradGuard no_grad;
  std::vector<WorkPtr> works;
  for (auto& p : params_)
    if (p.block < 0 || options_.zero_stage != 3) works.push_back(group_->broadcast(p.t.detach(), 0));
  for (auto& w : works) w->wait();
}

// Note [ZeRO-3]: rank 0's weights everywhere, then each block's parameters are moved into one
// flat storage per bucket (in bucket order, padding zero), this rank's slice copied out as its
// persistent shard, the parameters re-pointed at the flat storage, and the storage released.
void DataParallel::shard_parameters() {
  NoGradGuard no_grad;
  {
    std::vector<WorkPtr> works;
    for (auto& p : params_) works.push_back(group_->broadcast(p.t.detach(), 0));
    for (auto& w : works) w->wait();
  }
  const int64_t r = group_->rank();
  block_bucket_.clear();
  for (size_t bi = 0; bi < buckets_.size(); ++bi) {
    Bucket& b = *buckets_[bi];
    if (b.block < 0) continue;
    if (static_cast<size_t>(b.block) >= block_bucket_.size()) block_bucket_.resize(static_cast<size_t>(b.block) + 1, -1);
    FORGE_CHECK(block_bucket_[static_cast<size_t>(b.block)] < 0, "DataParallel: the parameters of block ", b.block,
                " are not consecutive in parameter order (parameter '", params_[static_cast<size_t>(b.params.front())].name,
                "' comes after another block's); ZeRO-3 needs each block's parameters together");
    block_bucket_[static_cast<size_t>(b.block)] = static_cast<int>(bi);
    Tensor flat = zeros({b.padded}, {.dtype = b.dtype, .device = device_});
    for (int pi : b.params) {
      Param& p = params_[static_cast<size_t>(pi)];
      flat.narrow(0, p.offset, p.numel).copy_(p.t.detach().reshape({-1}));
    }
    b.param_shard = flat.narrow(0, r * b.shard, b.shard).clone();
    b.full = flat.storage();
    b.full_view = flat;
    for (int pi : b.params) {
      Param& p = params_[static_cast<size_t>(pi)];
      const Shape shape = p.t.shape();
      p.t.set_data(Tensor::make(b.full, shape, contiguous_strides(shape), p.offset, b.dtype));
    }
    b.full->release();
    b.gather = Bucket::Gather::released;
  }
  for (size_t i = 0; i < block_bucket_.size(); ++i)
    FORGE_CHECK(block_bucket_[i] >= 0, "DataParallel: ZeRO-3 found parameters of block ", block_bucket_.size() - 1,
                " but none of block ", i, "; blocks must be numbered 0, 1, ... without gaps");
  hooks_ = std::make_shared<Hooks>(this, alive_);
}

DataParallel::Bucket& DataParallel::unit_bucket(int block) {
  FORGE_CHECK(block >= 0 && static_cast<size_t>(block) < block_bucket_.size(), "DataParallel: block ", block,
              " has no sharded parameters (ZeRO-3 knows blocks 0..", static_cast<int>(block_bucket_.size()) - 1, ")");
  return *buckets_[static_cast<size_t>(block_bucket_[static_cast<size_t>(block)])];
}

void DataParallel::gather_async(Bucket& b) {
  if (b.gather != Bucket::Gather::released) return;
  NoGradGuard no_grad;
  b.full->reallocate();
  b.gather_work = group_->all_gather(b.full_view, b.param_shard);
  b.gather = Bucket::Gather::gathering;
}

void DataParallel::ensure_gathered(Bucket& b) {
  gather_async(b);
  if (b.gather == Bucket::Gather::gathering) {
    b.gather_work->wait();  // the compute stream waits for the gather (NCCL); the host for MPI
    b.gather_work = nullptr;
    b.gather = Bucket::Gather::gathered;
  }
}

void DataParallel::release_unit(Bucket& b) {
  if (b.gather == Bucket::Gather::released) return;
  if (b.gather_work) {
    b.gather_work->wait();
    b.gather_work = nullptr;
  }
  b.full->release();  // stream-ordered: kernels already queued on it still see the memory
  b.gather = Bucket::Gather::released;
  b.in_backward = false;
}

void DataParallel::before_block(int block) {
  ensure_gathered(unit_bucket(block));
  if (static_cast<size_t>(block) + 1 < block_bucket_.size()) gather_async(unit_bucket(block + 1));
}

TensorList DataParallel::after_block(int block, const TensorList& outputs) {
  Bucket& b = unit_bucket(block);
  TensorList out = outputs;
  if (autograd::any_requires_grad(outputs)) {
    for (Tensor& t : out) {
      if (!t.defined() || !t.requires_grad()) continue;
      Tensor y = t.detach();
      autograd::record("zero3_gather", y, {t},
                       [this, block, alive = std::weak_ptr<int>(alive_)](const Tensor& g, const autograd::GradMask&) {
                         if (alive.lock()) before_block_backward(block);
                         return TensorList{g};
                       });
      t = y;
    }
  }
  // The last block is the first one backward needs: a training forward keeps it (step()
  // releases it before the weights change).
  const bool last = static_cast<size_t>(block) + 1 == block_bucket_.size();
  if (!b.in_backward && !(last && autograd::any_requires_grad(outputs))) release_unit(b);
  return out;
}

void DataParallel::before_block_backward(int block) {
  Bucket& b = unit_bucket(block);
  ensure_gathered(b);
  b.in_backward = true;
  if (block > 0) gather_async(unit_bucket(block - 1));
}

void DataParallel::for_each_full_parameter(const std::function<void(const std::string&, const Tensor&)>& fn) {
  NoGradGuard no_grad;
  for (auto& p : params_)
    if (p.block < 0) fn(p.name, p.t.detach());
  for (size_t u = 0; u < block_bucket_.size(); ++u) {
    Bucket& b = *buckets_[static_cast<size_t>(block_bucket_[u])];
    const bool was_released = b.gather == Bucket::Gather::released;
    ensure_gathered(b);
    for (int pi : b.params) fn(params_[static_cast<size_t>(pi)].name, params_[static_cast<size_t>(pi)].t.detach());
    if (was_released) release_unit(b);
  }
}

// Each parameter's .grad becomes its view of the bucket, overwritten by the first gradient of
// the step (Tensor::set_grad_buffer), so the buckets are not zero-filled every step (their
// padding stays zero from allocation); a parameter that got no gradient has its view zeroed
// before its bucket is reduced (zero_pending_grads).
void DataParallel::attach_bucket_grads() {
  NoGradGuard no_grad;
  for (auto& bp : buckets_) {
    Bucket& b = *bp;
    if (!b.grads.defined()) b.grads = zeros_like_device(b.padded, b.dtype, device_);
    for (int pi : b.params) {
      Param& p = params_[static_cast<size_t>(pi)];
      p.t.set_grad_buffer(b.grads.narrow(0, p.offset, p.numel).view(p.t.shape()));
    }
  }
  grads_attached_ = true;
}

void DataParallel::zero_pending_grads(Bucket& b) {
  if (options_.zero_stage >= 2) return;
  NoGradGuard no_grad;
  for (int pi : b.params) {
    Param& p = params_[static_cast<size_t>(pi)];
    if (p.t.grad_buffer_pending()) p.t.set_grad(b.grads.narrow(0, p.offset, p.numel).view(p.t.shape()).zero_());
  }
}

void DataParallel::begin_backward(bool sync) {
  FORGE_CHECK(!in_backward_, "DataParallel::begin_backward: the previous micro-step's end_backward() was not called");
  for (auto& b : buckets_) FORGE_CHECK(b->work == nullptr, "DataParallel::begin_backward: a reduction is still pending");
  if (options_.zero_stage <= 1 && !grads_attached_) attach_bucket_grads();
  if (options_.zero_stage >= 2 && !grads_attached_) {
    for (auto& b : buckets_) b->owned_fresh = true;
    grads_attached_ = true;
  }
  sync_ = sync || options_.zero_stage >= 2;
  last_micro_step_ = sync;
  in_backward_ = true;
  next_to_launch_ = 0;
  for (auto& b : buckets_) {
    b->ready = 0;
    b->launched = false;
  }
}

void DataParallel::on_grad_ready(int param_index) {
  if (!in_backward_) return;
  Param& p = params_[static_cast<size_t>(param_index)];
  Bucket& b = *buckets_[static_cast<size_t>(p.bucket)];
  if (options_.zero_stage >= 2) {
    NoGradGuard no_grad;
    const Tensor& g = p.t.grad();
    if (g.defined()) {
      if (!b.grads.defined()) b.grads = stage2_buffer(p.bucket);
      b.grads.narrow(0, p.offset, p.numel).copy_(g.reshape({-1}));
      p.t.set_grad(Tensor());  // ZeRO-2 keeps no full gradient
    }
  }
  ++b.ready;
  // ZeRO-3: every gradient of the block is in, so its backward is over: drop the gathered weights.
  if (b.block >= 0 && b.ready == static_cast<int>(b.params.size())) release_unit(b);
  launch_ready_buckets();
}

// Note [ZeRO-2 staging buffers]. A ZeRO-2 bucket's full gradient lives only until its
// reduce-scatter has read it. Allocating one per bucket would let every bucket whose reduction
// the GPU has not reached yet hold its memory (the host queues backward far ahead of the
// device), up to the whole model's gradients. Instead bucket i fills staging buffer i % 2,
// after making the current stream wait for the reduce-scatter of bucket i - 2, the last
// reader of that buffer (a stream wait, not a host one). Only when bucket i - 2 has not been
// started yet (its gradients arrived late) does bucket i get a buffer of its own.
Tensor DataParallel::stage2_buffer(int index) {
  Bucket& b = *buckets_[static_cast<size_t>(index)];
  const int slot = index % 2;
  Bucket* prev = index >= 2 ? buckets_[static_cast<size_t>(index - 2)].get() : nullptr;
  Tensor& st = staging_[slot];
  if (st.defined() && st.dtype() == b.dtype && st.numel() >= b.padded && (prev == nullptr || prev->launched)) {
    if (prev) finish_bucket(*prev);
    Tensor buf = st.narrow(0, 0, b.padded);
    buf.zero_();
    return buf;
  }
  return zeros_like_device(b.padded, b.dtype, device_);
}

void DataParallel::launch_ready_buckets() {
  if (!sync_) return;
  while (next_to_launch_ < num_buckets()) {
    Bucket& b = *buckets_[static_cast<size_t>(next_to_launch_)];
    if (b.ready < static_cast<int>(b.params.size())) break;
    launch(b);
    ++next_to_launch_;
    // ZeRO-2: fold the reduced slice of the bucket two back into the owned gradients now, so
    // its output buffer is not held until the end of backward.
    if (options_.zero_stage >= 2 && next_to_launch_ >= 3) finish_bucket(*buckets_[static_cast<size_t>(next_to_launch_ - 3)]);
  }
}

void DataParallel::launch(Bucket& b) {
  NoGradGuard no_grad;
  if (options_.skip_reductions) {  // debug.skip_reductions (DDP, ZeRO-1): a diagnostic, the run is wrong
    b.launched = true;
    return;
  }
  if (options_.zero_stage <= 1) {
    b.work = group_->all_reduce(b.grads, ReduceOp::avg);
  } else {
    if (!b.grads.defined()) b.grads = zeros_like_device(b.padded, b.dtype, device_);
    b.rs_out = empty({b.shard}, {.dtype = b.dtype, .device = device_});
    b.work = group_->reduce_scatter(b.rs_out, b.grads, ReduceOp::avg);
    b.grads = Tensor();  // the work holds it until the reduction is done
  }
  b.launched = true;
}

void DataParallel::finish_bucket(Bucket& b) {
  if (!b.work) return;
  b.work->wait();
  b.work = nullptr;
  if (options_.zero_stage >= 2) {
    NoGradGuard no_grad;
    if (b.owned_fresh) b.owned.copy_(b.rs_out);
    else b.owned.add_(b.rs_out);
    b.owned_fresh = false;
    b.rs_out = Tensor();
  }
  if (last_micro_step_ && b.cpu_grad.defined()) start_grad_download(b);
}

// Note [offloaded optimizer]: the bucket's owned, reduced gradient slice is final: convert it to
// f32 (on the compute stream) and, on a GPU, copy it into the pinned cpu_grad on a side stream,
// so the copy overlaps the rest of backward; step() waits for it. On the CPU, a plain copy.
void DataParallel::start_grad_download(Bucket& b) {
  NoGradGuard no_grad;
  const int64_t r = group_->rank();
  const Tensor g = options_.zero_stage == 1 ? b.grads.narrow(0, r * b.shard, b.shard) : b.owned;
  if (!device_.is_cuda()) {
    b.cpu_grad.copy_(g);
    b.grad_down = true;
    return;
  }
#ifdef FORGE_WITH_CUDA
  Tensor g32 = g.to(DType::f32).contiguous();
  if (g32.storage() == g.storage()) g32 = g32.clone();  // the optimizer may scale g before the copy lands
  const int dev = device_.index;
  if (!offload_stream_) offload_stream_ = std::make_unique<OffloadStream>(dev);
  cuda::Event ready;
  ready.record(cuda::Stream::current(dev));
  offload_stream_->stream.wait(ready);
  {
    cuda::StreamGuard on(offload_stream_->stream);
    cuda::copy(b.cpu_grad, g32, /*non_blocking=*/true);
  }
  cuda::record_stream(g32, offload_stream_->stream);
  b.grad_down = true;
#endif
}

void DataParallel::end_backward() {
  FORGE_CHECK(in_backward_, "DataParallel::end_backward without begin_backward");
  in_backward_ = false;
  for (auto& b : buckets_)
    if (b->block >= 0) release_unit(*b);  // blocks whose gradients did not all arrive
  if (!sync_) return;
  // Buckets whose every gradient did not arrive (unused parameters) are reduced now, in order.
  for (int i = next_to_launch_; i < num_buckets(); ++i) {
    zero_pending_grads(*buckets_[static_cast<size_t>(i)]);
    launch(*buckets_[static_cast<size_t>(i)]);
  }
  next_to_launch_ = num_buckets();
  for (auto& b : buckets_) finish_bucket(*b);
}

std::vector<Tensor> DataParallel::norm_tensors() const {
  if (options_.zero_stage >= 2) return piece_views_;
  std::vector<Tensor> ts;
  for (const auto& p : params_) ts.push_back(p.t);
  return ts;
}

Tensor DataParallel::grad_norm() {
  NoGradGuard no_grad;
  if (options_.zero_stage <= 1) return optim::total_grad_norm(norm_tensors());
  Tensor local = piece_views_.empty() ? zeros({}, {.dtype = DType::f32, .device = device_})
                                      : optim::total_grad_norm(piece_views_);
  Tensor sq = (local * local).contiguous();
  group_->all_reduce(sq, ReduceOp::sum)->wait();
  return sq.pow(0.5);
}

Tensor DataParallel::unscale_grads(optim::LossScaler& scaler) {
  FORGE_CHECK(!options_.offload_optimizer, "DataParallel: f16 loss scaling with the optimizer offloaded to the CPU is "
              "not supported; use run.dtype = \"bf16\" or dist.offload_optimizer = false");
  NoGradGuard no_grad;
  // DDP, ZeRO-1: the reduced gradients are whole and the same on every rank, so is their check.
  if (options_.zero_stage <= 1) return scaler.unscale_(norm_tensors());
  // ZeRO-2/3: each rank unscales the slices it owns; the norm and the overflow flag go global.
  const Tensor local = scaler.unscale_(piece_views_);
  Tensor sq = (local * local).contiguous();
  group_->all_reduce(sq, ReduceOp::sum)->wait();
  Tensor found = scaler.found_non_finite();
  group_->all_reduce(found, ReduceOp::max)->wait();
  return sq.pow(0.5);
}

void DataParallel::clip_grads(double max_norm, const Tensor& norm) {
  if (max_norm <= 0) return;
  NoGradGuard no_grad;
  if (options_.offload_optimizer) {
    // The gradients the optimizer reads are on the CPU (downloaded during backward): clipped
    // there by step(), once they have landed.
    offload_clip_ = {max_norm, norm};
    return;
  }
  if (options_.zero_stage == 0) optim::clip_grads_with_norm_(norm_tensors(), max_norm, norm);
  else if (!piece_views_.empty()) optim::clip_grads_with_norm_(piece_views_, max_norm, norm);
}

void DataParallel::step(const Tensor& skip_if) {
  NoGradGuard no_grad;
  for (auto& b : buckets_)
    if (b->block >= 0) release_unit(*b);  // ZeRO-3: gathered weights are about to be stale
  const auto clip = std::exchange(offload_clip_, {});
  ++step_count_;
  const int64_t r = group_->rank();
  if (optimizer_ && options_.offload_optimizer) {
    // Note [offloaded optimizer]: each bucket's owned gradient slice comes down in one copy
    // (converted to f32), the update runs on the CPU, and the new weights go up in one copy
    // per bucket as that bucket's all-gather input (below).
    for (auto& bp : buckets_) {
      Bucket& b = *bp;
      if (!b.cpu_grad.defined() || b.grad_down) continue;
      const Tensor g = options_.zero_stage == 1 ? b.grads.narrow(0, r * b.shard, b.shard) : b.owned;
      b.cpu_grad.copy_(g.to(Device::cpu(), DType::f32));  // (not downloaded during backward)
    }
#ifdef FORGE_WITH_CUDA
    if (offload_stream_) offload_stream_->stream.synchronize();  // the downloads queued in backward
#endif
    for (auto& bp : buckets_) bp->grad_down = false;
    if (clip.second.defined() && !piece_params_.empty())
      optim::clip_grads_with_norm_(piece_params_, clip.first, clip.second.to(Device::cpu()));
    optimizer_->step(skip_if);
  } else if (optimizer_) {
    optimizer_->step(skip_if);
  }
  if (options_.zero_stage == 0) return;
  // All-gather every bucket's owned slice into every rank's parameters; two buckets in flight.
  std::unordered_map<std::string, int> param_by_name;
  for (size_t i = 0; i < params_.size(); ++i) param_by_name[params_[i].name] = static_cast<int>(i);
  std::vector<std::vector<int>> pieces_in_bucket(buckets_.size());
  for (size_t k = 0; k < pieces_.size(); ++k)
    pieces_in_bucket[static_cast<size_t>(params_[static_cast<size_t>(param_by_name.at(pieces_[k].param))].bucket)]
        .push_back(static_cast<int>(k));
  struct InFlight {
    int bucket;
    Tensor out;
    WorkPtr work;
  };
  std::vector<InFlight> flying;
  auto land = [&](InFlight& f) {
    f.work->wait();
    const Bucket& b = *buckets_[static_cast<size_t>(f.bucket)];
    for (int pi : b.params) {
      Param& p = params_[static_cast<size_t>(pi)];
      p.t.detach().reshape({-1}).copy_(f.out.narrow(0, p.offset, p.numel));
    }
  };
  for (size_t bi = 0; bi < buckets_.size(); ++bi) {
    Bucket& b = *buckets_[bi];
    if (b.block >= 0) {
      // ZeRO-3: the shard is the weights; the next forward gathers it. Offloaded: one copy up.
      if (b.cpu_master.defined()) b.param_shard.copy_(b.cpu_master.to(device_, b.dtype));
      continue;
    }
    Tensor mine;
    if (b.cpu_master.defined()) {
      mine = b.cpu_master.to(device_, b.dtype);  // the offloaded update's result (its padding is 0)
      if (mine.storage() == b.cpu_master.storage()) mine = mine.clone();  // f32 CPU: not the master itself
    } else {
      mine = zeros_like_device(b.shard, b.dtype, device_);
    }
    for (int k : b.cpu_master.defined() ? std::vector<int>{} : pieces_in_bucket[bi]) {
      const Param& p = params_[static_cast<size_t>(param_by_name.at(pieces_[static_cast<size_t>(k)].param))];
      const ShardPiece& pc = pieces_[static_cast<size_t>(k)];
      mine.narrow(0, p.offset + pc.lo - r * b.shard, pc.hi - pc.lo).copy_(piece_views_[static_cast<size_t>(k)]);
    }
    Tensor out = empty({b.padded}, {.dtype = b.dtype, .device = device_});
    flying.push_back({static_cast<int>(bi), out, group_->all_gather(out, mine)});
    if (flying.size() > 1) {
      land(flying.front());
      flying.erase(flying.begin());
    }
  }
  for (auto& f : flying) land(f);
}

void DataParallel::zero_grad() {
  for (auto& p : params_) p.t.set_grad(Tensor());
  grads_attached_ = false;
}

void DataParallel::set_lr(double lr) {
  if (!optimizer_) return;
  for (auto& g : optimizer_->param_groups()) g.lr = lr;
}

std::vector<std::map<std::string, Tensor>> DataParallel::piece_state() const {
  std::vector<std::map<std::string, Tensor>> out(pieces_.size());
  if (!optimizer_) return out;
  const optim::StateDict sd = optimizer_->state_dict();
  for (const auto& [key, t] : sd.tensors) {
    // "state.<k>.<name>"
    const auto dot = key.find('.', 6);
    const auto k = static_cast<size_t>(std::stoll(key.substr(6, dot - 6)));
    out[k][key.substr(dot + 1)] = t.reshape({-1});
  }
  if (options_.offload_optimizer) {
    for (size_t k = 0; k < pieces_.size(); ++k)
      if (piece_views_[k].dtype() != DType::f32 && !out[k].empty()) out[k]["master"] = piece_params_[k];
  }
  return out;
}

std::vector<int64_t> DataParallel::piece_steps() const {
  std::vector<int64_t> steps(pieces_.size(), 0);
  if (!optimizer_) return steps;
  const optim::StateDict sd = optimizer_->state_dict();
  for (size_t k = 0; k < pieces_.size(); ++k) {
    auto it = sd.scalars.find("state." + std::to_string(k) + ".step");
    if (it != sd.scalars.end()) steps[k] = static_cast<int64_t>(it->second);
  }
  return steps;
}

void DataParallel::load_piece_state(const std::function<Tensor(const ShardPiece&, const std::string&)>& lookup,
                                    const std::function<int64_t(const ShardPiece&)>& step_of) {
  NoGradGuard no_grad;
  if (!optimizer_) return;
  optim::StateDict sd = optimizer_->state_dict();
  // Keep the group scalars; replace the per-parameter state.
  for (auto it = sd.scalars.begin(); it != sd.scalars.end();)
    it = it->first.rfind("state.", 0) == 0 ? sd.scalars.erase(it) : std::next(it);
  sd.tensors.clear();
  sd.scalars["step"] = static_cast<double>(step_count_);
  static const char* kNames[] = {"exp_avg", "exp_avg_sq", "master", "momentum_buffer"};
  for (size_t k = 0; k < pieces_.size(); ++k) {
    const int64_t steps = step_of(pieces_[k]);
    if (steps <= 0) continue;
    const std::string pre = "state." + std::to_string(k) + ".";
    sd.scalars[pre + "step"] = static_cast<double>(steps);
    for (const char* name : kNames) {
      Tensor t = lookup(pieces_[k], name);
      if (!t.defined()) continue;
      if (std::string(name) == "master" && options_.offload_optimizer) {
        piece_params_[k].copy_(t.to(DType::f32));
        continue;
      }
      if (std::string(name) == "master" && piece_params_[k].dtype() == DType::f32) continue;
      sd.tensors[pre + name] = t.reshape(piece_params_[k].shape());
    }
  }
  optimizer_->load_state_dict(sd);
}

int64_t DataParallel::optimizer_state_bytes() const {
  int64_t n = 0;
  for (const auto& m : piece_state())
    for (const auto& [name, t] : m) n += static_cast<int64_t>(t.nbytes());
  return n;
}

}  // namespace forge::dist
