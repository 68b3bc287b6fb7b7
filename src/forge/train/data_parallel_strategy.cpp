// DataParallelStrategy: the executor of every layout without pipeline stages: one process (a
// data-parallel group of one, Note [one process is a data-parallel group of one] in
// parallel/self_group.h), DDP, ZeRO-1/2 (+ offload) and ZeRO-3 over the data-parallel group of
// the mesh, with tensor and context parallelism, on parallel::DataParallel (parallel/data_parallel.h: gradient buckets reduced while backward
// runs, the optimizer state sharded by parameter ranges, block parameters sharded and gathered
// around each block). Its step:
//   for each micro-batch k: this rank's rows (dp_rank * b .. + b of the global micro-batch of
//     dp * b rows; Note [uneven rows] for a batch that does not divide; under context
//     parallelism the rank's part of each sequence, the gradients then reduced over dp x cp),
//     forward, loss / K,
//     begin_backward(sync = last), backward, end_backward
//   the loss of the global batch: all-reduce (avg) behind the last gradient bucket
//   the global gradient norm (f16: unscaled first, the overflow flag agreed by every rank),
//   clipping, the non-finite skip, the sharded update and the all-gather of the weights.
// debug.skip_reductions (DDP, ZeRO-1) skips every reduction: a diagnostic, the run is wrong.
#include <cstdio>
#include <iomanip>
#include <optional>
#include <sstream>
#include <ostream>
#include <unordered_map>

#include "forge/core/error.h"
#include "forge/io/atomic_file.h"
#include "forge/ops/copy.h"
#include "forge/ops/loss.h"
#include "forge/optim/clip.h"
#include "forge/optim/loss_scale.h"
#include "forge/parallel/data_parallel.h"
#include "forge/parallel/env.h"
#include "forge/parallel/sharded_state.h"
#include "forge/run/run_checkpoint.h"
#include "forge/train/strategy.h"
#include "forge/train/tensor_parallel_model.h"

namespace forge::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

