#pragma once
// What the two halves of fp8:: share (ops/fp8.cpp: the recipes, the CPU emulation and the public
// API; ops/fp8_device.cpp: the GPU path, Note [FP8 on the GPU]). Not part of the API.
#include <array>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "forge/ops/fp8.h"

namespace forge::fp8::detail {

// The process's FP8 state (ops/fp8.cpp).
extern std::vector<GuardEvent> g_events;                         // Note [FP8 guardrails]
extern ScalingOptions g_scaling;                                 // Note [FP8 delayed scaling]
extern AmaxHistories g_histories;
extern std::function<void(Tensor&)> g_amax_reduce_device;        // (under data parallelism)
extern std::map<std::string, std::array<double, 3>> g_amax_record;  // telemetry.fp8_amax
void record_amax(const std::string& layer, Operand op, float amax);

// The GPU path (ops/fp8_device.cpp).
Tensor linear_on_device(const Tensor& x, const Tensor& w, const Tensor& b, Recipe recipe, const std::string& layer);
void drain_device_records();  // the slots (and the queued copies) into g_events and the amax record
void read_queued_records(bool keep_newest);
void read_device_histories(AmaxHistories& out);
void reset_device_histories();

}  // namespace forge::fp8::detail
