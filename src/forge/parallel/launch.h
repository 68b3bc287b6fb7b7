#pragma once
// forge launch: starts the ranks of a job on this host and watches them (docs/dist.md,
// "Launching").
//
//   forge launch --nproc-per-node 8 -- forge train configs/gpt2-124m.toml
//
// Two ways to start the ranks (`spawn`):
//   direct  fork/exec N children with RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
//           FORGE_LAUNCHER=forge, FORGE_BIND, CUDA_DEVICE_ORDER=PCI_BUS_ID and, for GPU ranks,
//           FORGE_NCCL_ID (the NCCL unique id, made here). The default for GPU ranks.
//   mpirun  one child, `mpirun -np N ... COMMAND` (Open MPI, or MPICH's Hydra): the ranks read
//           the MPI variables and rank 0's NCCL id goes over MPI. The default for CPU ranks,
//           which communicate through MPI.
// Each child is in its own process group (same session). The launcher forwards SIGINT,
// SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 to every rank (a terminal's Ctrl-C reaches the launcher
// only, so each rank gets it once) and lets the ranks stop: forge train finishes its step and
// writes a checkpoint (Note [preemption] in train/preemption.h), for up to `stop_timeout`
// seconds; a second signal is forwarded too, and `grace_seconds` later the ranks get SIGKILL.
// Under mpirun, which kills its ranks on SIGTERM, the first stop goes to mpirun as SIGUSR2
// (forwarded to the ranks; FORGE_LAUNCH_STOP_SIGNAL=USR2 tells them it means stop), the second as
// SIGTERM (Note [stopping under mpirun]). The ranks get SIGTERM if the launcher dies.
// Children read /dev/null; their stdout and stderr lines come out prefixed "[rank N] " (under
// Open MPI too, through its --tag-output), a line every rank prints alike ("forge: error: ...")
// once as "[ranks 0-3] ...", and mpirun's own blocks only where they add something (Note [launch
// output], launch_output.h).
//
// When a rank exits non-zero or is killed by a signal, the launcher prints
//   forge launch: rank 1 (pid 4242) exited with code 3; stopping the other 3 ranks
// (under mpirun: "forge launch: rank 1 exited with code 3 first; mpirun stopped the job")
// sends SIGTERM to the others, SIGKILL after `grace_seconds`, and returns the rank's code
// (128 + signal for a signal). A rank that exits with kStoppedExitCode (75: stopped with its
// checkpoint, by a signal or run.time_limit) is not a failure: the others get `stop_timeout` to do
// the same, and the job returns 75. Otherwise a job stopped by a forwarded signal returns
// 128 + that signal; all ranks exiting 0 returns 0.
//
// In-job restarts (`max_restarts` > 0): when the job fails (a rank died, or a stuck collective
// ended it after FORGE_DIST_TIMEOUT) and the launcher was not signalled, every rank is stopped and
// the job started again, at most max_restarts times, with a fresh NCCL id and
// FORGE_RESTART_COUNT = 1, 2, ...: forge train continues from the latest valid checkpoint (Note
// [one command starts or continues]). A job that ends with 0 or 75 is not restarted.
//
// Bad input (nproc < 1, more GPU ranks than GPUs, an empty command, a command that is not an
// executable, no mpirun for CPU ranks) is a forge::Error with the fix, raised before anything
// starts.
#include <iosfwd>
#include <map>
#include <string>
#include <vector>

#include "forge/parallel/numa.h"

namespace forge::parallel {

// The exit code of a rank (and of the job) stopped early with its checkpoint written
// (forge train: a preemption signal or run.time_limit, Note [preemption]); running the same
// command again continues the run.
inline constexpr int kStoppedExitCode = 75;

enum class LaunchDevice { auto_, cpu, cuda };
enum class SpawnMode { auto_, direct, mpirun };
LaunchDevice parse_launch_device(const std::string& s);  // auto | cpu | cuda
SpawnMode parse_spawn_mode(const std::string& s);        // auto | direct | mpirun
const char* launch_device_name(LaunchDevice d);
const char* spawn_mode_name(SpawnMode s);

struct LaunchOptions {
  std::string nproc_per_node = "1";  // a count, or "gpu" (one rank per visible GPU)
  std::vector<std::string> command;  // the rank's command line; a first word `forge` is this forge
  LaunchDevice device = LaunchDevice::auto_;  // auto: cuda when a GPU is visible
  BindMode bind = BindMode::auto_;             // handed to the ranks as FORGE_BIND
  SpawnMode spawn = SpawnMode::auto_;          // auto: direct for GPU ranks, mpirun for CPU ranks (> 1)
  int master_port = 0;                         // reserved (multi-host rendezvous)
  double grace_seconds = 5;                    // between SIGTERM and SIGKILL when stopping ranks
  double stop_timeout = 900;                   // after a forwarded stop, before SIGKILL (a step and a checkpoint)
  int max_restarts = 0;                        // restarts of a failed job (0: none)
  int restart_count = 0;                       // which start this is (set by launch(); FORGE_RESTART_COUNT)
  bool prefix_output = true;                   // "[rank N] " before each line of a rank's output
  // Testing hooks. Rank output goes to `output` when set (else to the launcher's stdout and
  // stderr); `forge` as the first word becomes `forge_executable` ("" = /proc/self/exe);
  // `visible_gpus` >= 0 replaces the CUDA device count.
  std::ostream* output = nullptr;
  std::string forge_executable;
  int visible_gpus = -1;
};

// What launch() will start, resolved and checked (every bad-input error is raised here).
struct LaunchPlan {
  int nproc = 1;
  LaunchDevice device = LaunchDevice::cpu;  // cpu or cuda
  SpawnMode spawn = SpawnMode::direct;      // direct or mpirun
  std::string executable;                   // the absolute path run by each child
  std::vector<std::string> argv;            // its argv (for mpirun: mpirun's)
  std::map<std::string, std::string> env;   // set in every child (direct) / in mpirun's environment
  std::vector<std::string> unset_env;       // removed from every child's environment
  std::vector<std::map<std::string, std::string>> rank_env;  // per rank, direct spawn only
  std::string summary;                      // one line for the log
  bool mpirun_tags = false;                 // Open MPI's --tag-output: its lines name their rank
  bool tag_space = false;                   // Open MPI 5 (a space after the tag)
};

// Resolves `opt` into a plan. With make_nccl_id false (tests), GPU ranks get no FORGE_NCCL_ID.
LaunchPlan plan_launch(const LaunchOptions& opt, bool make_nccl_id = true);

// Starts the ranks of `opt`, watches them, and returns the job's exit status (above). `log`
// gets the launcher's own messages. Not reentrant: one launch per process at a time.
int launch(const LaunchOptions& opt, std::ostream& log);

// The path of an executable: a name with a '/' as is, else the first match on PATH. Throws
// forge::Error naming `what` when there is no such executable.
std::string find_executable(const std::string& name, const std::string& what);

}  // namespace forge::parallel
