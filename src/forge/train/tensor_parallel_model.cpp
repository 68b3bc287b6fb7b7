// The model of a tensor-parallel run (contract in tensor_parallel_model.h).
#include "forge/train/tensor_parallel_model.h"

#include <algorithm>
#include <map>
#include <ostream>

#include "forge/autograd/grad_mode.h"
#include "forge/core/error.h"
#include "forge/nn/model_registry.h"
#include "forge/ops/copy.h"
#include "forge/ops/creation.h"
#include "forge/ops/view.h"
#include "forge/parallel/env.h"
#include "forge/parallel/parallelize.h"
#include "forge/parallel/tensor_parallel.h"
#include "forge/telemetry/metrics.h"
#include "forge/run/language_model.h"
#include "forge/train/pipeline_model.h"
#include "forge/run/run_checkpoint.h"

namespace forge::train {

namespace {
void split_tensor_parallel(const RunConfig& cfg, const parallel::Layout& layout, const parallel::Mesh& mesh, Model& model,
                           std::ostream& log) {
  FORGE_CHECK(cfg.is_language_model(), "dist.tp = ", layout.tp, " splits a GPT or LLaMA; model.type = '",
              cfg.model.type, "' trains with dist.tp = 1");
  const parallel::ProcessGroupPtr& g = mesh.tp_group();
  FORGE_CHECK(g != nullptr && g->size() == layout.tp, "tensor parallelism: the mesh has no tensor-parallel group of ",
              layout.tp, " ranks attached");
  // Megatron keeps a tensor-parallel group inside one host (its all-reduces run on every layer,
  // over NVLink there); a group that crosses hosts works but is slow: said, not refused.
  const parallel::LaunchEnv env = parallel::launch_env();
  if (env.local_world_size < layout.tp)
    log << "warning: dist.tp = " << layout.tp << " is larger than the " << env.local_world_size
        << " rank(s) of this host: the tensor-parallel collectives cross hosts (slow); keep dist.tp <= the GPUs "
           "of one host\n";
  const nn::TransformerShape shape = nn::transformer_shape(cfg.model);
  // The whole model's state (on the CPU, from run.seed), then the split model loaded from it.
  std::map<std::string, Tensor> whole;
  for (const auto& [name, t] : model.module->state_dict()) whole.emplace(name, t);
  const int64_t whole_count = model.module->num_parameters();
  // The layout's composed spec (parallel/parallelize.h): the split layers, and context
  // parallelism's positions and attention on top when cp > 1.
  LanguageModel split = build_language_model(cfg, parallel::layer_spec_of(mesh, layout, shape.head_dim()));
  auto s = std::make_shared<parallel::tp::SplitModel>(*split.module, g, layout.sequence_parallel);
  s->load_whole(*split.module, whole);
  whole.clear();
  model.module = split.module;
  model.forward = split.forward;
  model.loss = split.loss;
  model.set_block_hooks = split.set_block_hooks;
  model.block_of = split.block_of;
  model.split = s;
  FORGE_CHECK(model.whole_parameters() == whole_count, "tensor parallelism: the split model holds ",
              model.whole_parameters(), " parameters of the whole model's ", whole_count);
  log << "tensor parallel: " << layout.tp << " rank(s) per group"
      << (layout.sequence_parallel ? ", sequence parallel" : "") << "; "
      << telemetry::format_count(static_cast<double>(model.module->num_parameters())) << " of the "
      << telemetry::format_count(static_cast<double>(whole_count)) << " parameters on each rank\n";
}

// Context parallelism alone (dist.cp > 1, dist.tp = 1): the same model rebuilt with the
// context-parallel layer spec (positions and attention: parallel/context_parallel.h) and loaded
// from the one built from run.seed; no parameter is split.
void context_parallel_model(const RunConfig& cfg, const parallel::Layout& layout, const parallel::Mesh& mesh, Model& model) {
  FORGE_CHECK(cfg.is_language_model(), "dist.cp = ", layout.cp, " splits the sequences of a GPT or LLaMA; model.type = '",
              cfg.model.type, "' trains with dist.cp = 1");
  const nn::NamedTensors whole = model.module->state_dict();
  LanguageModel cpm = build_language_model(cfg, parallel::layer_spec_of(mesh, layout, nn::transformer_shape(cfg.model).head_dim()));
  cpm.module->load_state_dict(whole);
  model.module = cpm.module;
  model.forward = cpm.forward;
  model.loss = cpm.loss;
  model.set_block_hooks = cpm.set_block_hooks;
  model.block_of = cpm.block_of;
}

}  // namespace

void split_model_for_layout(const RunConfig& cfg, const parallel::Layout& layout, const parallel::Mesh& mesh, Model& model,
                            std::ostream& log) {
  // Tensor parallelism first (the split model is rebuilt from the whole one), then this rank's
  // pipeline stage of it.
  if (layout.tp > 1) split_tensor_parallel(cfg, layout, mesh, model, log);  // (with cp when cp > 1)
  else if (layout.cp > 1) context_parallel_model(cfg, layout, mesh, model);
  if (layout.cp > 1)
    log << "context parallel: " << layout.cp << " rank(s) per group ("
        << (layout.cp_kind == parallel::ContextKind::ulysses ? "ulysses" : "ring") << "), "
        << cfg.train.seq_len / layout.cp << " of the " << cfg.train.seq_len << " positions of each sequence on each rank\n";
  stage_model_for_layout(cfg, layout, mesh, model, log);
}

// ---- checkpoints (Note [tensor-parallel checkpoints]) -----------------------------------------

std::vector<std::pair<std::string, Tensor>> gather_whole_model(const Model& model) {
  FORGE_CHECK(model.split != nullptr, "gather_whole_model: the model is not split");
  NoGradGuard no_grad;
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [name, t] : model.module->state_dict())
    out.emplace_back(name, model.split->whole_of(name, t).to(Device::cpu()).clone());
  return out;
}

