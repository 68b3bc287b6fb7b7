#pragma once
// The model of a tensor-parallel run (dist.tp > 1; issue 16, docs/dist.md "Tensor parallelism"):
// the task's whole model, built from run.seed on the CPU like every other run's, replaced by the
// same model built through tp::layer_spec over the mesh's tensor-parallel group and loaded
// from it, so a tp run starts from the weights of one process exactly.
#include <filesystem>
#include <iosfwd>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "forge/io/checkpoint.h"
#include "forge/optim/loss_scale.h"
#include "forge/parallel/data_parallel.h"
#include "forge/parallel/layout.h"
#include "forge/parallel/mesh.h"
#include "forge/parallel/sharded_state.h"
#include "forge/run/config.h"
#include "forge/run/model.h"

namespace forge::train {

// Called by the loop for every run, before the model moves to its device: for pp > 1 it keeps
// this rank's pipeline stage (train/pipeline_model.h); for tp > 1 it splits `model` (a language
// model: run/language_model.h) over mesh.tp_group(), with sequence parallelism when the layout
// says so, and sets model.split; otherwise it leaves it alone.
void split_model_for_layout(const RunConfig& cfg, const parallel::Layout& layout, const parallel::Mesh& mesh, Model& model,
                            std::ostream& log);

// ---- checkpoints of a tensor-parallel run -----------------------------------------------------

// Note [tensor-parallel checkpoints]
// ----------------------------------
// A tensor-parallel run writes the checkpoint every other layout writes (Note [resharding] in
// parallel/sharded_state.h): model.safetensors with the whole model's tensors, and the optimizer
// state by ranges of the whole parameters, here one range per parameter in one file. The ranks
// of the first data-parallel replica gather each tensor over their tensor-parallel group
// (SplitModel::whole_of), the optimizer state first assembled over the data-parallel group
// when ZeRO shards it; rank 0 writes. So any layout resumes it (another tp, dp, ZeRO stage, one
// process), and `forge export` / `forge sample` read it as they read any checkpoint. On load,
// each rank cuts its shard of every whole range it owns (SplitModel::local_of). Memory: rank 0
// holds the whole model and its optimizer state on the CPU while it writes, as DDP's rank 0 does.

// The whole model's state (parameters and buffers) on the CPU. Collective over the
// tensor-parallel group; every rank of it gets the result.
std::vector<std::pair<std::string, Tensor>> gather_whole_model(const Model& model);

struct WholeOptimizerState {
  std::vector<parallel::ShardPiece> pieces;                 // one per parameter: [0, its whole numel)
  std::vector<std::map<std::string, Tensor>> state;     // 1-D, on the CPU
  std::vector<int64_t> steps;
};
// The optimizer state of `dp` over the whole model (over the stage's parameters under pipeline
// parallelism). Collective over dp's group and the tensor-parallel group; filled where `keep` is
// true (empty elsewhere).
WholeOptimizerState gather_whole_optimizer(const Model& model, const parallel::DataParallel& dp, bool keep);

// Restores `dp`'s pieces of a split model from the whole-parameter ranges of `rs`.
void load_split_optimizer(const Model& model, parallel::DataParallel& dp, const parallel::RangedState& rs);

// Strategy::load_checkpoint of the layouts on parallel::DataParallel (data, tensor and pipeline
// parallel): the optimizer state of any layout's checkpoint into `dp`'s pieces (cut from whole
// parameters for a split model), its step count, and the f16 loss scale.
void load_data_parallel_checkpoint(const RunConfig& cfg, const Model& model, parallel::DataParallel& dp,
                                   optim::LossScaler* scaler, const io::CheckpointData& ck,
                                   const std::filesystem::path& ck_path);

}  // namespace forge::train
