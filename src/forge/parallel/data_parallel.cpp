// DataParallel: the three mechanisms composed (contract in data_parallel.h).
#include "forge/parallel/data_parallel.h"

#include "forge/autograd/grad_mode.h"
#include "forge/core/error.h"

namespace forge::parallel {

DataParallel::DataParallel(std::vector<std::pair<std::string, Tensor>> named_params,
                           std::vector<optim::ParamGroup> groups, const OptimizerFactory& make_optimizer,
                           ProcessGroupPtr group, DataParallelOptions options)
    : options_(options) {
  FORGE_CHECK(group != nullptr, "DataParallel: no process group");
  FORGE_CHECK(!options_.offload_optimizer || options_.sharding.optimizer_state(),
              "DataParallel: offload_optimizer needs a sharded optimizer (ZeRO-1, 2 or 3: the offloaded optimizer is the sharded one)");
  FORGE_CHECK(!options_.sharding.parameters() || options_.block_of != nullptr,
              "DataParallel: ZeRO-3 needs options.block_of (which block each parameter belongs to)");
  FORGE_CHECK(options_.bucket_mb > 0, "DataParallel: bucket_mb must be > 0, got ", options_.bucket_mb);
  FORGE_CHECK(!named_params.empty(), "DataParallel: no parameters");
  FORGE_CHECK(!options_.skip_reductions || !options_.sharding.gradients(),
              "DataParallel: skip_reductions (debug.skip_reductions, a diagnostic) works with DDP and ZeRO-1 only");
  FORGE_CHECK(options_.powersgd_rank == 0 || (!options_.sharding.optimizer_state() && !options_.skip_reductions),
              "dist.grad_compression = \"powersgd\" compresses DDP's all-reduces (dist.zero_stage = 0): ZeRO's "
              "reduce-scatters shard the gradients it needs whole; use dist.zero_stage = 0 or no compression");
  FORGE_CHECK(!options_.fp8_reduce || (options_.powersgd_rank == 0 && !options_.skip_reductions),
              "DataParallel: fp8_reduce with powersgd_rank or skip_reductions (one compression at a time; "
              "dist.grad_compression is \"fp8\" or \"powersgd\")");
  st_.group = std::move(group);
  st_.powersgd_rank = options_.powersgd_rank;
  st_.powersgd_seed = options_.powersgd_seed;
  st_.fp8_reduce = options_.fp8_reduce;
  st_.fp8_feedback_all_reduce = options_.fp8_feedback_all_reduce;
  st_.fp8_feedback_reduce_scatter = options_.fp8_feedback_reduce_scatter;
  st_.sharding = options_.sharding;
  st_.offload = options_.offload_optimizer;
  st_.skip_reductions = options_.skip_reductions;
  st_.release_grads = options_.release_grads && !options_.sharding.optimizer_state();
  FORGE_CHECK(!options_.norm_group || options_.norm_weight, "DataParallel: norm_group needs norm_weight");
  FORGE_CHECK(!options_.norm_group || !options_.offload_optimizer,
              "DataParallel: a norm_group (tensor parallelism) with the optimizer offloaded is not supported");
  st_.norm_group = options_.norm_group;
  st_.norm_weight = options_.norm_weight;
  st_.device = named_params.front().second.device();
  FORGE_CHECK(st_.group->device() == st_.device, "DataParallel: the parameters are on ", st_.device.str(), " but the ",
              st_.group->backend(), " group communicates ", st_.group->device().str(), " tensors");
  for (auto& [name, t] : named_params) {
    FORGE_CHECK(t.device() == st_.device, "DataParallel: parameter '", name, "' is on ", t.device().str(), ", not ",
                st_.device.str());
    FORGE_CHECK(t.is_contiguous(), "DataParallel: parameter '", name, "' is not contiguous");
    const int block = options_.sharding.parameters() ? options_.block_of(name) : -1;
    st_.params.push_back({name, t, -1, block, 0, t.numel()});
  }
  if (options_.sharding.parameters())
    for (auto& [name, t] : options_.frozen) {
      const int block = options_.block_of(name);
      if (block < 0) continue;  // (kept whole, as the trained parameters outside blocks)
      FORGE_CHECK(t.device() == st_.device && t.is_contiguous(), "DataParallel: frozen parameter '", name,
                  "' must be contiguous on ", st_.device.str());
      st_.frozen.push_back({name, t, block, 0, t.numel()});
    }
  build_buckets(st_, options_.bucket_mb);
  buckets_ = std::make_unique<GradientBuckets>(st_);
  if (options_.sharding.parameters()) shards_ = std::make_unique<BlockShards>(st_);
  optimizer_ = std::make_unique<ShardedOptimizer>(st_, *buckets_, groups, make_optimizer,
                                                  [this](int bucket) { return shards_->shard(bucket); });
  buckets_->on_final = [this](int bucket) {
    if (st_.offload) optimizer_->start_grad_download(bucket);
  };
  if (shards_) {
    // ZeRO-3: every gradient of a block is in, so its backward is over: drop the gathered weights;
    // at the end of backward, also those of blocks whose gradients did not all arrive.
    buckets_->on_all_grads_in = [this](int bucket) { shards_->release_after_grads(bucket); };
    buckets_->on_end_backward = [this] { shards_->release_all(); };
  }
}

DataParallel::~DataParallel() {
  st_.alive.reset();
  buckets_.reset();    // waits for the reductions in flight
  optimizer_.reset();  // and for the offloaded gradients' downloads
}

void DataParallel::broadcast_parameters() {
  NoGradGuard no_grad;
  std::vector<WorkPtr> works;
  for (auto& p : st_.params)
    if (p.block < 0 || !options_.sharding.parameters()) works.push_back(st_.group->broadcast(p.t.detach(), 0));
  for (auto& w : works) w->wait();
}

void DataParallel::begin_backward(bool sync) {
  // PowerSGD from its start step on (the optimizer steps taken so far: restored on resume).
  buckets_->set_compression(step_count_ >= options_.powersgd_start_step);
  buckets_->begin_backward(sync);
}
void DataParallel::end_backward() { buckets_->end_backward(); }
Tensor DataParallel::grad_norm() { return optimizer_->grad_norm(); }
std::vector<std::pair<std::string, Tensor>> DataParallel::named_grads() const { return optimizer_->named_grads(); }
Tensor DataParallel::unscale_grads(optim::LossScaler& scaler) { return optimizer_->unscale_grads(scaler); }
void DataParallel::clip_grads(double max_norm, const Tensor& norm) { optimizer_->clip_grads(max_norm, norm); }

void DataParallel::step(const Tensor& skip_if) {
  if (shards_) shards_->release_all();  // ZeRO-3: gathered weights are about to be stale
  ++step_count_;
  optimizer_->step(skip_if);
}

void DataParallel::zero_grad() { buckets_->zero_grad(); }
void DataParallel::set_lr(double lr) { optimizer_->set_lr(lr); }

void DataParallel::for_each_full_parameter(const std::function<void(const std::string&, const Tensor&)>& fn) {
  if (shards_) return shards_->for_each_full_parameter(fn);
  NoGradGuard no_grad;
  for (auto& p : st_.params) fn(p.name, p.t.detach());
}

std::vector<std::map<std::string, Tensor>> DataParallel::piece_state() const { return optimizer_->piece_state(); }
std::vector<int64_t> DataParallel::piece_steps() const { return optimizer_->piece_steps(); }

void DataParallel::load_piece_state(const std::function<Tensor(const ShardPiece&, const std::string&)>& lookup,
                                    const std::function<int64_t(const ShardPiece&)>& step_of) {
  optimizer_->load_piece_state(lookup, step_of, step_count_);
}

int64_t DataParallel::optimizer_state_bytes() const {
  int64_t n = 0;
  for (const auto& m : piece_state())
    for (const auto& [name, t] : m) n += static_cast<int64_t>(t.nbytes());
  return n;
}

}  // namespace forge::parallel
