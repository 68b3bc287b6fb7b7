#pragma once
// The accelerator catalogue behind `forge plan --gpu NAME`: dense (non-sparse) peak
// throughput per precision, memory and its bandwidth, links, power, an indicative price, and
// where each figure comes from.
//
// Peaks are the vendor's dense figures (the "with sparsity" numbers halved where the vendor
// quotes only those); for GeForce cards the tensor-core figures with FP32 accumulation (what
// mixed-precision training uses), which are half of the FP16-accumulate ones. A zero means
// the device has no such mode (V100: no bf16/tf32/fp8). Link figures are per GPU and per
// direction (NVLink "900 GB/s" bidirectional = 450 GB/s each way); `nvlink` is 0 for cards
// whose NVLink only bridges pairs (RTX 3090 Ti, H100 PCIe): collectives over more than two
// of them go through PCIe. Prices are indicative (2024-25 USD, they vary widely): override
// them with --price-hour / --price-gpu.
//
// "cpu" (cpu_device.h) is the host itself: its memory is the machine's RAM and its peak is
// measured (an f32 GEMM through forge's CPU backend) unless --peak-tflops gives one.
//
// This file and gpu_catalog.cpp include nothing above core: telemetry/mfu reads the peaks.
#include <string>
#include <vector>

namespace forge::plan {

enum class Precision { fp32, tf32, bf16, fp16, fp8 };
const char* precision_name(Precision p);
Precision parse_precision(const std::string& s);  // throws with the valid names

struct GpuSpec {
  std::string name;                  // "H100 SXM"
  std::vector<std::string> aliases;  // "h100", "h100-sxm", "h100-sxm5"
  double memory_gb = 0;              // device memory, 1e9 bytes
  double memory_bw_gbs = 0;          // device memory bandwidth, GB/s
  double fp32_tflops = 0;            // dense peaks, TFLOP/s (0: not supported)
  double tf32_tflops = 0;
  double bf16_tflops = 0;
  double fp16_tflops = 0;
  double fp8_tflops = 0;
  double nvlink_gbs = 0;             // per GPU, per direction, all-to-all within a node (0: none)
  double pcie_gbs = 0;               // host link per direction
  double tdp_w = 0;                  // board power
  double rent_per_hour = 0;          // indicative on-demand USD per GPU-hour (0: unknown)
  double price_usd = 0;              // indicative purchase price per GPU (0: unknown)
  bool is_cpu = false;
  std::string source;                // vendor datasheet / whitepaper the figures come from
  // The dense peak for `p` in FLOP/s; throws forge::Error naming the GPU and the modes it has
  // when it has no such mode.
  double peak_flops(Precision p) const;
};

const std::vector<GpuSpec>& gpu_catalog();
// By name or alias (case-, space-, '-'-insensitive). Throws forge::Error with the nearest
// names and the full list.
const GpuSpec& find_gpu(const std::string& name);

}  // namespace forge::plan
