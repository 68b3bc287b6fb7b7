#pragma once
// Strategy: everything a parallel layout changes about training, behind one interface, so the
// trainer's loop (train/trainer.cpp) never branches on the layout. DESIGN.md "Parallelism";
// docs/architecture.md "One training step".
//
//   auto s = make_strategy(cfg, layout, mesh, model, device, dtype, log);   // wraps model + optimizer
//   if (ck) s->load_checkpoint(*ck, ck_path);                               // optimizer, loss scale
//   for each step:
//     Tensor figures = s->train_step(micro_batches, lr, phases);           // no host sync
//     ... read figures one step later (Note [deferred step read]) ...
//     if (s->evaluates()) sums = s->evaluate(batches, max_batches, count_correct);
//     writer.submit(s->snapshot_checkpoint(run_dir, step, state, keep_last));  // collective
//
// A strategy owns:
//   - the wrapping of the model and the optimizer (one optimizer over the whole model, or
//     parallel::DataParallel's buckets, sharded optimizer state and sharded parameters);
//   - one optimizer step over its micro-batches: this rank's rows of each global micro-batch,
//     forward, loss, backward (gradient accumulation, the reductions), the global gradient norm,
//     f16 loss scaling, clipping, the non-finite skip and the update;
//   - evaluation (who evaluates, and how: ZeRO-3's forward is collective);
//   - checkpoint save/load in the shared format (run/run_checkpoint.h), so any layout resumes
//     any other.
// Two executors (make_strategy picks one from the layout):
//   DataParallelStrategy every layout without pipeline stages: one process (a data-parallel group
//                        of one, Note [one process is a data-parallel group of one] in
//                        parallel/self_group.h), DDP, ZeRO-1/2 (+ offload) and ZeRO-3 over the
//                        data-parallel group, on parallel::DataParallel, with tensor parallelism on
//                        a split model and context parallelism
//                        (train/data_parallel_strategy.cpp, train/tensor_parallel_model.h)
//   PipelineStrategy     pipeline parallelism with DDP / ZeRO-1/2 on each stage's data-parallel
//                        group (train/pipeline_strategy.cpp, train/pipeline_model.h)
#include <cstdint>
#include <filesystem>
#include <functional>
#include <iosfwd>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "forge/core/tensor.h"
#include "forge/data/loader.h"
#include "forge/io/checkpoint.h"
#include "forge/optim/loss_scale.h"
#include "forge/parallel/data_parallel.h"
#include "forge/parallel/layout.h"
#include "forge/parallel/mesh.h"
#include "forge/train/checkpoint_writer.h"
#include "forge/run/config.h"
#include "forge/run/model.h"
#include "forge/train/phase_marks.h"

namespace forge::train {

// What a checkpoint records besides the model and the optimizer: the data position, the
// resolved config, and the run's extra fields (tokenizer hash, tokens seen, ...).
struct RunState {
  data::SamplerState sampler;
  nlohmann::json config;
  nlohmann::json extra;
};

// An evaluation pass's sums over its batches: the cross-entropy summed over every target, the
// targets counted, and (when asked) the targets whose arg-max logit is right.
struct EvalSums {
  double loss_sum = 0.0;
  int64_t correct = 0;
  int64_t count = 0;
  double mean_loss() const { return loss_sum / static_cast<double>(count); }
  double accuracy() const { return static_cast<double>(correct) / static_cast<double>(count); }
};

class Strategy {
 public:
  virtual ~Strategy() = default;

  // One line for the log ("one process" / "data parallel: 2 rank(s) (forge launch, nccl), DDP, ...").
  virtual std::string describe() const = 0;

  // One optimizer step. `micro_batches` are the step's GLOBAL micro-batches (train.grad_accum of
  // them, batch_size / grad_accum rows each, on the host; an image run's last batch of an epoch
  // may have fewer); the strategy trains this rank's rows (Note [uneven rows]).
  // Returns, on the device and without a host synchronisation, a 1-D f32 tensor:
  //   [mean loss of the global batch, global gradient norm, skipped (1) or not (0), (loss scale: f16)]
  virtual Tensor train_step(const std::vector<data::Batch>& micro_batches, double lr, PhaseMarks& phases) = 0;

  // Whether this rank evaluates (rank 0 speaks for the job; ZeRO-3: every rank, its forward is
  // collective), and the sums of the first `max_batches` batches of `batches` (0 = all of them),
  // the model in eval mode under NoGradGuard; `count_correct`: also the arg-max hits.
  virtual bool evaluates() const = 0;
  virtual EvalSums evaluate(data::BatchSource& batches, int64_t max_batches, bool count_correct) = 0;

