// Device activity while training (contracts and Note [idle share] in gpu_sampler.h).
#include "forge/bench/gpu_sampler.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "forge/bench/nvml.h"
#include "forge/bench/top.h"

namespace forge::bench {

namespace {
// GpmFigures as an array, in one order (GpuSampler's sums).
double* figure(GpmFigures& f, int i) {
  double* all[8] = {&f.sm_active_pct, &f.sm_occupancy_pct, &f.tensor_active_pct, &f.dram_active_pct,
                    &f.pcie_tx_gbps,  &f.pcie_rx_gbps,     &f.nvlink_tx_gbps,    &f.nvlink_rx_gbps};
  return all[i];
}
}  // namespace

GpuSampler::GpuSampler(const std::string& pci_bus_id, int index, double period_s, double gpm_period_s)
    : nvml_(std::make_unique<Nvml>()) {
  if (!nvml_->ok()) return;
  device_ = nvml_->device(pci_bus_id, index);
  ok_ = device_ != nullptr && nvml_->utilization != nullptr;
  if (!ok_) return;
  gpm_ = std::make_unique<GpmReader>(*nvml_, static_cast<nvmlDevice_t>(device_));
  thread_ = std::thread([this, period_s, gpm_period_s] { loop(period_s, gpm_period_s); });
}

void GpuSampler::add_gpm(const GpmFigures& f) {
  GpmFigures g = f;
  std::lock_guard<std::mutex> lock(mu_);
  ++sums_.gpm_n;
  for (int i = 0; i < 8; ++i) {
    const double v = *figure(g, i);
    if (v < 0) continue;
    sums_.gpm_sum[i] += v;
    ++sums_.gpm_count[i];
  }
}

GpuSampler::~GpuSampler() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void GpuSampler::loop(double period_s, double gpm_period_s) {
  const auto h = static_cast<nvmlDevice_t>(device_);
  const auto period = std::chrono::duration<double>(period_s);
  using clock = std::chrono::steady_clock;
  auto gpm_due = clock::now();
  while (!stop_) {
    if (gpm_->ok() && clock::now() >= gpm_due) {
      if (const auto f = gpm_->next()) add_gpm(*f);
      gpm_due = clock::now() + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(gpm_period_s));
    }
    NvmlUtilization u;
    const bool have_util = nvml_->utilization(h, &u) == kNvmlSuccess;
    unsigned long long used = 0, total = 0;
    const bool have_mem = nvml_->memory_used(h, &used, &total);
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
      if (have_mem) sums_.mem_max = std::max(sums_.mem_max, static_cast<int64_t>(used));
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
  a.gpm_intervals = s.gpm_n;
  for (int i = 0; i < 8; ++i)
    if (s.gpm_count[i] > 0) *figure(a.gpm, i) = s.gpm_sum[i] / static_cast<double>(s.gpm_count[i]);
  return a;
}

std::string activity_text(const GpuActivity& a) {
  if (a.samples == 0) return "";
  auto pct = [](double v) { return std::to_string(static_cast<int>(std::lround(v))) + "%"; };
  std::string t = "GPU busy " + pct(a.utilization_pct);
  if (a.gpm.sm_active_pct >= 0) t += ", SM " + pct(a.gpm.sm_active_pct);
  if (a.gpm.tensor_active_pct >= 0) t += ", tensor " + pct(a.gpm.tensor_active_pct);
  return t;
}

nlohmann::json activity_record(const GpuActivity& a) {
  nlohmann::json r = nlohmann::json::object();
  if (a.samples == 0) return r;
  r["gpu_util_pct"] = a.utilization_pct;
  r["gpu_mem_util_pct"] = a.memory_utilization_pct;
  r["gpu_power_w"] = a.power_w;
  r["gpu_sm_clock_min_mhz"] = a.sm_clock_min_mhz;
  r["gpu_temp_max_c"] = a.temperature_max_c;
  r["gpu_mem_used_bytes"] = a.memory_used_max_bytes;
  std::string reasons;
  for (const auto& name : clock_event_reason_names(a.clock_event_reasons & ~uint64_t{1}))  // (not "idle")
    reasons += (reasons.empty() ? "" : ", ") + name;
  if (!reasons.empty()) r["gpu_clock_events"] = reasons;
  const std::pair<const char*, double> gpm[] = {
      {"gpu_sm_active_pct", a.gpm.sm_active_pct},   {"gpu_sm_occupancy_pct", a.gpm.sm_occupancy_pct},
      {"gpu_tensor_active_pct", a.gpm.tensor_active_pct}, {"gpu_dram_active_pct", a.gpm.dram_active_pct},
      {"gpu_pcie_tx_gbps", a.gpm.pcie_tx_gbps},     {"gpu_pcie_rx_gbps", a.gpm.pcie_rx_gbps},
      {"gpu_nvlink_tx_gbps", a.gpm.nvlink_tx_gbps}, {"gpu_nvlink_rx_gbps", a.gpm.nvlink_rx_gbps}};
  for (const auto& [key, v] : gpm)
    if (v >= 0) r[key] = v;
  return r;
}

}  // namespace forge::bench
