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
  sym(lib, memory_v2, "nvmlDeviceGetMemoryInfo_v2");
  sym(lib, power_limit, "nvmlDeviceGetEnforcedPowerLimit");
  sym(lib, clock_reasons, "nvmlDeviceGetCurrentClocksEventReasons");
  if (clock_reasons == nullptr) sym(lib, clock_reasons, "nvmlDeviceGetCurrentClocksThrottleReasons");  // older drivers
  sym(lib, compute_processes, "nvmlDeviceGetComputeRunningProcesses_v3");
  sym(lib, gpm_query_support, "nvmlGpmQueryDeviceSupport");
  sym(lib, gpm_sample_alloc, "nvmlGpmSampleAlloc");
  sym(lib, gpm_sample_free, "nvmlGpmSampleFree");
  sym(lib, gpm_sample_get, "nvmlGpmSampleGet");
  sym(lib, gpm_metrics_get, "nvmlGpmMetricsGet");
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

bool Nvml::memory_used(nvmlDevice_t h, unsigned long long* used, unsigned long long* total) const {
  if (lib_ == nullptr || h == nullptr) return false;
  NvmlMemoryV2 m2;
  if (memory_v2 != nullptr && memory_v2(h, &m2) == kNvmlSuccess) {
    *used = m2.used;
    *total = m2.total;
    return true;
  }
  NvmlMemory m;
  if (memory == nullptr || memory(h, &m) != kNvmlSuccess) return false;
  *used = m.used;
  *total = m.total;
  return true;
}

GpmReader::GpmReader(const Nvml& nvml, nvmlDevice_t device) : nvml_(nvml), device_(device) {
  if (!nvml.ok() || device == nullptr || !nvml.gpm_query_support || !nvml.gpm_sample_alloc || !nvml.gpm_sample_free ||
      !nvml.gpm_sample_get || !nvml.gpm_metrics_get)
    return;
  NvmlGpmSupport support;
  if (nvml.gpm_query_support(device, &support) != kNvmlSuccess || !support.is_supported_device) return;
  if (nvml.gpm_sample_alloc(&samples_[0]) != kNvmlSuccess) return;
  if (nvml.gpm_sample_alloc(&samples_[1]) != kNvmlSuccess) return;
  ok_ = true;
}

GpmReader::~GpmReader() {
  for (nvmlGpmSample_t s : samples_)
    if (s != nullptr) nvml_.gpm_sample_free(s);
}

std::optional<GpmFigures> GpmReader::next() {
  if (!ok_) return std::nullopt;
  nvmlGpmSample_t now = samples_[taken_ % 2], before = samples_[(taken_ + 1) % 2];
  if (nvml_.gpm_sample_get(device_, now) != kNvmlSuccess) return std::nullopt;
  if (++taken_ < 2) return std::nullopt;
  NvmlGpmMetricsGet get;
  get.sample1 = before;
  get.sample2 = now;
  const unsigned ids[] = {kGpmSmActive, kGpmSmOccupancy, kGpmTensorActive, kGpmDramActive,
                          kGpmPcieTx,   kGpmPcieRx,      kGpmNvlinkTx,     kGpmNvlinkRx};
  for (unsigned id : ids) get.metrics[get.num_metrics++].metric_id = id;
  if (nvml_.gpm_metrics_get(&get) != kNvmlSuccess) return std::nullopt;
  GpmFigures f;
  constexpr double kMiBToGB = 1048576.0 / 1e9;
  for (unsigned i = 0; i < get.num_metrics; ++i) {
    const NvmlGpmMetric& m = get.metrics[i];
    if (m.nvml_return != kNvmlSuccess) continue;
    switch (m.metric_id) {
      case kGpmSmActive: f.sm_active_pct = m.value; break;
      case kGpmSmOccupancy: f.sm_occupancy_pct = m.value; break;
      case kGpmTensorActive: f.tensor_active_pct = m.value; break;
      case kGpmDramActive: f.dram_active_pct = m.value; break;
      case kGpmPcieTx: f.pcie_tx_gbps = m.value * kMiBToGB; break;
      case kGpmPcieRx: f.pcie_rx_gbps = m.value * kMiBToGB; break;
      case kGpmNvlinkTx: f.nvlink_tx_gbps = m.value * kMiBToGB; break;
      case kGpmNvlinkRx: f.nvlink_rx_gbps = m.value * kMiBToGB; break;
      default: break;
    }
  }
  return f;
}

}  // namespace forge::bench
