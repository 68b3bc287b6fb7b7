#pragma once
// NVML loaded at run time (dlopen("libnvidia-ml.so.1")) for `forge info` and `forge bench burn`
// (docs/bench.md). forge declares the few functions it calls itself, from NVML's documented C API:
// the GPU machines have the driver's libnvidia-ml.so.1 but no nvml.h. Every function returns
// nvmlReturn_t (0 = NVML_SUCCESS); devices are opaque handles. A symbol the library lacks stays
// nullptr: check before calling.
//
//   bench::Nvml nv;                                   // loads and initialises; never throws
//   if (nv.ok()) {
//     nvmlDevice_t h = nv.device("0000:3b:00.0", 0);  // by PCI bus id, else by index
//     bench::NvmlSample s = nv.sample(h);            // SM clock, temperature, power (-1: unknown)
//   }
#include <optional>
#include <string>

namespace forge::bench {

using nvmlReturn_t = int;
using nvmlDevice_t = struct nvmlDevice_st*;
using nvmlGpmSample_t = struct nvmlGpmSample_st*;
inline constexpr nvmlReturn_t kNvmlSuccess = 0;
inline constexpr int kNvmlFeatureEnabled = 1;     // nvmlEnableState_t NVML_FEATURE_ENABLED
inline constexpr int kNvmlP2pCapsNvlink = 2;      // nvmlGpuP2PCapsIndex_t NVML_P2P_CAPS_INDEX_NVLINK
inline constexpr int kNvmlP2pStatusOk = 0;        // nvmlGpuP2PStatus_t NVML_P2P_STATUS_OK
inline constexpr unsigned kNvmlMaxLinks = 18;     // NVML_NVLINK_MAX_LINKS
inline constexpr int kNvmlClockSm = 1;            // nvmlClockType_t NVML_CLOCK_SM
inline constexpr int kNvmlTemperatureGpu = 0;     // nvmlTemperatureSensors_t NVML_TEMPERATURE_GPU

// NVML's structs of the calls below (their documented layouts).
struct NvmlUtilization {
  unsigned gpu = 0, memory = 0;  // percent of the last sample period a kernel ran / memory was read or written
};
struct NvmlMemory {
  unsigned long long total = 0, free = 0, used = 0;  // bytes
};
// nvmlMemory_v2_t: `used` without the driver's reservation, which is what nvidia-smi shows (the v1
// call's `used` includes it: about 0.6 GB on an idle H200).
struct NvmlMemoryV2 {
  unsigned version = 40u | (2u << 24);  // NVML_STRUCT_VERSION(Memory, 2): sizeof | version << 24
  unsigned long long total = 0, reserved = 0, free = 0, used = 0;
};
static_assert(sizeof(NvmlMemoryV2) == 40);
struct NvmlProcessInfo {  // nvmlProcessInfo_t (the _v2/_v3 calls)
  unsigned pid = 0;
  unsigned long long used_gpu_memory = 0;
  unsigned gpu_instance_id = 0, compute_instance_id = 0;
};

// GPU Performance Monitoring (Hopper and later): nvmlGpmSupport_t, nvmlGpmMetric_t and
// nvmlGpmMetricsGet_t (version 1, metrics[NVML_GPM_METRIC_MAX = 98] as first published; the
// library reads and writes only numMetrics entries).
struct NvmlGpmSupport {
  unsigned version = 1, is_supported_device = 0;
};
struct NvmlGpmMetric {
  unsigned metric_id = 0;
  nvmlReturn_t nvml_return = 0;
  double value = 0;
  const char *short_name = nullptr, *long_name = nullptr, *unit = nullptr;
};
struct NvmlGpmMetricsGet {
  unsigned version = 1, num_metrics = 0;
  nvmlGpmSample_t sample1 = nullptr, sample2 = nullptr;
  NvmlGpmMetric metrics[98];
};
// nvmlGpmMetricId_t values forge reads.
inline constexpr unsigned kGpmSmActive = 2;       // NVML_GPM_METRIC_SM_UTIL: % of SMs busy, time-averaged
inline constexpr unsigned kGpmSmOccupancy = 3;    // NVML_GPM_METRIC_SM_OCCUPANCY: % of the resident-warp limit
inline constexpr unsigned kGpmTensorActive = 5;   // NVML_GPM_METRIC_ANY_TENSOR_UTIL: % of time tensor pipes ran
inline constexpr unsigned kGpmDramActive = 10;    // NVML_GPM_METRIC_DRAM_BW_UTIL: % of peak DRAM bandwidth
inline constexpr unsigned kGpmPcieTx = 20;        // NVML_GPM_METRIC_PCIE_TX_PER_SEC, MiB/s
inline constexpr unsigned kGpmPcieRx = 21;        // NVML_GPM_METRIC_PCIE_RX_PER_SEC, MiB/s
inline constexpr unsigned kGpmNvlinkRx = 60;      // NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC, MiB/s
inline constexpr unsigned kGpmNvlinkTx = 61;      // NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC, MiB/s

// What the SMs did between two GPM samples (-1: not measured). Note [utilisation is not
// saturation] in top.cpp: these, not nvidia-smi's utilisation, say how busy the GPU was.
struct GpmFigures {
  double sm_active_pct = -1, sm_occupancy_pct = -1, tensor_active_pct = -1, dram_active_pct = -1;
  double pcie_tx_gbps = -1, pcie_rx_gbps = -1, nvlink_tx_gbps = -1, nvlink_rx_gbps = -1;  // GB/s (1e9 bytes)
};

// What `forge bench burn` reads each row (-1: NVML could not tell).
struct NvmlSample {
  int sm_clock_mhz = -1;   // nvmlDeviceGetClockInfo(NVML_CLOCK_SM): the current SM clock
  int temperature_c = -1;  // nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)
  double power_w = -1;     // nvmlDeviceGetPowerUsage (milliwatts) / 1000
};

class Nvml {
 public:
  Nvml();   // dlopen + nvmlInit_v2; ok() says whether it worked, note() why not
  ~Nvml();  // nvmlShutdown + dlclose
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  bool ok() const { return lib_ != nullptr; }
  const std::string& note() const { return note_; }
  // The NVML handle of a CUDA device: by PCI bus id (CUDA's order, and CUDA_VISIBLE_DEVICES, need
  // not match NVML's), else by `index`; nullptr when neither works.
  nvmlDevice_t device(const std::string& pci_bus_id, int index) const;
  NvmlSample sample(nvmlDevice_t h) const;
  // Used and total bytes as nvidia-smi shows them (the v2 call where the driver has it); false
  // when NVML cannot tell.
  bool memory_used(nvmlDevice_t h, unsigned long long* used, unsigned long long* total) const;

