#include "forge/bench/burn.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "forge/autograd/grad_mode.h"
#include "forge/bench/gemm.h"
#include "forge/bench/host_info.h"
#include "forge/bench/nvml.h"
#include "forge/core/error.h"
#include "forge/ops/creation.h"
#include "forge/ops/matmul.h"
#include "forge/telemetry/mfu.h"

#ifdef FORGE_WITH_CUDA
#include "forge/backends/cuda/bench_kernels.h"
#include "forge/backends/cuda/device_info.h"
#include "forge/backends/cuda/event_timer.h"
#include "forge/backends/cuda/matmul.h"
#endif

namespace forge::bench {

namespace {

using Clock = std::chrono::steady_clock;

double since_s(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Differing 32-bit words of two CPU tensors of one size (a trailing partial word counts as one).
int64_t count_mismatches_cpu(const Tensor& a, const Tensor& b) {
  const auto* pa = static_cast<const unsigned char*>(a.data_ptr());
  const auto* pb = static_cast<const unsigned char*>(b.data_ptr());
  const size_t n = a.nbytes();
  int64_t bad = 0;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    uint32_t x = 0, y = 0;
    std::memcpy(&x, pa + i, 4);
    std::memcpy(&y, pb + i, 4);
    bad += x != y ? 1 : 0;
  }
  if (i < n && std::memcmp(pa + i, pb + i, n - i) != 0) ++bad;
  return bad;
}

}  // namespace

int64_t default_burn_size(Device device) { return device.is_cuda() ? 8192 : 1024; }
DType default_burn_dtype(Device device) { return device.is_cuda() ? DType::bf16 : DType::f32; }

BurnReport run_burn(const BurnOptions& opt_in, const std::function<void(const BurnRow&)>& on_row) {
  BurnOptions opt = opt_in;
  if (opt.size == 0) opt.size = default_burn_size(opt.device);
  FORGE_CHECK(opt.size > 0, "bench burn: --size must be positive, got ", opt.size);
  FORGE_CHECK(opt.seconds > 0, "bench burn: --seconds must be positive, got ", opt.seconds);
  FORGE_CHECK(opt.interval_s > 0, "bench burn: --interval must be positive, got ", opt.interval_s);
  FORGE_CHECK(opt.chunk_s > 0, "bench burn: the chunk length must be positive");
  FORGE_CHECK(opt.dtype == DType::f32 || opt.dtype == DType::bf16 || opt.dtype == DType::f16 || opt.dtype == DType::f64,
              "bench burn: dtype must be f32, bf16, f16 or f64, got ", dtype_name(opt.dtype));
  FORGE_CHECK(opt.device.is_cuda() || opt.dtype == DType::f32 || opt.dtype == DType::f64,
              "bench burn: the CPU runs f32 or f64 (OpenBLAS), got ", dtype_name(opt.dtype));
#ifndef FORGE_WITH_CUDA
  FORGE_CHECK(opt.device.is_cpu(), "bench burn: ", opt.device.str(), " requested but forge was built without CUDA");
#endif
  NoGradGuard no_grad;
  BurnReport rep;
  rep.options = opt;
  rep.device = opt.device.str();
  rep.flops_per_gemm = gemm_flops({opt.size, opt.size, opt.size});
  const bool cuda = opt.device.is_cuda();
  [[maybe_unused]] const int dev = cuda ? opt.device.index : -1;  // used only with CUDA

  const int64_t n = opt.size;
  const TensorOptions to{.dtype = opt.dtype, .device = opt.device};
  Generator gen(777);
  const Tensor a = randn({n, n}, to, &gen);
  const Tensor b = randn({n, n}, to, &gen);
  Tensor out = empty({n, n}, to);
  Tensor counter;
  std::function<void()> gemm;
  std::function<void()> sync = [] {};
#ifdef FORGE_WITH_CUDA
  Nvml nvml_holder;  // loaded for GPUs only (below)
  nvmlDevice_t nvml_dev = nullptr;
#endif
  if (cuda) {
#ifdef FORGE_WITH_CUDA
    rep.device_name = telemetry::device_name(opt.device);
    gemm = [&] { cuda::matmul(a, b, out); };
    sync = [dev] { cuda::synchronize_current_stream(dev); };
    counter = zeros({1}, {.dtype = DType::i64, .device = opt.device});
    rep.nvml = nvml_holder.ok();
    rep.nvml_note = nvml_holder.note();
    if (rep.nvml) nvml_dev = nvml_holder.device(cuda::device_properties(dev).pci_bus_id, dev);
#endif
  } else {
    rep.device_name = host_info().cpu_model;
    gemm = [&] { out.copy_(ops::matmul(a, b)); };
    rep.nvml_note = "not used on the CPU";
  }

  // The reference: the first product after a warm-up run (cuBLASLt picks and caches its plan).
  gemm();
  sync();
  gemm();
  const Tensor ref = out.clone();
  sync();
  // Chunk length: as many GEMMs as take ~chunk_s, from one timed run.
  const auto tc = Clock::now();
  gemm();
  sync();
  const double one_s = std::max(since_s(tc), 1e-6);
  const int64_t chunk = std::max<int64_t>(1, static_cast<int64_t>(opt.chunk_s / one_s));

  int64_t cpu_errors = 0;
  const auto read_errors = [&]() -> int64_t {
    if (!cuda) return cpu_errors;
    return counter.to(Device::cpu()).item<int64_t>();
  };
  const auto t0 = Clock::now();
  auto row_t = t0;
  int64_t row_iters = 0;
  while (true) {
    for (int64_t i = 0; i < chunk; ++i) gemm();
    if (rep.checks == opt.inject_error_at_check) {
      if (cuda) {
#ifdef FORGE_WITH_CUDA
        cuda::bench_flip_bit(out, static_cast<int64_t>(out.nbytes()) / 2);
#endif
      } else {
        static_cast<unsigned char*>(out.data_ptr())[out.nbytes() / 2] ^= 1u;
      }
    }
    if (cuda) {
#ifdef FORGE_WITH_CUDA
      cuda::bench_count_mismatches(out, ref, counter);
#endif
    } else {
      cpu_errors += count_mismatches_cpu(out, ref);
    }
    sync();
    ++rep.checks;
    rep.iterations += chunk;
    row_iters += chunk;
    const double t = since_s(t0);
    const bool done = t >= opt.seconds;
    const double dt = std::chrono::duration<double>(Clock::now() - row_t).count();
    if (done || dt >= opt.interval_s) {
      BurnRow row;
      row.t_s = t;
      row.tflops = dt > 0 ? static_cast<double>(row_iters) * rep.flops_per_gemm / dt / 1e12 : 0;
      row.iterations = rep.iterations;
      row.checks = rep.checks;
      row.errors = read_errors();
#ifdef FORGE_WITH_CUDA
      if (cuda && rep.nvml) {
        const NvmlSample s = nvml_holder.sample(nvml_dev);
        row.sm_clock_mhz = s.sm_clock_mhz;
        row.temperature_c = s.temperature_c;
        row.power_w = s.power_w;
      }
#endif
      rep.rows.push_back(row);
      if (on_row) on_row(row);
      row_t = Clock::now();
      row_iters = 0;
    }
    if (done) break;
  }
  rep.seconds = since_s(t0);
  rep.errors = read_errors();
  rep.mean_tflops = rep.seconds > 0 ? static_cast<double>(rep.iterations) * rep.flops_per_gemm / rep.seconds / 1e12 : 0;
  return rep;
}

nlohmann::json to_json(const BurnReport& r) {
  nlohmann::json j;
  j["benchmark"] = "burn";
  j["device"] = r.device;
  j["device_name"] = r.device_name;
  j["method"] = {{"gemm", std::to_string(r.options.size) + "^3 " + dtype_name(r.options.dtype)},
                 {"path", r.device == "cpu" ? "ops::matmul (OpenBLAS)" : "cuda::matmul (cuBLASLt)"},
                 {"check", "latest result vs the reference computed at start, bitwise per 32-bit word"},
                 {"chunk_s", r.options.chunk_s},
                 {"interval_s", r.options.interval_s},
                 {"flops", "2*n^3 per GEMM; TFLOP/s = GEMMs in the interval * flops / wall time"}};
  j["size"] = r.options.size;
  j["dtype"] = dtype_name(r.options.dtype);
  j["seconds"] = r.seconds;
  j["iterations"] = r.iterations;
  j["checks"] = r.checks;
  j["errors"] = r.errors;
  j["mean_tflops"] = r.mean_tflops;
  j["nvml"] = {{"available", r.nvml}, {"note", r.nvml_note}};
  auto opt = [](double v) { return v < 0 ? nlohmann::json(nullptr) : nlohmann::json(v); };
  nlohmann::json rows = nlohmann::json::array();
  for (const BurnRow& x : r.rows)
    rows.push_back({{"t_s", x.t_s},
                    {"tflops", x.tflops},
                    {"iterations", x.iterations},
                    {"checks", x.checks},
                    {"errors", x.errors},
                    {"sm_clock_mhz", opt(x.sm_clock_mhz)},
                    {"temperature_c", opt(x.temperature_c)},
                    {"power_w", opt(x.power_w)}});
  j["rows"] = rows;
  return j;
}

}  // namespace forge::bench
