#pragma once
// Optimizer state by parameter ranges: how a ZeRO (or DDP) run saves its optimizer so that a
// checkpoint can be resumed on another number of ranks or another ZeRO stage (resharded on
// load), or by a single process.
//
// A shard file (one per rank that holds state; DDP: rank 0 only) is a safetensors file:
//   tensors   "<state>|<param>|<lo>"   1-D, the elements [lo, lo + numel) of the row-major
//                                      flattening of <param>'s state <state> (exp_avg,
//                                      exp_avg_sq, master, momentum_buffer)
//   metadata  "step|<param>|<lo>"     the update count of that range (decimal)
// A single-process checkpoint's optimizer.safetensors ("state.<k>.<name>", slot k = the k-th
// parameter over the optimizer's groups) is read through add_full_state with the names of the
// slots. Whatever wrote the state, get(param, state, lo, hi) assembles any range from the
// pieces that cover it.
//
// Note [resharding]. A checkpoint's optimizer state is keyed by (parameter name, element range),
// never by rank or by optimizer slot, and the model's weights are always saved whole (ZeRO-3's
// blocks gathered for the save). So a run resumes under any layout: another world size, another
// ZeRO stage, DDP, or one process. Each rank asks this RangedState for exactly the ranges its
// new layout owns (DataParallel's pieces, or whole parameters for one process), which may span
// several saved pieces or cut one; a range the files cover only in part is an error naming the
// missing shard file. The update counts must agree across the pieces a range spans.
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "forge/core/tensor.h"
#include "forge/io/safetensors.h"
#include "forge/parallel/dp_state.h"

namespace forge::parallel {

// Writes one rank's shard file of the checkpoint of `checkpoint_step` (atomically; its metadata
// records that step as forge_step, Note [checkpoint integrity]). Throws, writing nothing, when a
// tensor holds a NaN or an infinity (io::check_finite).
void write_optimizer_shard(const std::filesystem::path& file, const std::vector<ShardPiece>& pieces,
                           const std::vector<std::map<std::string, Tensor>>& state, const std::vector<int64_t>& steps,
                           int64_t checkpoint_step);

class RangedState {
 public:
  // Adds every range of a shard file (tensors read to the CPU).
  void add_shard_file(const std::filesystem::path& file);
  // Adds a single-process optimizer state: tensors "state.<k>.<name>", scalars
  // "state.<k>.step"; slot_names[k] names the parameter of slot k.
  void add_full_state(const io::NamedTensors& tensors, const std::map<std::string, double>& scalars,
                      const std::vector<std::string>& slot_names);

  // Elements [lo, hi) of `param`'s state `name` (1-D, on the CPU, the saved dtype); undefined
  // when no range of that parameter has the state. Throws when the saved ranges cover
  // [lo, hi) only in part (a checkpoint with a missing shard file).
  Tensor get(const std::string& param, const std::string& name, int64_t lo, int64_t hi) const;
  // The update count of [lo, hi) of `param` (0 when it has no state). Throws if the ranges that
  // cover it disagree.
  int64_t step(const std::string& param, int64_t lo, int64_t hi) const;
  std::set<std::string> state_names() const;
  bool empty() const { return ranges_.empty(); }

 private:
  struct Range {
    int64_t lo = 0, hi = 0;
    int64_t step = 0;
    std::map<std::string, Tensor> state;
  };
  void add(const std::string& param, int64_t lo, int64_t hi, int64_t step, const std::string& name, const Tensor& t);
  std::map<std::string, std::vector<Range>> ranges_;  // by parameter
};

}  // namespace forge::parallel
