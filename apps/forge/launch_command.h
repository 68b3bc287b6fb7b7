#pragma once
// `forge launch`: starts the ranks of a job on this host (src/forge/parallel/launch.h,
// docs/dist.md "Launching").
namespace CLI {
class App;
}

namespace forge::app {

// Adds the `launch` subcommand and its options to `app`; returns it. Everything after the
// options (or after `--`) is the ranks' command line.
CLI::App* add_launch_command(CLI::App& app);
// Runs `forge launch` after parsing; returns the job's exit status.
int run_launch(CLI::App& launch);

}  // namespace forge::app