  // The functions (nullptr where the library lacks one).
  nvmlReturn_t (*driver_version)(char*, unsigned) = nullptr;
  nvmlReturn_t (*by_index)(unsigned, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*by_bus_id)(const char*, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*nvlink_state)(nvmlDevice_t, unsigned, int*) = nullptr;
  nvmlReturn_t (*nvlink_version)(nvmlDevice_t, unsigned, unsigned*) = nullptr;
  nvmlReturn_t (*pcie_gen)(nvmlDevice_t, unsigned*) = nullptr;
  nvmlReturn_t (*pcie_width)(nvmlDevice_t, unsigned*) = nullptr;
  nvmlReturn_t (*pcie_max_gen)(nvmlDevice_t, unsigned*) = nullptr;
  nvmlReturn_t (*pcie_max_width)(nvmlDevice_t, unsigned*) = nullptr;
  nvmlReturn_t (*common_ancestor)(nvmlDevice_t, nvmlDevice_t, int*) = nullptr;
  nvmlReturn_t (*p2p_status)(nvmlDevice_t, nvmlDevice_t, int, int*) = nullptr;
  nvmlReturn_t (*clock_info)(nvmlDevice_t, int, unsigned*) = nullptr;
  nvmlReturn_t (*temperature)(nvmlDevice_t, int, unsigned*) = nullptr;
  nvmlReturn_t (*power_usage)(nvmlDevice_t, unsigned*) = nullptr;
  nvmlReturn_t (*device_count)(unsigned*) = nullptr;
  nvmlReturn_t (*name)(nvmlDevice_t, char*, unsigned) = nullptr;
  nvmlReturn_t (*utilization)(nvmlDevice_t, NvmlUtilization*) = nullptr;
  nvmlReturn_t (*memory)(nvmlDevice_t, NvmlMemory*) = nullptr;
  nvmlReturn_t (*memory_v2)(nvmlDevice_t, NvmlMemoryV2*) = nullptr;  // nvmlDeviceGetMemoryInfo_v2
  nvmlReturn_t (*power_limit)(nvmlDevice_t, unsigned*) = nullptr;          // nvmlDeviceGetEnforcedPowerLimit, mW
  nvmlReturn_t (*clock_reasons)(nvmlDevice_t, unsigned long long*) = nullptr;  // nvmlDeviceGetCurrentClocksEventReasons
  nvmlReturn_t (*compute_processes)(nvmlDevice_t, unsigned*, NvmlProcessInfo*) = nullptr;  // ..._v3
  nvmlReturn_t (*gpm_query_support)(nvmlDevice_t, NvmlGpmSupport*) = nullptr;
  nvmlReturn_t (*gpm_sample_alloc)(nvmlGpmSample_t*) = nullptr;
  nvmlReturn_t (*gpm_sample_free)(nvmlGpmSample_t) = nullptr;
  nvmlReturn_t (*gpm_sample_get)(nvmlDevice_t, nvmlGpmSample_t) = nullptr;
  nvmlReturn_t (*gpm_metrics_get)(NvmlGpmMetricsGet*) = nullptr;

 private:
  void* lib_ = nullptr;
  nvmlReturn_t (*shutdown_)() = nullptr;
  std::string note_;
};

// A device's GPM counters over successive intervals: each next() samples them and returns the
// figures since the previous next() (nothing the first time). ok() is false where the driver or
// the GPU has no GPM (before Hopper; some virtualised GPUs), and next() then returns nothing.
class GpmReader {
 public:
  GpmReader(const Nvml& nvml, nvmlDevice_t device);
  ~GpmReader();
  GpmReader(const GpmReader&) = delete;
  GpmReader& operator=(const GpmReader&) = delete;
  bool ok() const { return ok_; }
  std::optional<GpmFigures> next();

 private:
  const Nvml& nvml_;
  nvmlDevice_t device_;
  nvmlGpmSample_t samples_[2] = {nullptr, nullptr};
  int taken_ = 0;  // samples taken so far (the latest is samples_[(taken_ - 1) % 2])
  bool ok_ = false;
};

}  // namespace forge::bench
