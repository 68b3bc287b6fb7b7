// PipelineStrategy: pipeline parallelism (dist.pp > 1) composed with data parallelism (DDP,
// ZeRO-1/2) on each stage's data-parallel group, and with tensor parallelism within each stage
// (3D: the stage's model split over its tp group, train/tensor_parallel_model.h). Each rank holds one stage of the model
// (train/pipeline_model.h); a step runs its micro-batches through the stages in the order of the
// schedule (Note [pipeline schedules], parallel/pipeline_schedule.h):
//   forward of micro-batch m: the first stage embeds this rank's rows, any other receives the
//     activations (B, T, C) from the stage before; the stage runs its blocks; the last stage
//     computes the loss / K, any other sends its output to the next stage.
//   backward of m: the last stage backpropagates its loss, any other receives the gradient of its
//     output from the next stage; a stage that received its input sends that input's gradient
//     back. Around it, the data-parallel group's begin/end_backward (reduced on the last one).
// Then: GPT's tied embedding's gradient summed between the first and last stage (each holds a
// copy of wte), the loss of the global batch (the last stage's, summed over the pipeline, averaged
// over the data-parallel group), the global gradient norm (the stages' squared norms summed over
// the pipeline group, the tied copy counted once: Note [split gradient norm]), clipping, the skip,
// and each stage's update. Activations and their gradients travel by ProcessGroup send/recv on the
// pipeline group (NCCL on GPUs, MPI on CPUs): sends are started and waited for at the end of the
// step, receives waited for where they are needed.
#include <cstdio>
#include <optional>
#include <ostream>
#include <unordered_map>

#include "forge/autograd/deferred.h"
#include "forge/autograd/grad_mode.h"
#include "forge/core/error.h"
#include "forge/nn/causal_lm.h"
#include "forge/nn/model_registry.h"
#include "forge/ops/binary.h"
#include "forge/ops/copy.h"
#include "forge/ops/creation.h"
#include "forge/ops/loss.h"
#include "forge/ops/reduce.h"
#include "forge/optim/clip.h"
#include "forge/optim/loss_scale.h"
#include "forge/parallel/hierarchical_group.h"
#include "forge/parallel/data_parallel.h"
#include "forge/parallel/env.h"
#include "forge/parallel/pipeline_schedule.h"
#include "forge/parallel/sharded_state.h"
#include "forge/run/run_checkpoint.h"
#include "forge/train/strategy.h"
#include "forge/train/tensor_parallel_model.h"

namespace forge::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