class DataParallelStrategy final : public Strategy {
 public:
  DataParallelStrategy(const RunConfig& cfg, const parallel::Layout& layout, const parallel::Mesh& mesh, Model& model,
                       DType dtype, std::ostream& log)
      : cfg_(cfg), layout_(layout), model_(model), device_(model.device()), solo_(!needs_process_group(layout)) {
    group_ = strategy_detail::data_parallel_group(mesh, layout);  // (dp x cp: Note [context-parallel sequence layout])
    dp_rank_ = mesh.dp_rank();
    dp_size_ = mesh.dp();
    cp_group_ = mesh.cp_group();
    split_ = model.split;
    std::vector<std::pair<std::string, Tensor>> trainable, frozen;  // (frozen: LoRA's base, sharded by ZeRO-3)
    {
      std::unordered_map<const TensorImpl*, bool> seen;  // tied weights: once, under their first name
      for (const auto& [n, t] : model.module->named_parameters())
        if (seen.emplace(t.impl(), true).second) (t.requires_grad() ? trainable : frozen).emplace_back(n, t);
    }
    dp_ = std::make_unique<parallel::DataParallel>(
        trainable, optim::decay_groups(model.module->named_parameters(), cfg.optim.weight_decay),
        [this](std::vector<optim::ParamGroup> groups) { return make_optimizer_for(cfg_, std::move(groups)); }, group_,
        parallel::DataParallelOptions{.sharding = layout.sharding(),
                                  .offload_optimizer = cfg.dist.offload_optimizer,
                                  .bucket_mb = cfg.dist.bucket_mb,
                                  .block_of = model.block_of,
                                  .skip_reductions = cfg.debug.skip_reductions,
                                  .norm_group = split_ ? split_->group() : nullptr,
                                  .norm_weight = split_ ? std::function<double(const std::string&)>(
                                                              [s = split_](const std::string& n) { return s->norm_weight(n); })
                                                        : nullptr,
                                  .frozen = frozen,
                                  .release_grads = solo_,
                                  .powersgd_rank = cfg.dist.grad_compression == "powersgd" && !solo_
                                                       ? static_cast<int>(cfg.dist.powersgd_rank)
                                                       : 0,
                                  .powersgd_seed = static_cast<uint64_t>(cfg.run.seed) ^ 0x9e3779b97f4a7c15ull,
                                  // (PowerSGD's alone: FP8 compresses from the first step)
                                  .powersgd_start_step = layout.grad_compression == parallel::GradCompression::powersgd
                                                             ? cfg.dist.powersgd_start_step
                                                             : 0,
                                  .fp8_reduce = layout.grad_compression == parallel::GradCompression::fp8 && !solo_,
                                  .fp8_feedback_all_reduce = layout.fp8_feedback_all_reduce,
                                  .fp8_feedback_reduce_scatter = layout.fp8_feedback_reduce_scatter});
    if (dp_->block_hooks()) model.set_block_hooks(dp_->block_hooks());
    dp_->broadcast_parameters();
    if (dtype == DType::f16) scaler_.emplace(device_);
    if (solo_) return;  // (one process: nothing to say beyond describe())
    const parallel::LaunchEnv env = parallel::launch_env();
    if (split_) log << "mesh: " << mesh.describe() << "\n";
    std::ostringstream nodes;  // (dist.dp_reduce, dist.link_gbps)
    if (layout.dp_reduce == parallel::DpReduce::hierarchical) nodes << ", reduced within each node first";
    if (layout.link_gbps > 0) nodes << ", a simulated link of " << layout.link_gbps << " Gb/s between nodes";
    if (cfg.dist.grad_compression == "powersgd")
      nodes << ", PowerSGD rank " << cfg.dist.powersgd_rank << " (" << std::fixed << std::setprecision(1)
            << 100 * dp_->compression_sent_fraction() << "% of the gradient values sent"
            << (cfg.dist.powersgd_start_step > 0 ? ", from step " + std::to_string(cfg.dist.powersgd_start_step + 1) : "")
            << ")" << std::defaultfloat;
    if (layout.grad_compression == parallel::GradCompression::fp8) {
      const bool feedback = layout.sharding().gradients() ? layout.fp8_feedback_reduce_scatter : layout.fp8_feedback_all_reduce;
      nodes << ", gradients sent in FP8 (e4m3 blocks of 128, " << (feedback ? "error feedback" : "no error feedback")
            << (layout.dp_reduce == parallel::DpReduce::hierarchical ? "; between nodes only" : "") << "; "
            << std::fixed << std::setprecision(1) << 100 * dp_->compression_sent_fraction()
            << "% of the gradient bytes sent)" << std::defaultfloat;
    }
    log << "data parallel: " << group_->size() << " rank(s) (" << parallel::launcher_name(env.launcher) << ", "
        << group_->backend() << "), " << layout.sharding().name() << nodes.str()
        << (layout.offload ? " with the optimizer on the CPU" : "") << ", " << dp_->num_buckets()
        << " gradient bucket(s) of <= " << cfg.dist.bucket_mb << " MB; " << layout.micro_batch << " of the "
        << layout.micro_batch * layout.dp << " rows of each micro-batch on each rank\n";
    if (layout.sharding().parameters()) {  // Note [frozen block shards] (parallel/block_shards.h)
      int64_t n = 0, elements = 0;
      for (const auto& [name, t] : frozen)
        if (model.block_of(name) >= 0) ++n, elements += t.numel();
      if (n > 0)
        log << "ZeRO-3 also shards the blocks' " << n << " untrained parameter(s) (" << elements
            << " elements, LoRA's frozen base): each rank holds 1/" << group_->size() << " of them between uses\n";
    }
  }

  void seed_master_weights(const std::function<Tensor(const std::string&)>& f32_of) override {
    dp_->seed_masters(f32_of);
  }

  std::string describe() const override {
    return solo_ ? "layout: one process on " + device_.str() : "layout: " + layout_.describe();
  }

