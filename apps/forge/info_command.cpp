// forge info: prints what src/forge/bench reads about the machine (docs/bench.md), or with
// --env forge's environment switches (src/forge/core/env.h, docs/environment.md).
#include "info_command.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "forge/bench/gpu_info.h"
#include "forge/bench/host_info.h"
#include "forge/core/env.h"
#include "threading_defaults.h"

namespace forge::app {

namespace {

bool g_json = false;
bool g_env = false;

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), f, v);
  return buf;
}

std::string bytes_str(int64_t b) {
  const double d = static_cast<double>(b);
  if (b >= (int64_t{1} << 30)) return fmt("%.1f GiB", d / (1 << 30));
  if (b >= (int64_t{1} << 20)) return fmt("%.0f MiB", d / (1 << 20));
  if (b >= (int64_t{1} << 10)) return fmt("%.0f KiB", d / (1 << 10));
  return std::to_string(b) + " B";
}

std::string peak(double tflops) { return tflops > 0 ? fmt("%.1f", tflops) : std::string("-"); }

void print_row(const std::string& key, const std::string& value) {
  std::printf("  %-22s %s\n", key.c_str(), value.c_str());
}

std::string link_str(int v, const char* prefix) { return v < 0 ? std::string("?") : prefix + std::to_string(v); }

void print_table(const bench::HostInfo& h, const bench::GpuSystemInfo& g) {
  std::printf("forge %s\n\nHost\n", FORGE_VERSION);
  print_row("CPU", h.cpu_model.empty() ? "?" : h.cpu_model);
  print_row("sockets/cores/threads",
            std::to_string(h.sockets) + " / " + std::to_string(h.cores) + " / " + std::to_string(h.threads));
  print_row("NUMA nodes", std::to_string(h.numa_nodes));
  for (const auto& c : h.caches)
    print_row("cache " + bench::cache_name(c), bytes_str(c.size_bytes) + " x " + std::to_string(c.instances) +
                                                   " (shared by " + std::to_string(c.cpus_per_instance) + " CPUs)");
  print_row("memory", bytes_str(h.memory_bytes));
  print_row("OpenMP wait policy", wait_policy_description());
  print_row("thread binding", thread_binding_description());

  std::printf("\nCUDA\n");
  print_row("forge built with CUDA", g.cuda_build ? "yes" : "no");
  print_row("driver (CUDA API)", bench::cuda_version_string(g.driver_version));
  print_row("runtime", bench::cuda_version_string(g.runtime_version));
  print_row("cuDNN (loaded)", g.cudnn.empty() ? "-" : g.cudnn);
  print_row("NVML", g.nvml ? "driver " + g.nvml_driver_version : g.nvml_note);
  if (g.gpus.empty()) {
    std::printf("\nGPUs: %s\n", g.note.c_str());
    return;
  }
  for (const auto& d : g.gpus) {
    std::printf("\nGPU %d: %s\n", d.index, d.name.c_str());
    print_row("compute capability", std::to_string(d.cc_major) + "." + std::to_string(d.cc_minor));
    print_row("SMs", std::to_string(d.sm_count));
    print_row("SM clock (peak)", std::to_string(d.clock_mhz) + " MHz");
    print_row("memory", bytes_str(d.memory_bytes) + ", " + std::to_string(d.memory_bus_bits) + "-bit bus at " +
                            std::to_string(d.memory_clock_mhz) + " MHz");
    print_row("bandwidth (theory)", fmt("%.0f GB/s", d.bandwidth_gbs) + "  (2 x clock x bus / 8)");
    print_row("L2", bytes_str(d.l2_bytes));
    print_row("PCI bus id", d.pci_bus_id);
    if (g.nvml) {
      print_row("PCIe (current / max)", link_str(d.pcie_gen, "gen") + " x" + link_str(d.pcie_width, "") + " / " +
                                            link_str(d.pcie_max_gen, "gen") + " x" + link_str(d.pcie_max_width, ""));
      print_row("NVLink", d.nvlinks_active <= 0 ? std::string("none active")
                                                : std::to_string(d.nvlinks_active) + " active links, NVLink " +
                                                      link_str(d.nvlink_version, ""));
    }
    if (d.catalogue.empty()) {
      print_row("dense peaks", "not in the catalogue (forge plan --list-gpus)");
    } else {
      print_row("catalogue entry", d.catalogue + fmt(" (datasheet %.0f GB/s)", d.catalogue_bw_gbs));
      print_row("dense peaks TFLOP/s", "fp32 " + peak(d.fp32_tflops) + "  tf32 " + peak(d.tf32_tflops) + "  bf16 " +
                                           peak(d.bf16_tflops) + "  fp16 " + peak(d.fp16_tflops) + "  fp8 " +
                                           peak(d.fp8_tflops));
      print_row("source", d.source);
    }
  }
  if (g.nvml && g.gpus.size() > 1) {
    std::printf("\nGPU links (NVML; NV<n> = NVLink with n links, else the PCIe path as in nvidia-smi topo -m)\n      ");
    for (size_t j = 0; j < g.gpus.size(); ++j) std::printf(" %6s", ("GPU" + std::to_string(j)).c_str());
    std::printf("\n");
    for (size_t i = 0; i < g.topology.size(); ++i) {
      std::printf("  GPU%-2zu", i);
      for (const auto& cell : g.topology[i]) std::printf(" %6s", cell.c_str());
      std::printf("\n");
    }
  }
}

