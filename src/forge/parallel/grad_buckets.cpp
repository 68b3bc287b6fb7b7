// Gradient buckets reduced while backward runs (contract in grad_buckets.h).
#include "forge/parallel/grad_buckets.h"

#include <algorithm>
#include <string>
#include <vector>

#include "forge/autograd/grad_mode.h"
#include "forge/core/error.h"
#include "forge/core/memory_owner.h"
#include "forge/core/trace_range.h"
#include "forge/ops/creation.h"

namespace forge::parallel {

namespace {

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

Tensor zeros_on(int64_t n, DType dtype, Device device) { return zeros({n}, {.dtype = dtype, .device = device}); }

}  // namespace

void build_buckets(DpState& st, double bucket_mb) {
  const int64_t W = st.world();
  const auto cap = static_cast<int64_t>(bucket_mb * 1e6);
  DpBucket* cur = nullptr;
  int64_t bytes = 0;
  for (int i = static_cast<int>(st.params.size()) - 1; i >= 0; --i) {
    DpParam& p = st.params[static_cast<size_t>(i)];
    const auto pb = static_cast<int64_t>(p.t.nbytes());
    // Stage 3: a block is one bucket, whatever its size, and shares it with nothing else.
    const bool split = p.block >= 0 ? false : bytes > 0 && bytes + pb > cap;
    if (cur == nullptr || split || cur->dtype != p.t.dtype() || cur->block != p.block) {
      FORGE_CHECK(cur == nullptr || p.block < 0 || cur->block != p.block,
                  "DataParallel: block ", p.block, " mixes dtypes (parameter '", p.name, "' is ",
                  dtype_name(p.t.dtype()), "); ZeRO-3 needs one dtype per block");
      st.buckets.emplace_back();
      cur = &st.buckets.back();
      cur->dtype = p.t.dtype();
      cur->block = p.block;
      bytes = 0;
    }
    p.bucket = st.num_buckets() - 1;
    p.offset = cur->numel;
    cur->params.push_back(i);
    cur->numel += p.numel;
    bytes += pb;
  }
  for (auto& b : st.buckets) {
    b.padded = round_up(std::max<int64_t>(b.numel, 1), W);
    b.shard = b.padded / W;
  }
}


GradientBuckets::GradientBuckets(DpState& st) : st_(st), state_(st.buckets.size()) {
  if (st_.powersgd_rank > 0) powersgd_ = std::make_unique<PowerSgd>(st_, st_.powersgd_rank, st_.powersgd_seed);
  if (st_.fp8_reduce && st_.world() > 1)
    fp8_ = std::make_unique<Fp8GradReduce>(
        st_, Fp8Feedback{st_.fp8_feedback_all_reduce, st_.fp8_feedback_reduce_scatter});
  if (st_.sharding.gradients()) {  // Note [ZeRO-2 staging buffers]
    const DType dt = st_.buckets.front().dtype;
    int64_t most = 0;
    for (const auto& b : st_.buckets)
      if (b.dtype == dt) most = std::max(most, b.padded);
    for (auto& s : staging_) s = empty({most}, {.dtype = dt, .device = st_.device});
  }
  // Hooks: fire when a parameter's gradient is final for this backward. They hold the parameter
  // index only and check that the DataParallel still exists.
  for (size_t i = 0; i < st_.params.size(); ++i) {
    const int idx = static_cast<int>(i);
    st_.params[i].t.register_grad_hook([this, idx, alive = std::weak_ptr<int>(st_.alive)](Tensor&) {
      if (alive.lock()) on_grad_ready(idx);
    });
  }
}

GradientBuckets::~GradientBuckets() {
  for (auto& b : state_)
    if (b.work) b.work->synchronize();
}

Tensor GradientBuckets::owned_slice(int bucket) const {
  const DpBucket& b = st_.buckets[static_cast<size_t>(bucket)];
  return !st_.sharding.gradients() ? full(bucket).narrow(0, st_.rank() * b.shard, b.shard) : owned(bucket);
}

void GradientBuckets::allocate_for_sharded_optimizer() {
  for (size_t i = 0; i < state_.size(); ++i) {
    const DpBucket& b = st_.buckets[i];
    if (st_.sharding.gradients()) state_[i].owned = zeros_on(b.shard, b.dtype, st_.device);
    else state_[i].grads = zeros_on(b.padded, b.dtype, st_.device);  // ZeRO-1: the whole bucket
  }
}

// Each parameter's .grad becomes its view of the bucket, overwritten by the first gradient of
// the step (Tensor::set_grad_buffer), so the buckets are not zero-filled every step (their
// padding stays zero from allocation); a parameter that got no gradient has its view zeroed
// before its bucket is reduced (zero_pending_grads).
// Note [gradient memory between steps]: with release_grads (DDP in one process) zero_grad drops
// the buckets, and they are taken again here from the caching allocator (uninitialised: only the
// padding is zeroed; every parameter's view is overwritten or zeroed as above), so the gradients
// hold memory from backward to the update only, as autograd's own .grad tensors did, instead of
// adding the model's gradient bytes to the next forward's peak. Inside a captured step the
// allocation and the release are the graph's, as autograd's were.
void GradientBuckets::attach_bucket_grads() {
  NoGradGuard no_grad;
  for (size_t i = 0; i < state_.size(); ++i) {
    const DpBucket& b = st_.buckets[i];
    Tensor& grads = state_[i].grads;
    if (!grads.defined() && st_.release_grads) {
      grads = empty({b.padded}, {.dtype = b.dtype, .device = st_.device});
      if (b.padded > b.numel) grads.narrow(0, b.numel, b.padded - b.numel).zero_();
    }
    if (!grads.defined()) grads = zeros_on(b.padded, b.dtype, st_.device);
    for (int pi : b.params) {
      DpParam& p = st_.params[static_cast<size_t>(pi)];
      p.t.set_grad_buffer(grads.narrow(0, p.offset, p.numel).view(p.t.shape()));
    }
  }
  grads_attached_ = true;
}

void GradientBuckets::zero_pending_grads(int bucket) {
  if (st_.sharding.gradients()) return;
  NoGradGuard no_grad;
  const DpBucket& b = st_.buckets[static_cast<size_t>(bucket)];
  const Tensor& grads = state_[static_cast<size_t>(bucket)].grads;
  for (int pi : b.params) {
    DpParam& p = st_.params[static_cast<size_t>(pi)];
    if (p.t.grad_buffer_pending()) p.t.set_grad(grads.narrow(0, p.offset, p.numel).view(p.t.shape()).zero_());
  }
}

void GradientBuckets::begin_backward(bool sync) {
  FORGE_CHECK(!in_backward_, "DataParallel::begin_backward: the previous micro-step's end_backward() was not called");
  for (auto& b : state_) FORGE_CHECK(b.work == nullptr, "DataParallel::begin_backward: a reduction is still pending");
  if (!st_.sharding.gradients() && !grads_attached_) attach_bucket_grads();
  if (st_.sharding.gradients() && !grads_attached_) {
    for (auto& b : state_) b.owned_fresh = true;
    grads_attached_ = true;
  }
  sync_ = sync || st_.sharding.gradients();
  last_micro_step_ = sync;
  in_backward_ = true;
  next_to_launch_ = 0;
  for (auto& b : state_) {
    b.ready = 0;
    b.launched = false;
  }
}

void GradientBuckets::on_grad_ready(int param_index) {
  if (!in_backward_) return;
  DpParam& p = st_.params[static_cast<size_t>(param_index)];
  Bucket& b = state_[static_cast<size_t>(p.bucket)];
  if (st_.sharding.gradients()) {
    NoGradGuard no_grad;
    const Tensor& g = p.t.grad();
    if (g.defined()) {
      if (!b.grads.defined()) b.grads = staging_buffer(p.bucket);
      b.grads.narrow(0, p.offset, p.numel).copy_(g.reshape({-1}));
      p.t.set_grad(Tensor());  // ZeRO-2/3 keep no full gradient
    }
  }
  ++b.ready;
  if (b.ready == static_cast<int>(st_.buckets[static_cast<size_t>(p.bucket)].params.size()) && on_all_grads_in)
    on_all_grads_in(p.bucket);
  launch_ready_buckets();
}

// Note [ZeRO-2 staging buffers]. A ZeRO-2 bucket's full gradient lives only until its
// reduce-scatter has read it. Allocating one per bucket would let every bucket whose reduction
// the GPU has not reached yet hold its memory (the host queues backward far ahead of the
// device), up to the whole model's gradients. Instead bucket i fills staging buffer i % 2,
// after making the current stream wait for the reduce-scatter of bucket i - 2, the last
// reader of that buffer (a stream wait, not a host one). Only when bucket i - 2 has not been
// started yet (its gradients arrived late) does bucket i get a buffer of its own.
Tensor GradientBuckets::staging_buffer(int index) {
  const DpBucket& b = st_.buckets[static_cast<size_t>(index)];
  const int slot = index % 2;
  const bool prev_exists = index >= 2;
  Tensor& s = staging_[slot];
  if (s.defined() && s.dtype() == b.dtype && s.numel() >= b.padded &&
      (!prev_exists || state_[static_cast<size_t>(index - 2)].launched)) {
    if (prev_exists) finish(index - 2);
    Tensor buf = s.narrow(0, 0, b.padded);
    buf.zero_();
    return buf;
  }
  return zeros_on(b.padded, b.dtype, st_.device);
}

void GradientBuckets::launch_ready_buckets() {
  if (!sync_) return;
  while (next_to_launch_ < st_.num_buckets()) {
    const int i = next_to_launch_;
    if (state_[static_cast<size_t>(i)].ready < static_cast<int>(st_.buckets[static_cast<size_t>(i)].params.size())) break;
    launch(i);
    ++next_to_launch_;
    // ZeRO-2: fold the reduced slice of the bucket two back into the owned gradients now, so
    // its output buffer is not held until the end of backward.
    if (st_.sharding.gradients() && next_to_launch_ >= 3) finish(next_to_launch_ - 3);
  }
}

void GradientBuckets::launch(int index) {
  NoGradGuard no_grad;
  Bucket& b = state_[static_cast<size_t>(index)];
  const DpBucket& lay = st_.buckets[static_cast<size_t>(index)];
  if (st_.skip_reductions) {  // debug.skip_reductions (DDP, ZeRO-1): a diagnostic, the run is wrong
    b.launched = true;
    return;
  }
  if (trace::sink()) {  // a traced step (core/trace_range.h): when each bucket's collective starts
    static std::vector<const char*> names[2];
    auto& n = names[!st_.sharding.gradients() ? 0 : 1];
    while (n.size() <= static_cast<size_t>(index))
      n.push_back(intern_memory_owner(std::string(!st_.sharding.gradients() ? "all-reduce" : "reduce-scatter") +
                                      " bucket " + std::to_string(n.size())));
    trace::instant(n[static_cast<size_t>(index)]);
  }
  if (powersgd_ && compress_) {
    powersgd_->reduce(index, b.grads);
    b.work = completed_work();  // (done in place when its bucket was ready)
  } else if (!st_.sharding.gradients()) {
    b.work = fp8_ && compress_ ? fp8_->all_reduce(index, b.grads) : st_.group->all_reduce(b.grads, ReduceOp::avg);
  } else {
    if (!b.grads.defined()) b.grads = zeros_on(lay.padded, lay.dtype, st_.device);
    b.rs_out = empty({lay.shard}, {.dtype = lay.dtype, .device = st_.device});
    b.work = fp8_ && compress_ ? fp8_->reduce_scatter(index, b.rs_out, b.grads)
                               : st_.group->reduce_scatter(b.rs_out, b.grads, ReduceOp::avg);
    b.grads = Tensor();  // the work holds it until the reduction is done
  }
  b.launched = true;
}

void GradientBuckets::finish(int index) {
  Bucket& b = state_[static_cast<size_t>(index)];
  if (!b.work) return;
  b.work->wait();
  b.work = nullptr;
  if (st_.sharding.gradients()) {
    NoGradGuard no_grad;
    if (b.owned_fresh) b.owned.copy_(b.rs_out);
    else b.owned.add_(b.rs_out);
    b.owned_fresh = false;
    b.rs_out = Tensor();
  }
  if (last_micro_step_ && on_final) on_final(index);
}

void GradientBuckets::end_backward() {
  FORGE_CHECK(in_backward_, "DataParallel::end_backward without begin_backward");
  in_backward_ = false;
  if (on_end_backward) on_end_backward();
  if (!sync_) return;
  // Buckets whose every gradient did not arrive (unused parameters) are reduced now, in order.
  for (int i = next_to_launch_; i < st_.num_buckets(); ++i) {
    zero_pending_grads(i);
    launch(i);
  }
  next_to_launch_ = st_.num_buckets();
  for (int i = 0; i < st_.num_buckets(); ++i) finish(i);
}

void GradientBuckets::zero_grad() {
  for (auto& p : st_.params) p.t.set_grad(Tensor());
  if (st_.release_grads)  // Note [gradient memory between steps]
    for (auto& b : state_) b.grads = Tensor();
  grads_attached_ = false;
}

}  // namespace forge::parallel