  Tensor train_step(const std::vector<data::Batch>& micro_batches, double lr, PhaseMarks& phases) override {
    dp_->set_lr(lr);
    const auto K = static_cast<int64_t>(micro_batches.size());
    const int64_t dp_rank = dp_rank_, dp_size = dp_size_;
    Tensor loss_sum;  // on the device: read once per step
    // Note [token-weighted loss]: empty unless some targets do not count (the rows of every
    // micro-batch are cut alike, so the first one's give this rank's range).
    std::vector<double> weights;
    {
      const int64_t rows = micro_batches.front().inputs.size(0);
      const int64_t lo = dp_rank * rows / dp_size, hi = (dp_rank + 1) * rows / dp_size;
      weights = cp_group_ ? strategy_detail::token_weights(micro_batches, lo, hi - lo, group_->size(), cp_group_->rank(),
                                                           cp_group_->size())
                          : strategy_detail::token_weights(micro_batches, lo, hi - lo, dp_size);
    }
    // Note [token weights on the device]: a captured step's targets are on the GPU (DDP's step is
    // the one captured: no context parallelism here).
    const bool on_device = weights.empty() && strategy_detail::weighs_tokens(cfg_) &&
                           !micro_batches.front().targets.is_cpu();
    FORGE_CHECK(!on_device || !cp_group_, "train: token weights on the device under context parallelism");
    const Tensor counted = on_device ? strategy_detail::counted_targets(micro_batches) : Tensor();
    for (int64_t k = 0; k < K; ++k) {
      // Every rank draws the same global micro-batch and trains on its own rows of it.
      const data::Batch& global = micro_batches[static_cast<size_t>(k)];
      const int64_t rows = global.inputs.size(0);
      const int64_t lo = dp_rank * rows / dp_size, hi = (dp_rank + 1) * rows / dp_size;
      FORGE_CHECK(hi > lo, "train: a micro-batch of ", rows, " rows leaves rank ", dp_rank, " of ", dp_size,
                  " without a row; every micro-batch needs at least one row per data-parallel rank");
      const data::Batch mb = strategy_detail::local_part(global, lo, hi - lo, cp_group_, device_);
      if (k == K - 1) phases.mark(0);
      // The gradient the loss will get (Note [expected loss gradient]).
      const ops::LossGradDivisor expect(K, scaler_ ? scaler_->scale_tensor() : Tensor());
      Tensor loss = model_.training_loss(mb);
      // Note [uneven rows]: a global micro-batch of R rows that dp does not divide (the last batch
      // of an image run's epoch) gives rank r its share [r R / dp, (r + 1) R / dp); its mean loss
      // weighted by rows_r dp / R makes the average over the ranks (of the losses and of the
      // gradients) the mean over all R rows, as in one process. Batches that divide skip the
      // multiplication, so their numbers are unchanged.
      if (!weights.empty())
        loss = strategy_detail::weighted(loss, weights[static_cast<size_t>(k)]);
      else if (on_device)
        loss = strategy_detail::weighted(
            loss, strategy_detail::device_token_weight(mb.targets, counted, K, dp_size, loss.dtype()));
      else if ((hi - lo) * dp_size != rows)
        loss = loss * (static_cast<double>((hi - lo) * dp_size) / static_cast<double>(rows));
      const Tensor l = loss.detach().to(DType::f32);
      loss_sum = loss_sum.defined() ? loss_sum + l : l;
      Tensor scaled = K == 1 ? loss : loss / static_cast<double>(K);
      if (scaler_) scaled = scaler_->scale_loss(scaled);
      if (k == K - 1) phases.mark(1);
      dp_->begin_backward(/*sync=*/k == K - 1);
      scaled.backward();
      if (k == K - 1) phases.mark(2);
      dp_->end_backward();
    }
    // Tensor parallelism: the gradients that need a sum over the tensor-parallel group (Note
    // [split gradients]), on what the update reads (whole gradients, or ZeRO-2's pieces).
    if (split_) split_->reduce_grads(dp_->named_grads());
    phases.mark(3);
    Tensor mean_loss = K == 1 ? loss_sum : loss_sum / static_cast<double>(K);
    if (group_->size() > 1 && !cfg_.debug.skip_reductions) {
      // The loss of the global batch, queued behind the last gradient bucket. Not before
      // backward: there its NCCL kernel waited for the slower rank's forward while this
      // rank's backward ran, and the spinning kernel's SMs cost backward ~0.6 ms a step on two
      // H200s (benchmarks/results/dist_NVIDIA_H200.md, section 2).
      mean_loss = mean_loss.contiguous();
      group_->all_reduce(mean_loss, parallel::ReduceOp::avg)->wait();
    }
    return strategy_detail::finish_data_parallel_step(*dp_, scaler_ ? &*scaler_ : nullptr, cfg_.optim.grad_clip,
                                                      mean_loss, phases);
  }

  // Rank 0 evaluates for the job; under ZeRO-3 every rank runs the same evaluation (its forward
  // gathers the blocks: collectives), and rank 0 reports it. Under tensor parallelism the ranks of
  // the first replica evaluate together (the split forward is collective over them).
  // Under context parallelism the ranks of the first replica's group evaluate together (each its
  // part of every sequence: the attention is collective over them).
  bool evaluates() const override { return dp_rank_ == 0 || layout_.sharding().parameters(); }
  EvalSums evaluate(data::BatchSource& batches, int64_t max_batches, bool count_correct) override {
    return strategy_detail::evaluate_model(model_, batches, max_batches, count_correct, cp_group_);
  }

