// NVML at run time (contract in nvml.h).
#include "forge/bench/nvml.h"

#include <dlfcn.h>

namespace forge::bench {

namespace {
template <class F>
void sym(void* lib, F& f, const char* name) {
  f = reinterpret_cast<F>(::dlsym(lib, name));
}
}  // namespace

Nvml::Nvml() {
  void* lib = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    note_ = "NVML not available (libnvidia-ml.so.1 not found)";
    return;
  }
  nvmlReturn_t (*init)() = nullptr;
  sym(lib, init, "nvmlInit_v2");
  sym(lib, shutdown_, "nvmlShutdown");
  if (init == nullptr || shutdown_ == nullptr) {
    note_ = "NVML not available (no nvmlInit_v2)";
    ::dlclose(lib);
    return;
  }
  const nvmlReturn_t r = init();
  if (r != kNvmlSuccess) {
    note_ = "NVML not available (nvmlInit_v2 returned " + std::to_string(r) + ")";
    ::dlclose(lib);
    return;
  }
  lib_ = lib;
  sym(lib, driver_version, "nvmlSystemGetDriverVersion");
  sym(lib, by_index, "nvmlDeviceGetHandleByIndex_v2");
  sym(lib, by_bus_id, "nvmlDeviceGetHandleByPciBusId_v2");
  sym(lib, nvlink_state, "nvmlDeviceGetNvLinkState");
  sym(lib, nvlink_version, "nvmlDeviceGetNvLinkVersion");
  sym(lib, pcie_gen, "nvmlDeviceGetCurrPcieLinkGeneration");
  sym(lib, pcie_width, "nvmlDeviceGetCurrPcieLinkWidth");
  sym(lib, pcie_max_gen, "nvmlDeviceGetMaxPcieLinkGeneration");
  sym(lib, pcie_max_width, "nvmlDeviceGetMaxPcieLinkWidth");
  sym(lib, common_ancestor, "nvmlDeviceGetTopologyCommonAncestor");
  sym(lib, p2p_status, "nvmlDeviceGetP2PStatus");
  sym(lib, clock_info, "nvmlDeviceGetClockInfo");
  sym(lib, temperature, "nvmlDeviceGetTemperature");
  sym(lib, power_usage, "nvmlDeviceGetPowerUsage");
  sym(lib, device_count, "nvmlDeviceGetCount_v2");
  sym(lib, name, "nvmlDeviceGetName");
  sym(lib, utilization, "nvmlDeviceGetUtilizationRates");
  sym(lib, memory, "nvmlDeviceGetMemoryInfo");
  sym(lib, power_limit, "nvmlDeviceGetEnforcedPowerLimit");
  sym(lib, clock_reasons, "nvmlDeviceGetCurrentClocksEventReasons");
  if (clock_reasons == nullptr) sym(lib, clock_reasons, "nvmlDeviceGetCurrentClocksThrottleReasons");  // older drivers
  sym(lib, compute_processes, "nvmlDeviceGetComputeRunningProcesses_v3");
}

Nvml::~Nvml() {
  if (lib_ != nullptr) {
    shutdown_();
    ::dlclose(lib_);
  }
}

nvmlDevice_t Nvml::device(const std::string& pci_bus_id, int index) const {
  if (lib_ == nullptr) return nullptr;
  nvmlDevice_t h = nullptr;
  if (by_bus_id != nullptr && !pci_bus_id.empty() && by_bus_id(pci_bus_id.c_str(), &h) == kNvmlSuccess) return h;
  h = nullptr;
  if (by_index != nullptr && index >= 0 && by_index(static_cast<unsigned>(index), &h) == kNvmlSuccess) return h;
  return nullptr;
}

NvmlSample Nvml::sample(nvmlDevice_t h) const {
  NvmlSample s;
  if (lib_ == nullptr || h == nullptr) return s;
  unsigned v = 0;
  if (clock_info != nullptr && clock_info(h, kNvmlClockSm, &v) == kNvmlSuccess) s.sm_clock_mhz = static_cast<int>(v);
  if (temperature != nullptr && temperature(h, kNvmlTemperatureGpu, &v) == kNvmlSuccess) s.temperature_c = static_cast<int>(v);
  if (power_usage != nullptr && power_usage(h, &v) == kNvmlSuccess) s.power_w = static_cast<double>(v) / 1000.0;
  return s;
}

}  // namespace forge::bench