class PipelineStrategy final : public Strategy {
 public:
  PipelineStrategy(const RunConfig& cfg, const parallel::Layout& layout, const parallel::Mesh& mesh, Model& model, DType dtype,
                   std::ostream& log)
      : cfg_(cfg), layout_(layout), model_(model), device_(model.device()), dtype_(dtype), world_(mesh.world()) {
    FORGE_CHECK(model.stage != nullptr, "PipelineStrategy: the model has no pipeline stage (train/pipeline_model.h)");
    FORGE_CHECK(world_ != nullptr, "PipelineStrategy: the mesh has no process group attached");
    stage_ = model.stage;
    split_ = model.split;
    lm_ = std::dynamic_pointer_cast<nn::CausalLM>(model.module);
    pp_ = mesh.pp_group();
    // Note [pipeline links]: activations travel on one communicator, their gradients on another.
    // On one NCCL communicator (one stream, its point-to-point operations in issue order, a large
    // send waiting for its receive), 1F1B would deadlock: stage 0 queues send(a1) before
    // recv(g0), while stage 1 can post recv(a1) only after its send(g0), which waits for stage
    // 0's recv(g0). Each direction alone is issued in micro-batch order on both sides of every
    // link. (Megatron pairs the two in batched groups instead.)
    for (const auto& ranks : mesh.all_pp_groups()) {
      if (auto g = world_->new_group(ranks)) forward_ = g;
      if (auto g = world_->new_group(ranks)) backward_ = g;
    }
    FORGE_CHECK(forward_ && backward_, "PipelineStrategy: no pipeline links for this rank");
    if (layout.link_gbps > 0) {  // stage-to-stage traffic over a simulated network: one link, both communicators (Note [paced link])
      const parallel::LinkPace link{.gbps = layout.link_gbps, .latency_us = layout.link_latency_us,
                                    .clock = parallel::new_link_clock()};
      const int node = strategy_detail::node_size(layout);
      forward_ = parallel::paced_across_nodes(forward_, mesh.pp_group_ranks(), node, link);
      backward_ = parallel::paced_across_nodes(backward_, mesh.pp_group_ranks(), node, link);
    }
    tp_rank_ = mesh.tp_rank();
    seq_parts_ = split_ && split_->sequence_parallel() ? mesh.tp() : 1;
    // The gradient norm's group: the ranks that hold the other parts of this replica's model (the
    // pipeline, and with tensor parallelism its tp x pp ranks; one group per data-parallel rank).
    // (Every rank creates every such group, in one order: new_group is collective over the world,
    // and under context parallelism there is one per cp coordinate too.)
    norm_group_ = pp_;
    if (split_)
      for (const std::vector<int>& ranks : mesh.all_groups({"pp", "tp"}))
        if (auto g = world_->new_group(ranks)) norm_group_ = g;
    group_ = strategy_detail::data_parallel_group(mesh, layout);
    // Context parallelism (Note [context-parallel sequence layout]): every stage of a pipeline
    // holds its cp ranks' parts of the same rows; the rows split over the dp ranks only, and the
    // gradients reduce over dp x cp (group_).
    cp_group_ = mesh.cp_group();
    dp_size_ = mesh.dp();
    dp_rank_ = mesh.dp_rank();
    width_ = nn::transformer_shape(cfg.model).d_model;
    // GPT's tied embedding: its two copies' gradients summed between the first and the last stage
    // of each pipeline (a group per data-parallel position; collective over the world).
    if (!stage_->tied.empty()) {
      FORGE_CHECK(!layout.sharding().gradients(), "dist.zero_stage = ", layout.zero, " with dist.pp = ", layout.pp,
                  " and a head tied to the embedding (GPT) is not supported yet (the two stages shard the "
                  "embedding's gradient differently); use dist.zero_stage = 0 or 1");
      for (const std::vector<int>& stages : mesh.all_pp_groups())  // (first, last) of every pipeline
        if (auto g = world_->new_group({stages.front(), stages.back()})) tied_group_ = g;
    }
    std::vector<std::pair<std::string, Tensor>> trainable;
    {
      std::unordered_map<const TensorImpl*, bool> seen;
      for (const auto& [n, t] : model.module->named_parameters())
        if (stage_->held.count(n) && t.requires_grad() && seen.emplace(t.impl(), true).second) trainable.emplace_back(n, t);
    }
    const std::string tied = stage_->tied;
    const auto split = split_;
    dp_ = std::make_unique<parallel::DataParallel>(
        trainable, optim::decay_groups(trainable, cfg.optim.weight_decay),
        [this](std::vector<optim::ParamGroup> groups) { return make_optimizer_for(cfg_, std::move(groups)); }, group_,
        parallel::DataParallelOptions{.sharding = layout.sharding(),
                                  .offload_optimizer = false,
                                  .bucket_mb = cfg.dist.bucket_mb,
                                  .block_of = nullptr,
                                  .skip_reductions = cfg.debug.skip_reductions,
                                  .norm_group = norm_group_,
                                  .norm_weight = [tied, split](const std::string& n) {
                                    return (n == tied ? 0.5 : 1.0) * (split ? split->norm_weight(n) : 1.0);
                                  },
                                  .frozen = {},
                                  .fp8_reduce = layout.grad_compression == parallel::GradCompression::fp8 && group_->size() > 1,
                                  .fp8_feedback_all_reduce = layout.fp8_feedback_all_reduce,
                                  .fp8_feedback_reduce_scatter = layout.fp8_feedback_reduce_scatter});
    dp_->broadcast_parameters();
    if (dtype == DType::f16) scaler_.emplace(device_);
    log << "pipeline parallel: stage " << stage_->index << " of " << stage_->stages << " on each of "
        << group_->size() << " data-parallel rank(s) ("
        << layout.sharding().name()
        << (layout.grad_compression == parallel::GradCompression::fp8 && group_->size() > 1 ? ", gradients sent in FP8"
                                                                                            : "")
        << "); "
        << layout.grad_accum << " micro-batch(es) of " << layout.micro_batch << " row(s) per step ("
        << parallel::schedule_name(layout.schedule) << ")\n";
  }

