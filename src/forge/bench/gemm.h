#pragma once
// `forge bench gemm` (docs/bench.md): the throughput of forge's matrix product, C = A B with
// row-major A (M x K), B (K x N) and a contiguous C, on random inputs (randn, never zeros).
// On a GPU it goes through the cuBLASLt path training uses (cuda::matmul, the kernel behind
// ops::matmul) and is timed with CUDA events; fp8 (e4m3) through cuda::fp8_gemm_bf16_out
// (cuBLASLt, D bf16 = A B_t^T with B_t (N x K), per-tensor scales 1, f32 accumulation;
// Note [FP8 GEMM layout] in backends/cuda/gemm_fp8.h) on GPUs of compute capability >= 8.9,
// reported as skipped elsewhere; on the CPU through ops::matmul (OpenBLAS),
// timed with steady_clock. Each (dtype, shape): warm-up (>= warmup_runs runs and >=
// warmup_ms), then `repeats` timed runs; the median is reported. FLOPs = 2 M N K.
//
//   bench::GemmOptions o;
//   o.device = Device::cpu();
//   o.shapes = bench::square_shapes(bench::parse_size_list("64,128"));
//   o.dtypes = {"f32"};
//   bench::GemmReport r = bench::run_gemm(o);   // r.results[i].gflops
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "forge/core/device.h"

namespace forge::bench {

struct GemmShape {
  int64_t m = 0, n = 0, k = 0;
  friend bool operator==(const GemmShape&, const GemmShape&) = default;
};

// "128,1024,4096" -> {128, 1024, 4096}; "128..2048" -> the powers of two from 128 to 2048
// (both ends powers of two); items may mix the two ("64,128..512"). Sizes must be positive
// integers; throws forge::Error naming the bad item otherwise.
std::vector<int64_t> parse_size_list(const std::string& spec);
// "4096x4096x1024" (also "X") -> {m=4096, n=4096, k=1024}; throws forge::Error otherwise.
GemmShape parse_mnk(const std::string& spec);
// The powers of two from lo to hi (both powers of two, lo <= hi).
std::vector<int64_t> powers_of_two(int64_t lo, int64_t hi);
std::vector<GemmShape> square_shapes(const std::vector<int64_t>& sizes);

// 2 M N K: one multiply and one add per term of each output's dot product.
double gemm_flops(const GemmShape& s);

// The dtypes `forge bench gemm` knows: f32, tf32 (f32 storage, TF32 tensor cores), bf16, f16,
// fp8 (alias e4m3), f64. "f32,bf16" -> {"f32", "bf16"}; throws forge::Error for an unknown
// name or one the device cannot run (the CPU: f32, f64, and fp8, which run_gemm reports as
// skipped there, as on GPUs without FP8 support).
std::vector<std::string> parse_dtype_list(const std::string& spec, Device device);
std::vector<std::string> default_dtypes(Device device);      // cuda: f32 tf32 bf16 f16 fp8; cpu: f32 f64
std::vector<int64_t> default_sizes(Device device);           // cuda: 128..16384; cpu: 128..2048

// The median of `v` (the mean of the middle two for an even count); 0 for an empty vector.
double median(std::vector<double> v);

struct GemmOptions {
  Device device = Device::cpu();
  std::vector<GemmShape> shapes;
  std::vector<std::string> dtypes;
  int warmup_runs = 3;       // at least this many untimed runs ...
  double warmup_ms = 50;     // ... and at least this long (wall clock)
  int repeats = 20;          // timed runs; the median is reported
  // CUDA, not fp8: each (dtype, shape) measured twice, with cuBLASLt's heuristic first choice
  // (GEMM tuning off) and with the tuned algorithm (Note [GEMM algorithm tuning] in
  // backends/cuda/blaslt.h). Otherwise the process's setting (FORGE_GEMM_TUNING) is measured.
  bool compare_tuning = false;
};

struct GemmResult {
  std::string dtype;
  GemmShape shape;
  double flops = 0;          // gemm_flops(shape)
  double median_ms = 0, min_ms = 0, max_ms = 0;
  double tflops = 0;         // flops / median time
  double peak_tflops = 0;    // the catalogue's dense peak for the dtype (0: unknown)
  double peak_pct = 0;       // 100 tflops / peak_tflops (0: unknown)
  int input_sets = 1;        // distinct (A, B) pairs the runs rotate through
  double heuristic_median_ms = 0;  // compare_tuning: the median with the heuristic's choice (0: not measured)
};

struct GemmSkip {
  std::string dtype;
  std::string shape;         // "" for the whole dtype
  std::string reason;
};

struct GemmReport {
  std::string device;        // "cuda:0", "cpu"
  std::string device_name;   // "NVIDIA H100 80GB HBM3", the CPU model, ...
  std::string catalogue;     // the GPU catalogue entry ("" when unknown / CPU)
  std::string timer;         // "cuda events" / "steady_clock"
  std::string gemm_tuning;   // CUDA: "cached" / "off" (the process's setting) or "compare"; "" on the CPU
  int64_t gemm_fallback_shapes = 0;  // CUDA: GEMM shapes without a cuBLASLt algorithm so far (cuda::gemm_tuning_stats)
  GemmOptions options;
  std::vector<GemmResult> results;
  std::vector<GemmSkip> skipped;
};

// Throws forge::Error for an empty shape or dtype list, repeats < 1, or a CUDA device in a
// build without CUDA. A (dtype, shape) that fails (out of memory) is recorded in `skipped`.
GemmReport run_gemm(const GemmOptions& opt);

nlohmann::json to_json(const GemmReport& r);

}  // namespace forge::bench
