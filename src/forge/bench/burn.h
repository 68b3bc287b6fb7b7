#pragma once
// `forge bench burn` (docs/bench.md): sustained GEMM load with result checking. On a GPU, bf16
// C = A B (8192^3 by default) through cuda::matmul (the cuBLASLt path of ops::matmul) back to
// back; on the CPU, f32 through ops::matmul (OpenBLAS). The product is computed once at the start
// as the reference; after every chunk of GEMMs (~0.1 s of work) the latest result is compared with
// it bit for bit (cuBLASLt and OpenBLAS are deterministic for one shape, algorithm and thread
// count), and every differing 32-bit word counts as an error. One row every `interval_s`: elapsed
// time, TFLOP/s over the interval, and on a GPU the SM clock, temperature and power from NVML.
//
//   bench::BurnOptions o;  o.device = Device::cpu();  o.seconds = 0.5;  o.size = 128;
//   bench::BurnReport r = bench::run_burn(o, [](const bench::BurnRow& row) { ... });
//   r.errors == 0
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "forge/core/device.h"
#include "forge/core/dtype.h"

namespace forge::bench {

struct BurnOptions {
  Device device = Device::cpu();
  double seconds = 60;
  int64_t size = 0;              // M = N = K; 0: 8192 (GPU), 1024 (CPU)
  DType dtype = DType::f32;      // the GPU default is bf16 (default_burn_dtype)
  double interval_s = 2;         // one row per interval
  double chunk_s = 0.1;          // GEMMs queued between two checks
  // Test hook: before the check with this 0-based index, flip one bit of the result (-1: never).
  int inject_error_at_check = -1;
};

int64_t default_burn_size(Device device);   // 8192 (GPU), 1024 (CPU)
DType default_burn_dtype(Device device);    // bf16 (GPU), f32 (CPU)

struct BurnRow {
  double t_s = 0;              // since the start of the timed loop
  double tflops = 0;           // GEMM FLOPs in the interval / its wall time
  int64_t iterations = 0;      // GEMMs so far
  int64_t checks = 0;          // comparisons so far
  int64_t errors = 0;          // differing words so far
  int sm_clock_mhz = -1;       // NVML (-1: unknown / CPU)
  int temperature_c = -1;
  double power_w = -1;
};

struct BurnReport {
  std::string device, device_name;
  BurnOptions options;         // with size and dtype resolved
  double flops_per_gemm = 0;   // 2 n^3
  std::vector<BurnRow> rows;
  int64_t iterations = 0, checks = 0, errors = 0;
  double seconds = 0;          // the timed loop's length
  double mean_tflops = 0;      // all iterations / seconds
  bool nvml = false;
  std::string nvml_note;
};

// Runs the burn; `on_row` (may be empty) sees each row as it is made (to print it live).
BurnReport run_burn(const BurnOptions& opt, const std::function<void(const BurnRow&)>& on_row = {});
nlohmann::json to_json(const BurnReport& r);

}  // namespace forge::bench