  void seed_master_weights(const std::function<Tensor(const std::string&)>& f32_of) override {
    dp_->seed_masters(f32_of);
  }

  std::string describe() const override { return "layout: " + layout_.describe(); }

  Tensor train_step(const std::vector<data::Batch>& micro_batches, double lr, PhaseMarks& phases) override {
    dp_->set_lr(lr);
    const auto K = static_cast<int64_t>(micro_batches.size());
    // A (micro-batch, chunk)'s slot; chunk c of this rank is virtual stage c P + s of V = v P (one
    // chunk, the stage itself, outside the interleaved schedule).
    const int P = stage_->stages, s_rank = stage_->index, v = static_cast<int>(stage_->chunks.size()), V = P * v;
    const int prev = (s_rank - 1 + P) % P, next = (s_rank + 1) % P;
    auto slot = [v](int64_t m, int c) { return static_cast<size_t>(m * v + c); };
    std::vector<Tensor> inputs(static_cast<size_t>(K * v)), outputs(static_cast<size_t>(K * v));
    std::vector<std::pair<Tensor, parallel::WorkPtr>> sends;
    Tensor loss_sum;
    // Note [token-weighted loss]: empty unless some targets do not count.
    const int64_t all_rows = micro_batches.front().inputs.size(0), W = dp_size_, r = dp_rank_;
    const std::vector<double> token_w =
        cp_group_ ? strategy_detail::token_weights(micro_batches, r * all_rows / W, all_rows / W, group_->size(),
                                                   cp_group_->rank(), cp_group_->size())
                  : strategy_detail::token_weights(micro_batches, r * all_rows / W, all_rows / W, W);
    phases.mark(0);
    // ZB-H1 (Note [pipeline schedules]): each micro-batch's linears queue their weight gradients
    // (W) during its forward; B computes the rest; W runs the queue later. The data-parallel
    // reduction then happens once, after every pass (begin/end_backward without a sync around
    // each pass, one synchronising pair at the end).
    const bool split_w = layout_.schedule == parallel::PipelineSchedule::zb_h1;
    std::vector<std::shared_ptr<autograd::DeferredGrads>> weights(static_cast<size_t>(K));
    const std::vector<parallel::pp::Action> actions = parallel::pp::schedule(layout_.schedule, P, s_rank, K, v);
    size_t last_backward = 0;  // the step's last backward: the data-parallel reduction runs there
    for (size_t i = 0; i < actions.size(); ++i)
      if (actions[i].op == parallel::pp::Op::backward) last_backward = i;
    for (size_t i = 0; i < actions.size(); ++i) {
      const parallel::pp::Action& a = actions[i];
      const auto m = static_cast<size_t>(a.micro);
      if (a.op == parallel::pp::Op::weight) {
        // (Every stage runs at least one block's linears: an empty queue means they were not queued.)
        FORGE_CHECK(weights[m] && !weights[m]->empty(), "pipeline: the W pass of micro-batch ", a.micro,
                    " has no queued weight gradients");
        dp_->begin_backward(/*sync=*/false);
        weights[m]->run();
        dp_->end_backward();
        weights[m] = nullptr;
        continue;
      }
      const int j = a.chunk * P + s_rank;  // the virtual stage
      const size_t k = slot(a.micro, a.chunk);
      const data::Batch mb = rows_of(micro_batches[m]);
      if (a.op == parallel::pp::Op::forward) {
        std::optional<autograd::DeferWeightGrads> defer;
        if (split_w) defer.emplace(weights[m] = std::make_shared<autograd::DeferredGrads>());
        const nn::Documents docs{mb.documents, mb.positions};  // a packed batch's (Note [packed documents])
        nn::Stream s;
        if (j == 0) {
          s = lm_->embed(mb.inputs, docs);
        } else {
          inputs[k] = receive(*forward_, mb, prev).requires_grad_();
          s = nn::Stream{inputs[k], Tensor(), docs};
        }
        const auto [begin, end] = stage_->chunks[static_cast<size_t>(a.chunk)];
        s = lm_->blocks(s, begin, end);
        if (j == V - 1) {
          // The gradient the loss will get (Note [expected loss gradient]).
          const ops::LossGradDivisor expect(K, scaler_ ? scaler_->scale_tensor() : Tensor());
          Tensor loss = lm_->head_loss(s, mb.targets);
          if (!token_w.empty()) loss = strategy_detail::weighted(loss, token_w[m]);
          const Tensor l = loss.detach().to(DType::f32);
          loss_sum = loss_sum.defined() ? loss_sum + l : l;
          Tensor scaled = K == 1 ? loss : loss / static_cast<double>(K);
          outputs[k] = scaler_ ? scaler_->scale_loss(scaled) : scaled;
        } else {
          outputs[k] = s.materialize();
          const Tensor out = outputs[k].detach().contiguous();
          sends.emplace_back(out, forward_->send(out, next));
        }
      } else {
        dp_->begin_backward(/*sync=*/!split_w && i == last_backward);
        if (j == V - 1) {
          outputs[k].backward();
        } else {
          const Tensor dy = receive(*backward_, mb, next);
          outputs[k].backward(dy);
        }
        dp_->end_backward();
        if (j > 0) {
          const Tensor dx = inputs[k].grad().contiguous();
          sends.emplace_back(dx, backward_->send(dx, prev));
        }
        inputs[k] = outputs[k] = Tensor();  // this micro-batch's activations go
      }
    }
    if (split_w) {  // the data-parallel reduction of everything accumulated
      dp_->begin_backward(/*sync=*/true);
      dp_->end_backward();
    }
    for (auto& [t, w] : sends) w->wait();
    // Tensor parallelism: the sums over the tensor-parallel group (Note [split gradients]).
    if (split_) split_->reduce_grads(dp_->named_grads());
    phases.mark(3);
    // The tied embedding: the first stage's lookup and the last stage's head each gave part of
    // its gradient.
    if (tied_group_) {
      for (auto& [n, g] : dp_->named_grads())
        if (n == stage_->tied && g.defined()) tied_group_->all_reduce(g, parallel::ReduceOp::sum)->wait();
    }
    // The loss of the global batch: the last stage's, summed over the pipeline (the others add
    // zero), averaged over the data-parallel group.
    Tensor mean_loss = stage_->last() ? (K == 1 ? loss_sum : loss_sum / static_cast<double>(K))
                                      : zeros({}, {.dtype = DType::f32, .device = device_});
    mean_loss = mean_loss.contiguous();
    pp_->all_reduce(mean_loss, parallel::ReduceOp::sum)->wait();
    if (group_->size() > 1) group_->all_reduce(mean_loss, parallel::ReduceOp::avg)->wait();
    return strategy_detail::finish_data_parallel_step(*dp_, scaler_ ? &*scaler_ : nullptr, cfg_.optim.grad_clip,
                                                      mean_loss, phases);
  }

