#pragma once
// `forge top`: a live per-GPU and per-process view of what the GPUs are doing, from NVML (loaded
// at run time, bench/nvml.h), beside any training job, forge's or not.
//
//   forge top                 # refreshes every --interval seconds (default 1) until Ctrl-C
//   forge top --once          # one table
//   forge top --once --json   # one JSON object
//
// Per GPU: name, utilisation as nvidia-smi shows it (the share of the last sample period in which
// any kernel ran: NOT how busy the SMs were, Note [utilisation is not saturation] in top.cpp),
// beside what says how busy they were where the GPU has GPM (Hopper and later, over a short
// window): SM activity and occupancy, tensor-core and DRAM activity, PCIe and NVLink traffic;
// memory-controller utilisation, memory used / total (as nvidia-smi counts it), power / limit,
// SM clock, temperature, and the clock-event (throttle) reasons in words. Per process on a GPU: pid, its command (from
// /proc), GPU memory. Without NVML or a GPU: a message saying so on stderr and exit status 3
// (kNoGpuStatus), distinct from a usage error (2) or a failure (1).
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "forge/bench/nvml.h"

namespace forge::bench {

inline constexpr int kNoGpuStatus = 3;

struct GpuProcess {
  unsigned pid = 0;
  std::string command;            // /proc/<pid>/comm ("?" when not readable: another container)
  int64_t gpu_memory_bytes = -1;  // -1: NVML could not tell
};

struct GpuState {
  int index = 0;
  std::string name;
  int utilization_pct = -1, memory_utilization_pct = -1;  // -1: unknown
  int64_t memory_used_bytes = -1, memory_total_bytes = -1;
  double power_w = -1, power_limit_w = -1;
  int sm_clock_mhz = -1, temperature_c = -1;
  uint64_t clock_event_reasons = 0;
  std::vector<std::string> reasons;  // clock_event_reasons in words ("power cap", "HW thermal slowdown", ...)
  GpmFigures gpm;                    // over the snapshot's GPM window (-1: no GPM)
  std::vector<GpuProcess> processes;
};

// The clock-event (throttle) reason bits of NVML in words; "idle" alone is left out of alarms.
std::vector<std::string> clock_event_reason_names(uint64_t bits);

struct TopSnapshot {
  std::string driver;
  std::vector<GpuState> gpus;
  std::string note;  // why there is nothing (no NVML, no GPU)
};

// One sample of every GPU NVML sees (empty gpus + note when none); the GPM figures over the
// gpm_window_s seconds the call waits between its two GPM samples (0: none read).
TopSnapshot top_snapshot(double gpm_window_s = 0.5);
// The table `forge top` prints, and its JSON.
std::string top_table(const TopSnapshot& s);
nlohmann::json top_json(const TopSnapshot& s);

}  // namespace forge::bench
