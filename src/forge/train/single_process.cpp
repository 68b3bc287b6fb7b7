// SingleProcess: the strategy of one process without dist (train/strategy.h). The optimizer
// spans the whole model; with run.dtype = "f16" a LossScaler (optim/loss_scale.h) scales the
// loss and unscales the gradients; the checkpoint holds the whole optimizer state
// (optimizer.safetensors) and the loss scale (extra.loss_scaler).
#include <optional>
#include <unordered_map>

#include "forge/core/error.h"
#include "forge/io/atomic_file.h"
#include "forge/optim/clip.h"
#include "forge/optim/loss_scale.h"
#include "forge/ops/loss.h"
#include "forge/run/run_checkpoint.h"
#include "forge/train/strategy.h"

namespace forge::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

class SingleProcess final : public Strategy {
 public:
  SingleProcess(const RunConfig& cfg, Model& model, DType dtype)
      : cfg_(cfg), model_(model), device_(model.device()), params_(model.module->parameters()),
        optimizer_(make_optimizer_for(cfg, optim::decay_groups(model.module->named_parameters(), cfg.optim.weight_decay))) {
    if (dtype == DType::f16) scaler_.emplace(device_);
  }

  std::string describe() const override { return "layout: one process on " + device_.str(); }

  void seed_master_weights(const std::function<Tensor(const std::string&)>& f32_of) override {
    std::unordered_map<const TensorImpl*, std::string> name_of;
    for (const auto& [name, t] : model_.module->named_parameters()) name_of.emplace(t.impl(), name);
    for (const auto& g : optimizer_->param_groups())
      for (const Tensor& p : g.params) {
        if (p.dtype() == DType::f32) continue;
        auto it = name_of.find(p.impl());
        if (it == name_of.end()) continue;
        if (const Tensor v = f32_of(it->second); v.defined()) optimizer_->seed_state(p, "master", v);
      }
  }

  Tensor train_step(const std::vector<data::Batch>& micro_batches, double lr, PhaseMarks& phases) override {
    for (auto& g : optimizer_->param_groups()) g.lr = lr;
    const auto K = static_cast<int64_t>(micro_batches.size());
    // Note [token-weighted loss]: empty unless some targets do not count.
    const std::vector<double> weights =
        strategy_detail::token_weights(micro_batches, 0, micro_batches.front().inputs.size(0), 1);
    // Note [token weights on the device]: a captured step's targets are on the GPU.
    const bool on_device = weights.empty() && strategy_detail::weighs_tokens(cfg_) &&
                           !micro_batches.front().targets.is_cpu();
    const Tensor counted = on_device ? strategy_detail::counted_targets(micro_batches) : Tensor();
    Tensor loss_sum;  // on the device: read once per step
    for (int64_t k = 0; k < K; ++k) {
      const data::Batch& global = micro_batches[static_cast<size_t>(k)];
      const data::Batch b = strategy_detail::local_rows(global, 0, global.inputs.size(0), device_);
      if (k == K - 1) phases.mark(0);
      // The gradient the loss will get (Note [expected loss gradient]).
      const ops::LossGradDivisor expect(K, scaler_ ? scaler_->scale_tensor() : Tensor());
      Tensor loss = model_.training_loss(b);
      if (!weights.empty()) loss = strategy_detail::weighted(loss, weights[static_cast<size_t>(k)]);
      else if (on_device)
        loss = strategy_detail::weighted(loss, strategy_detail::device_token_weight(b.targets, counted, K, 1, loss.dtype()));
      const Tensor l = loss.detach().to(DType::f32);
      loss_sum = loss_sum.defined() ? loss_sum + l : l;
      Tensor scaled = K == 1 ? loss : loss / static_cast<double>(K);
      if (scaler_) scaled = scaler_->scale_loss(scaled);
      if (k == K - 1) phases.mark(1);
      scaled.backward();
      if (k == K - 1) phases.mark(2);
    }
    phases.mark(3);
    const Tensor mean_loss = K == 1 ? loss_sum : loss_sum / static_cast<double>(K);
    // Note [one sync per step]: the gradient norm, the clip, the skip decision and the update
    // all run on the device.
    const Tensor norm = scaler_ ? scaler_->unscale_(params_) : optim::total_grad_norm(params_);
    // Note [clipping inside the update]: the next step() clips (AdamW on a GPU: in its kernel,
    // without rewriting the gradients); the scaler's step below is that step.
    if (cfg_.optim.grad_clip > 0) optimizer_->clip_next_step(cfg_.optim.grad_clip, norm);
    // A non-finite loss or norm skips the update (loss * 0 is NaN for an inf/NaN loss).
    const Tensor bad = optim::found_non_finite(norm.to(DType::f32) + mean_loss * 0.0);
    phases.mark(4);
    if (scaler_) {
      scaler_->step(*optimizer_);  // skips on the scaler's own overflow flag
      scaler_->update();
    } else {
      optimizer_->step(bad);
    }
    phases.mark(5);
    Tensor figures = strategy_detail::step_figures(mean_loss, norm, bad, scaler_ ? scaler_->scale_tensor() : Tensor());
    optimizer_->zero_grad();
    return figures;
  }