  // Part 1 of the checkpoint of `step` under run_dir (Note [async checkpoints] in
  // train/checkpoint_writer.h; collective where the layout needs it: every rank calls it): what
  // this rank writes, copied to host memory (ops::host_copy; the caller waits for the copies),
  // and on rank 0 the checkpoint to publish, keeping the last `keep_last`.
  virtual CheckpointJob snapshot_checkpoint(const std::filesystem::path& run_dir, int64_t step, const RunState& state,
                                            int64_t keep_last) = 0;
  // The bytes of each device tensor snapshot_checkpoint copies to the host on this rank, in its
  // order, so that the trainer can reserve that pinned memory during the first steps instead of
  // at the first checkpoint (Note [reserving segments ahead] in core/block_pool.cpp). Called
  // after a step (the optimizer's state exists). Empty: nothing reserved (the first checkpoint
  // allocates it).
  virtual std::vector<size_t> checkpoint_host_bytes() const { return {}; }
  // Restores the optimizer (and loss-scaler) state of a checkpoint written by any layout. The
  // model's weights were loaded before the strategy was made (they are whole in every checkpoint).
  virtual void load_checkpoint(const io::CheckpointData& ck, const std::filesystem::path& ck_path) = 0;

  // Note [masters from the f32 initial weights]
  // A 16-bit run's parameters are rounded from f32 weights: the random initialisation's (made
  // in f32 on the CPU) or model.init_from's. AdamW keeps an f32 master of each 16-bit
  // parameter (Note [bf16 master weights], optim/adamw.h); made from the parameter at its
  // first update, it would start on the bf16 grid, and an update smaller than half the bf16
  // spacing of a weight (2^-9 of |w|: 4e-5 for a weight of 0.02, where the first warmup
  // steps' lr is 1e-6 to 1e-5) would round back to the same weight, step after step, until
  // the updates add up past it. From the f32 weights instead, each master sits somewhere in
  // its rounding interval and the same small update moves the share of weights it carries
  // across a rounding boundary: on average, the update. Measured (GPT-2 124M, init_from, lr
  // warmup 2.4e-6 per step): the loss after the first update was 10.886 on the grid against
  // 10.715 for PyTorch's f32 parameters under autocast; reproduced on the CPU and gone with
  // masters from f32 (benchmarks/results/convergence_NVIDIA_H200.md). On a fresh 16-bit run the
  // trainer keeps the f32 weights (local: after the tensor-parallel split) until the strategy
  // exists, then seeds the masters from them here: every layout, each rank its own pieces
  // (ZeRO), the CPU master itself when offloaded. f32 runs have no masters: nothing to do.
  // f32_of(name): the parameter's f32 values (its local shape), undefined when there are none.
  virtual void seed_master_weights(const std::function<Tensor(const std::string&)>& f32_of) = 0;

