// forge top (contracts in top.h).
//
// Note [utilisation is not saturation]: NVML's (and nvidia-smi's) "GPU utilisation" is the share
// of the sample period in which at least one kernel was running on the device. One small kernel
// on one SM counts as 100%; a data loader that starves the GPU between steps shows as the gaps.
// How busy the SMs and tensor cores were is another measurement: Hopper's GPM metrics (SM
// activity: the time-averaged share of SMs with work; tensor-core activity), which forge top shows
// beside it where the GPU has them.
#include "forge/bench/top.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>

#include "forge/bench/nvml.h"
#include "forge/telemetry/metrics.h"

namespace forge::bench {

std::vector<std::string> clock_event_reason_names(uint64_t bits) {
  static const std::pair<uint64_t, const char*> names[] = {
      {0x1, "idle"},          {0x2, "application clocks"}, {0x4, "power cap"},
      {0x8, "HW slowdown"},   {0x10, "sync boost"},        {0x20, "SW thermal slowdown"},
      {0x40, "HW thermal slowdown"}, {0x80, "HW power brake"}, {0x100, "display clocks"}};
  std::vector<std::string> out;
  for (const auto& [bit, name] : names)
    if (bits & bit) out.emplace_back(name);
  return out;
}

namespace {

std::string command_of(unsigned pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/comm");
  std::string c;
  if (!std::getline(in, c) || c.empty()) return "?";
  return c;
}

}  // namespace

TopSnapshot top_snapshot(double gpm_window_s) {
  TopSnapshot s;
  const Nvml nv;
  if (!nv.ok()) {
    s.note = nv.note();
    return s;
  }
  char buf[96] = {0};
  if (nv.driver_version && nv.driver_version(buf, sizeof(buf)) == kNvmlSuccess) s.driver = buf;
  unsigned n = 0;
  if (!nv.device_count || nv.device_count(&n) != kNvmlSuccess || n == 0) {
    s.note = "NVML sees no GPU";
    return s;
  }
  // GPM first: one sample of every device, the window, then the rest of the snapshot with the
  // second sample.
  std::vector<std::unique_ptr<GpmReader>> gpm(n);
  bool any_gpm = false;
  for (unsigned i = 0; i < n && gpm_window_s > 0; ++i) {
    if (nvmlDevice_t h = nv.device("", static_cast<int>(i))) {
      gpm[i] = std::make_unique<GpmReader>(nv, h);
      if (gpm[i]->ok()) {
        gpm[i]->next();
        any_gpm = true;
      }
    }
  }
  if (any_gpm) std::this_thread::sleep_for(std::chrono::duration<double>(gpm_window_s));
  for (unsigned i = 0; i < n; ++i) {
    nvmlDevice_t h = nv.device("", static_cast<int>(i));
    if (!h) continue;
    GpuState g;
    g.index = static_cast<int>(i);
    char name[96] = {0};
    if (nv.name && nv.name(h, name, sizeof(name)) == kNvmlSuccess) g.name = name;
    NvmlUtilization u;
    if (nv.utilization && nv.utilization(h, &u) == kNvmlSuccess) {
      g.utilization_pct = static_cast<int>(u.gpu);
      g.memory_utilization_pct = static_cast<int>(u.memory);
    }
    unsigned long long used = 0, total = 0;
    if (nv.memory_used(h, &used, &total)) {
      g.memory_used_bytes = static_cast<int64_t>(used);
      g.memory_total_bytes = static_cast<int64_t>(total);
    }
    if (gpm[i] && gpm[i]->ok())
      if (const auto f = gpm[i]->next()) g.gpm = *f;
    const NvmlSample smp = nv.sample(h);
    g.power_w = smp.power_w;
    g.sm_clock_mhz = smp.sm_clock_mhz;
    g.temperature_c = smp.temperature_c;
    unsigned limit = 0;
    if (nv.power_limit && nv.power_limit(h, &limit) == kNvmlSuccess) g.power_limit_w = limit / 1000.0;
    unsigned long long reasons = 0;
    if (nv.clock_reasons && nv.clock_reasons(h, &reasons) == kNvmlSuccess) {
      g.clock_event_reasons = reasons;
      g.reasons = clock_event_reason_names(reasons);
    }
    if (nv.compute_processes) {
      // Room for twice the entries NVML may write: should a driver's nvmlProcessInfo_t be larger
      // than the layout declared here, its writes still stay inside the buffer.
      std::vector<NvmlProcessInfo> procs(128);
      unsigned count = 64;
      if (nv.compute_processes(h, &count, procs.data()) == kNvmlSuccess) {
        for (unsigned k = 0; k < count && k < 64; ++k) {
          GpuProcess p;
          p.pid = procs[k].pid;
          p.command = command_of(p.pid);
          // NVML_VALUE_NOT_AVAILABLE (all ones) when the driver cannot attribute memory.
          if (procs[k].used_gpu_memory != ~0ULL) p.gpu_memory_bytes = static_cast<int64_t>(procs[k].used_gpu_memory);
          g.processes.push_back(p);
        }
      }
    }
    s.gpus.push_back(std::move(g));
  }
  return s;
}

std::string top_table(const TopSnapshot& s) {
  std::ostringstream o;
  o << "forge top: " << s.gpus.size() << " GPU(s)" << (s.driver.empty() ? "" : ", driver " + s.driver)
    << "  (util = share of time any kernel ran, not SM saturation)\n";
  char line[256];
  std::snprintf(line, sizeof(line), "%-3s %-24s %5s %5s %5s %5s %19s %15s %7s %5s  %s\n", "gpu", "name", "util", "SM",
                "TC", "mem%", "memory", "power", "sm MHz", "temp", "clock events");
  o << line;
  auto pct = [](int v) { return v < 0 ? std::string("-") : std::to_string(v) + "%"; };
  auto pctf = [](double v) { return v < 0 ? std::string("-") : std::to_string(static_cast<int>(v + 0.5)) + "%"; };
  for (const auto& g : s.gpus) {
    const std::string mem = g.memory_total_bytes < 0 ? "-"
                                                     : telemetry::format_bytes(static_cast<double>(g.memory_used_bytes)) + " / " +
                                                           telemetry::format_bytes(static_cast<double>(g.memory_total_bytes));
    char power[48];
    if (g.power_w < 0) std::snprintf(power, sizeof(power), "-");
    else std::snprintf(power, sizeof(power), "%.0f / %.0f W", g.power_w, g.power_limit_w);
    std::string reasons;
    for (const auto& r : g.reasons) reasons += (reasons.empty() ? "" : ", ") + r;
    std::snprintf(line, sizeof(line), "%-3d %-24.24s %5s %5s %5s %5s %19s %15s %7s %5s  %s\n", g.index, g.name.c_str(),
                  pct(g.utilization_pct).c_str(), pctf(g.gpm.sm_active_pct).c_str(), pctf(g.gpm.tensor_active_pct).c_str(),
                  pct(g.memory_utilization_pct).c_str(), mem.c_str(), power,
                  g.sm_clock_mhz < 0 ? "-" : std::to_string(g.sm_clock_mhz).c_str(),
                  g.temperature_c < 0 ? "-" : (std::to_string(g.temperature_c) + "C").c_str(),
                  reasons.empty() ? "-" : reasons.c_str());
    o << line;
  }
  for (const auto& g : s.gpus)
    if (g.gpm.nvlink_tx_gbps >= 0 || g.gpm.pcie_tx_gbps >= 0) {
      std::snprintf(line, sizeof(line), "gpu %d: SM occupancy %s, DRAM %s, PCIe tx/rx %.1f / %.1f GB/s, NVLink tx/rx %.1f / %.1f GB/s\n",
                    g.index, pctf(g.gpm.sm_occupancy_pct).c_str(), pctf(g.gpm.dram_active_pct).c_str(),
                    std::max(0.0, g.gpm.pcie_tx_gbps), std::max(0.0, g.gpm.pcie_rx_gbps),
                    std::max(0.0, g.gpm.nvlink_tx_gbps), std::max(0.0, g.gpm.nvlink_rx_gbps));
      o << line;
    }
  o << "(util: nvidia-smi's; SM, TC: the share of SMs busy and of tensor-core activity, GPM)\n";
  bool any = false;
  for (const auto& g : s.gpus)
    for (const auto& p : g.processes) {
      if (!any) o << "\nprocesses:\n", any = true;
      std::snprintf(line, sizeof(line), "  gpu %-2d pid %-8u %-20.20s %s\n", g.index, p.pid, p.command.c_str(),
                    p.gpu_memory_bytes < 0 ? "-" : telemetry::format_bytes(static_cast<double>(p.gpu_memory_bytes)).c_str());
      o << line;
    }
  if (!any) o << "\nno compute processes\n";
  return o.str();
}

nlohmann::json top_json(const TopSnapshot& s) {
  nlohmann::json j = {{"driver", s.driver}, {"gpus", nlohmann::json::array()}};
  for (const auto& g : s.gpus) {
    nlohmann::json procs = nlohmann::json::array();
    for (const auto& p : g.processes)
      procs.push_back({{"pid", p.pid}, {"command", p.command}, {"gpu_memory_bytes", p.gpu_memory_bytes}});
    j["gpus"].push_back({{"index", g.index}, {"name", g.name}, {"utilization_pct", g.utilization_pct},
                         {"memory_utilization_pct", g.memory_utilization_pct}, {"memory_used_bytes", g.memory_used_bytes},
                         {"memory_total_bytes", g.memory_total_bytes}, {"power_w", g.power_w},
                         {"power_limit_w", g.power_limit_w}, {"sm_clock_mhz", g.sm_clock_mhz},
                         {"temperature_c", g.temperature_c}, {"clock_event_reasons", g.clock_event_reasons},
                         {"clock_event_reason_names", g.reasons}, {"processes", procs},
                         {"sm_active_pct", g.gpm.sm_active_pct}, {"sm_occupancy_pct", g.gpm.sm_occupancy_pct},
                         {"tensor_active_pct", g.gpm.tensor_active_pct}, {"dram_active_pct", g.gpm.dram_active_pct},
                         {"pcie_tx_gbps", g.gpm.pcie_tx_gbps}, {"pcie_rx_gbps", g.gpm.pcie_rx_gbps},
                         {"nvlink_tx_gbps", g.gpm.nvlink_tx_gbps}, {"nvlink_rx_gbps", g.gpm.nvlink_rx_gbps}});
  }
  return j;
}

}  // namespace forge::bench
