#pragma once
// The host as a `forge plan` device ("--gpu cpu").
#include "forge/plan/gpu_catalog.h"

namespace forge::plan {

// RAM from the OS; `peak_tflops` (f32) as given, or measured with measure_cpu_peak_tflops()
// when <= 0.
GpuSpec cpu_device(double peak_tflops);
// Best f32 GEMM throughput of forge's CPU backend over a few sizes (about a second).
double measure_cpu_peak_tflops();

}  // namespace forge::plan
