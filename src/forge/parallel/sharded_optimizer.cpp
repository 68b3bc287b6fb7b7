// The optimizer over whole parameters or owned slices, offload, and the weights' all-gather
// (contract in sharded_optimizer.h).
#include "forge/parallel/sharded_optimizer.h"

#include <algorithm>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "forge/autograd/grad_mode.h"
#include "forge/core/error.h"
#include "forge/ops/copy.h"
#include "forge/ops/creation.h"
#include "forge/optim/clip.h"

#ifdef FORGE_WITH_CUDA
#include "forge/backends/cuda/stream.h"
#include "forge/backends/cuda/tensor_kernels.h"
#endif

namespace forge::parallel {

struct ShardedOptimizer::OffloadStream {
#ifdef FORGE_WITH_CUDA
  explicit OffloadStream(int device) : stream(cuda::Stream::create(device)) {}
  cuda::Stream stream;
#endif
};

ShardedOptimizer::ShardedOptimizer(DpState& st, GradientBuckets& grads, const std::vector<optim::ParamGroup>& groups,
                                   const OptimizerFactory& make_optimizer, std::function<Tensor(int)> block_shard)
    : st_(st), grads_(grads), block_shard_(std::move(block_shard)) {
  NoGradGuard no_grad;
  std::unordered_map<const TensorImpl*, int> index_of;
  for (size_t i = 0; i < st_.params.size(); ++i) index_of[st_.params[i].t.impl()] = static_cast<int>(i);
  std::vector<optim::ParamGroup> piece_groups;
  if (!st_.sharding.optimizer_state()) {
    // DDP: the whole optimizer on every rank, over the parameters themselves.
    for (const auto& g : groups) {
      optim::ParamGroup pg = g;
      for (const Tensor& t : g.params) {
        auto it = index_of.find(t.impl());
        FORGE_CHECK(it != index_of.end(), "DataParallel: an optimizer parameter of shape ", t.shape(),
                    " is not among the named parameters");
        const DpParam& p = st_.params[static_cast<size_t>(it->second)];
        pieces_.push_back({p.name, 0, p.numel});
        piece_params_.push_back(p.t);
        piece_views_.push_back(p.t);
      }
      piece_groups.push_back(std::move(pg));
    }
    optimizer_ = make_optimizer(std::move(piece_groups));
    // Note [clipping inside the update] (optim/optimizer.h): clip_grads may hand the clip to the
    // optimizer only if it updates exactly the tensors whose gradients clipping must scale
    // (norm_tensors(): every parameter). Each optimizer parameter is one of st_.params (checked
    // above) and appears once (Optimizer checks), so the sets agree when their sizes do.
    std::unordered_set<const TensorImpl*> all, mine;
    for (const DpParam& p : st_.params) all.insert(p.t.impl());
    for (const Tensor& t : piece_params_) mine.insert(t.impl());
    clip_in_update_ = all.size() == mine.size();
    return;
  }
  // ZeRO: the owned slice [r*s, (r+1)*s) of every bucket, cut at parameter boundaries.
  const int64_t r = st_.rank();
  if (st_.offload) offload_.resize(st_.buckets.size());
  std::unordered_map<int, std::vector<int>> pieces_of_param;  // param index -> piece indices
  for (size_t bi = 0; bi < st_.buckets.size(); ++bi) {
    const DpBucket& b = st_.buckets[bi];
    const int64_t lo = r * b.shard, hi = lo + b.shard;
    for (int pi : b.params) {
      const DpParam& p = st_.params[static_cast<size_t>(pi)];
      const int64_t a = std::max(lo, p.offset), e = std::min(hi, p.offset + p.numel);
      if (a >= e) continue;
      ShardPiece piece{p.name, a - p.offset, e - p.offset};
      // Stage 3 blocks: the persistent shard holds the weights (the parameter's storage is released).
      Tensor view = b.block >= 0 ? block_shard_(static_cast<int>(bi)).narrow(0, a - lo, e - a)
                                 : p.t.detach().reshape({-1}).narrow(0, piece.lo, piece.hi - piece.lo);
      pieces_of_param[pi].push_back(static_cast<int>(pieces_.size()));
      pieces_.push_back(piece);
      piece_views_.push_back(view);
      if (st_.offload) {
        // Note [offloaded optimizer]: the master weights are views of the bucket's f32 slice on
        // the CPU (pinned next to a GPU), their gradients views of its f32 gradient slice, so
        // each step moves one block per bucket each way instead of one per piece.
        OffloadSlice& o = offload_[bi];
        if (!o.cpu_master.defined()) {
          o.cpu_master = zeros({b.shard}, {.dtype = DType::f32});
          o.cpu_grad = zeros({b.shard}, {.dtype = DType::f32});
          if (st_.device.is_cuda()) {
            o.cpu_master = o.cpu_master.pin_memory();
            o.cpu_grad = o.cpu_grad.pin_memory();
          }
        }
        const int64_t at = a - lo;
        Tensor master = o.cpu_master.narrow(0, at, e - a);
        master.copy_(view.to(Device::cpu(), DType::f32));
        master.set_grad(o.cpu_grad.narrow(0, at, e - a));
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
  // Gradient views of the pieces (stage 1: into the buckets; stages 2/3: into the owned slices).
  grads_.allocate_for_sharded_optimizer();
  std::unordered_map<std::string, int> param_by_name;
  for (size_t i = 0; i < st_.params.size(); ++i) param_by_name[st_.params[i].name] = static_cast<int>(i);
  for (size_t k = 0; k < pieces_.size(); ++k) {
    const DpParam& p = st_.params[static_cast<size_t>(param_by_name.at(pieces_[k].param))];
    const DpBucket& b = st_.buckets[static_cast<size_t>(p.bucket)];
    const int64_t n = pieces_[k].hi - pieces_[k].lo;
    Tensor g = !st_.sharding.gradients() ? grads_.full(p.bucket).narrow(0, p.offset + pieces_[k].lo, n)
                                         : grads_.owned(p.bucket).narrow(0, p.offset + pieces_[k].lo - r * b.shard, n);
    piece_grad_views_.push_back(g);
    piece_views_[k].set_grad(g);
  }
}

void ShardedOptimizer::seed_masters(const std::function<Tensor(const std::string&)>& f32_of) {
  NoGradGuard no_grad;
  for (size_t k = 0; k < pieces_.size(); ++k) {
    const ShardPiece& piece = pieces_[k];
    const Tensor whole = f32_of(piece.param);
    if (!whole.defined()) continue;
    const Tensor part = whole.detach().reshape({-1}).narrow(0, piece.lo, piece.hi - piece.lo);
    Tensor& target = piece_params_[k];
    if (target.dtype() == DType::f32) {  // offloaded: the CPU master is the optimizer's parameter
      if (!piece_views_[k].is_same(target)) target.copy_(ops::to(part, target.device(), DType::f32));
    } else if (optimizer_) {
      optimizer_->seed_state(target, "master", part);
    }
  }
}

ShardedOptimizer::~ShardedOptimizer() {
#ifdef FORGE_WITH_CUDA
  if (offload_stream_) offload_stream_->stream.synchronize();
#endif
}

// Note [offloaded optimizer]: the bucket's owned, reduced gradient slice is final: convert it to
// f32 (on the compute stream) and, on a GPU, copy it into the pinned cpu_grad on a side stream,
// so the copy overlaps the rest of backward; step() waits for it. On the CPU, a plain copy.
void ShardedOptimizer::start_grad_download(int bucket) {
  if (offload_.empty() || !offload_[static_cast<size_t>(bucket)].cpu_grad.defined()) return;
  NoGradGuard no_grad;
  OffloadSlice& o = offload_[static_cast<size_t>(bucket)];
  const Tensor g = grads_.owned_slice(bucket);
  if (!st_.device.is_cuda()) {
    o.cpu_grad.copy_(g);
    o.grad_down = true;
    return;
  }
#ifdef FORGE_WITH_CUDA
  Tensor g32 = g.to(DType::f32).contiguous();
  if (g32.storage() == g.storage()) g32 = g32.clone();  // the optimizer may scale g before the copy lands
  const int dev = st_.device.index;
  if (!offload_stream_) offload_stream_ = std::make_unique<OffloadStream>(dev);
  cuda::Event ready;
  ready.record(cuda::Stream::current(dev));
  offload_stream_->stream.wait(ready);
  {
    cuda::StreamGuard on(offload_stream_->stream);
    cuda::copy(o.cpu_grad, g32, /*non_blocking=*/true);
  }
  cuda::record_stream(g32, offload_stream_->stream);
  o.grad_down = true;
#endif
}

std::vector<Tensor> ShardedOptimizer::norm_tensors() const {
  if (st_.sharding.gradients()) return piece_views_;
  std::vector<Tensor> ts;
  for (const auto& p : st_.params) ts.push_back(p.t);
  return ts;
}

std::vector<std::string> ShardedOptimizer::norm_names() const {
  std::vector<std::string> names;
  if (st_.sharding.gradients()) {
    for (const auto& p : pieces_) names.push_back(p.param);
  } else {
    for (const auto& p : st_.params) names.push_back(p.name);
  }
  return names;
}

std::vector<std::pair<std::string, Tensor>> ShardedOptimizer::named_grads() const {
  const std::vector<Tensor> ts = norm_tensors();
  const std::vector<std::string> names = norm_names();
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < ts.size(); ++i) out.emplace_back(names[i], ts[i].grad());
  return out;
}

Tensor ShardedOptimizer::weighted_square_norm() const {
  const std::vector<Tensor> ts = norm_tensors();
  const std::vector<std::string> names = norm_names();
  std::map<double, std::vector<Tensor>> by_weight;
  for (size_t i = 0; i < ts.size(); ++i) by_weight[st_.norm_weight(names[i])].push_back(ts[i]);
  Tensor sq = zeros({}, {.dtype = DType::f32, .device = st_.device});
  for (const auto& [w, group] : by_weight) {
    const Tensor n = optim::total_grad_norm(group);
    sq = sq + n * n * w;
  }
  return sq;
}

Tensor ShardedOptimizer::global_norm(Tensor sq) const {
  sq = sq.contiguous();
  if (st_.sharding.gradients()) st_.group->all_reduce(sq, ReduceOp::sum)->wait();
  if (st_.norm_group) st_.norm_group->all_reduce(sq, ReduceOp::sum)->wait();
  return sq.pow(0.5);
}

Tensor ShardedOptimizer::grad_norm() {
  NoGradGuard no_grad;
  if (st_.norm_weight) return global_norm(weighted_square_norm());
  if (!st_.sharding.gradients()) return optim::total_grad_norm(norm_tensors());
  Tensor local = piece_views_.empty() ? zeros({}, {.dtype = DType::f32, .device = st_.device})
                                      : optim::total_grad_norm(piece_views_);
  Tensor sq = (local * local).contiguous();
  st_.group->all_reduce(sq, ReduceOp::sum)->wait();
  return sq.pow(0.5);
}

Tensor ShardedOptimizer::unscale_grads(optim::LossScaler& scaler) {
  FORGE_CHECK(!st_.offload, "DataParallel: f16 loss scaling with the optimizer offloaded to the CPU is "
              "not supported; use run.dtype = \"bf16\" or dist.offload_optimizer = false");
  NoGradGuard no_grad;
  if (st_.norm_weight) {
    // Tensor parallelism: the gradients unscaled in one pass; the weighted norm in another
    // (Note [split gradient norm]); the overflow flag agreed by every rank that holds a part.
    scaler.unscale_(norm_tensors());
    const Tensor norm = global_norm(weighted_square_norm());
    Tensor found = scaler.found_non_finite();
    if (st_.sharding.gradients()) st_.group->all_reduce(found, ReduceOp::max)->wait();
    if (st_.norm_group) st_.norm_group->all_reduce(found, ReduceOp::max)->wait();
    return norm;
  }
  // DDP, ZeRO-1: the reduced gradients are whole and the same on every rank, so is their check.
  if (!st_.sharding.gradients()) return scaler.unscale_(norm_tensors());
  // ZeRO-2/3: each rank unscales the slices it owns; the norm and the overflow flag go global.
  const Tensor local = scaler.unscale_(piece_views_);
  Tensor sq = (local * local).contiguous();
  st_.group->all_reduce(sq, ReduceOp::sum)->wait();
  Tensor found = scaler.found_non_finite();
  st_.group->all_reduce(found, ReduceOp::max)->wait();
  return sq.pow(0.5);
}

void ShardedOptimizer::clip_grads(double max_norm, const Tensor& norm) {
  if (max_norm <= 0) return;
  NoGradGuard no_grad;
  if (st_.offload) {
    // The gradients the optimizer reads are on the CPU (downloaded during backward): clipped
    // there by step(), once they have landed.
    offload_clip_ = {max_norm, norm};
    return;
  }
  // DDP: the optimizer spans every parameter, so it can clip inside its update (Note [clipping
  // inside the update]: AdamW on a GPU scales each gradient as it loads it; no clip pass). A
  // DataParallel given optimizer groups that leave out some parameters clips them all first, as
  // before. ZeRO-1/2/3 clip the gradients (views of the buckets) first; offload clips in step().
  if (!st_.sharding.optimizer_state() && optimizer_ && clip_in_update_) optimizer_->clip_next_step(max_norm, norm);
  else if (!st_.sharding.optimizer_state()) optim::clip_grads_with_norm_(norm_tensors(), max_norm, norm);
  else if (!piece_views_.empty()) optim::clip_grads_with_norm_(piece_views_, max_norm, norm);
}

void ShardedOptimizer::step(const Tensor& skip_if) {
  NoGradGuard no_grad;
  const auto clip = std::exchange(offload_clip_, {});
  const int64_t r = st_.rank();
  if (optimizer_ && st_.offload) {
    // Note [offloaded optimizer]: each bucket's owned gradient slice comes down in one copy
    // (converted to f32), the update runs on the CPU, and the new weights go up in one copy
    // per bucket as that bucket's all-gather input (below).
    for (size_t bi = 0; bi < offload_.size(); ++bi) {
      OffloadSlice& o = offload_[bi];
      if (!o.cpu_grad.defined() || o.grad_down) continue;
      o.cpu_grad.copy_(grads_.owned_slice(static_cast<int>(bi)).to(Device::cpu(), DType::f32));  // (not downloaded during backward)
    }
#ifdef FORGE_WITH_CUDA
    if (offload_stream_) offload_stream_->stream.synchronize();  // the downloads queued in backward
#endif
    for (auto& o : offload_) o.grad_down = false;
    if (clip.second.defined() && !piece_params_.empty())
      optim::clip_grads_with_norm_(piece_params_, clip.first, clip.second.to(Device::cpu()));
    optimizer_->step(skip_if);
  } else if (optimizer_) {
    optimizer_->step(skip_if);
  }
  if (!st_.sharding.optimizer_state()) return;
  // All-gather every bucket's owned slice into every rank's parameters; two buckets in flight.
  std::unordered_map<std::string, int> param_by_name;
  for (size_t i = 0; i < st_.params.size(); ++i) param_by_name[st_.params[i].name] = static_cast<int>(i);
  std::vector<std::vector<int>> pieces_in_bucket(st_.buckets.size());
  for (size_t k = 0; k < pieces_.size(); ++k)
    pieces_in_bucket[static_cast<size_t>(st_.params[static_cast<size_t>(param_by_name.at(pieces_[k].param))].bucket)]
        .push_back(static_cast<int>(k));
  struct InFlight {
    int bucket;
    Tensor out;
    WorkPtr work;
  };
  std::vector<InFlight> flying;
  auto land = [&](InFlight& f) {
    f.work->wait();
    const DpBucket& b = st_.buckets[static_cast<size_t>(f.bucket)];
    for (int pi : b.params) {
      DpParam& p = st_.params[static_cast<size_t>(pi)];
      p.t.detach().reshape({-1}).copy_(f.out.narrow(0, p.offset, p.numel));
    }
  };
  for (size_t bi = 0; bi < st_.buckets.size(); ++bi) {
    const DpBucket& b = st_.buckets[bi];
    const Tensor cpu_master = offload_.empty() ? Tensor() : offload_[bi].cpu_master;
    if (b.block >= 0) {
      // ZeRO-3: the shard is the weights; the next forward gathers it. Offloaded: one copy up.
      if (cpu_master.defined()) block_shard_(static_cast<int>(bi)).copy_(cpu_master.to(st_.device, b.dtype));
      continue;
    }
    Tensor mine;
    if (cpu_master.defined()) {
      mine = cpu_master.to(st_.device, b.dtype);  // the offloaded update's result (its padding is 0)
      if (mine.storage() == cpu_master.storage()) mine = mine.clone();  // f32 CPU: not the master itself
    } else {
      mine = zeros({b.shard}, {.dtype = b.dtype, .device = st_.device});
    }
    for (int k : cpu_master.defined() ? std::vector<int>{} : pieces_in_bucket[bi]) {
      const DpParam& p = st_.params[static_cast<size_t>(param_by_name.at(pieces_[static_cast<size_t>(k)].param))];
      const ShardPiece& pc = pieces_[static_cast<size_t>(k)];
      mine.narrow(0, p.offset + pc.lo - r * b.shard, pc.hi - pc.lo).copy_(piece_views_[static_cast<size_t>(k)]);
    }
    Tensor out = empty({b.padded}, {.dtype = b.dtype, .device = st_.device});
    flying.push_back({static_cast<int>(bi), out, st_.group->all_gather(out, mine)});
    if (flying.size() > 1) {
      land(flying.front());
      flying.erase(flying.begin());
    }
  }
  for (auto& f : flying) land(f);
}

void ShardedOptimizer::set_lr(double lr) {
  if (!optimizer_) return;
  for (auto& g : optimizer_->param_groups()) g.lr = lr;
}

std::vector<std::map<std::string, Tensor>> ShardedOptimizer::piece_state() const {
  std::vector<std::map<std::string, Tensor>> out(pieces_.size());
  if (!optimizer_) return out;
  const optim::StateDict sd = optimizer_->state_dict();
  for (const auto& [key, t] : sd.tensors) {
    // "state.<k>.<name>"
    const auto dot = key.find('.', 6);
    const auto k = static_cast<size_t>(std::stoll(key.substr(6, dot - 6)));
    out[k][key.substr(dot + 1)] = t.reshape({-1});
  }
  if (st_.offload) {
    for (size_t k = 0; k < pieces_.size(); ++k)
      if (piece_views_[k].dtype() != DType::f32 && !out[k].empty()) out[k]["master"] = piece_params_[k];
  }
  return out;
}

std::vector<int64_t> ShardedOptimizer::piece_steps() const {
  std::vector<int64_t> steps(pieces_.size(), 0);
  if (!optimizer_) return steps;
  const optim::StateDict sd = optimizer_->state_dict();
  for (size_t k = 0; k < pieces_.size(); ++k) {
    auto it = sd.scalars.find("state." + std::to_string(k) + ".step");
    if (it != sd.scalars.end()) steps[k] = static_cast<int64_t>(it->second);
  }
  return steps;
}

void ShardedOptimizer::load_piece_state(const std::function<Tensor(const ShardPiece&, const std::string&)>& lookup,
                                        const std::function<int64_t(const ShardPiece&)>& step_of, int64_t step_count) {
  NoGradGuard no_grad;
  if (!optimizer_) return;
  optim::StateDict sd = optimizer_->state_dict();
  // Keep the group scalars; replace the per-parameter state.
  for (auto it = sd.scalars.begin(); it != sd.scalars.end();)
    it = it->first.rfind("state.", 0) == 0 ? sd.scalars.erase(it) : std::next(it);
  sd.tensors.clear();
  sd.scalars["step"] = static_cast<double>(step_count);
  static const char* kNames[] = {"exp_avg", "exp_avg_sq", "master", "momentum_buffer"};
  for (size_t k = 0; k < pieces_.size(); ++k) {
    const int64_t steps = step_of(pieces_[k]);
    if (steps <= 0) continue;
    const std::string pre = "state." + std::to_string(k) + ".";
    sd.scalars[pre + "step"] = static_cast<double>(steps);
    for (const char* name : kNames) {
      Tensor t = lookup(pieces_[k], name);
      if (!t.defined()) continue;
      if (std::string(name) == "master" && st_.offload) {
        piece_params_[k].copy_(t.to(DType::f32));
        continue;
      }
      if (std::string(name) == "master" && piece_params_[k].dtype() == DType::f32) continue;
      sd.tensors[pre + name] = t.reshape(piece_params_[k].shape());
    }
  }
  optimizer_->load_state_dict(sd);
}

}  // namespace forge::parallel
