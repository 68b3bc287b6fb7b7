#pragma once
// The command that runs a planned layout with `forge train` (issue 17: `forge plan --search`
// prints it for its best layout).
#include <string>

#include "forge/plan/plan.h"

namespace forge::plan {

struct TrainCommand {
  std::string command;      // the launcher and `forge train` with the layout's keys
  std::string unsupported;  // why forge train cannot run this layout yet ("" when it can)
  std::string fill_in;      // what the user replaces in it, in words ("" when nothing)
};

// One host (gpus <= gpus_per_node): `forge launch --nproc-per-node N -- forge train ...`; several:
// `srun -N nodes --ntasks-per-node G forge train ...` (forge train reads Slurm's variables). The
// model is the config's (in.model.name ending in .toml) or given by its [model] keys; the layout
// by train.batch_size (the global batch), train.grad_accum, train.seq_len and the [dist] keys;
// train.steps covers the planned tokens. Without in.data_given the data keys are placeholders,
// CORPUS and TOKENIZER, named in fill_in.
TrainCommand train_command(const PlanInput& in, const Layout& l);

}  // namespace forge::plan
