#pragma once
// The readable side of `forge plan`: text tables for a plan, a layout search, a per-module
// model summary, and the GPU and model catalogues. (The JSON side is plan.h's *_json.)
#include <cstddef>
#include <string>

#include "forge/plan/plan.h"

namespace forge::plan {

std::string format_plan(const PlanInput& in, const PlanResult& r);
// The `top` fastest layouts that fit, then the rejected ones grouped by reason (every one
// with `all_rejected`, else a count and the first few of each kind).
std::string format_search(const PlanInput& in, const SearchResult& s, size_t top, bool all_rejected);
std::string format_summary(const ModelSpec& m, const Summary& s);
std::string format_gpu_catalog();
std::string format_presets();

}  // namespace forge::plan
