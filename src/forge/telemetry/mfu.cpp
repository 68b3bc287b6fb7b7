// MFU: FLOPs per token and the device's dense peak (Note [MFU] in mfu.h).
#include "forge/telemetry/mfu.h"

#include <algorithm>
#include <cctype>

#include "forge/backends/device_runtime.h"
#include "forge/core/error.h"
#include "forge/plan/gpu_catalog.h"

namespace forge::telemetry {
namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// The catalogue entry for a driver-reported name ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB",
// "NVIDIA GeForce RTX 4090"): the first rule whose marker the name contains. Form factors the
// catalogue does not list (H100 NVL, A100 PCIe) map to nothing rather than to a wrong peak.
const plan::GpuSpec* catalogue_entry(const std::string& device_name) {
  const std::string n = lower(device_name);
  auto has = [&](const char* s) { return n.find(s) != std::string::npos; };
  const char* entry = nullptr;
  if (has("h100")) entry = has("pcie") ? "H100 PCIe" : has("nvl") ? nullptr : "H100 SXM";
  else if (has("h200")) entry = has("nvl") ? nullptr : "H200 SXM";
  else if (has("h800")) entry = has("pcie") ? nullptr : "H800 SXM";
  else if (has("h20")) entry = "H20";
  else if (has("a100")) entry = has("pcie") ? nullptr : has("40gb") ? "A100 SXM 40GB" : "A100 SXM 80GB";
  else if (has("a800")) entry = has("pcie") ? nullptr : "A800 SXM 80GB";
  else if (has("l40s")) entry = nullptr;
  else if (has("l40")) entry = "L40";
  else if (has("4090")) entry = "RTX 4090";
  else if (has("3090 ti")) entry = "RTX 3090 Ti";
  else if (has("v100")) entry = "V100 SXM2 32GB";
  if (entry == nullptr) return nullptr;
  for (const auto& g : plan::gpu_catalog())
    if (g.name == entry) return &g;
  return nullptr;
}

}  // namespace

double transformer_flops_per_token(double matmul_params, int64_t n_layer, int64_t seq_len, int64_t width) {
  return 6.0 * matmul_params +
         12.0 * static_cast<double>(n_layer) * static_cast<double>(seq_len) * static_cast<double>(width);
}

std::string device_name(Device device) { return runtime::device_name(device); }

std::optional<double> device_peak_flops(Device device, DType dtype) {
  if (!device.is_cuda()) return std::nullopt;
  const plan::GpuSpec* g = catalogue_entry(device_name(device));
  if (g == nullptr) return std::nullopt;
  double tflops = 0;
  switch (dtype) {
    case DType::bf16: tflops = g->bf16_tflops; break;
    case DType::f16: tflops = g->fp16_tflops; break;
    case DType::f32: tflops = g->fp32_tflops; break;
    default: return std::nullopt;
  }
  if (tflops <= 0) return std::nullopt;
  return tflops * 1e12;
}

std::optional<std::string> catalogue_name(const std::string& device_name) {
  const plan::GpuSpec* g = catalogue_entry(device_name);
  if (g == nullptr) return std::nullopt;
  return g->name;
}

}  // namespace forge::telemetry
