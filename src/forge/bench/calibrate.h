#pragma once
// `forge bench calibrate` (docs/plan.md, Efficiency profiles): the measurements behind an
// efficiency profile of this GPU (plan/gpu_profile.h, Note [efficiency profiles]), which
// `forge plan --profile FILE` prices each kernel of a step from:
//   GEMMs       per precision (bf16, and fp8 where the GPU has it), each shape timed after 300 ms
//               of back-to-back products (the clocks a step's sustained load leaves): square products 1024..16384
//               and the products of transformer widths at m = 4096 and 16384 tokens (n, k in
//               768..16384), plus `extra` shapes (e.g. a config's own: calibrate_shapes); the
//               sustained rate and k_half fitted to them (plan::fit_gemm), every point kept;
//   attention   forge bench attention's causal shapes (T 1k..8k, head sizes 64 and 128) on the
//               back-end training takes (cuDNN's fused attention, else forge's flash kernels);
//   memory      the copy bandwidth of forge bench memory at 256M f32 elements (2 GB each way).
// Microbenchmarks of the GPU only: no training run goes into a profile.
#include <cstdint>
#include <string>
#include <vector>

#include "forge/bench/gemm.h"
#include "forge/core/device.h"
#include "forge/plan/gpu_profile.h"

namespace forge::bench {

struct CalibrateOptions {
  Device device = Device::cuda(0);
  std::vector<GemmShape> extra;  // shapes measured besides the grid (a model's own)
  int repeats = 20;
  bool quick = false;            // fewer shapes (tests, a first look)
};

// The GEMM shapes of the grid (`quick`: a small one).
std::vector<GemmShape> calibrate_gemm_shapes(bool quick);

// Runs the measurements on a CUDA device and returns the profile (gpu: the catalogue entry of the
// device; measured_on: its name; source: what was measured, with forge's version and the date).
// Throws forge::Error on the CPU, or on a GPU the catalogue does not know (name it with --gpu).
plan::GpuProfile calibrate(const CalibrateOptions& opt, const std::string& gpu_override = "");

}  // namespace forge::bench
