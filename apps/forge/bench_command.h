#pragma once
// `forge bench <what>`: measurements of this machine (docs/bench.md). Today: `forge bench gemm`,
// the TFLOP/s of forge's matrix product (src/forge/bench/gemm.h).
namespace CLI {
class App;
}

namespace forge::app {

// Adds the `bench` subcommand and its subcommands (with their options) to `app`; returns it.
CLI::App* add_bench_command(CLI::App& app);
// Runs the parsed `forge bench <what>`: a readable table, or one JSON object with --json.
int run_bench(const CLI::App& bench);

}  // namespace forge::app