  // Note [data-parallel checkpoints]. Collective: every rank calls it. The model is whole on
  // every rank (ZeRO-1/2 shard only the optimizer; ZeRO-3's blocks are gathered one at a time
  // and rank 0 keeps a CPU copy), so rank 0 writes model.safetensors, the same file whatever the
  // stage; the optimizer is saved by parameter ranges (parallel/sharded_state.h), one shard file per rank
  // (DDP: rank 0's alone). Every rank writes its file into a staging directory next to the
  // checkpoint (a name prune_checkpoints treats as a temporary); rank 0 then moves them into
  // the checkpoint it publishes with replace_directory_atomic, so the checkpoint appears
  // whole or not at all: a crash mid-save leaves the previous one intact. The writes happen in
  // part 2, off the training thread with checkpoint.async (Note [async checkpoints]). state.json's
  // extra.dist names the files and the layout that wrote them; any other world size or stage
  // reshards on load.
  // DDP, ZeRO-1 and -2 without tensor parallelism (the others gather first: not reserved).
  std::vector<size_t> checkpoint_host_bytes() const override {
    std::vector<size_t> bytes;
    auto add = [&](const Tensor& t) {
      if (!t.is_cpu()) bytes.push_back(static_cast<size_t>(t.numel()) * element_size(t.dtype()));
    };
    if (solo_) {  // the model and the whole optimizer's state (snapshot_solo)
      for (const auto& [name, t] : model_.module->state_dict()) add(t);
      for (const auto& [name, t] : dp_->local_optimizer()->state_dict().tensors) add(t);
      return bytes;
    }
    if (split_ || dp_->options().sharding.parameters()) return bytes;
    const bool rank0 = dp_->group()->rank() == 0;
    if (dp_->options().sharding.optimizer_state() || rank0)
      for (const auto& piece : dp_->piece_state())
        for (const auto& [name, t] : piece) add(t);
    if (rank0)
      for (const auto& [name, t] : model_.module->state_dict()) add(t);
    return bytes;
  }

  CheckpointJob snapshot_checkpoint(const fs::path& run_dir, int64_t step, const RunState& state,
                                    int64_t keep_last) override {
    if (solo_) return snapshot_solo(run_dir, step, state, keep_last);
    parallel::ProcessGroup& pg = *dp_->group();
    // The job's rank 0 (under tensor parallelism the data-parallel group's rank 0 is one per
    // tensor-parallel rank).
    const bool rank0 = pg.rank() == 0 && (!split_ || split_->group()->rank() == 0);
    CheckpointJob job = checkpoint_job(run_dir, step, keep_last);
    job.staging = checkpoint_staging(job.dir, step, /*create=*/rank0);
    pg.barrier()->synchronize();  // the staging directory exists before any rank's writer uses it
    const bool sharded = dp_->options().sharding.optimizer_state() && !split_;
    auto file_of = [](int r) { return optimizer_shard_name(r); };
    // Note [tensor-parallel checkpoints]: the first replica gathers the whole model and optimizer
    // state over its tensor-parallel group; rank 0 writes them as one file.
    std::vector<std::pair<std::string, Tensor>> whole_model;
    if (split_) {
      const bool first_replica = pg.rank() == 0;
      WholeOptimizerState o = gather_whole_optimizer(model_, *dp_, rank0);
      if (first_replica) whole_model = gather_whole_model(model_);
      if (rank0) job.shard = strategy_detail::shard_job(file_of(0), std::move(o.pieces), o.state, std::move(o.steps), job.host_bytes);
    } else if (sharded || rank0) {
      job.shard = strategy_detail::shard_job(file_of(pg.rank()), dp_->pieces(), dp_->piece_state(), dp_->piece_steps(), job.host_bytes);
    }
    // ZeRO-3: the blocks' parameters gathered (collective), copied to rank 0's memory.
    std::unordered_map<std::string, Tensor> gathered;
    if (dp_->options().sharding.parameters())
      dp_->for_each_full_parameter([&](const std::string& name, const Tensor& t) {
        if (rank0) gathered[name] = ops::host_copy(t);
      });
    if (rank0) {
      io::CheckpointData d;
      d.step = step;
      nn::NamedTensors model_state = split_ ? whole_model : model_.module->state_dict();
      for (auto& [name, t] : model_state)
        if (auto it = gathered.find(name); it != gathered.end()) t = it->second;
      d.model = strategy_detail::host_copies(model_state, job.host_bytes);
      io::capture_rng(d);
      d.data_loader = json::parse(state.sampler.to_json());
      d.config = state.config;
      d.extra = state.extra;
      d.extra["optimizer"] = {{"name", optimizer_class_name(cfg_)}, {"scalars", {{"step", dp_->step_count()}}}};
      json files = json::array();
      for (int r = 0; r < (sharded ? pg.size() : 1); ++r) {
        files.push_back(file_of(r));
        d.move_in.push_back(job.staging / file_of(r));
      }
      if (scaler_) d.extra["loss_scaler"] = scaler_->state_dict().scalars;
      d.extra["dist"] = {{"world_size", pg.size()},
                         {"zero_stage", dp_->options().sharding.stage()},
                         {"tp", split_ ? split_->group()->size() : 1},
                         {"cp", cp_group_ ? cp_group_->size() : 1},
                         {"sequence_parallel", split_ && split_->sequence_parallel()},
                         {"offload_optimizer", dp_->options().offload_optimizer},
                         {"files", files}};
      job.publish = std::move(d);
    }
    return job;
  }

