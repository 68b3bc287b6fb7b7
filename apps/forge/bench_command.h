#pragma once
// `forge bench <what>`: measurements of this machine (docs/bench.md): gemm (TFLOP/s of forge's
// matrix product), memory (bandwidth), layer (a GPT block by part), roofline (all of them against
// the measured ceilings, with an SVG plot) and burn (sustained GEMM load with result checking);
// the measurements are in src/forge/bench/.
namespace CLI {
class App;
}

namespace forge::app {

// Adds the `bench` subcommand and its subcommands (with their options) to `app`; returns it.
CLI::App* add_bench_command(CLI::App& app);
// Runs the parsed `forge bench <what>`: a readable table, or one JSON object with --json.
int run_bench(const CLI::App& bench);

}  // namespace forge::app
