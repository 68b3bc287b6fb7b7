#pragma once
// What forge train leaves behind when a device runs out of memory (issue 19; Note [memory owners]
// in core/memory_owner.h): <run dir>/oom_snapshot.rank<r>.json, the allocator at the failure
// (live bytes by owner, its pools, how fragmented) beside forge plan's prediction for the run's
// config and layout on that device.
//
//   try { ... } catch (const OutOfMemoryError& e) {
//     const std::string path = train::write_oom_report(e, cfg);   // "" if it could not be written
//   }
#include <string>

#include <nlohmann/json.hpp>

#include "forge/core/device.h"
#include "forge/core/memory_owner.h"
#include "forge/parallel/layout.h"
#include "forge/plan/plan.h"
#include "forge/run/config.h"

namespace forge::train {

// forge plan's input for a run: its config's model, precision, optimizer, batch and layout, on
// `device` (the catalogue's entry for a GPU's name, forge's CPU model for the CPU) with
// world_size GPUs; what `forge plan --config <run>/config.toml --gpu <that GPU> --gpus <world>`
// plans. Throws forge::Error when the GPU is not in the catalogue.
plan::PlanInput plan_input_of_run(const RunConfig& cfg, const parallel::Layout& layout, Device device, int world_size);

// The snapshot as JSON (error, request, owner, allocator, live bytes by owner; "plan": the
// prediction's memory per GPU, or "plan_error" saying why there is none).
nlohmann::json oom_report(const OutOfMemoryError& e, const RunConfig& cfg);

// Writes oom_report to the run directory (atomically); returns its path, or "" when it could not.
std::string write_oom_report(const OutOfMemoryError& e, const RunConfig& cfg);

}  // namespace forge::train