WholeOptimizerState gather_whole_optimizer(const Model& model, const parallel::DataParallel& dp, bool keep) {
  FORGE_CHECK(model.split != nullptr, "gather_whole_optimizer: the model is not split");
  NoGradGuard no_grad;
  const parallel::ProcessGroupPtr& g = dp.group();
  const bool sharded = dp.options().sharding.optimizer_state() && g->size() > 1;
  const auto& pieces = dp.pieces();
  const auto state = dp.piece_state();
  const auto steps = dp.piece_steps();
  // The state names every rank agrees on (a ZeRO rank may own no piece of the model).
  static const char* kNames[] = {"exp_avg", "exp_avg_sq", "master", "momentum_buffer"};
  const Device dev = model.device();
  Tensor has = zeros({4}, {.dtype = DType::f32, .device = dev});
  for (const auto& m : state)
    for (int i = 0; i < 4; ++i)
      if (m.count(kNames[i]) != 0) {
        Tensor flag = ops::narrow(has, 0, i, 1);
        ops::fill_(flag, 1.0);
      }
  g->all_reduce(has, parallel::ReduceOp::max)->wait();
  if (model.split->group()) model.split->group()->all_reduce(has, parallel::ReduceOp::max)->wait();
  const std::vector<double> have = has.to_vector<double>();
  WholeOptimizerState out;
  for (const auto& [name, p] : model.module->named_parameters()) {
    if (!p.requires_grad()) continue;
    if (model.stage && !model.stage->held.count(name)) continue;  // (another pipeline stage's)
    // This parameter's pieces on this rank, and its update count (agreed over the group).
    std::vector<size_t> mine;
    int64_t step = 0;
    for (size_t k = 0; k < pieces.size(); ++k)
      if (pieces[k].param == name) mine.push_back(k), step = std::max(step, steps[k]);
    Tensor step_t = full({1}, static_cast<double>(step), {.dtype = DType::f32, .device = dev});
    if (sharded) g->all_reduce(step_t, parallel::ReduceOp::max)->wait();
    std::map<std::string, Tensor> whole_state;
    for (int i = 0; i < 4; ++i) {
      if (have[static_cast<size_t>(i)] == 0) continue;
      // This rank's tensor of the state, assembled over the data-parallel group when sharded.
      Tensor local = zeros({p.numel()}, {.dtype = DType::f32, .device = dev});
      for (size_t k : mine) {
        const auto it = state[k].find(kNames[i]);
        if (it == state[k].end()) continue;
        Tensor dst = ops::narrow(local, 0, pieces[k].lo, pieces[k].hi - pieces[k].lo);
        ops::copy_(dst, it->second.to(dev, DType::f32));
      }
      if (sharded) g->all_reduce(local, parallel::ReduceOp::sum)->wait();
      const Tensor whole = model.split->whole_of(name, local.reshape(p.shape()));
      if (keep) whole_state[kNames[i]] = whole.reshape({-1}).to(Device::cpu()).clone();
    }
    if (!keep) continue;
    out.pieces.push_back({name, 0, model.split->at(name).whole_numel()});
    out.state.push_back(std::move(whole_state));
    out.steps.push_back(static_cast<int64_t>(step_t.item()));
  }
  return out;
}

void load_split_optimizer(const Model& model, parallel::DataParallel& dp, const parallel::RangedState& rs) {
  FORGE_CHECK(model.split != nullptr, "load_split_optimizer: the model is not split");
  const parallel::tp::SplitModel& s = *model.split;
  dp.load_piece_state(
      [&](const parallel::ShardPiece& p, const std::string& n) -> Tensor {
        const parallel::tp::ParamSplit& ps = s.at(p.param);
        const Tensor whole = rs.get(p.param, n, 0, ps.whole_numel());
        if (!whole.defined()) return whole;
        return s.local_of(p.param, whole.reshape(ps.whole_shape)).reshape({-1}).narrow(0, p.lo, p.hi - p.lo).contiguous();
      },
      [&](const parallel::ShardPiece& p) { return rs.step(p.param, 0, s.at(p.param).whole_numel()); });
}

void load_data_parallel_checkpoint(const RunConfig& cfg, const Model& model, parallel::DataParallel& dp,
                                   optim::LossScaler* scaler, const io::CheckpointData& ck,
                                   const std::filesystem::path& ck_path) {
  const std::string optimizer_class = optimizer_class_name(cfg);  // (named: g++ 13's -Wdangling-reference)
  const nlohmann::json& o = checkpoint_optimizer_record(ck, ck_path, optimizer_class);
  // (A one-process checkpoint names its optimizer slots by the whole model's parameters in the
  // optimizer's order; a pipeline stage's module has every name, its other stages' tensors empty.)
  const parallel::RangedState rs = ranged_optimizer_state(ck, ck_path, optimizer_slots(cfg, *model.module));
  if (model.split) {
    load_split_optimizer(model, dp, rs);
  } else {
    dp.load_piece_state([&](const parallel::ShardPiece& p, const std::string& n) { return rs.get(p.param, n, p.lo, p.hi); },
                        [&](const parallel::ShardPiece& p) { return rs.step(p.param, p.lo, p.hi); });
  }
  dp.set_step_count(static_cast<int64_t>(o["scalars"].value("step", 0.0)));
  if (scaler) restore_loss_scaler(*scaler, ck);
}

}  // namespace forge::train