// ---- forge info --env ---------------------------------------------------------------------------

std::string value_text(const env::Listing& l) {
  if (!l.raw) return "(unset)";
  return l.raw->empty() ? "(empty)" : *l.raw;
}

void print_env_table(const std::vector<env::Listing>& all) {
  std::printf("forge %s: environment switches (src/forge/core/env.h, docs/environment.md)\n", FORGE_VERSION);
  std::printf("Unset or empty means the default; each is read once, at its first use; a malformed value is an "
              "error there.\n\n");
  const std::vector<std::string> head = {"NAME", "VALUE", "DEFAULT", "CATEGORY"};
  std::vector<size_t> w;
  for (const auto& h : head) w.push_back(h.size());
  for (const auto& l : all) {
    w[0] = std::max(w[0], l.spec->name.size());
    w[1] = std::max(w[1], value_text(l).size());
    w[2] = std::max(w[2], l.spec->default_value.size());
    w[3] = std::max(w[3], std::string(env::category_name(l.spec->category)).size());
  }
  const auto row = [&](const std::string& a, const std::string& b, const std::string& c, const std::string& d,
                       const std::string& meaning) {
    std::printf("  %-*s  %-*s  %-*s  %-*s  %s\n", static_cast<int>(w[0]), a.c_str(), static_cast<int>(w[1]), b.c_str(),
                static_cast<int>(w[2]), c.c_str(), static_cast<int>(w[3]), d.c_str(), meaning.c_str());
  };
  row(head[0], head[1], head[2], head[3], "MEANING");
  for (const auto& l : all) {
    row(std::string(l.spec->name), value_text(l), std::string(l.spec->default_value),
        env::category_name(l.spec->category), std::string(l.spec->meaning));
    if (!l.error.empty()) std::printf("    error: %s\n", l.error.c_str());
  }
  std::printf("\nCategories: diagnostic (changes only what is measured or printed), performance (the same math up "
              "to rounding), debugging (how faults show up; results unchanged), numerics (changes results: a "
              "run's config key is preferred).\n");
}

nlohmann::json env_json(const std::vector<env::Listing>& all) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& l : all) {
    nlohmann::json s;
    s["name"] = std::string(l.spec->name);
    s["value"] = l.raw ? nlohmann::json(*l.raw) : nlohmann::json(nullptr);
    s["default"] = std::string(l.spec->default_value);
    s["kind"] = env::kind_name(l.spec->kind);
    s["accepted"] = env::accepted_forms(*l.spec);
    s["category"] = env::category_name(l.spec->category);
    s["meaning"] = std::string(l.spec->meaning);
    s["error"] = l.error.empty() ? nlohmann::json(nullptr) : nlohmann::json(l.error);
    list.push_back(std::move(s));
  }
  return {{"forge_version", FORGE_VERSION}, {"switches", std::move(list)}};
}

}  // namespace

CLI::App* add_info_command(CLI::App& app) {
  auto* info = app.add_subcommand("info", "the GPUs (peaks, bandwidth, links), driver, CUDA and host CPU of this machine");
  info->add_flag("--json", g_json, "print one JSON object instead of the table");
  info->add_flag("--env", g_env, "list forge's environment switches (FORGE_*) and their values here instead");
  info->footer("Every field and where it comes from: docs/bench.md; the switches: docs/environment.md.");
  return info;
}

int run_info() {
  if (g_env) {
    const std::vector<env::Listing> all = env::switches();
    if (g_json) std::cout << env_json(all).dump(2) << "\n";
    else print_env_table(all);
    return 0;
  }
  const bench::HostInfo host = bench::host_info();
  const bench::GpuSystemInfo gpus = bench::gpu_info();
  if (g_json) {
    nlohmann::json j = bench::to_json(gpus);
    j["host"] = bench::to_json(host);
    j["forge_version"] = FORGE_VERSION;
    j["host"]["omp_wait_policy"] = wait_policy_description();
    j["host"]["thread_binding"] = thread_binding_description();
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  print_table(host, gpus);
  return 0;
}

}  // namespace forge::app
