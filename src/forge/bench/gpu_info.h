#pragma once
// The GPUs of this machine for `forge info` (docs/bench.md): what the CUDA runtime reports,
// the theoretical memory bandwidth, the catalogue's dense peaks (plan/gpu_catalog.h) and, where
// NVML can be loaded at run time (libnvidia-ml.so.1, dlopen), how the GPUs are linked.
//
//   auto s = forge::bench::gpu_info();   // s.gpus.empty() && s.note == "no CUDA device" on a CPU box
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace forge::bench {

struct GpuInfo {
  int index = 0;                    // CUDA device index
  std::string name;                 // as the driver reports it
  int cc_major = 0, cc_minor = 0;   // compute capability
  int sm_count = 0;
  int clock_mhz = 0;                // peak SM clock
  int memory_clock_mhz = 0;         // peak memory clock
  int memory_bus_bits = 0;
  int64_t memory_bytes = 0;
  int l2_bytes = 0;
  std::string pci_bus_id;
  double bandwidth_gbs = 0;         // theoretical_bandwidth_gbs(memory clock, bus width)
  // The catalogue entry (telemetry::catalogue_name) and its dense peaks in TFLOP/s; "" / 0
  // when the GPU is not in the catalogue (or has no such mode).
  std::string catalogue;
  double fp32_tflops = 0, tf32_tflops = 0, bf16_tflops = 0, fp16_tflops = 0, fp8_tflops = 0;
  double catalogue_bw_gbs = 0;
  std::string source;
  // NVML (-1: not known).
  int nvlinks_active = -1;          // links 0..17 whose nvmlDeviceGetNvLinkState is enabled
  int nvlink_version = -1;          // of the first active link
  int pcie_gen = -1, pcie_width = -1;          // current (drops at idle)
  int pcie_max_gen = -1, pcie_max_width = -1;  // what the link can do
};

struct GpuSystemInfo {
  std::vector<GpuInfo> gpus;
  int driver_version = 0;           // cudaDriverGetVersion (12040 = CUDA 12.4); 0 without a driver
  int runtime_version = 0;          // cudaRuntimeGetVersion; 0 without CUDA support
  std::string cudnn;                // cudnnGetVersion of the library loaded, "9.14.0"; empty without CUDA
  bool cuda_build = false;          // forge built with FORGE_CUDA
  std::string note;                 // "no CUDA device" when gpus is empty
  bool nvml = false;                // NVML loaded and initialised
  std::string nvml_note;            // "NVML not available" / the failing call
  std::string nvml_driver_version;  // nvmlSystemGetDriverVersion, "550.54.15"
  // topology[i][j]: the PCIe path between GPUs i and j (nvmlDeviceGetTopologyCommonAncestor):
  // "X" (itself), "PIX", "PXB", "PHB", "NODE", "SYS" as in nvidia-smi topo -m; "NV" when both
  // have active NVLinks (per-GPU link counts in GpuInfo). Empty without NVML.
  std::vector<std::vector<std::string>> topology;
};

// Theoretical DRAM bandwidth in GB/s (1e9 bytes/s): 2 transfers per clock (DDR) x memory clock
// x bus width / 8. The driver reports HBM clocks so that this gives the datasheet figure:
// H100 SXM 2619 MHz x 5120 bits -> 3352 GB/s; A100 SXM 40GB 1215 MHz x 5120 bits -> 1555 GB/s.
double theoretical_bandwidth_gbs(int memory_clock_khz, int memory_bus_bits);

// "12.4" from 12040; "-" for 0.
std::string cuda_version_string(int v);

GpuSystemInfo gpu_info();

nlohmann::json to_json(const GpuSystemInfo& g);

}  // namespace forge::bench