  // The first data-parallel replica's stages evaluate together (a forward through the pipeline;
  // with context parallelism, all its cp ranks, each on its part of the sequences); rank 0 (its
  // first stage) reports.
  bool evaluates() const override { return dp_rank_ == 0; }
  EvalSums evaluate(data::BatchSource& batches, int64_t max_batches, bool count_correct) override {
    FORGE_CHECK(!count_correct, "evaluate: a pipeline stage counts no arg-max hits");
    NoGradGuard no_grad;
    const bool was_training = model_.module->is_training();
    model_.module->eval();
    EvalSums sums;
    double loss_sum = 0;
    for (int64_t b = 0; max_batches == 0 || b < max_batches; ++b) {
      auto batch = batches.next();
      if (!batch) break;
      const data::Batch mb = cp_group_ ? strategy_detail::local_part(*batch, 0, batch->inputs.size(0), cp_group_, device_)
                                       : batch->map([&](const Tensor& t) { return t.to(device_); });
      const nn::Documents docs{mb.documents, mb.positions};
      // Each of this rank's chunks in order (one outside the interleaved schedule): virtual stage
      // c P + s receives from the rank before and sends to the rank after.
      const int P = stage_->stages, V = P * static_cast<int>(stage_->chunks.size());
      for (size_t c = 0; c < stage_->chunks.size(); ++c) {
        const int j = static_cast<int>(c) * P + stage_->index;
        nn::Stream s = j == 0 ? lm_->embed(mb.inputs, docs)
                              : nn::Stream{receive(*forward_, mb, (stage_->index - 1 + P) % P), Tensor(), docs};
        s = lm_->blocks(s, stage_->chunks[c].first, stage_->chunks[c].second);
        if (j == V - 1) {
          const double counted = ops::sum(ops::ne(mb.targets, -100.0)).item();
          loss_sum += lm_->head_loss(s, mb.targets).item() * counted;
        } else {
          forward_->send(s.materialize().contiguous(), (stage_->index + 1) % P)->wait();
        }
      }
      sums.count += std::llround(ops::sum(ops::ne(batch->targets, -100.0)).item());  // the targets that count
    }
    model_.module->train(was_training);
    Tensor l = full({1}, loss_sum, {.dtype = DType::f64, .device = device_});
    pp_->all_reduce(l, parallel::ReduceOp::sum)->wait();
    if (cp_group_) cp_group_->all_reduce(l, parallel::ReduceOp::sum)->wait();  // the parts' sums
    sums.loss_sum = l.item();
    FORGE_CHECK(sums.count > 0, "evaluate: no evaluation batch");
    return sums;
  }

