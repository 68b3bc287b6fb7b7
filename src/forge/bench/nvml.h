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
#include <string>

namespace forge::bench {

using nvmlReturn_t = int;
using nvmlDevice_t = struct nvmlDevice_st*;
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
struct NvmlProcessInfo {  // nvmlProcessInfo_t (the _v2/_v3 calls)
  unsigned pid = 0;
  unsigned long long used_gpu_memory = 0;
  unsigned gpu_instance_id = 0, compute_instance_id = 0;
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
  nvmlReturn_t (*power_limit)(nvmlDevice_t, unsigned*) = nullptr;          // nvmlDeviceGetEnforcedPowerLimit, mW
  nvmlReturn_t (*clock_reasons)(nvmlDevice_t, unsigned long long*) = nullptr;  // nvmlDeviceGetCurrentClocksEventReasons
  nvmlReturn_t (*compute_processes)(nvmlDevice_t, unsigned*, NvmlProcessInfo*) = nullptr;  // ..._v3

 private:
  void* lib_ = nullptr;
  nvmlReturn_t (*shutdown_)() = nullptr;
  std::string note_;
};

}  // namespace forge::bench
