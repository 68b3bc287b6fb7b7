// The GPUs for `forge info` (contract in gpu_info.h; fields and sources in docs/bench.md).
#include "forge/bench/gpu_info.h"

#include <cstdio>
#include <exception>

#include "forge/bench/nvml.h"
#include "forge/ops/creation.h"
#include "forge/plan/gpu_catalog.h"
#include "forge/telemetry/mfu.h"
#ifdef FORGE_WITH_CUDA
#include "forge/backends/cuda/cudnn_attention.h"
#include "forge/backends/cuda/device_info.h"
#endif

namespace forge::bench {
namespace {

// nvmlGpuTopologyLevel_t -> nvidia-smi topo -m's names.
std::string topology_name(int level) {
  switch (level) {
    case 0: return "X";      // NVML_TOPOLOGY_INTERNAL: the same board
    case 10: return "PIX";   // NVML_TOPOLOGY_SINGLE: one PCIe switch
    case 20: return "PXB";   // NVML_TOPOLOGY_MULTIPLE: several PCIe switches
    case 30: return "PHB";   // NVML_TOPOLOGY_HOSTBRIDGE: a host bridge
    case 40: return "NODE";  // NVML_TOPOLOGY_NODE: host bridges of one NUMA node
    case 50: return "SYS";   // NVML_TOPOLOGY_SYSTEM: across NUMA nodes (SMP interconnect)
    default: return "?";
  }
}

void query_nvml(GpuSystemInfo& s) {
  const Nvml nv;
  if (!nv.ok()) {
    s.nvml_note = nv.note();
    return;
  }
  s.nvml = true;
  char buf[96] = {};
  if (nv.driver_version != nullptr && nv.driver_version(buf, sizeof(buf)) == kNvmlSuccess) s.nvml_driver_version = buf;
  const size_t n = s.gpus.size();
  std::vector<nvmlDevice_t> handles(n, nullptr);
  for (size_t i = 0; i < n; ++i) {
    GpuInfo& g = s.gpus[i];
    // By PCI bus id: CUDA's order (and CUDA_VISIBLE_DEVICES) need not match NVML's.
    const nvmlDevice_t h = nv.device(g.pci_bus_id, g.index);
    handles[i] = h;
    if (h == nullptr) continue;
    unsigned v = 0;
    if (nv.pcie_gen != nullptr && nv.pcie_gen(h, &v) == kNvmlSuccess) g.pcie_gen = static_cast<int>(v);
    if (nv.pcie_width != nullptr && nv.pcie_width(h, &v) == kNvmlSuccess) g.pcie_width = static_cast<int>(v);
    if (nv.pcie_max_gen != nullptr && nv.pcie_max_gen(h, &v) == kNvmlSuccess) g.pcie_max_gen = static_cast<int>(v);
    if (nv.pcie_max_width != nullptr && nv.pcie_max_width(h, &v) == kNvmlSuccess) g.pcie_max_width = static_cast<int>(v);
    if (nv.nvlink_state != nullptr) {
      g.nvlinks_active = 0;
      for (unsigned link = 0; link < kNvmlMaxLinks; ++link) {
        int state = 0;
        if (nv.nvlink_state(h, link, &state) != kNvmlSuccess || state != kNvmlFeatureEnabled) continue;
        if (g.nvlinks_active++ == 0 && nv.nvlink_version != nullptr && nv.nvlink_version(h, link, &v) == kNvmlSuccess)
          g.nvlink_version = static_cast<int>(v);
      }
    }
  }
  s.topology.assign(n, std::vector<std::string>(n, "?"));
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) {
      if (i == j) {
        s.topology[i][j] = topology_name(0);
        continue;
      }
      if (handles[i] == nullptr || handles[j] == nullptr) continue;
      int status = -1;
      if (nv.p2p_status != nullptr && nv.p2p_status(handles[i], handles[j], kNvmlP2pCapsNvlink, &status) == kNvmlSuccess &&
          status == kNvmlP2pStatusOk) {
        std::string nv = "NV";
        if (s.gpus[i].nvlinks_active > 0) nv += std::to_string(s.gpus[i].nvlinks_active);
        s.topology[i][j] = nv;
        continue;
      }
      int level = -1;
      if (nv.common_ancestor != nullptr && nv.common_ancestor(handles[i], handles[j], &level) == kNvmlSuccess)
        s.topology[i][j] = topology_name(level);
    }
  }
}

}  // namespace

double theoretical_bandwidth_gbs(int memory_clock_khz, int memory_bus_bits) {
  return 2.0 * static_cast<double>(memory_clock_khz) * 1e3 * static_cast<double>(memory_bus_bits) / 8.0 / 1e9;
}

