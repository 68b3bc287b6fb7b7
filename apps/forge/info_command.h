#pragma once
// `forge info`: the GPUs, driver, CUDA runtime, GPU links and host CPU of this machine
// (src/forge/bench/{gpu,host}_info.h; every field and its source in docs/bench.md).
// `forge info --env`: forge's environment switches instead (src/forge/core/env.h, every one
// declared there, with its value in this environment; docs/environment.md).
namespace CLI {
class App;
}

namespace forge::app {

// Adds the `info` subcommand (and its --json and --env flags) to `app`; returns it.
CLI::App* add_info_command(CLI::App& app);
// Runs `forge info` after parsing: a readable table, or one JSON object with --json; with
// --env the same for the environment switches (a malformed value is listed with its error).
int run_info();

}  // namespace forge::app
