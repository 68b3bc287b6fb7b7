// Device activity while training (contracts and Note [idle share] in gpu_sampler.h).
#include "forge/bench/gpu_sampler.h"

#include <algorithm>
#include <chrono>

#include "forge/bench/nvml.h"

namespace forge::bench {

GpuSampler::GpuSampler(const std::string& pci_bus_id, int index, double period_s) : nvml_(std::make_unique<Nvml>()) {
  if (!nvml_->ok()) return;
  device_ = nvml_->device(pci_bus_id, index);
  ok_ = device_ != nullptr && nvml_->utilization != nullptr;
  if (ok_) thread_ = std::thread([this, period_s] { loop(period_s); });
}

GpuSampler::~GpuSampler() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void GpuSampler::loop(double period_s) {
  const auto h = static_cast<nvmlDevice_t>(device_);
  const auto period = std::chrono::duration<double>(period_s);
  while (!stop_) {
    NvmlUtilization u;
    const bool have_util = nvml_->utilization(h, &u) == kNvmlSuccess;
    NvmlMemory m;
    const bool have_mem = nvml_->memory && nvml_->memory(h, &m) == kNvmlSuccess;
    const NvmlSample s = nvml_->sample(h);
    unsigned long long reasons = 0;
    if (nvml_->clock_reasons) nvml_->clock_reasons(h, &reasons);
    if (have_util) {
      std::lock_guard<std::mutex> lock(mu_);
      ++sums_.n;
      sums_.util += u.gpu;
      sums_.mem_util += u.memory;
      sums_.power += std::max(0.0, s.power_w);
      if (s.sm_clock_mhz >= 0) sums_.clock_min = sums_.clock_min < 0 ? s.sm_clock_mhz : std::min(sums_.clock_min, s.sm_clock_mhz);
      sums_.temp_max = std::max(sums_.temp_max, s.temperature_c);
      if (have_mem) sums_.mem_max = std::max(sums_.mem_max, static_cast<int64_t>(m.used));
      sums_.reasons |= reasons;
    }
    std::this_thread::sleep_for(period);
  }
}

GpuActivity GpuSampler::take() {
  Sums s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::swap(s, sums_);
  }
  GpuActivity a;
  if (s.n == 0) return a;
  const double n = static_cast<double>(s.n);
  a.samples = s.n;
  a.utilization_pct = s.util / n;
  a.memory_utilization_pct = s.mem_util / n;
  a.power_w = s.power / n;
  a.sm_clock_min_mhz = s.clock_min;
  a.temperature_max_c = s.temp_max;
  a.memory_used_max_bytes = s.mem_max;
  a.clock_event_reasons = s.reasons;
  return a;
}

}  // namespace forge::bench
