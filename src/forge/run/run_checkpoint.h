#pragma once
// What checkpoints of language-model runs share, whatever the layout that writes them
// (Note [data-parallel checkpoints] in train/data_parallel_strategy.cpp): finding a checkpoint,
// the optimizer a config makes, its state slots by parameter name, and the optimizer state of a
// checkpoint by parameter ranges (parallel/sharded_state.h), so that any layout resumes any other.
#include <filesystem>
#include <iosfwd>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "forge/io/checkpoint.h"
#include "forge/nn/module.h"
#include "forge/optim/loss_scale.h"
#include "forge/optim/optimizer.h"
#include "forge/parallel/sharded_state.h"
#include "forge/run/config.h"

namespace forge::train {

// A checkpoint directory (as named: loading it verifies it, and refuses a damaged one), or the
// latest valid checkpoint of a run directory (Note [checkpoint integrity]: each newer one that
// fails verification is skipped, with a warning on `warn`, std::cerr by default); `who` names
// the option in errors ("--resume", "sample: --checkpoint").
std::filesystem::path resolve_checkpoint(const std::filesystem::path& p, const char* who, std::ostream* warn = nullptr);

// A run directory that this start created is removed again when the start is refused before
// training begins (a GPU that is not there, --resume without a checkpoint, bad data), so a
// refused command leaves nothing behind. Only an empty directory goes (its own emptied lock file
// aside): whatever a failed start wrote there, and anything another process put in it, stays.
//   CreatedRunDir created(run_dir);                     // before the run lock (destroyed after it)
//   if (fs::create_directories(run_dir, ec)) created.created();
//   ... checks that may throw ...
//   created.keep();                                     // the run begins
class CreatedRunDir {
 public:
  explicit CreatedRunDir(std::filesystem::path dir) : dir_(std::move(dir)) {}
  CreatedRunDir(const CreatedRunDir&) = delete;
  CreatedRunDir& operator=(const CreatedRunDir&) = delete;
  ~CreatedRunDir();
  void created() { created_ = true; }
  void keep() { created_ = false; }

 private:
  std::filesystem::path dir_;
  bool created_ = false;
};

// Note [one command starts or continues]: how `forge train` begins in its run directory.
//   - run.overwrite = true: afresh; rank 0 (`owner`) removes what an earlier run of forge left
//     there (checkpoints/, metrics.jsonl, tb/); nothing else.
//   - --resume [PATH]: from PATH (resolve_checkpoint), or the run's latest valid checkpoint;
//     an error when there is none.
//   - otherwise: from the latest valid checkpoint when there is one (newer damaged ones are
//     skipped with a warning); afresh when there is none, after removing the metrics of an
//     earlier attempt that never wrote a checkpoint; an error, naming each failure and the fix,
//     when checkpoints exist but none is valid (never a silent restart from step 0).
// The same files give every rank the same answer.
struct RunStart {
  std::optional<std::filesystem::path> checkpoint;  // continue from it; none: start at step 0
  bool verified = false;                            // the checkpoint passed verify_checkpoint here already
  std::vector<std::string> notes;                   // lines for the log (skipped checkpoints, what was removed)
};
RunStart choose_run_start(const RunConfig& cfg, bool resume, const std::string& resume_from,
                          const std::filesystem::path& run_dir, bool owner);

// The optimizer optim.* describes, over `groups` (their hyper-parameters set).
std::unique_ptr<optim::Optimizer> make_optimizer_for(const RunConfig& cfg, std::vector<optim::ParamGroup> groups);
// The name optim.name's optimizer reports (Optimizer::name()), as checkpoints record it.
std::string optimizer_class_name(const RunConfig& cfg);
// The optimizer's slots in order (slot k of its state_dict is the k-th parameter over its
// groups), by name: optim::decay_groups' order.
std::vector<std::pair<std::string, Tensor>> optimizer_slots(const RunConfig& cfg, const nn::Module& model);

// extra.optimizer of a checkpoint ({"name", "scalars"}), checked to hold `want`'s state.
const nlohmann::json& checkpoint_optimizer_record(const io::CheckpointData& ck, const std::filesystem::path& ck_path,
                                                  const std::string& want);
// The optimizer state of a checkpoint by parameter ranges: the shard files of a data-parallel
// run (extra.dist.files), or a single process's optimizer.safetensors.
parallel::RangedState ranged_optimizer_state(const io::CheckpointData& ck, const std::filesystem::path& ck_path,
                                         const std::vector<std::pair<std::string, Tensor>>& slots);
// Restores a whole-model optimizer from any checkpoint (one process's, or reassembled from a
// data-parallel run's shards).
void restore_optimizer(optim::Optimizer& opt, const io::CheckpointData& ck, const std::filesystem::path& ck_path,
                       const std::vector<std::pair<std::string, Tensor>>& slots);

// Note [data-parallel checkpoints]: the staging directory next to checkpoint `dir` of `step` (a
// name prune_checkpoints treats as a temporary), created afresh when `create`; and a rank's
// optimizer shard file name in it ("optimizer.rank00003.safetensors").
std::filesystem::path checkpoint_staging(const std::filesystem::path& dir, int64_t step, bool create);
std::string optimizer_shard_name(int rank);

// f16: the loss scaler's state a checkpoint recorded (extra.loss_scaler), if any.
void restore_loss_scaler(optim::LossScaler& scaler, const io::CheckpointData& ck);

}  // namespace forge::train