  bool evaluates() const override { return true; }
  EvalSums evaluate(data::BatchSource& batches, int64_t max_batches, bool count_correct) override {
    return strategy_detail::evaluate_model(model_, batches, max_batches, count_correct);
  }

  CheckpointJob snapshot_checkpoint(const fs::path& run_dir, int64_t step, const RunState& state,
                                    int64_t keep_last) override {
    CheckpointJob job = checkpoint_job(run_dir, step, keep_last);
    io::CheckpointData d;
    d.step = step;
    d.model = strategy_detail::host_copies(model_.module->state_dict(), job.host_bytes);
    const optim::StateDict sd = optimizer_->state_dict();
    d.optimizer = strategy_detail::host_copies({sd.tensors.begin(), sd.tensors.end()}, job.host_bytes);
    io::capture_rng(d);
    d.data_loader = json::parse(state.sampler.to_json());
    d.config = state.config;
    d.extra = state.extra;
    d.extra["optimizer"] = {{"name", optimizer_->name()}, {"scalars", sd.scalars}};
    if (scaler_) d.extra["loss_scaler"] = scaler_->state_dict().scalars;
    job.publish = std::move(d);
    return job;
  }

  std::vector<size_t> checkpoint_host_bytes() const override {
    std::vector<size_t> bytes;
    auto add = [&](const Tensor& t) {
      if (!t.is_cpu()) bytes.push_back(static_cast<size_t>(t.numel()) * element_size(t.dtype()));
    };
    for (const auto& [name, t] : model_.module->state_dict()) add(t);
    for (const auto& [name, t] : optimizer_->state_dict().tensors) add(t);
    return bytes;
  }

  void load_checkpoint(const io::CheckpointData& ck, const fs::path& ck_path) override {
    restore_optimizer(*optimizer_, ck, ck_path, optimizer_slots(cfg_, *model_.module));
    if (scaler_) restore_loss_scaler(*scaler_, ck);
  }

  // Note [the step as a CUDA graph]: the whole step is device work (Note [one sync per step]).
  std::string graph_blocker() const override { return ""; }
  void begin_graph_capture() override { optimizer_->begin_graph_capture(device_); }
  void end_graph_capture() override {
    optimizer_->end_graph_capture();
    optimizer_->stage_graph_inputs();
  }
  void before_replay(double lr) override {
    for (auto& g : optimizer_->param_groups()) g.lr = lr;
    optimizer_->count_replayed_step();
    optimizer_->stage_graph_inputs();
  }

 private:
  const RunConfig cfg_;
  Model& model_;
  Device device_;
  std::vector<Tensor> params_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::optional<optim::LossScaler> scaler_;
};

}  // namespace

std::unique_ptr<Strategy> make_single_process(const RunConfig& cfg, Model& model, DType dtype) {
  return std::make_unique<SingleProcess>(cfg, model, dtype);
}

}  // namespace forge::train