  // Note [pipeline checkpoints]: the same format as every layout's (Note [resharding]). Each
  // stage's optimizer state is already in whole-parameter ranges (pipeline parallelism splits the
  // model by tensors, never inside one): every rank that holds state writes its shard file (DDP:
  // each stage's first data-parallel rank). The first replica's stages send rank 0 their tensors
  // (a broadcast over the pipeline group from each tensor's owner), and rank 0 writes the whole
  // model and state.json, publishing the checkpoint atomically as the data-parallel layouts do.
  CheckpointJob snapshot_checkpoint(const fs::path& run_dir, int64_t step, const RunState& state,
                                    int64_t keep_last) override {
    const bool rank0 = world_->rank() == 0;
    CheckpointJob job = checkpoint_job(run_dir, step, keep_last);
    job.staging = checkpoint_staging(job.dir, step, /*create=*/rank0);
    world_->barrier()->synchronize();  // the staging directory exists before any rank's writer uses it
    const bool sharded = dp_->options().sharding.optimizer_state() && !split_;
    auto file_of = [](int r) { return optimizer_shard_name(r); };
    // Who writes an optimizer file: every rank (ZeRO), or each stage's first data-parallel rank
    // (DDP); with tensor parallelism each stage's first replica gathers its state over the group
    // (Note [tensor-parallel checkpoints]) and its tensor-parallel rank 0 writes it.
    const bool first_replica = group_->rank() == 0;
    if (split_) {
      WholeOptimizerState o = gather_whole_optimizer(model_, *dp_, first_replica && tp_rank_ == 0);
      if (first_replica && tp_rank_ == 0)
        job.shard = strategy_detail::shard_job(file_of(world_->rank()), std::move(o.pieces), o.state,
                                               std::move(o.steps), job.host_bytes);
    } else if (sharded || first_replica) {
      job.shard = strategy_detail::shard_job(file_of(world_->rank()), dp_->pieces(), dp_->piece_state(),
                                             dp_->piece_steps(), job.host_bytes);
    }
    // The whole model on rank 0, tensor by tensor from its owner stage (and, with tensor
    // parallelism, gathered over the first stage's tensor-parallel group).
    std::vector<std::pair<std::string, Tensor>> whole;
    if (first_replica) {
      NoGradGuard no_grad;
      for (const auto& [name, t] : model_.module->state_dict()) {
        const int owner = stage_->owner.at(name);
        Tensor buf = owner == stage_->index ? t.detach().contiguous()
                                            : empty(stage_->whole_shapes.at(name), {.dtype = t.dtype(), .device = device_});
        pp_->broadcast(buf, owner)->wait();
        if (split_ && stage_->first()) buf = split_->whole_of(name, buf);
        if (rank0) {
          whole.emplace_back(name, ops::host_copy(buf));
          job.host_bytes += static_cast<uint64_t>(buf.numel()) * element_size(buf.dtype());
        }
      }
    }
    if (rank0) {
      io::CheckpointData d;
      d.step = step;
      d.model = io::NamedTensors(std::move(whole));
      io::capture_rng(d);
      d.data_loader = json::parse(state.sampler.to_json());
      d.config = state.config;
      d.extra = state.extra;
      d.extra["optimizer"] = {{"name", optimizer_class_name(cfg_)}, {"scalars", {{"step", dp_->step_count()}}}};
      json files = json::array();
      for (int r = 0; r < world_->size(); ++r) {
        // Who wrote a file: every rank (ZeRO), or each stage's first data-parallel rank (DDP; with
        // tensor parallelism its tensor-parallel rank 0).
        // (Rank r = ((dp_rank * pp + pp_rank) * cp + cp_rank) * tp + tp_rank: parallel/mesh.h.)
        const int tp = static_cast<int>(layout_.tp), cp = static_cast<int>(layout_.cp), pp = static_cast<int>(layout_.pp);
        const bool first = r / (tp * cp * pp) == 0 && (r / tp) % cp == 0;
        const bool wrote = sharded || (first && (!split_ || r % static_cast<int>(layout_.tp) == 0));
        if (!wrote) continue;
        files.push_back(file_of(r));
        d.move_in.push_back(job.staging / file_of(r));
      }
      if (scaler_) d.extra["loss_scaler"] = scaler_->state_dict().scalars;
      d.extra["dist"] = {{"world_size", world_->size()},
                         {"zero_stage", dp_->options().sharding.stage()},
                         {"offload_optimizer", false},
                         {"pp", stage_->stages},
                         {"tp", layout_.tp},
                         {"files", files}};
      job.publish = std::move(d);
    }
    return job;
  }

