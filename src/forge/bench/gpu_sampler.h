#pragma once
// Device activity while training (telemetry of `forge train` on a GPU): NVML sampled off the
// training thread, summarised per logging interval.
//
//   bench::GpuSampler s("0000:3b:00.0", 0);   // the CUDA device's PCI bus id (NVML's order may differ)
//   ... train ...
//   bench::GpuActivity a = s.take();          // since the last take: mean utilisation, power, ...
//
// Note [idle share]: NVML's utilisation is the share of time any kernel ran (Note [utilisation
// is not saturation] in top.cpp). Its complement over a logging interval is the time the GPU had
// nothing to run: the host, the data loader or a synchronisation kept it waiting. The trainer
// warns when that share exceeds its threshold. How busy the SMs were while kernels ran is what
// GPM says (Hopper and later; GpmReader in nvml.h), read about once a second: the share of SMs
// busy, their warp occupancy, the tensor cores' and DRAM's activity, and PCIe and NVLink traffic.
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "forge/bench/nvml.h"

namespace forge::bench {

struct GpuActivity {
  int64_t samples = 0;                 // 0: nothing measured (then every figure below is -1)
  double utilization_pct = -1;         // mean of the samples
  double memory_utilization_pct = -1;  // memory controller, mean
  double power_w = -1;                 // mean
  int sm_clock_min_mhz = -1;           // lowest SM clock seen
  int temperature_max_c = -1;
  int64_t memory_used_max_bytes = -1;  // the device's, all processes
  uint64_t clock_event_reasons = 0;    // every reason seen (NVML bits; clock_event_reason_names)
  int64_t gpm_intervals = 0;           // GPM intervals ended since the last take (0: gpm is all -1)
  GpmFigures gpm;                      // each figure's mean over those intervals
};

// For the progress line: "GPU busy 97%, SM 81%, tensor 38%" (the GPM parts where measured);
// empty without samples.
std::string activity_text(const GpuActivity& a);
// For metrics.jsonl: gpu_util_pct, gpu_mem_util_pct, gpu_power_w, gpu_sm_clock_min_mhz,
// gpu_temp_max_c, gpu_mem_used_bytes, gpu_clock_events (when any but idle), and of GPM where
// measured gpu_sm_active_pct, gpu_sm_occupancy_pct, gpu_tensor_active_pct, gpu_dram_active_pct,
// gpu_pcie_tx_gbps, gpu_pcie_rx_gbps, gpu_nvlink_tx_gbps, gpu_nvlink_rx_gbps. Empty without samples.
nlohmann::json activity_record(const GpuActivity& a);

class GpuSampler {
 public:
  // Samples the device every period_s seconds on a thread of its own; without NVML or the
  // device, ok() is false and take() returns no samples.
  GpuSampler(const std::string& pci_bus_id, int index, double period_s = 0.1, double gpm_period_s = 1.0);
  ~GpuSampler();
  GpuSampler(const GpuSampler&) = delete;
  GpuSampler& operator=(const GpuSampler&) = delete;

  bool ok() const { return ok_; }
  // The summary of the samples since the last take (or the start), and a fresh start.
  GpuActivity take();

 private:
  struct Sums {
    int64_t n = 0;
    double util = 0, mem_util = 0, power = 0;
    int clock_min = -1, temp_max = -1;
    int64_t mem_max = -1;
    uint64_t reasons = 0;
    int64_t gpm_n = 0;
    double gpm_sum[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t gpm_count[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  };
  void loop(double period_s, double gpm_period_s);
  void add_gpm(const GpmFigures& f);
  std::unique_ptr<Nvml> nvml_;
  std::unique_ptr<GpmReader> gpm_;
  void* device_ = nullptr;
  bool ok_ = false;
  std::mutex mu_;
  Sums sums_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace forge::bench
