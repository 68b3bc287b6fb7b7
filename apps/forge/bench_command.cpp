// forge bench: runs the measurements of src/forge/bench (method: docs/bench.md).
#include "bench_command.h"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "forge/io/output_guard.h"
#include "forge/bench/attention.h"
#include "forge/bench/burn.h"
#include "forge/bench/calibrate.h"
#include "forge/bench/collectives.h"
#include "forge/bench/gemm.h"
#include "forge/bench/layer.h"
#include "forge/bench/memory.h"
#include "forge/bench/roofline.h"
#include "forge/core/error.h"
#include "forge/io/atomic_file.h"
#include "forge/plan/gpu_profile.h"

namespace forge::app {

namespace {

struct GemmArgs {
  std::string device = "auto";
  std::string sizes;               // "" = the device's default
  std::vector<std::string> mnk;
  std::string dtypes;              // "" = the device's default
  int repeats = 20;
  int warmup = 3;
  double warmup_ms = 50;
  bool compare_tuning = false;
  bool json = false;
};

GemmArgs g_gemm;

struct MemoryArgs {
  std::string device = "auto";
  std::string sizes;               // "" = the device's default
  int repeats = 20;
  int warmup = 3;
  double warmup_ms = 50;
  bool no_host = false, no_peer = false;
  bool json = false;
};
MemoryArgs g_memory;

struct LayerArgs {
  std::string device = "auto";
  int64_t batch = 0, seq = 0, width = 0, heads = 0;  // 0 = the device's default
  std::string dtype;
  int repeats = 20;
  int warmup = 3;
  double warmup_ms = 50;
  bool json = false;
};
LayerArgs g_layer;

struct AttentionArgs {
  std::string device = "auto";
  std::vector<std::string> shapes;  // empty: the device's defaults
  std::string backends;             // empty: the device's defaults
  std::string dtype;
  int repeats = 20;
  int warmup = 3;
  std::string layout = "bhsd";
  bool json = false;
};
AttentionArgs g_attention;

struct CollectivesArgs {
  std::string device = "auto";
  std::string sizes;               // "" = 8..1G on GPUs, 8..64M on CPUs
  std::string ops;                 // "" = all
  std::string dtype = "f32";
  int iters = 20;
  int warmup = 5;
  bool json = false;
  int node_size = 0;
  std::string dp_reduce = "flat";
  double link_gbps = 0;
  double link_latency_us = 25;
  std::string grad_compression = "none";
};
CollectivesArgs g_coll;

struct RooflineArgs {
  std::string device = "auto";
  std::vector<std::string> from;
  std::string svg;                 // "" = roofline.svg
  bool force = false;              // replace an --svg file that forge bench roofline did not write
  int repeats = 10;
  bool json = false;
};
RooflineArgs g_roofline;

struct BurnArgs {
  std::string device = "auto";
  double seconds = 60;
  int64_t size = 0;
  std::string dtype;
  double interval = 2;
  int inject_error = -1;           // test hook (hidden option)
  bool json = false;
};
BurnArgs g_burn;

void print_json(nlohmann::json j) {
  j["forge_version"] = FORGE_VERSION;
  std::cout << j.dump(2) << "\n";
}

// CLI11 validators from the parsers, so that a bad list is a usage error with their message.
template <class F>
CLI::Validator parser_check(F parse, const char* name) {
  return CLI::Validator(
      [parse](std::string& s) -> std::string {
        try {
          parse(s);
          return "";
        } catch (const Error& e) {
          return e.what();
        }
      },
      "", name);
}

void print_gemm_table(const bench::GemmReport& r) {
  const bool cpu = r.device == "cpu";
  std::printf("forge bench gemm on %s (%s%s)\n", r.device.c_str(), r.device_name.empty() ? "?" : r.device_name.c_str(),
              r.catalogue.empty() ? "" : (", catalogue: " + r.catalogue).c_str());
  std::printf("C = A B, row-major, randn inputs; median of %d timed runs after warm-up (%s); FLOPs = 2*M*N*K\n",
              r.options.repeats, r.timer.c_str());
  const bool compare = r.gemm_tuning == "compare";
  if (!cpu)
    std::printf("GEMM algorithm: %s\n", compare ? "tuned, beside cuBLASLt's heuristic choice (heur. ms)"
                                      : r.gemm_tuning == "cached" ? "tuned (FORGE_GEMM_TUNING=cached)"
                                                                  : "cuBLASLt's heuristic choice (FORGE_GEMM_TUNING=off)");
  std::printf("\n  %-5s %7s %7s %7s %11s %11s %10s %8s%s\n", "dtype", "M", "N", "K", "median ms", "min ms",
              cpu ? "GFLOP/s" : "TFLOP/s", "% peak", compare ? "   heur. ms  speed-up" : "");
  for (const auto& x : r.results) {
    const double rate = cpu ? x.tflops * 1e3 : x.tflops;
    char pct[32] = "-";
    if (x.peak_tflops > 0) std::snprintf(pct, sizeof(pct), "%.1f", x.peak_pct);
    char heur[48] = "";
    if (compare && x.heuristic_median_ms > 0)
      std::snprintf(heur, sizeof(heur), " %10.4f %8.3fx", x.heuristic_median_ms, x.heuristic_median_ms / x.median_ms);
    std::printf("  %-5s %7lld %7lld %7lld %11.4f %11.4f %10.1f %8s%s\n", x.dtype.c_str(),
                static_cast<long long>(x.shape.m), static_cast<long long>(x.shape.n),
                static_cast<long long>(x.shape.k), x.median_ms, x.min_ms, rate, pct, heur);
  }
  if (r.gemm_fallback_shapes > 0)
    std::printf("  %lld GEMM shape(s) had no cuBLASLt algorithm (the fallback ran; stderr names them)\n",
                static_cast<long long>(r.gemm_fallback_shapes));
  for (const auto& s : r.skipped)
    std::printf("  %s%s: %s\n", s.dtype.c_str(), s.shape.empty() ? "" : (" " + s.shape).c_str(), s.reason.c_str());
  if (!cpu && r.catalogue.empty())
    std::printf("\n%% peak: this GPU is not in the catalogue (forge plan --list-gpus)\n");
}

int run_gemm_command() {
  bench::GemmOptions o;
  o.device = parse_device(g_gemm.device);
  if (!g_gemm.sizes.empty()) o.shapes = bench::square_shapes(bench::parse_size_list(g_gemm.sizes));
  for (const auto& s : g_gemm.mnk) o.shapes.push_back(bench::parse_mnk(s));
  if (o.shapes.empty()) o.shapes = bench::square_shapes(bench::default_sizes(o.device));
  o.dtypes = g_gemm.dtypes.empty() ? bench::default_dtypes(o.device) : bench::parse_dtype_list(g_gemm.dtypes, o.device);
  o.repeats = g_gemm.repeats;
  o.warmup_runs = g_gemm.warmup;
  o.warmup_ms = g_gemm.warmup_ms;
  o.compare_tuning = g_gemm.compare_tuning;
  const bench::GemmReport r = bench::run_gemm(o);
  if (g_gemm.json) {
    print_json(bench::to_json(r));
  } else {
    print_gemm_table(r);
  }
  return 0;
}

// ---- memory -------------------------------------------------------------------------------------

void print_memory_table(const bench::MemoryReport& r) {
  std::printf("forge bench memory on %s (%s)\n", r.device.c_str(), r.device_name.empty() ? "?" : r.device_name.c_str());
  std::printf("median of %d timed runs after warm-up (%s); GB/s = bytes read + written / time", r.options.repeats,
              r.timer.c_str());
  if (r.device == "cpu") std::printf("; %d OpenMP threads", r.threads);
  std::printf("\n\n  %-13s %-5s %9s %12s %11s %10s %10s  %s\n", "kernel", "dtype", "elements", "bytes", "median ms", "GB/s",
              r.device == "cpu" ? "GFLOP/s" : "TFLOP/s", "note");
  for (const auto& x : r.results) {
    char rate[32] = "-";
    if (x.flops > 0) std::snprintf(rate, sizeof(rate), r.device == "cpu" ? "%.2f" : "%.4f", r.device == "cpu" ? x.tflops * 1e3 : x.tflops);
    std::printf("  %-13s %-5s %9s %12.4g %11.4f %10.1f %10s  %s\n", x.kernel.c_str(), x.dtype.c_str(),
                bench::element_count_str(x.elements).c_str(), x.bytes, x.median_ms, x.gbs, rate, x.note.c_str());
  }
  for (const auto& s : r.skipped) std::printf("  skipped %s %s: %s\n", s.kernel.c_str(), s.size.c_str(), s.reason.c_str());
}

int run_memory_command() {
  bench::MemoryOptions o;
  o.device = parse_device(g_memory.device);
  o.sizes = g_memory.sizes.empty() ? bench::default_memory_sizes(o.device) : bench::parse_element_list(g_memory.sizes);
  o.repeats = g_memory.repeats;
  o.warmup_runs = g_memory.warmup;
  o.warmup_ms = g_memory.warmup_ms;
  o.host = !g_memory.no_host;
  o.peer = !g_memory.no_peer;
  const bench::MemoryReport r = bench::run_memory(o);
  if (g_memory.json) print_json(bench::to_json(r));
  else print_memory_table(r);
  return 0;
}

// ---- layer --------------------------------------------------------------------------------------

void print_layer_table(const bench::LayerReport& r) {
  const bench::LayerConfig& c = r.options.config;
  const bool cpu = r.device == "cpu";
  const double scale = cpu ? 1e3 : 1;  // GFLOP/s on the CPU
  const char* unit = cpu ? "GFLOP/s" : "TFLOP/s";
  std::printf("forge bench layer on %s (%s): GPT block, batch %lld, seq %lld, width %lld, heads %lld, %s\n", r.device.c_str(),
              r.device_name.empty() ? "?" : r.device_name.c_str(), static_cast<long long>(c.batch),
              static_cast<long long>(c.seq), static_cast<long long>(c.width), static_cast<long long>(c.heads),
              dtype_name(c.dtype));
  std::printf("forward and backward timed separately, median of %d runs after warm-up (%s); FLOPs: ffn 16bsh^2 + "
              "attention 8bsh^2 + 4bs^2h per forward, backward 2x\n\n",
              r.options.repeats, r.timer.c_str());
  std::printf("  %-14s %-10s %10s %10s %10s %9s %9s %7s\n", "part", "kind", "GFLOP", "fwd ms", "bwd ms", unit, "GB/s",
              "share");
  for (const auto& p : r.parts) {
    const double gf = (p.part.flops_fwd + p.part.flops_bwd) / 1e9;
    char flops[32] = "-", rate[32] = "-", gbs[32] = "-";
    if (gf > 0) {
      std::snprintf(flops, sizeof(flops), "%.2f", gf);
      std::snprintf(rate, sizeof(rate), "%.1f", p.tflops * scale);
    }
    if (p.part.bytes_fwd + p.part.bytes_bwd > 0) std::snprintf(gbs, sizeof(gbs), "%.0f", p.gbs);
    std::printf("  %-14s %-10s %10s %10.4f %10.4f %9s %9s %6.1f%%\n", p.part.name.c_str(), p.part.kind.c_str(), flops,
                p.time.fwd_ms, p.time.bwd_ms, rate, gbs, 100 * p.share);
  }
  std::printf("  %-14s %-10s %10s %10s %10s %9s %9s %6.1f%%\n", "sum of parts", "", "", "", "", "", "",
              r.block.total_ms() > 0 ? 100 * r.parts_ms / r.block.total_ms() : 0.0);
  std::printf("  %-14s %-10s %10.2f %10.4f %10.4f %9.1f %9s %6.1f%%\n", "block", "", r.block_flops / 1e9, r.block.fwd_ms,
              r.block.bwd_ms, r.block_tflops * scale, "", 100.0);
  if (r.fused_gelu) std::printf("\nmlp_fc_gelu: the up-projection's GEMM with GELU in its epilogue (ops::linear_gelu)\n");
}

int run_layer_command() {
  bench::LayerOptions o;
  o.device = parse_device(g_layer.device);
  o.config = bench::default_layer_config(o.device);
  if (g_layer.batch > 0) o.config.batch = g_layer.batch;
  if (g_layer.seq > 0) o.config.seq = g_layer.seq;
  if (g_layer.width > 0) o.config.width = g_layer.width;
  if (g_layer.heads > 0) o.config.heads = g_layer.heads;
  if (!g_layer.dtype.empty()) o.config.dtype = parse_dtype(g_layer.dtype);
  o.repeats = g_layer.repeats;
  o.warmup_runs = g_layer.warmup;
  o.warmup_ms = g_layer.warmup_ms;
  const bench::LayerReport r = bench::run_layer(o);
  if (g_layer.json) print_json(bench::to_json(r));
  else print_layer_table(r);
  return 0;
}

// ---- attention ----------------------------------------------------------------------------------

int run_attention_command() {
  bench::AttentionOptions o;
  o.device = parse_device(g_attention.device);
  o.dtype = g_attention.dtype.empty() ? (o.device.is_cuda() ? DType::bf16 : DType::f32) : parse_dtype(g_attention.dtype);
  for (const std::string& s : g_attention.shapes) o.shapes.push_back(bench::parse_attention_shape(s));
  if (o.shapes.empty()) o.shapes = bench::default_attention_shapes(o.device);
  o.backends = g_attention.backends.empty() ? bench::default_attention_backends(o.device)
                                            : bench::parse_attention_backends(g_attention.backends, o.device);
  o.repeats = g_attention.repeats;
  o.warmup_runs = g_attention.warmup;
  o.layout = g_attention.layout;
  const bench::AttentionReport r = bench::run_attention(o);
  if (g_attention.json) {
    print_json(bench::to_json(r));
    return 0;
  }
  std::printf("forge bench attention on %s (%s), %s, layout %s%s%s; median of %d, %s\n", r.device.c_str(),
              r.device_name.c_str(), dtype_name(o.dtype), o.layout.c_str(), r.cudnn_version.empty() ? "" : ", cuDNN ",
              r.cudnn_version.c_str(), o.repeats, r.timer.c_str());
  std::printf("FLOPs: forward 4 B H T S D (halved when causal), backward 2.5 x forward\n\n");
  std::printf("%-22s %-10s %10s %10s %10s %10s\n", "B x H x Hkv x T x D", "back-end", "fwd ms", "fwd TF/s", "bwd ms",
              "bwd TF/s");
  for (const auto& x : r.results) {
    if (!x.skipped.empty()) {
      std::printf("%-22s %-10s   skipped: %s\n", bench::shape_str(x.shape).c_str(), x.backend.c_str(), x.skipped.c_str());
      continue;
    }
    std::printf("%-22s %-10s %10.3f %10.1f %10.3f %10.1f\n", bench::shape_str(x.shape).c_str(), x.backend.c_str(),
                x.fwd_ms, x.fwd_tflops, x.bwd_ms, x.bwd_tflops);
  }
  return 0;
}

// ---- roofline -----------------------------------------------------------------------------------

void print_roofline_table(const bench::Roofline& r, const std::string& svg) {
  const bool tera = r.device != "cpu";
  const double scale = tera ? 1 : 1e3;
  const char* unit = tera ? "TFLOP/s" : "GFLOP/s";
  std::printf("forge bench roofline on %s (%s)\n\n", r.device.c_str(), r.device_name.empty() ? "?" : r.device_name.c_str());
  std::printf("  bandwidth roof %.1f GB/s (%s)\n", r.bandwidth_gbs, r.bandwidth_from.empty() ? "-" : r.bandwidth_from.c_str());
  for (const auto& c : r.compute)
    std::printf("  %-5s roof     %.2f %s (%s); ridge point %.2f FLOP/byte\n", c.dtype.c_str(), c.tflops * scale, unit,
                c.from.c_str(), bench::ridge_point(c.tflops, r.bandwidth_gbs));
  std::printf("\n  %-24s %-10s %-5s %10s %10s %10s %10s %7s  %s\n", "kernel", "kind", "dtype", "FLOP/byte", unit, "GB/s",
              "roof", "% roof", "bound");
  for (const auto& p : r.points) {
    const bench::RooflineCeiling* c = bench::ceiling_for(r, p.dtype);
    const double roof = c != nullptr && r.bandwidth_gbs > 0
                            ? bench::attainable_tflops(p.intensity(), c->tflops, r.bandwidth_gbs)
                            : 0;
    char pct[32] = "-", roof_s[32] = "-";
    if (roof > 0) {
      std::snprintf(pct, sizeof(pct), "%.1f", 100 * p.tflops() / roof);
      std::snprintf(roof_s, sizeof(roof_s), "%.2f", roof * scale);
    }
    const bool mem = c != nullptr && p.intensity() < bench::ridge_point(c->tflops, r.bandwidth_gbs);
    std::printf("  %-24s %-10s %-5s %10.3g %10.3f %10.1f %10s %7s  %s\n", p.name.c_str(), p.kind.c_str(),
                p.dtype.c_str(), p.intensity(), p.tflops() * scale, p.gbs(), roof_s, pct, mem ? "memory" : "compute");
  }
  std::printf("\nlayer norms/activations/residuals: rough op counts, not model FLOPs (docs/bench.md)\n");
  if (!svg.empty()) std::printf("plot: %s\n", svg.c_str());
}

int run_roofline_command() {
  bench::RooflineOptions o;
  o.device = parse_device(g_roofline.device);
  o.from = g_roofline.from;
  o.repeats = g_roofline.repeats;
  const std::string svg = g_roofline.svg.empty() ? "roofline.svg" : g_roofline.svg;
  // Note [nothing deletes what it did not write]: checked before the measurements.
  io::check_output_file(svg, "bench roofline: --svg", [](std::string_view head) {
    return head.find("<!-- forge bench roofline -->") != std::string_view::npos;
  }, g_roofline.force);
  const bench::Roofline r = bench::run_roofline(o);
  {
    std::ofstream out(svg);
    FORGE_CHECK(out.good(), "bench roofline: cannot write '", svg, "'");
    out << bench::roofline_svg(r);
  }
  if (g_roofline.json) {
    nlohmann::json j = bench::to_json(r);
    j["svg"] = svg;
    print_json(j);
  } else {
    print_roofline_table(r, svg);
  }
  return 0;
}

// ---- burn ---------------------------------------------------------------------------------------

int run_burn_command() {
  bench::BurnOptions o;
  o.device = parse_device(g_burn.device);
  o.seconds = g_burn.seconds;
  o.size = g_burn.size;
  o.dtype = g_burn.dtype.empty() ? bench::default_burn_dtype(o.device) : parse_dtype(g_burn.dtype);
  o.interval_s = g_burn.interval;
  o.inject_error_at_check = g_burn.inject_error;
  const bool cpu = o.device.is_cpu();
  const auto num = [](double v, const char* f) {
    if (v < 0) return std::string("-");
    char b[32];
    std::snprintf(b, sizeof(b), f, v);
    return std::string(b);
  };
  std::function<void(const bench::BurnRow&)> on_row;
  if (!g_burn.json) {
    std::printf("forge bench burn on %s: %lld^3 %s GEMMs for %.3g s, each result checked bitwise against the first\n\n",
                o.device.str().c_str(), static_cast<long long>(o.size > 0 ? o.size : bench::default_burn_size(o.device)),
                dtype_name(o.dtype), o.seconds);
    std::printf("  %8s %10s %10s %8s %8s %8s\n", "time s", cpu ? "GFLOP/s" : "TFLOP/s", "SM MHz", "temp C", "power W",
                "errors");
    std::fflush(stdout);
    on_row = [&](const bench::BurnRow& x) {
      std::printf("  %8.1f %10.1f %10s %8s %8s %8lld\n", x.t_s, cpu ? x.tflops * 1e3 : x.tflops,
                  num(x.sm_clock_mhz, "%.0f").c_str(), num(x.temperature_c, "%.0f").c_str(), num(x.power_w, "%.0f").c_str(),
                  static_cast<long long>(x.errors));
      std::fflush(stdout);
    };
  }
  const bench::BurnReport r = bench::run_burn(o, on_row);
  if (g_burn.json) {
    print_json(bench::to_json(r));
  } else {
    std::printf("\n%lld GEMMs in %.1f s, %.1f %s mean; %lld checks, %lld errors%s%s\n", static_cast<long long>(r.iterations),
                r.seconds, cpu ? r.mean_tflops * 1e3 : r.mean_tflops, cpu ? "GFLOP/s" : "TFLOP/s",
                static_cast<long long>(r.checks), static_cast<long long>(r.errors),
                cpu || r.nvml ? "" : "; ", cpu || r.nvml ? "" : r.nvml_note.c_str());
  }
  if (r.errors > 0) {
    std::cerr << "forge bench burn: " << r.errors << " mismatching words in " << r.checks
              << " checks against the reference product: this GPU/CPU computes wrong results\n";
    return 1;
  }
  return 0;
}

// ---- collectives ---------------------------------------------------------------------------------

std::string size_str(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  double v = static_cast<double>(bytes);
  while (v >= 1024 && u < 3) v /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof(buf), v == static_cast<int64_t>(v) ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

int run_collectives_command() {
  bench::CollectivesOptions o;
  o.device = parse_device(g_coll.device);
  if (g_coll.sizes.empty()) {
    o.sizes = bench::collective_sizes(8, o.device.is_cuda() ? (int64_t{1} << 30) : (int64_t{1} << 26));
  } else if (const auto dots = g_coll.sizes.find(".."); dots != std::string::npos) {
    o.sizes = bench::collective_sizes(bench::parse_element_count(g_coll.sizes.substr(0, dots)),
                                      bench::parse_element_count(g_coll.sizes.substr(dots + 2)));
  } else {
    o.sizes = bench::parse_element_list(g_coll.sizes);
  }
  for (size_t p = 0; p < g_coll.ops.size();) {
    const size_t c = std::min(g_coll.ops.find(',', p), g_coll.ops.size());
    if (c > p) o.ops.push_back(g_coll.ops.substr(p, c - p));
    p = c + 1;
  }
  o.dtype = parse_dtype(g_coll.dtype);
  FORGE_CHECK(o.dtype == DType::f32 || o.dtype == DType::bf16 || o.dtype == DType::f16,
              "bench collectives: --dtype must be f32, bf16 or f16, got '", g_coll.dtype, "'");
  o.iters = g_coll.iters;
  o.warmup = g_coll.warmup;
  FORGE_CHECK(g_coll.dp_reduce == "flat" || g_coll.dp_reduce == "hierarchical",
              "bench collectives: --dp-reduce must be flat or hierarchical, got '", g_coll.dp_reduce, "'");
  o.node_size = g_coll.node_size;
  o.hierarchical = g_coll.dp_reduce == "hierarchical";
  o.link_gbps = g_coll.link_gbps;
  o.link_latency_us = g_coll.link_latency_us;
  FORGE_CHECK(g_coll.grad_compression == "none" || g_coll.grad_compression == "fp8",
              "bench collectives: --grad-compression must be none or fp8, got '", g_coll.grad_compression, "'");
  o.fp8 = g_coll.grad_compression == "fp8";
  const bench::CollectivesReport r = bench::run_collectives(o);
  if (r.rank != 0) return 0;  // rank 0 speaks for the job
  if (g_coll.json) {
    print_json(bench::to_json(r));
    return 0;
  }
  std::printf("forge bench collectives: %d rank(s) (%s), %s on %s%s%s, %s, %d iterations after %d warm-up\n", r.world,
              r.launcher.c_str(), r.backend.c_str(), r.device.c_str(), r.device_name.empty() ? "" : " ",
              r.device_name.c_str(), dtype_name(r.options.dtype), r.options.iters, r.options.warmup);
  if (!r.transport_env.empty()) std::printf("transport: %s\n", r.transport_env.c_str());
  if (!r.nodes.empty()) std::printf("nodes: %s\n", r.nodes.c_str());
  if (r.options.fp8)
    std::printf("all_reduce and reduce_scatter: gradients in FP8 (dist.grad_compression = \"fp8\"), averaged; sizes "
                "and bandwidths of the uncompressed tensors\n");
  std::string op;
  for (const auto& x : r.results) {
    if (x.op != op) {
      op = x.op;
      std::printf("\n%-15s %12s %12s %12s %13s %13s\n", op.c_str(), "size", "elements", "time (us)", "algbw (GB/s)",
                  "busbw (GB/s)");
    }
    std::printf("%-15s %12s %12lld %12.1f %13.2f %13.2f\n", "", size_str(x.bytes).c_str(),
                static_cast<long long>(x.elements), x.time_us, x.algbw_gbs, x.busbw_gbs);
  }
  for (const auto& n : r.notes) std::printf("note: %s\n", n.c_str());
  return 0;
}

// ---- calibrate ----------------------------------------------------------------------------------

struct CalibrateArgs {
  std::string device = "auto";
  std::string out;
  std::string gpu;
  std::vector<std::string> mnk;
  int repeats = 20;
  bool quick = false, force = false;
};
CalibrateArgs g_calibrate;

bool is_profile_json(std::string_view head) { return head.find("\"memory_gbs\"") != std::string_view::npos; }

int run_calibrate_command() {
  FORGE_CHECK(!g_calibrate.out.empty(), "bench calibrate: --out FILE is required (the profile's JSON)");
  // Note [nothing deletes what it did not write]: checked before the measurements.
  io::check_output_file(g_calibrate.out, "bench calibrate: --out", is_profile_json, g_calibrate.force);
  bench::CalibrateOptions o;
  o.device = parse_device(g_calibrate.device);
  for (const auto& s : g_calibrate.mnk) o.extra.push_back(bench::parse_mnk(s));
  o.repeats = g_calibrate.repeats;
  o.quick = g_calibrate.quick;
  const plan::GpuProfile p = bench::calibrate(o, g_calibrate.gpu);
  io::write_file_atomic(g_calibrate.out, plan::to_json(p).dump(2) + "\n");
  const plan::GemmEfficiency& e = p.gemm.at(plan::Precision::bf16);
  std::printf("forge bench calibrate: %s (%s, %lld SMs)\n", p.gpu.c_str(), p.measured_on.c_str(),
              static_cast<long long>(p.sms));
  for (const auto& [prec, g] : p.gemm)
    std::printf("  GEMM %-5s sustained %7.1f TFLOP/s, k_half %4.0f (%zu shapes)\n", plan::precision_name(prec),
                g.sustained_tflops, g.k_half, g.points.size());
  for (const auto& a : p.attention)
    std::printf("  attention T %5lld head %3lld: %6.1f fwd, %6.1f bwd TFLOP/s\n", static_cast<long long>(a.seq),
                static_cast<long long>(a.head_dim), a.fwd_tflops, a.bwd_tflops);
  std::printf("  copies %.0f GB/s\nwrote %s: forge plan --gpu %s --profile %s\n", p.memory_gbs, g_calibrate.out.c_str(),
              p.gpu.c_str(), g_calibrate.out.c_str());
  (void)e;
  return 0;
}

}  // namespace

CLI::App* add_bench_command(CLI::App& app) {
  auto* bench = app.add_subcommand(
      "bench", "measure this machine (gemm, memory, layer, attention, roofline, burn, collectives); method: docs/bench.md");
  bench->require_subcommand(1);
  auto* gemm = bench->add_subcommand("gemm", "TFLOP/s of forge's matrix product (cuBLASLt on a GPU, OpenBLAS on the CPU)");
  gemm->add_option("--device", g_gemm.device, "auto (the first GPU if any), cpu, cuda or cuda:N")->capture_default_str();
  gemm->add_option("--sizes", g_gemm.sizes,
                   "square sizes, e.g. 128,1024 or 128..4096 (powers of two); default 128..16384 (GPU), 128..2048 (CPU)")
      ->check(parser_check([](const std::string& s) { bench::parse_size_list(s); }, "SIZES"));
  gemm->add_option("--mnk", g_gemm.mnk, "a GEMM shape MxNxK, e.g. 4096x4096x1024 (repeatable)")
      ->check(parser_check([](const std::string& s) { bench::parse_mnk(s); }, "MxNxK"));
  gemm->add_option("--dtype", g_gemm.dtypes,
                   "dtypes among f32,tf32,bf16,f16,fp8,f64; default f32,tf32,bf16,f16,fp8 (GPU), f32,f64 (CPU)");
  gemm->add_option("--repeats", g_gemm.repeats, "timed runs per GEMM (the median is reported)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  gemm->add_option("--warmup", g_gemm.warmup, "untimed runs first (at least)")->capture_default_str()->check(CLI::NonNegativeNumber);
  gemm->add_option("--warmup-ms", g_gemm.warmup_ms, "warm up for at least this long (ms)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  gemm->add_flag("--compare-tuning", g_gemm.compare_tuning,
                 "GPU: time each GEMM with cuBLASLt's heuristic choice too, beside the tuned algorithm");
  gemm->add_flag("--json", g_gemm.json, "print one JSON object instead of the table");
  gemm->footer("Method (timer, warm-up, repeats, FLOP count): docs/bench.md.");

  auto* mem = bench->add_subcommand("memory", "memory bandwidth: GPU copy/multiply, host<->device, peer; CPU STREAM copy/triad");
  mem->add_option("--device", g_memory.device, "auto (the first GPU if any), cpu, cuda or cuda:N")->capture_default_str();
  mem->add_option("--sizes", g_memory.sizes,
                  "element counts, e.g. 64K,1M,1G or 64K..1G (powers of two); default 64K..1G x4 (GPU), 64K..64M x4 (CPU)")
      ->check(parser_check([](const std::string& s) { bench::parse_element_list(s); }, "SIZES"));
  mem->add_option("--repeats", g_memory.repeats, "timed runs per kernel and size (the median is reported)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  mem->add_option("--warmup", g_memory.warmup, "untimed runs first (at least)")->capture_default_str()->check(CLI::NonNegativeNumber);
  mem->add_option("--warmup-ms", g_memory.warmup_ms, "warm up for at least this long (ms)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  mem->add_flag("--no-host", g_memory.no_host, "skip the host<->device copies");
  mem->add_flag("--no-peer", g_memory.no_peer, "skip the GPU<->GPU copies");
  mem->add_flag("--json", g_memory.json, "print one JSON object instead of the table");
  mem->footer("Method (kernels, bytes counted, timer): docs/bench.md.");

  auto* layer = bench->add_subcommand("layer", "a GPT block forward+backward: TFLOP/s overall and per part");
  layer->add_option("--device", g_layer.device, "auto (the first GPU if any), cpu, cuda or cuda:N")->capture_default_str();
  layer->add_option("--batch", g_layer.batch, "batch size (default 16 GPU, 2 CPU)")->check(CLI::PositiveNumber);
  layer->add_option("--seq", g_layer.seq, "sequence length (default 1024 GPU, 64 CPU)")->check(CLI::PositiveNumber);
  layer->add_option("--width", g_layer.width, "model width n_embd (default 768 GPU, 128 CPU)")->check(CLI::PositiveNumber);
  layer->add_option("--heads", g_layer.heads, "attention heads, dividing the width (default 12 GPU, 4 CPU)")
      ->check(CLI::PositiveNumber);
  layer->add_option("--dtype", g_layer.dtype, "bf16, f16, f32 (default bf16 GPU, f32 CPU)");
  layer->add_option("--repeats", g_layer.repeats, "timed runs (the median is reported)")->capture_default_str()->check(CLI::PositiveNumber);
  layer->add_option("--warmup", g_layer.warmup, "untimed runs first (at least)")->capture_default_str()->check(CLI::NonNegativeNumber);
  layer->add_option("--warmup-ms", g_layer.warmup_ms, "warm up for at least this long (ms)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  layer->add_flag("--json", g_layer.json, "print one JSON object instead of the table");
  layer->footer("Method (parts, FLOP and byte counts, timer): docs/bench.md.");

  auto* attn = bench->add_subcommand(
      "attention", "scaled dot-product attention forward and backward on each of forge's back-ends (cuDNN, flash)");
  attn->add_option("--device", g_attention.device, "auto (the first GPU if any), cpu, cuda or cuda:N")->capture_default_str();
  attn->add_option("--shape", g_attention.shapes,
                   "BxHxHKVxTxD[,full] (repeatable), e.g. 4x32x8x2048x128; default: T 1k..8k at 16k tokens for head "
                   "dims 64 (12/12 and 16/4 heads) and 128 (32/8 heads), causal")
      ->check(parser_check([](const std::string& s) { bench::parse_attention_shape(s); }, "SHAPE"));
  attn->add_option("--backends", g_attention.backends,
                   "comma-separated among cudnn, cudnn-det, flash, composed (GPU) or cpu; default cudnn,flash (GPU)");
  attn->add_option("--dtype", g_attention.dtype, "bf16 or f16 on a GPU (default bf16); f32 or f64 on the CPU");
  attn->add_option("--repeats", g_attention.repeats, "timed runs (the median is reported)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  attn->add_option("--warmup", g_attention.warmup, "untimed runs first")->capture_default_str()->check(CLI::NonNegativeNumber);
  attn->add_option("--layout", g_attention.layout,
                   "bhsd: every tensor (B, H, T, D)-contiguous; bshd: (B, T, H, D) memory viewed as (B, H, T, D), as "
                   "forge's GPT and LLaMA attention get them (on the CPU only the inputs)")
      ->capture_default_str()
      ->check(CLI::IsMember({"bhsd", "bshd"}));
  attn->add_flag("--json", g_attention.json, "print one JSON object instead of the table");
  attn->footer("Method (back-ends, FLOP count, timer): docs/bench.md. Beside PyTorch: benchmarks/attention/run.sh.");

  auto* roof = bench->add_subcommand("roofline", "arithmetic intensity vs achieved FLOP/s of every kernel, with an SVG plot");
  roof->add_option("--device", g_roofline.device, "auto (the first GPU if any), cpu, cuda or cuda:N")->capture_default_str();
  roof->add_option("--from", g_roofline.from, "a `forge bench gemm|memory|layer --json` file to plot instead of measuring (repeatable)")
      ->check(CLI::ExistingFile);
  roof->add_option("--svg", g_roofline.svg, "write the plot here (default roofline.svg)");
  roof->add_flag("--force", g_roofline.force, "replace --svg even when it is not a plot forge bench roofline wrote");
  roof->add_option("--repeats", g_roofline.repeats, "timed runs per measurement")->capture_default_str()->check(CLI::PositiveNumber);
  roof->add_flag("--json", g_roofline.json, "print one JSON object instead of the table");
  roof->footer("Method (ceilings, ridge point, counts): docs/bench.md.");

  auto* burn = bench->add_subcommand("burn", "sustained GEMM load with bitwise result checking; exits 1 on any mismatch");
  burn->add_option("--device", g_burn.device, "auto (the first GPU if any), cpu, cuda or cuda:N")->capture_default_str();
  burn->add_option("--seconds", g_burn.seconds, "how long to run")->capture_default_str()->check(CLI::PositiveNumber);
  burn->add_option("--size", g_burn.size, "M = N = K of the GEMM (default 8192 GPU, 1024 CPU)")->check(CLI::PositiveNumber);
  burn->add_option("--dtype", g_burn.dtype, "bf16, f16, f32 (default bf16 GPU, f32 CPU)");
  burn->add_option("--interval", g_burn.interval, "seconds between rows")->capture_default_str()->check(CLI::PositiveNumber);
  burn->add_option("--inject-error", g_burn.inject_error, "test hook: corrupt the result before check N")->group("");
  burn->add_flag("--json", g_burn.json, "print one JSON object instead of the table");
  burn->footer("Method (checking, NVML columns): docs/bench.md.");

  auto* coll = bench->add_subcommand(
      "collectives", "all_reduce, all_gather, reduce_scatter, broadcast, send/recv through forge's ProcessGroup");
  coll->add_option("--device", g_coll.device, "auto, cpu (MPI) or cuda (NCCL, one GPU per rank)")->capture_default_str();
  coll->add_option("--sizes", g_coll.sizes, "bytes: LO..HI (x2 steps, e.g. 8..1G) or a list (4K,1M); default 8..1G "
                                            "(GPU), 8..64M (CPU)");
  coll->add_option("--ops", g_coll.ops, "comma-separated subset of all_reduce,all_gather,reduce_scatter,broadcast,send_recv");
  coll->add_option("--dtype", g_coll.dtype, "f32, bf16 or f16")->capture_default_str();
  coll->add_option("--iters", g_coll.iters, "timed operations per size")->capture_default_str()->check(CLI::PositiveNumber);
  coll->add_option("--warmup", g_coll.warmup, "untimed operations first")->capture_default_str()->check(CLI::NonNegativeNumber);
  coll->add_flag("--json", g_coll.json, "print one JSON object instead of the table (rank 0)");
  coll->add_option("--node-size", g_coll.node_size, "simulated nodes: ranks per node (0 = the launch's ranks per host)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  coll->add_option("--dp-reduce", g_coll.dp_reduce, "flat or hierarchical (within each node first), as dist.dp_reduce")
      ->capture_default_str();
  coll->add_option("--link-gbps", g_coll.link_gbps, "simulated link between nodes, Gb/s (0 = none), as dist.link_gbps")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  coll->add_option("--link-latency-us", g_coll.link_latency_us, "its latency per ring step, as dist.link_latency_us")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  coll->add_option("--grad-compression", g_coll.grad_compression,
                   "none, or fp8: all_reduce and reduce_scatter as dist.grad_compression = \"fp8\" sends gradients")
      ->capture_default_str();
  coll->footer("Run under forge launch or mpirun for several ranks. Method and columns: docs/bench.md.");

  auto* cal = bench->add_subcommand(
      "calibrate", "an efficiency profile of this GPU (GEMMs, attention, copies) for forge plan --profile");
  cal->add_option("--device", g_calibrate.device, "auto (the first GPU), cuda or cuda:N")->capture_default_str();
  cal->add_option("--out", g_calibrate.out, "the profile's JSON file (required)")->required();
  cal->add_option("--gpu", g_calibrate.gpu, "the catalogue entry this GPU is (default: recognised from its name)");
  cal->add_option("--mnk", g_calibrate.mnk, "a GEMM shape MxNxK measured besides the grid (repeatable), e.g. a model's own")
      ->check(parser_check([](const std::string& s) { bench::parse_mnk(s); }, "MxNxK"));
  cal->add_option("--repeats", g_calibrate.repeats, "timed runs per measurement (the median is kept)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cal->add_flag("--quick", g_calibrate.quick, "a small grid (a first look; the shipped profiles use the full one)");
  cal->add_flag("--force", g_calibrate.force, "replace --out even if it is not a profile this command wrote");
  cal->footer("What is measured and how forge plan uses it: docs/plan.md (Efficiency profiles).");
  return bench;
}

int run_bench(const CLI::App& bench) {
  if (bench.get_subcommand("gemm")->parsed()) return run_gemm_command();
  if (bench.get_subcommand("memory")->parsed()) return run_memory_command();
  if (bench.get_subcommand("layer")->parsed()) return run_layer_command();
  if (bench.get_subcommand("attention")->parsed()) return run_attention_command();
  if (bench.get_subcommand("roofline")->parsed()) return run_roofline_command();
  if (bench.get_subcommand("burn")->parsed()) return run_burn_command();
  if (bench.get_subcommand("collectives")->parsed()) return run_collectives_command();
  if (bench.get_subcommand("calibrate")->parsed()) return run_calibrate_command();
  std::cerr << bench.help();
  return 2;
}

}  // namespace forge::app
