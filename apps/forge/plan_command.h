#pragma once
// `forge plan`: the cost model of a training run (src/forge/plan, docs/plan.md).
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace forge::app {

// Adds the `plan` subcommand and its options to `app`; returns it.
CLI::App* add_plan_command(CLI::App& app);
// Runs `forge plan` after parsing. `overrides` ("--section.key=value") apply to --config.
int run_plan(const std::vector<std::string>& overrides);

}  // namespace forge::app
