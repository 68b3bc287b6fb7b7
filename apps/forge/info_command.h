#pragma once
// `forge info`: the GPUs, driver, CUDA runtime, GPU links and host CPU of this machine
// (src/forge/bench/{gpu,host}_info.h; every field and its source in docs/bench.md).
namespace CLI {
class App;
}

namespace forge::app {

// Adds the `info` subcommand (and its --json flag) to `app`; returns it.
CLI::App* add_info_command(CLI::App& app);
// Runs `forge info` after parsing: a readable table, or one JSON object with --json.
int run_info();

}  // namespace forge::app