  // Note [the step as a CUDA graph]: DDP's step is device work and NCCL collectives, which a
  // capture records (they join the captured stream through events); the sharded layouts are not
  // captured yet.
  std::string graph_blocker() const override {
    if (split_) return "tensor parallelism's step is not captured yet";
    if (cp_group_) return "context parallelism's step is not captured yet";
    if (layout_.sharding().optimizer_state()) return layout_.sharding().name() + "'s sharded step is not captured yet";
    return "";
  }
  void begin_graph_capture() override {
    if (optim::Optimizer* o = dp_->local_optimizer()) o->begin_graph_capture(device_);
  }
  void end_graph_capture() override {
    if (optim::Optimizer* o = dp_->local_optimizer()) {
      o->end_graph_capture();
      o->stage_graph_inputs();
    }
  }
  void before_replay(double lr) override {
    dp_->set_lr(lr);
    dp_->count_replayed_step();
    if (optim::Optimizer* o = dp_->local_optimizer()) {
      o->count_replayed_step();
      o->stage_graph_inputs();
    }
  }
  void after_replay_launched() override { group_->watch_replayed_work("a CUDA graph replay of the training step"); }

  void load_checkpoint(const io::CheckpointData& ck, const fs::path& ck_path) override {
    load_data_parallel_checkpoint(cfg_, model_, *dp_, scaler_ ? &*scaler_ : nullptr, ck, ck_path);
  }

 private:
  // One process's checkpoint: the whole optimizer's state in optimizer.safetensors ("state.<k>.<name>",
  // slot k over decay_groups' order, which DDP's optimizer keeps), the loss scale in
  // extra.loss_scaler; no staging directory, no shard files. Any layout resumes it (Note [resharding]).
  CheckpointJob snapshot_solo(const fs::path& run_dir, int64_t step, const RunState& state, int64_t keep_last) {
    optim::Optimizer& opt = *dp_->local_optimizer();
    CheckpointJob job = checkpoint_job(run_dir, step, keep_last);
    io::CheckpointData d;
    d.step = step;
    d.model = strategy_detail::host_copies(model_.module->state_dict(), job.host_bytes);
    const optim::StateDict sd = opt.state_dict();
    d.optimizer = strategy_detail::host_copies({sd.tensors.begin(), sd.tensors.end()}, job.host_bytes);
    io::capture_rng(d);
    d.data_loader = json::parse(state.sampler.to_json());
    d.config = state.config;
    d.extra = state.extra;
    d.extra["optimizer"] = {{"name", opt.name()}, {"scalars", sd.scalars}};
    if (scaler_) d.extra["loss_scaler"] = scaler_->state_dict().scalars;
    job.publish = std::move(d);
    return job;
  }

  const RunConfig cfg_;
  const parallel::Layout layout_;
  Model& model_;
  Device device_;
  const bool solo_;  // one process without ZeRO (Note [one process is a data-parallel group of one])
  parallel::ProcessGroupPtr group_;     // the gradients' reduction: data x context parallel
  int64_t dp_rank_ = 0, dp_size_ = 1;  // this rank's model replica (its rows of each micro-batch)
  parallel::ProcessGroupPtr cp_group_;  // context parallelism: the ranks sharing each sequence (or null)
  std::shared_ptr<const parallel::tp::SplitModel> split_;  // tensor parallelism: the model's split, or null
  std::unique_ptr<parallel::DataParallel> dp_;
  std::optional<optim::LossScaler> scaler_;
};

}  // namespace

std::unique_ptr<Strategy> make_data_parallel(const RunConfig& cfg, const parallel::Layout& layout, const parallel::Mesh& mesh,
                                             Model& model, DType dtype, std::ostream& log) {
  return std::make_unique<DataParallelStrategy>(cfg, layout, mesh, model, dtype, log);
}

}  // namespace forge::train
