// forge launch: the command line of parallel::launch (src/forge/parallel/launch.h).
#include "launch_command.h"

#include <CLI/CLI.hpp>
#include <iostream>
#include <string>
#include <vector>

#include "forge/parallel/launch.h"

namespace forge::app {

namespace {

struct LaunchArgs {
  std::string nproc = "1";
  std::string device = "auto";
  std::string bind = "auto";
  std::string spawn = "auto";
  double grace_seconds = 5;
  double stop_timeout = 900;
  int max_restarts = 0;
  int master_port = 0;
  bool no_prefix = false;
};

LaunchArgs g_args;
std::vector<std::string> g_command;

constexpr const char* kFooter =
    "Examples:\n"
    "  forge launch --nproc-per-node gpu -- forge train configs/gpt2-124m.toml   one rank per GPU\n"
    "  forge launch --nproc-per-node 4 --device cpu forge train configs/tiny.toml --run.device=cpu\n"
    "                                                 four CPU ranks, started through mpirun\n"
    "Each rank gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE (and FORGE_NCCL_ID for GPU ranks).\n"
    "If a rank fails, the others are stopped and its exit code is returned (with --max-restarts N the job is\n"
    "restarted from its latest checkpoint). SIGTERM, SIGINT, SIGHUP, SIGUSR1/2 are forwarded: forge train\n"
    "checkpoints and exits 75. docs/dist.md, \"Launching\"; docs/train.md, \"Long runs\".";

}  // namespace

CLI::App* add_launch_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("launch", "start the ranks of a distributed job on this host");
  cmd->add_option("--nproc-per-node", g_args.nproc, "ranks to start: a number, or gpu (one per visible GPU)")
      ->capture_default_str();
  cmd->add_option("--device", g_args.device, "auto (cuda when a GPU is visible), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--bind", g_args.bind, "NUMA binding of the ranks: auto (on with 2+ NUMA nodes), numa or none")
      ->check(CLI::IsMember({"auto", "numa", "none"}))
      ->capture_default_str();
  cmd->add_option("--spawn", g_args.spawn,
                  "how ranks start: direct (fork/exec, the default for GPU ranks), mpirun (the default for CPU ranks) "
                  "or auto")
      ->check(CLI::IsMember({"auto", "direct", "mpirun"}))
      ->capture_default_str();
  cmd->add_option("--grace-seconds", g_args.grace_seconds, "seconds between SIGTERM and SIGKILL when stopping ranks")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--stop-timeout", g_args.stop_timeout,
                  "seconds the ranks get, after a forwarded stop signal (or a rank that stopped with its checkpoint), "
                  "to finish their step and write the checkpoint before SIGKILL")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--max-restarts", g_args.max_restarts,
                  "when the job fails (a rank dies, or a collective times out), restart every rank up to this many "
                  "times; forge train continues from the latest valid checkpoint")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--master-port", g_args.master_port, "reserved for multi-host rendezvous (unused)");
  cmd->add_flag("--no-prefix", g_args.no_prefix, "do not prefix the ranks' output lines with [rank N]");
  // The first word that is not one of the options above starts the command, which keeps
  // everything after it (its own options included); `--` may separate the two.
  cmd->add_option("command", g_command, "the ranks' command line, e.g. forge train configs/gpt2-124m.toml");
  cmd->prefix_command();
  cmd->positionals_at_end();
  cmd->footer(kFooter);
  return cmd;
}

int run_launch(CLI::App& launch) {
  parallel::LaunchOptions opt;
  opt.nproc_per_node = g_args.nproc;
  opt.device = parallel::parse_launch_device(g_args.device);
  opt.bind = parallel::parse_bind_mode(g_args.bind);
  opt.spawn = parallel::parse_spawn_mode(g_args.spawn);
  opt.grace_seconds = g_args.grace_seconds;
  opt.stop_timeout = g_args.stop_timeout;
  opt.max_restarts = g_args.max_restarts;
  opt.master_port = g_args.master_port;
  opt.prefix_output = !g_args.no_prefix;
  opt.command = g_command;
  for (const auto& a : launch.remaining())  // CLI11 leaves the `--` separator there
    if (a != "--") opt.command.push_back(a);
  return parallel::launch(opt, std::cerr);
}

}  // namespace forge::app
