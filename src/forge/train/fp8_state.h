#pragma once
// forge train's side of FP8 (ops/fp8.h, docs/fp8.md): the recipe and scaling set from the config,
// the delayed-scaling histories in and out of checkpoints, the data-parallel amax reduction, the
// guardrail events in the log and the amax record in the metrics.
#include <filesystem>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <string>

#include "forge/io/checkpoint.h"
#include "forge/ops/fp8.h"
#include "forge/parallel/layout.h"
#include "forge/parallel/process_group.h"
#include "forge/run/config.h"

namespace forge::train {

// Note [FP8 delayed scaling] (ops/fp8.h): the amax histories in a checkpoint's extra state under
// this key, as {layer: {"activation": [...], "weight": [...], "gradient": [...]}} (oldest first).
inline constexpr const char* kFp8HistoriesKey = "fp8_amax_histories";

// Sets the process's recipe (run.fp8) and scaling (run.fp8_scaling, run.fp8_amax_history), and
// with delayed scaling restores the histories of `ck` (at `ck_path`; logged when it has none).
// Throws for delayed scaling under tp, pp or cp > 1, and on a GPU (`device`) for delayed scaling
// and tp > 1 (Note [FP8 on the GPU]). Sets the GEMM choice (run.fp8_select). Returns whether
// scaling is delayed.
bool configure_fp8(const RunConfig& cfg, const parallel::Layout& layout, Device device, const io::CheckpointData* ck,
                   const std::filesystem::path& ck_path, std::ostream& log);
// Delayed scaling under data parallelism: each training cast's amax maxed over `group` before it
// joins the history (fp8::set_amax_reduce; the hook holds the group weakly). Null or a group of
// one: none.
void set_fp8_amax_group(const parallel::ProcessGroupPtr& group);
// The histories as the checkpoint holds them, and back. A checkpoint is read as untrusted input:
// anything but that shape of finite non-negative numbers is an error naming `where`; a history
// longer than `keep` keeps its last `keep` entries.
nlohmann::json fp8_histories_json();
fp8::AmaxHistories fp8_histories_from(const nlohmann::json& j, int64_t keep, const std::string& where);
// telemetry.fp8_amax: {layer: {operand: amax}} since the last call (fp8::take_amax_record).
nlohmann::json fp8_amax_record_json();
// Note [FP8 GEMM choice] (ops/fp8.h): the linear shapes chosen since the last call, with the times
// measured (after the first step; nothing when no new shape was met).
void report_fp8_gemm_choices(std::ostream& log);
// Note [FP8 guardrails] (ops/fp8.h): the non-finite amaxes of the steps' casts, by layer and operand
// (the first 20 events of the run in full, then a count), each with its step. On a GPU a step's
// events come one step late (Note [FP8 guardrails one step late]): after each step the trainer
// queues its records and reports the earlier steps'; `all` reads everything (before an evaluation,
// a checkpoint or the end). `step`: the step an event recorded at once (the CPU) belongs to.
void report_fp8_guard_events(int64_t step, std::ostream& log, bool all = false);

}  // namespace forge::train
