// The pieces every strategy shares, and the choice of one (contracts in strategy.h).
#include "forge/train/strategy.h"

#include <cmath>

#include "forge/autograd/grad_mode.h"
#include "forge/core/error.h"
#include "forge/ops/binary.h"
#include "forge/ops/copy.h"
#include "forge/ops/creation.h"
#include "forge/ops/join.h"
#include "forge/ops/loss.h"
#include "forge/ops/reduce.h"
#include "forge/optim/clip.h"
#include "forge/parallel/context_parallel.h"
#include "forge/parallel/env.h"
#include "forge/parallel/hierarchical_group.h"

namespace forge::train {

namespace strategy_detail {

io::NamedTensors host_copies(const std::vector<std::pair<std::string, Tensor>>& tensors, uint64_t& bytes) {
  std::vector<std::pair<std::string, Tensor>> out;
  out.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    out.emplace_back(name, ops::host_copy(t));
    bytes += static_cast<uint64_t>(t.numel()) * element_size(t.dtype());
  }
  return io::NamedTensors(std::move(out));
}

CheckpointJob::Shard shard_job(std::string file, std::vector<parallel::ShardPiece> pieces,
                               const std::vector<std::map<std::string, Tensor>>& state, std::vector<int64_t> steps,
                               uint64_t& bytes) {
  CheckpointJob::Shard s{.file = std::move(file), .pieces = std::move(pieces), .state = {}, .steps = std::move(steps)};
  s.state.reserve(state.size());
  for (const auto& piece : state) {
    std::map<std::string, Tensor> copies;
    for (const auto& [name, t] : piece) {
      copies[name] = ops::host_copy(t);
      bytes += static_cast<uint64_t>(t.numel()) * element_size(t.dtype());
    }
    s.state.push_back(std::move(copies));
  }
  return s;
}

data::Batch local_rows(const data::Batch& global, int64_t row0, int64_t rows, Device device) {
  data::Batch b = global;
  if (rows != global.inputs.size(0)) b = b.map([&](const Tensor& t) { return t.narrow(0, row0, rows).contiguous(); });
  if (device.is_cuda() && !global.inputs.is_cuda())  // (a captured step's batch is on the GPU already)
    b = b.map([&](const Tensor& t) { return t.pin_memory().to(device, /*non_blocking=*/true); });
  return b;
}

data::Batch local_part(const data::Batch& global, int64_t row0, int64_t rows, const parallel::ProcessGroupPtr& cp_group,
                       Device device) {
  if (!cp_group) return local_rows(global, row0, rows, device);
  // Note [context-parallel sequence layout]: the rank's chunks cut where the batch is (the host),
  // so only 1/cp of each sequence travels to the device.
  // (A packed batch's documents and positions too: Note [context-parallel documents].)
  const data::Batch part = global.map([&](const Tensor& t) {
    return parallel::cp::local_sequence(t.narrow(0, row0, rows), cp_group->rank(), cp_group->size());
  });
  return local_rows(part, 0, rows, device);
}

// Note [token-weighted loss] (strategy.h).
std::vector<double> token_weights(const std::vector<data::Batch>& micro_batches, int64_t row0, int64_t rows,
                                  int64_t dp, int cp_rank, int cp_size) {
  const auto K = static_cast<int64_t>(micro_batches.size());
  std::vector<int64_t> local(static_cast<size_t>(K), 0);
  int64_t counted = 0, all = 0;
  for (int64_t k = 0; k < K; ++k) {
    const Tensor& t = micro_batches[static_cast<size_t>(k)].targets;
    if (!t.defined() || !t.is_cpu() || t.dtype() != DType::i64) return {};  // (a captured step's are on the GPU)
    const Tensor c = t.contiguous();
    const int64_t* y = c.data<int64_t>();
    const int64_t per_row = t.dim() > 1 ? t.numel() / t.size(0) : 1;
    const int64_t chunk = per_row / (2 * cp_size);  // a context-parallel rank holds 2 chunks of a row
    auto mine = [&](int64_t i) {
      const int64_t row = i / per_row;
      if (row < row0 || row >= row0 + rows) return false;
      if (cp_size == 1) return true;
      const int64_t c = (i % per_row) / chunk;
      return c == cp_rank || c == 2 * cp_size - 1 - cp_rank;
    };
    for (int64_t i = 0; i < c.numel(); ++i) {
      if (y[i] == -100) continue;
      ++counted;
      if (mine(i)) ++local[static_cast<size_t>(k)];
    }
    all += c.numel();
  }
  // No target counts at all (every one -100): each mean is NaN, and the trainer's non-finite guard
  // skips the step and says so, as for any step without a finite loss.
  if (counted == all || counted == 0) return {};
  std::vector<double> w(static_cast<size_t>(K));
  for (int64_t k = 0; k < K; ++k)
    w[static_cast<size_t>(k)] = static_cast<double>(local[static_cast<size_t>(k)] * K * dp) / static_cast<double>(counted);
  return w;
}

Tensor weighted(const Tensor& loss, double w) {
  if (w != 0) return loss * w;
  return ops::where(ops::eq(loss.detach(), loss.detach()), loss, 0.0) * 0.0;  // (NaN != NaN)
}

// Note [token weights on the device] (strategy.h).
Tensor counted_targets(const std::vector<data::Batch>& micro_batches) {
  Tensor n;
  for (const data::Batch& b : micro_batches) {
    const Tensor c = ops::sum(ops::ne(b.targets, -100.0).to(DType::f64));
    n = n.defined() ? n + c : c;
  }
  return n;
}

Tensor device_token_weight(const Tensor& local_targets, const Tensor& counted, int64_t K, int64_t G, DType dtype) {
  const Tensor n = ops::sum(ops::ne(local_targets, -100.0).to(DType::f64));
  return (n * static_cast<double>(K * G) / counted).to(dtype);
}

Tensor weighted(const Tensor& loss, const Tensor& w) {
  return ops::where(ops::eq(loss.detach(), loss.detach()), loss, 0.0) * w;
}

bool weighs_tokens(const RunConfig& cfg) { return cfg.data.packing == "documents" || cfg.data.format == "chat"; }

EvalSums evaluate_model(const Model& model, data::BatchSource& batches, int64_t max_batches, bool count_correct,
                        const parallel::ProcessGroupPtr& cp_group) {
  NoGradGuard no_grad;
  const bool was_training = model.module->is_training();
  model.module->eval();
  const Device device = model.device();
  EvalSums sums;
  for (int64_t b = 0; max_batches == 0 || b < max_batches; ++b) {
    auto batch = batches.next();
    if (!batch) break;
    if (cp_group) *batch = local_part(*batch, 0, batch->inputs.size(0), cp_group, Device::cpu());
    const Tensor targets = batch->targets.to(device);
    if (model.split || batch->documents.defined()) {
      FORGE_CHECK(!count_correct, "evaluate: a split model or a packed batch counts no arg-max hits");
      // Tensor parallelism: this rank holds a slice of the logits; the model's loss combines the
      // slices (the mean over the targets that count), collective over its group. A packed batch:
      // the loss reads its documents (Note [packed documents]) and counts only the targets that
      // stay inside one.
      const double counted = ops::sum(ops::ne(targets, -100.0)).item();
      const data::Batch on_device = batch->map([&](const Tensor& t) { return t.to(device); });
      sums.loss_sum += model.training_loss(on_device).item() * counted;
      sums.count += std::llround(counted);
      continue;
    }
    const Tensor logits = model.forward(batch->inputs.to(device));
    sums.loss_sum += ops::cross_entropy(logits, targets, -100, ops::Reduction::sum).item();
    if (count_correct) sums.correct += ops::sum(ops::eq(ops::argmax(logits, -1), targets)).item<int64_t>();
    sums.count += batch->targets.numel();
  }
  model.module->train(was_training);
  if (cp_group) {  // each rank summed its part of the sequences
    Tensor t = from_vector(std::vector<double>{sums.loss_sum, static_cast<double>(sums.correct),
                                               static_cast<double>(sums.count)},
                           {3})
                   .to(device, DType::f64);
    cp_group->all_reduce(t, parallel::ReduceOp::sum)->wait();
    const std::vector<double> v = t.to_vector<double>();
    sums.loss_sum = v[0];
    sums.correct = static_cast<int64_t>(std::llround(v[1]));
    sums.count = static_cast<int64_t>(std::llround(v[2]));
  }
  FORGE_CHECK(sums.count > 0, "evaluate: no evaluation batch");
  return sums;
}

Tensor step_figures(const Tensor& mean_loss, const Tensor& norm, const Tensor& bad, const Tensor& loss_scale) {
  std::vector<Tensor> figures = {mean_loss.reshape({}), norm.to(DType::f32).reshape({}), bad.reshape({})};
  if (loss_scale.defined()) figures.push_back(loss_scale.to(DType::f32).reshape({}));
  return ops::stack(figures);
}

int node_size(const parallel::Layout& layout) {
  return layout.node_size > 0 ? static_cast<int>(layout.node_size) : parallel::launch_env().local_world_size;
}

parallel::ProcessGroupPtr data_parallel_group(const parallel::Mesh& mesh, const parallel::Layout& layout) {
  FORGE_CHECK(mesh.world() != nullptr, "strategy: the mesh has no process group attached");
  parallel::ProcessGroupPtr flat = mesh.dp_cp_group();
  if (!flat) return mesh.dp() * mesh.cp() == mesh.world_size() ? mesh.world() : parallel::group_of_one(mesh.world());
  if (layout.dp_reduce != parallel::DpReduce::hierarchical && layout.link_gbps <= 0) return flat;
  // Note [hierarchical data-parallel reduction], Note [paced link]: nodes of dist.node_size world
  // ranks (or the launch's per host).
  const parallel::NodeLayout nodes{
      .node_size = node_size(layout),
      .hierarchical = layout.dp_reduce == parallel::DpReduce::hierarchical,
      .link = {.gbps = layout.link_gbps, .latency_us = layout.link_latency_us}};
  return parallel::node_aware_group(flat, mesh.group_ranks({"dp", "cp"}), nodes);
}

Tensor finish_data_parallel_step(parallel::DataParallel& dp, optim::LossScaler* scaler, double grad_clip,
                                 const Tensor& mean_loss, PhaseMarks& phases) {
  // Note [one sync per step]: norm, clip, skip decision and update all run on the device.
  const Tensor norm = scaler ? dp.unscale_grads(*scaler) : dp.grad_norm();
  if (grad_clip > 0) dp.clip_grads(grad_clip, norm);
  // A non-finite loss or norm skips the update (loss * 0 is NaN for an inf/NaN loss); under
  // f16 the norm is inf/NaN exactly when the scaler found an overflow on some rank.
  const Tensor bad = optim::found_non_finite(norm.to(DType::f32) + mean_loss * 0.0);
  phases.mark(4);
  dp.step(bad);
  if (scaler) scaler->update();
  phases.mark(5);
  Tensor figures = step_figures(mean_loss, norm, bad, scaler ? scaler->scale_tensor() : Tensor());
  dp.zero_grad();
  return figures;
}

}  // namespace strategy_detail

std::unique_ptr<Strategy> make_data_parallel(const RunConfig& cfg, const parallel::Layout& layout, const parallel::Mesh& mesh,
                                             Model& model, DType dtype, std::ostream& log);
std::unique_ptr<Strategy> make_pipeline(const RunConfig& cfg, const parallel::Layout& layout, const parallel::Mesh& mesh,
                                        Model& model, DType dtype, std::ostream& log);

bool needs_process_group(const parallel::Layout& layout) { return layout.gpus() > 1 || layout.sharding().optimizer_state(); }

std::unique_ptr<Strategy> make_strategy(const RunConfig& cfg, const parallel::Layout& layout, const parallel::Mesh& mesh,
                                        Model& model, DType dtype, std::ostream& log) {
  // Pipeline parallelism (with data parallelism on each stage's group).
  if (layout.pp > 1) return make_pipeline(cfg, layout, mesh, model, dtype, log);
  // Every other layout, one process included (Note [data-parallel runs], strategy.h).
  return make_data_parallel(cfg, layout, mesh, model, dtype, log);
}

}  // namespace forge::train
