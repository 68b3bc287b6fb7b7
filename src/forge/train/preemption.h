#pragma once
// Stopping a run early without losing work: preemption signals and the wall-clock limit.
//
// Note [preemption]: while `forge train` runs, SIGTERM, SIGINT and run.preempt_signal (SIGUSR1
// by default: Slurm's `--signal=USR1@120`) only raise a flag (StopSignals). The training loop
// proposes, at every step, what this rank wants: go on, a checkpoint (checkpoint.interval_minutes
// has passed) or a stop (a signal, or run.time_limit about to run out); the ranks agree on the
// largest proposal with one all-reduce of one number (the world's process group; on a GPU it is
// read one step later, like the step's loss: Note [deferred step read]), so every rank acts on
// the same step. A stop finishes that step, writes its checkpoint on every rank, waits for the
// write, and ends with exit code kStoppedExitCode (75, EX_TEMPFAIL: "try again"); running the
// same command again continues from it (Note [one command starts or continues]).
//
// A second signal ends the process at once (exit 128 + signal): the checkpoint being written, if
// any, is abandoned, and the previous one stays the latest (checkpoints are published whole). A
// signal that arrives within kSameSignalWindow of the first counts as the same one: under Slurm a
// rank may get a signal both from Slurm and, forwarded, from `forge launch`.
#include <string>
#include <vector>

#include "forge/parallel/launch.h"
#include "forge/run/run_values.h"

namespace forge::train {

// The exit code of a run stopped by a signal or run.time_limit after writing its checkpoint.
using parallel::kStoppedExitCode;
inline constexpr double kSameSignalWindow = 1.0;  // seconds

// What the ranks agree on at a step (the largest proposal wins).
enum class StepVerdict { go_on = 0, checkpoint = 1, stop = 2 };

// parse_duration, parse_stop_signal and signal_name: run/run_values.h.

// Installs the stop handlers for SIGTERM, SIGINT and `extra` (0s are ignored) for its lifetime,
// and restores the previous handlers after. One at a time per process.
class StopSignals {
 public:
  explicit StopSignals(const std::vector<int>& extra);
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  // The first stop signal received since construction (0 = none).
  static int received();
  // Forget a received signal (tests).
  static void reset();

 private:
  std::vector<int> signals_;
};

}  // namespace forge::train