  // ---- CUDA graphs: the hooks of GraphedStep (Note [the step as a CUDA graph], train/graphed_step.h)
  // Why this layout's train_step cannot be captured ("" when it can).
  virtual std::string graph_blocker() const { return "this layout's step is not captured"; }
  // Around the capture of one train_step: the optimizer reads its lr and step counts from the
  // device from then on (end_graph_capture also queues this step's values there).
  virtual void begin_graph_capture() {}
  virtual void end_graph_capture() {}
  // Before a replay of the captured step: the host's bookkeeping of that step (its step counts),
  // and its lr queued to the device. After launching it: whatever watches the step's work.
  virtual void before_replay(double lr) { (void)lr; }
  virtual void after_replay_launched() {}
};

// The strategy of `layout` over `model` (on its device, in its dtype, weights final).
// Note [data-parallel runs]: a job of several ranks, or ZeRO on a world of one (so its sharded
// code paths run, and can be tested, on one process), trains through DataParallelStrategy on the
// mesh's data-parallel group of the world (MPI or NCCL); one process without ZeRO trains through
// the same executor over a self group (no MPI, no NCCL: parallel/self_group.h), and writes one
// process's checkpoint format. Every format reads back under any layout (Note [resharding]), so
// a run moves between them on --resume. `log` gets what rank 0 should say.
std::unique_ptr<Strategy> make_strategy(const RunConfig& cfg, const parallel::Layout& layout, const parallel::Mesh& mesh,
                                        Model& model, DType dtype, std::ostream& log);

// Whether `layout` trains through a process group (Note [data-parallel runs]): several ranks, or ZeRO.
bool needs_process_group(const parallel::Layout& layout);

// Shared pieces of the implementations.
namespace strategy_detail {
// One micro-batch's rows [row0, row0 + rows) of a global micro-batch, moved to `device` (through
// pinned memory on a GPU: a queued copy, no host wait).
data::Batch local_rows(const data::Batch& global, int64_t row0, int64_t rows, Device device);
// Host copies (ops::host_copy) of named tensors, their bytes added to `bytes`.
io::NamedTensors host_copies(const std::vector<std::pair<std::string, Tensor>>& tensors, uint64_t& bytes);
// A CheckpointJob's optimizer shard, its state host copies (bytes added to `bytes`).
CheckpointJob::Shard shard_job(std::string file, std::vector<parallel::ShardPiece> pieces,
                               const std::vector<std::map<std::string, Tensor>>& state, std::vector<int64_t> steps,
                               uint64_t& bytes);
// local_rows, then under context parallelism (cp_group set) this rank's part of every sequence
// (parallel/context_parallel.h).
data::Batch local_part(const data::Batch& global, int64_t row0, int64_t rows, const parallel::ProcessGroupPtr& cp_group,
                       Device device);
// Note [token-weighted loss]: a step's loss is the mean over every target that counts (!= -100) in
// its K global micro-batches, all data-parallel ranks' rows together, as one process computes it
// for the whole batch at once. Each micro-batch's loss is the mean over its own counted targets,
// and the loop divides it by K and the data-parallel average by dp: right when every micro-batch
// counts the same number of targets per row. Packed documents (data.packing = "documents") and
// masked prompts drop different numbers of targets from different rows, so there micro-batch k of
// a rank, counting n_k of the step's N targets, weighs its mean by w_k = n_k K dp / N before the
// 1/K: sum over ranks of (1/dp) sum over k of (w_k / K) mean_k = (sum of every token's loss) / N,
// the loss and the gradient of one process. (A mean of per-micro-batch means would weigh a token
// of a short micro-batch more than one of a long: the gradient-accumulation bias transformers
// fixed in 4.46.)
// Under context parallelism a rank's part is its chunks of those rows (Note [context-parallel
// sequence layout]), and dp is the data x context-parallel ranks the loss is averaged over.
// Returns the w_k of rows [row0, row0 + rows) of each micro-batch (context-parallel rank cp_rank of
// cp_size: its chunks of them) for `dp` ranks, or an empty vector when every target of the step
// counts (the loops then leave their arithmetic as it was).
std::vector<double> token_weights(const std::vector<data::Batch>& micro_batches, int64_t row0, int64_t rows,
                                  int64_t dp, int cp_rank = 0, int cp_size = 1);
// loss * w; a micro-batch with no target of its own (w = 0, its mean NaN) gives a 0 that still
// carries the graph (its backward writes zero gradients: every row of it is ignored).
Tensor weighted(const Tensor& loss, double w);
// Note [token weights on the device]: the step as a CUDA graph runs on its static batches, whose
// targets are on the GPU, and a replay cannot take numbers from the host. The same weights then
// come from device tensors: N, the counted targets of every global micro-batch (f64, once per
// step), and per micro-batch w_k = n_k K G / N from its local part's targets, in f64 (the host's
// double arithmetic, exact in the counts) and rounded to the loss's dtype as the host's double is;
// weighted() then multiplies where(loss == loss, loss, 0) by it, the same bits as the host path
// for any w (and a 0, not a NaN, for w = 0). When every target counts, w_k is exactly 1.
// `G`: the ranks the loss is averaged over (dp, or dp x cp).
Tensor counted_targets(const std::vector<data::Batch>& micro_batches);
Tensor device_token_weight(const Tensor& local_targets, const Tensor& counted, int64_t K, int64_t G, DType dtype);
Tensor weighted(const Tensor& loss, const Tensor& w);
// Whether a run's loss is weighted by counted targets (packed documents, chat masks).
bool weighs_tokens(const RunConfig& cfg);
// Strategy::evaluate on one model replica; under context parallelism every rank of cp_group
// calls it, each on its part of the sequences, and all get the sums of the whole.
EvalSums evaluate_model(const Model& model, data::BatchSource& batches, int64_t max_batches, bool count_correct,
                        const parallel::ProcessGroupPtr& cp_group = nullptr);
// The step's figures as one 1-D f32 tensor (train_step's return value).
Tensor step_figures(const Tensor& mean_loss, const Tensor& norm, const Tensor& bad, const Tensor& loss_scale);
// The data-parallel group of a layout on `mesh`: the mesh's dp x cp group (the gradients of a
// context-parallel run reduce over both), the world when they span it, or a group of one when
// tensor or pipeline parallelism spans the world (collective then). With dist.dp_reduce =
// "hierarchical", that group reducing within each node first (parallel/hierarchical_group.h;
// collective over the group).
parallel::ProcessGroupPtr data_parallel_group(const parallel::Mesh& mesh, const parallel::Layout& layout);
// World ranks per node: dist.node_size, or the launch's ranks per host (parallel::LaunchEnv).
int node_size(const parallel::Layout& layout);
// The end of a step on parallel::DataParallel, after backward and the loss's reductions: the global
// norm (f16: unscaled, the overflow agreed), clipping at grad_clip, the non-finite skip, the
// update, the figures (train_step's return value) and zero_grad.
Tensor finish_data_parallel_step(parallel::DataParallel& dp, optim::LossScaler* scaler, double grad_clip,
                                 const Tensor& mean_loss, PhaseMarks& phases);
}  // namespace strategy_detail

}  // namespace forge::train