  void load_checkpoint(const io::CheckpointData& ck, const fs::path& ck_path) override {
    load_data_parallel_checkpoint(cfg_, model_, *dp_, scaler_ ? &*scaler_ : nullptr, ck, ck_path);
  }

  std::string graph_blocker() const override { return "pipeline parallelism's step is not captured yet"; }

 private:
  // This rank's rows of a global micro-batch (every stage of a pipeline trains the same rows).
  data::Batch rows_of(const data::Batch& global) const {
    const int64_t rows = global.inputs.size(0), W = dp_size_, r = dp_rank_;
    return strategy_detail::local_part(global, r * rows / W, rows / W, cp_group_, device_);
  }
  // The activations (or their gradient) of micro-batch `mb` from stage `from`: (rows, T, C), or
  // this rank's slice of the sequence (rows, T / tp, C) under sequence parallelism.
  Tensor receive(parallel::ProcessGroup& link, const data::Batch& mb, int from) const {
    Tensor t = empty({mb.inputs.size(0), mb.inputs.size(1) / seq_parts_, width_}, {.dtype = dtype_, .device = device_});
    link.recv(t, from)->wait();
    return t;
  }

  const RunConfig cfg_;
  const parallel::Layout layout_;
  Model& model_;
  Device device_;
  DType dtype_;
  parallel::ProcessGroupPtr world_, pp_, group_, tied_group_, norm_group_;
  parallel::ProcessGroupPtr forward_, backward_;  // Note [pipeline links]
  std::shared_ptr<const Model::Stage> stage_;
  std::shared_ptr<const parallel::tp::SplitModel> split_;  // tensor parallelism within each stage, or null
  int tp_rank_ = 0;
  parallel::ProcessGroupPtr cp_group_;  // context parallelism's group, or null
  int dp_size_ = 1, dp_rank_ = 0;        // the data-parallel ranks the rows split over
  int64_t seq_parts_ = 1;  // sequence parallelism: the activations between stages are T / tp long
  std::shared_ptr<nn::CausalLM> lm_;
  int64_t width_ = 0;
  std::unique_ptr<parallel::DataParallel> dp_;
  std::optional<optim::LossScaler> scaler_;
};

}  // namespace

std::unique_ptr<Strategy> make_pipeline(const RunConfig& cfg, const parallel::Layout& layout, const parallel::Mesh& mesh,
                                        Model& model, DType dtype, std::ostream& log) {
  return std::make_unique<PipelineStrategy>(cfg, layout, mesh, model, dtype, log);
}

}  // namespace forge::train
