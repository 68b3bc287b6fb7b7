#pragma once
// forge plan: the cost model of a training run. One PlanInput (model, tokens, batch,
// hardware, precision, optimizer, layout, expected MFU, prices) -> one PlanResult
// (parameters, FLOPs, memory per GPU, step time, time to train, GPU-hours, cost), or a
// search over every layout of a number of GPUs, ranked by time, with the reason each
// rejected layout fails. docs/plan.md explains every formula.
//
//   PlanInput in;
//   in.model = find_preset("llama2-7b").spec;
//   in.tokens = 2e12;
//   in.global_batch = 1024;
//   in.cluster = make_cluster(find_gpu("h100"), 64);
//   in.layout = {.dp = 64, .micro_batch = 2, .grad_accum = 8, .zero = 1};
//   PlanResult r = evaluate(in);   // throws forge::Error for bad input
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "forge/plan/cost.h"
#include "forge/plan/gpu_catalog.h"
#include "forge/plan/gpu_profile.h"
#include "forge/plan/memory_model.h"
#include "forge/plan/model_spec.h"
#include "forge/plan/time_model.h"

namespace forge::plan {

struct PlanInput {
  ModelSpec model;
  double tokens = 0;            // training tokens
  int64_t global_batch = 0;     // sequences of model.seq_len per optimizer step
  TrainingSetup setup;
  Cluster cluster;
  Layout layout;
  double mfu = 0.4;             // utilisation of the compute (model FLOPs / peak while computing)
  // Note [efficiency profiles]: when set, each kernel of the step is priced from the profile and
  // `mfu` is not used (forge plan's default on a GPU with a shipped profile; --mfu plans at an MFU).
  std::optional<GpuProfile> profile;
  CostInputs cost;
  // The config names its training data (forge plan --config with data.source = "files"): the
  // run command uses it; otherwise the command has CORPUS and TOKENIZER to fill in.
  bool data_given = false;
};

// A cluster of `gpus` GPUs of one kind with the catalogue's links: NVLink (or the vendor's
// equivalent) within a node where the GPU has an all-to-all one, else PCIe; 25 GB/s of
// network per GPU (one 200 Gb/s NIC per GPU) across nodes.
Cluster make_cluster(const GpuSpec& gpu, int64_t gpus, int64_t gpus_per_node = 8);

struct PlanResult {
  Layout layout;
  ParamCount params;
  FlopsPerToken flops;
  double total_flops = 0;       // tokens * model FLOPs per token
  MemoryBreakdown memory;
  TimeBreakdown time;
  CostBreakdown cost;
};

// The first thing wrong with layout `l` for `in` ("" when none): GPU count, divisibility
// (heads and kv-heads by tp, layers by pp, batch by micro-batch x dp), unsupported
// combinations. Each message names the values and the fix.
std::string layout_problem(const PlanInput& in, const Layout& l);
// Checks the input that does not depend on the layout (model, tokens, MFU, precision on this
// device) and then in.layout; throws forge::Error with the first problem.
void check_input(const PlanInput& in);
PlanResult evaluate(const PlanInput& in);                     // in.layout; checks first
PlanResult evaluate_layout(const PlanInput& in, const Layout& l);  // no checks

// --search: every layout of in.cluster.gpus GPUs. A dimension set in `fixed` is not varied.
struct SearchSpace {
  std::optional<int64_t> dp, tp, pp, micro_batch;
  std::optional<int> zero;
  std::optional<parallel::DpReduce> dp_reduce;  // unset: both tried where the data-parallel group spans nodes
  std::optional<bool> offload, sequence_parallel;
  std::optional<Checkpointing> checkpointing;
};
struct Rejected {
  Layout layout;
  std::string kind;    // "divisibility", "unsupported", "topology", "memory"
  std::string reason;
  double needs_bytes = 0;  // "memory": the total per GPU it would need
};
struct SearchResult {
  std::vector<PlanResult> fits;   // ranked by time to train (to 4 digits), then memory
  std::vector<Rejected> rejected;
  int64_t considered = 0;
};
SearchResult search(const PlanInput& in, const SearchSpace& fixed = {});

nlohmann::json layout_json(const Layout& l);
nlohmann::json plan_json(const PlanInput& in, const PlanResult& r);
nlohmann::json search_json(const PlanInput& in, const SearchResult& s);

}  // namespace forge::plan
