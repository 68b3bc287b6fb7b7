// The host as a `forge plan` device: its RAM and a measured f32 GEMM peak (kept apart from
// gpu_catalog.cpp, which is a table of facts that telemetry/mfu also reads).
#include "forge/plan/cpu_device.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "forge/core/generator.h"
#include "forge/ops/creation.h"
#include "forge/ops/matmul.h"

namespace forge::plan {

double measure_cpu_peak_tflops() {
  double best = 0;
  Generator gen(0);  // a private stream: measuring leaves the default generator alone
  for (int64_t n : {256, 512, 1024}) {
    const Tensor a = randn({n, n}, {}, &gen), b = randn({n, n}, {}, &gen);
    (void)ops::matmul(a, b);  // warm up threads and caches
    const int reps = n >= 1024 ? 2 : 5;
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) (void)ops::matmul(a, b);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * static_cast<double>(n * n * n) * reps / s);
  }
  return best / 1e12;
}

GpuSpec cpu_device(double peak_tflops) {
  GpuSpec c;
  c.name = "cpu";
  c.aliases = {"cpu"};
  const double ram = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  c.memory_gb = ram / 1e9;
  c.memory_bw_gbs = 20;  // a conservative host figure; only the optimizer step uses it
  const bool measured = peak_tflops <= 0;
  const double p = measured ? measure_cpu_peak_tflops() : peak_tflops;
  c.fp32_tflops = c.tf32_tflops = p;
  c.is_cpu = true;
  c.source = measured ? "this machine: RAM from the OS, f32 peak measured with forge's CPU GEMM (best of 256-1024 "
                        "square matmuls)"
                      : "this machine: RAM from the OS, f32 peak from --peak-tflops";
  return c;
}

}  // namespace forge::plan
