#pragma once
// Training checkpoints: everything `--resume` needs to continue a run exactly.
//
// A checkpoint is a directory, written with replace_directory_atomic (io/atomic_file.h), so a
// crash leaves either the previous checkpoint or the new one, complete:
//
//   <dir>/model.safetensors      named parameters (metadata: format=pt, forge_step=<step>)
//   <dir>/optimizer.safetensors  named optimizer state tensors (moments, master weights, ...)
//                                (metadata: forge_step=<step>)
//   <dir>/state.json             {"format": "forge-checkpoint", "format_version": 2,
//                                 "forge_version": "0.1.0", "step": 123,
//                                 "rng": {"default": {"seed": S, "offset": O},
//                                         "generators": {"<name>": {"seed": S, "offset": O}}},
//                                 "data_loader": <any JSON>, "config": <JSON or a string>,
//                                 "extra": <any JSON>}
//   <dir>/manifest.json          written last: {"format": "forge-checkpoint-manifest",
//                                 "format_version": 1, "step": 123, "files": {"<name>":
//                                 {"bytes": N, "hash": "xxh3:<16 hex>"}, ...}} - every other
//                                 file of the directory (io/checksum.h)
//   Seeds and offsets are unsigned 64-bit JSON integers. A reader refuses a format_version
//   newer than its own kCheckpointFormatVersion.
//
// Note [checkpoint integrity]: a checkpoint is loaded only after verify_checkpoint has found
// every file the manifest lists with its size and checksum, and the same step in the manifest,
// state.json, the directory's name (step_N) and the forge_step metadata of every safetensors
// file in it. A flipped byte, a truncated or deleted file, or an edited step is an error that
// names the file. Checkpoints of format_version 1 (before manifests) load unverified, and say so
// (CheckpointData::verified). Non-finite tensors are never written (check_finite, called by
// save_checkpoint on every tensor it writes): a run whose state became NaN stops with its last
// good checkpoint the latest.
//
// Runs keep their checkpoints as <run_dir>/checkpoints/step_<step, 8+ digits>/ (checkpoint_path).
// find_latest_checkpoint() takes the highest step among directories named exactly
// step_<digits> that hold all three files, so the temporaries of an interrupted save
// (step_….tmp.<pid>.<hex>, step_….old.<pid>.<hex>) are never picked.
#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "forge/core/device.h"
#include "forge/core/generator.h"
#include "forge/core/shape.h"
#include "forge/io/safetensors.h"

namespace forge::io {

inline constexpr int kCheckpointFormatVersion = 2;

// A Generator's position: its seed and its offset into the Philox stream (core/generator.h).
struct GeneratorState {
  uint64_t seed = 0;
  uint64_t offset = 0;
  friend bool operator==(const GeneratorState&, const GeneratorState&) = default;
};

GeneratorState generator_state(const Generator& gen);
void set_generator_state(Generator& gen, const GeneratorState& state);

struct CheckpointData {
  int64_t step = 0;
  NamedTensors model;      // -> model.safetensors
  NamedTensors optimizer;  // -> optimizer.safetensors
  GeneratorState rng;      // forge::default_generator()
  std::map<std::string, GeneratorState> generators;  // other named generators (dropout, shuffling, ...)
  nlohmann::json data_loader;  // the data loader's position; any JSON
  nlohmann::json config;       // the run config: a JSON object, or its text as a string
  nlohmann::json extra;        // anything else to restore (optimizer scalars, loss scale, ...)
  // save_checkpoint only: files (on the same file system) moved into the directory before it
  // is published, so they appear atomically with the rest (the shard files of other ranks).
  std::vector<std::filesystem::path> move_in;
  // Set by load_checkpoint from state.json; save_checkpoint writes the running forge's.
  std::string forge_version;
  int format_version = kCheckpointFormatVersion;
  // Set by load_checkpoint: the manifest was checked (false only for format_version 1).
  bool verified = false;
};

// Fills data.rng from forge::default_generator() and data.generators from `named`.
void capture_rng(CheckpointData& data, const std::map<std::string, Generator*>& named = {});
// Restores forge::default_generator() and each generator of `named` (each must be in the
// checkpoint), so the next random numbers are the ones the saved run would have drawn.
void restore_rng(const CheckpointData& data, const std::map<std::string, Generator*>& named = {});

// Writes (or atomically replaces) checkpoint directory `dir`, its manifest last. Throws a
// forge::Error, writing nothing, when a floating-point tensor holds a NaN or an infinity.
void save_checkpoint(const std::filesystem::path& dir, const CheckpointData& data);
// Reads checkpoint directory `dir` after verify_checkpoint (`verify` = false: the caller has just
// verified it, e.g. through find_latest_valid_checkpoint); tensors are placed on `device`.
// Throws a forge::Error naming the file and the field for a missing file, bad JSON, a missing or
// mistyped field, a format_version newer than this forge's, or a failed verification.
CheckpointData load_checkpoint(const std::filesystem::path& dir, Device device = Device::cpu(), bool verify = true);

// Note [checkpoint integrity]: checks the manifest of checkpoint `dir` against its files (sizes,
// checksums) and the step everywhere it is recorded; throws a forge::Error naming the file and
// what differs. Returns false, without checking, for a format_version 1 checkpoint (no manifest).
bool verify_checkpoint(const std::filesystem::path& dir);

// Throws a forge::Error ("<what>: tensor 'x' [4, 6] holds NaN (first at element 12)<why>") for
// the first floating-point tensor of `tensors` with a NaN or an infinity. CPU tensors are read in
// place; others are copied to the host first.
void check_finite(const std::vector<std::pair<std::string, Tensor>>& tensors, const std::string& what,
                  const std::string& why = ": the training state is not finite, so it is not saved");

// <run_dir>/checkpoints/step_<step, zero-padded to 8 digits>.
std::filesystem::path checkpoint_path(const std::filesystem::path& run_dir, int64_t step);
// The complete checkpoints of a run, by increasing step.
std::vector<std::pair<int64_t, std::filesystem::path>> list_checkpoints(const std::filesystem::path& run_dir);
// The highest-step complete checkpoint of a run, if any (not verified).
std::optional<std::filesystem::path> find_latest_checkpoint(const std::filesystem::path& run_dir);
// The highest-step checkpoint of a run that verify_checkpoint accepts, among all its step_N
// directories (complete or not). Each newer one that fails is skipped with its error in
// `skipped` (for the caller's warnings).
struct ValidCheckpoint {
  std::optional<std::filesystem::path> dir;
  std::vector<std::string> skipped;  // one message per checkpoint that failed, newest first
};
ValidCheckpoint find_latest_valid_checkpoint(const std::filesystem::path& run_dir);
// Removes all but the newest `keep_last` complete checkpoints, and the temporaries of
// interrupted saves in <run_dir>/checkpoints. Only while no save is in progress.
void prune_checkpoints(const std::filesystem::path& run_dir, size_t keep_last);

// Names and shapes in order, e.g. of a model's parameters.
using NamedShapes = std::vector<std::pair<std::string, Shape>>;
NamedShapes named_shapes(const NamedTensors& tensors);

// Throws a forge::Error ("checkpoint from another model shape: ...") naming the first tensor
// of `expected` that is missing from `loaded`, has another shape there (with both shapes) or is
// not floating point there (issue 43: integer weights), or else the first tensor of `loaded` that
// `expected` lacks. `source` names the loaded side
// in the message (e.g. the checkpoint's path).
void check_compatible(const NamedShapes& expected, const NamedTensors& loaded,
                      const std::string& source = "the checkpoint");

}  // namespace forge::io
