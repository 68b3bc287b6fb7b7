// forge bench: runs the measurements of src/forge/bench (method: docs/bench.md).
#include "bench_command.h"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "forge/bench/gemm.h"
#include "forge/core/error.h"

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
  bool json = false;
};

GemmArgs g_gemm;

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
  std::printf("C = A B, row-major, randn inputs; median of %d timed runs after warm-up (%s); FLOPs = 2*M*N*K\n\n",
              r.options.repeats, r.timer.c_str());
  std::printf("  %-5s %7s %7s %7s %11s %11s %10s %8s\n", "dtype", "M", "N", "K", "median ms", "min ms",
              cpu ? "GFLOP/s" : "TFLOP/s", "% peak");
  for (const auto& x : r.results) {
    const double rate = cpu ? x.tflops * 1e3 : x.tflops;
    char pct[32] = "-";
    if (x.peak_tflops > 0) std::snprintf(pct, sizeof(pct), "%.1f", x.peak_pct);
    std::printf("  %-5s %7lld %7lld %7lld %11.4f %11.4f %10.1f %8s\n", x.dtype.c_str(),
                static_cast<long long>(x.shape.m), static_cast<long long>(x.shape.n),
                static_cast<long long>(x.shape.k), x.median_ms, x.min_ms, rate, pct);
  }
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
  const bench::GemmReport r = bench::run_gemm(o);
  if (g_gemm.json) {
    nlohmann::json j = bench::to_json(r);
    j["forge_version"] = FORGE_VERSION;
    std::cout << j.dump(2) << "\n";
  } else {
    print_gemm_table(r);
  }
  return 0;
}

}  // namespace

CLI::App* add_bench_command(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "measure this machine (GEMM throughput, ...); method: docs/bench.md");
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
  gemm->add_flag("--json", g_gemm.json, "print one JSON object instead of the table");
  gemm->footer("Method (timer, warm-up, repeats, FLOP count): docs/bench.md.");
  return bench;
}

int run_bench(const CLI::App& bench) {
  if (bench.get_subcommand("gemm")->parsed()) return run_gemm_command();
  std::cerr << bench.help();
  return 2;
}

}  // namespace forge::app