std::string cuda_version_string(int v) {
  if (v <= 0) return "-";
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

GpuSystemInfo gpu_info() {
  GpuSystemInfo s;
#ifdef FORGE_WITH_CUDA
  s.cuda_build = true;
  s.driver_version = cuda::driver_version();
  s.runtime_version = cuda::runtime_version();
  // The library the loader found, which can differ from the headers forge was built with (e.g.
  // PyTorch's wheel carries a cuDNN of its own: compare like with like).
  s.cudnn = cuda::cudnn_version_string();
  int count = 0;
  try {
    count = forge::cuda_device_count();
  } catch (const std::exception&) {
    count = 0;
  }
  for (int d = 0; d < count; ++d) {
    const cuda::DeviceProperties p = cuda::device_properties(d);
    GpuInfo g;
    g.index = d;
    g.name = p.name;
    g.cc_major = p.major;
    g.cc_minor = p.minor;
    g.sm_count = p.sm_count;
    g.clock_mhz = p.clock_khz / 1000;
    g.memory_clock_mhz = p.memory_clock_khz / 1000;
    g.memory_bus_bits = p.memory_bus_bits;
    g.memory_bytes = p.total_memory;
    g.l2_bytes = p.l2_bytes;
    g.pci_bus_id = p.pci_bus_id;
    g.bandwidth_gbs = theoretical_bandwidth_gbs(p.memory_clock_khz, p.memory_bus_bits);
    if (const auto entry = telemetry::catalogue_name(p.name)) {
      const plan::GpuSpec& spec = plan::find_gpu(*entry);
      g.catalogue = spec.name;
      g.fp32_tflops = spec.fp32_tflops;
      g.tf32_tflops = spec.tf32_tflops;
      g.bf16_tflops = spec.bf16_tflops;
      g.fp16_tflops = spec.fp16_tflops;
      g.fp8_tflops = spec.fp8_tflops;
      g.catalogue_bw_gbs = spec.memory_bw_gbs;
      g.source = spec.source;
    }
    s.gpus.push_back(std::move(g));
  }
#endif
  if (s.gpus.empty()) {
    s.note = "no CUDA device";
    s.nvml_note = "not queried (no CUDA device)";
    return s;
  }
  query_nvml(s);
  return s;
}

nlohmann::json to_json(const GpuSystemInfo& s) {
  nlohmann::json gpus = nlohmann::json::array();
  auto opt = [](int v) { return v < 0 ? nlohmann::json(nullptr) : nlohmann::json(v); };
  for (const auto& g : s.gpus) {
    nlohmann::json peaks = nlohmann::json::object();
    if (!g.catalogue.empty())
      peaks = {{"fp32", g.fp32_tflops}, {"tf32", g.tf32_tflops}, {"bf16", g.bf16_tflops},
               {"fp16", g.fp16_tflops}, {"fp8", g.fp8_tflops}};
    gpus.push_back({{"index", g.index},
                    {"name", g.name},
                    {"compute_capability", std::to_string(g.cc_major) + "." + std::to_string(g.cc_minor)},
                    {"sm_count", g.sm_count},
                    {"clock_mhz", g.clock_mhz},
                    {"memory_clock_mhz", g.memory_clock_mhz},
                    {"memory_bus_bits", g.memory_bus_bits},
                    {"memory_bytes", g.memory_bytes},
                    {"l2_bytes", g.l2_bytes},
                    {"pci_bus_id", g.pci_bus_id},
                    {"bandwidth_gbs", g.bandwidth_gbs},
                    {"catalogue", g.catalogue.empty() ? nlohmann::json(nullptr) : nlohmann::json(g.catalogue)},
                    {"dense_peak_tflops", peaks},
                    {"catalogue_bandwidth_gbs", g.catalogue_bw_gbs},
                    {"source", g.source},
                    {"nvlinks_active", opt(g.nvlinks_active)},
                    {"nvlink_version", opt(g.nvlink_version)},
                    {"pcie_gen", opt(g.pcie_gen)},
                    {"pcie_width", opt(g.pcie_width)},
                    {"pcie_max_gen", opt(g.pcie_max_gen)},
                    {"pcie_max_width", opt(g.pcie_max_width)}});
  }
  return {{"gpus", gpus},
          {"note", s.note},
          {"cuda_build", s.cuda_build},
          {"driver", cuda_version_string(s.driver_version)},
          {"cuda_runtime", cuda_version_string(s.runtime_version)},
          {"cudnn", s.cudnn.empty() ? "-" : s.cudnn},
          {"nvml", {{"available", s.nvml},
                    {"note", s.nvml_note},
                    {"driver_version", s.nvml_driver_version},
                    {"topology", s.topology}}}};
}

}  // namespace forge::bench
