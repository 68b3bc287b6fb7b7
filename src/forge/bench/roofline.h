#pragma once
// `forge bench roofline` (docs/bench.md): every kernel the other benchmarks measure (GEMMs per
// dtype, the elementwise multiply / STREAM triad, the GPT block's parts) as a point (arithmetic
// intensity = FLOPs / bytes, achieved FLOP/s) under the measured ceilings: the bandwidth roof
// (the best copy GB/s) and one compute roof per GEMM dtype (its best TFLOP/s), with the ridge
// point = peak FLOP/s / bandwidth. Built from the `--json` documents of bench gemm, memory and
// layer (measured on the spot, or read from files); drawn as a hand-written log-log SVG.
//
//   bench::Roofline r = bench::roofline_from({gemm_json, memory_json, layer_json});
//   std::string svg = bench::roofline_svg(r);
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "forge/core/device.h"

namespace forge::bench {

struct RooflinePoint {
  std::string name;   // "gemm bf16 4096", "multiply 16M", "layer qkv", ...
  std::string kind;   // gemm, memory, attention, norm, activation, residual
  std::string dtype;
  double flops = 0;   // counted FLOPs (layer norms/activations/residuals: rough op counts)
  double bytes = 0;   // bytes read + written at least
  double ms = 0;      // median time
  double intensity() const { return bytes > 0 ? flops / bytes : 0; }
  double tflops() const { return ms > 0 ? flops / (ms * 1e-3) / 1e12 : 0; }
  double gbs() const { return ms > 0 ? bytes / (ms * 1e-3) / 1e9 : 0; }
};

struct RooflineCeiling {
  std::string dtype;  // the GEMM dtype whose best throughput it is
  double tflops = 0;
  std::string from;   // "gemm bf16 8192"
};

struct Roofline {
  std::string device, device_name;
  double bandwidth_gbs = 0;   // the best copy (GPU "copy", CPU "stream_copy")
  std::string bandwidth_from; // "copy 1G (kernel)"
  std::vector<RooflineCeiling> compute;  // best first
  std::vector<RooflinePoint> points;
};

// FLOP/byte where the roof turns: peak / bandwidth.
double ridge_point(double peak_tflops, double bandwidth_gbs);
// min(peak, bandwidth x intensity), TFLOP/s.
double attainable_tflops(double intensity, double peak_tflops, double bandwidth_gbs);
// The roof a point sits under: the ceiling of its dtype, else f32's, else the highest.
const RooflineCeiling* ceiling_for(const Roofline& r, const std::string& dtype);

// Adds the points and ceilings of one `forge bench gemm|memory|layer --json` document (others
// are ignored); the device fields come from the first document.
void add_to_roofline(Roofline& r, const nlohmann::json& doc);
Roofline roofline_from(const std::vector<nlohmann::json>& docs);

struct RooflineOptions {
  Device device = Device::cpu();
  int repeats = 10;
  int warmup_runs = 2;
  double warmup_ms = 20;
  std::vector<std::string> from;   // JSON files instead of measuring
};
// Measures the small set (GPU: gemm bf16/f32 at 1024, 4096, 8192; memory 1M, 16M, 256M; the
// default layer. CPU: gemm f32/f64 at 256, 512; memory 1M, 4M; the default CPU layer) or reads
// opt.from.
Roofline run_roofline(const RooflineOptions& opt);

nlohmann::json to_json(const Roofline& r);
// A log-log SVG plot: x FLOP/byte, y FLOP/s; roofs as lines, ridge points marked, points labelled.
std::string roofline_svg(const Roofline& r);

}  // namespace forge::bench
