#include "forge/plan/gpu_catalog.h"

#include <algorithm>

#include "forge/core/error.h"
#include "forge/plan/names.h"

namespace forge::plan {

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::fp32: return "fp32";
    case Precision::tf32: return "tf32";
    case Precision::bf16: return "bf16";
    case Precision::fp16: return "fp16";
    case Precision::fp8: return "fp8";
  }
  return "?";
}

Precision parse_precision(const std::string& s) {
  const std::string n = normalize_name(s);
  if (n == "fp32" || n == "f32" || n == "float32") return Precision::fp32;
  if (n == "tf32") return Precision::tf32;
  if (n == "bf16" || n == "bfloat16") return Precision::bf16;
  if (n == "fp16" || n == "f16" || n == "float16" || n == "half") return Precision::fp16;
  if (n == "fp8") return Precision::fp8;
  FORGE_THROW("unknown precision '", s, "'; use fp32, tf32 (fp32 storage, TF32 tensor cores), bf16 or fp16 (mixed "
              "precision with f32 master weights) or fp8 (bf16 storage, FP8 GEMMs)");
}

double GpuSpec::peak_flops(Precision p) const {
  double t = 0;
  switch (p) {
    case Precision::fp32: t = fp32_tflops; break;
    case Precision::tf32: t = tf32_tflops; break;
    case Precision::bf16: t = bf16_tflops; break;
    case Precision::fp16: t = fp16_tflops; break;
    case Precision::fp8: t = fp8_tflops; break;
  }
  if (t <= 0) {
    std::string has;
    const std::pair<const char*, double> modes[] = {
        {"fp32", fp32_tflops}, {"tf32", tf32_tflops}, {"bf16", bf16_tflops}, {"fp16", fp16_tflops}, {"fp8", fp8_tflops}};
    for (const auto& [n, v] : modes)
      if (v > 0) has += (has.empty() ? "" : ", ") + std::string(n);
    FORGE_THROW("the ", name, " has no ", precision_name(p), " peak in the catalogue (it has: ", has,
                "); choose --precision among those, or give --peak-tflops");
  }
  return t * 1e12;
}

const std::vector<GpuSpec>& gpu_catalog() {
  static const std::vector<GpuSpec> table = [] {
    std::vector<GpuSpec> t;
    // name, aliases, mem GB, mem GB/s, fp32, tf32, bf16, fp16, fp8, nvlink, pcie, W, $/h, $, cpu, source
    t.push_back({"V100 SXM2 32GB", {"v100", "v100-32gb", "v100-sxm2"}, 32, 900, 15.7, 0, 0, 125, 0, 150, 16, 300, 0.6,
                 3000, false,
                 "NVIDIA Tesla V100 datasheet (SXM2: 15.7 TF FP32, 125 TF tensor FP16, 32 GB HBM2 at 900 GB/s, NVLink "
                 "300 GB/s, PCIe Gen3); no bf16/tf32"});
    t.push_back({"A100 SXM 40GB", {"a100-40gb", "a100-sxm-40gb", "a100-40g"}, 40, 1555, 19.5, 156, 312, 312, 0, 300, 32,
                 400, 1.2, 10000, false,
                 "NVIDIA A100 Tensor Core GPU datasheet (dense: 19.5 TF FP32, 156 TF TF32, 312 TF BF16/FP16; 40 GB HBM2 "
                 "1,555 GB/s; NVLink 600 GB/s; PCIe Gen4 64 GB/s)"});
    t.push_back({"A100 SXM 80GB", {"a100-80gb", "a100-sxm-80gb", "a100-80g", "a100-sxm4-80gb"}, 80, 2039, 19.5, 156, 312,
                 312, 0, 300, 32, 400, 1.5, 15000, false,
                 "NVIDIA A100 Tensor Core GPU datasheet (dense: 19.5 TF FP32, 156 TF TF32, 312 TF BF16/FP16; 80 GB "
                 "HBM2e 2,039 GB/s; NVLink 600 GB/s; PCIe Gen4 64 GB/s)"});
    t.push_back({"A800 SXM 80GB", {"a800", "a800-80gb", "a800-sxm"}, 80, 2039, 19.5, 156, 312, 312, 0, 200, 32, 400, 0, 0,
                 false,
                 "NVIDIA A800 Tensor Core GPU datasheet (nvidia.cn: A100 compute, NVLink 400 GB/s, 80 GB HBM2e 2,039 "
                 "GB/s)"});
    t.push_back({"H100 SXM", {"h100", "h100-sxm", "h100-sxm5", "h100-80gb"}, 80, 3350, 67, 494.7, 989.4, 989.4, 1978.9,
                 450, 64, 700, 2.5, 30000, false,
                 "NVIDIA H100 Tensor Core GPU datasheet (SXM, dense = half the sparse figures: 67 TF FP32, 495 TF TF32, "
                 "989 TF BF16/FP16, 1,979 TF FP8; 80 GB HBM3 3.35 TB/s; NVLink 900 GB/s; PCIe Gen5 128 GB/s)"});
    t.push_back({"H100 PCIe", {"h100-pcie"}, 80, 2000, 51, 378, 756, 756, 1513, 0, 64, 350, 2.0, 25000, false,
                 "NVIDIA H100 Tensor Core GPU datasheet (PCIe, dense: 51 TF FP32, 378 TF TF32, 756 TF BF16/FP16, 1,513 "
                 "TF FP8; 80 GB HBM2e 2 TB/s; PCIe Gen5 128 GB/s; NVLink bridge pairs only)"});
    t.push_back({"H800 SXM", {"h800", "h800-sxm"}, 80, 3350, 67, 494.7, 989.4, 989.4, 1978.9, 200, 64, 700, 0, 0, false,
                 "NVIDIA H800 datasheet (nvidia.cn: H100 SXM compute, NVLink 400 GB/s, 80 GB HBM3 3.35 TB/s)"});
    t.push_back({"H20", {"h20", "hgx-h20"}, 96, 4000, 44, 74, 148, 148, 296, 450, 64, 400, 0, 0, false,
                 "NVIDIA HGX H20 product specification (as published to partners and widely reported: 44 TF FP32, 74 TF "
                 "TF32, 148 TF BF16/FP16, 296 TF FP8 dense; 96 GB HBM3 4.0 TB/s; NVLink 900 GB/s)"});
    t.push_back({"H200 SXM", {"h200", "h200-sxm", "h200-141gb"}, 141, 4800, 67, 494.7, 989.4, 989.4, 1978.9, 450, 64, 700,
                 3.5, 35000, false,
                 "NVIDIA H200 Tensor Core GPU datasheet (SXM, dense = half the sparse figures: 989 TF BF16/FP16, 1,979 "
                 "TF FP8; 141 GB HBM3e 4.8 TB/s; NVLink 900 GB/s)"});
    t.push_back({"L40", {"l40", "l40-48gb"}, 48, 864, 90.5, 90.5, 181.05, 181.05, 362.1, 0, 32, 300, 1.0, 8000, false,
                 "NVIDIA L40 datasheet (dense: 90.5 TF FP32 and TF32, 181 TF BF16/FP16, 362 TF FP8; 48 GB GDDR6 864 GB/s; "
                 "PCIe Gen4 64 GB/s; no NVLink)"});
    t.push_back({"RTX 3090 Ti", {"rtx3090ti", "3090ti", "rtx-3090-ti"}, 24, 1008, 40, 40, 80, 80, 0, 0, 32, 450, 0.3, 1200,
                 false,
                 "NVIDIA Ampere GA102 architecture whitepaper, scaled to the 3090 Ti's 84 SMs at 1.86 GHz (40 TF FP32, "
                 "80 TF FP16/BF16 tensor with FP32 accumulate); 24 GB GDDR6X 1,008 GB/s; PCIe Gen4; NVLink bridge pairs "
                 "only"});
    t.push_back({"RTX 4090", {"rtx4090", "4090", "rtx-4090"}, 24, 1008, 82.6, 82.6, 165.2, 165.2, 330.3, 0, 32, 450, 0.4,
                 1800, false,
                 "NVIDIA Ada Lovelace architecture whitepaper, GeForce RTX 4090 (82.6 TF FP32, 165.2 TF FP16/BF16 and "
                 "330.3 TF FP8 tensor with FP32 accumulate, dense); 24 GB GDDR6X 1,008 GB/s; PCIe Gen4; no NVLink and no "
                 "peer-to-peer (GPU-GPU traffic crosses host memory: --pcie 12 is more realistic)"});
    t.push_back({"Ascend 910B", {"910b", "ascend910b", "ascend-910b"}, 64, 1600, 0, 0, 320, 320, 0, 196, 64, 400, 0, 0,
                 false,
                 "Huawei publishes no per-chip datasheet; figures as widely reported for the Ascend 910B (Atlas 800T A2): "
                 "~320 TF FP16/BF16, 64 GB HBM2e ~1.6 TB/s, HCCS 392 GB/s; verify for your part"});
    return t;
  }();
  return table;
}

const GpuSpec& find_gpu(const std::string& name) {
  const std::string q = normalize_name(name);
  std::vector<std::string> all;
  for (const auto& g : gpu_catalog()) {
    if (normalize_name(g.name) == q) return g;
    for (const auto& a : g.aliases)
      if (normalize_name(a) == q) return g;
    all.push_back(g.aliases.front());
  }
  all.push_back("cpu");
  std::string list;
  for (const auto& n : all) list += (list.empty() ? "" : ", ") + n;
  FORGE_THROW("unknown GPU '", name, "'", did_you_mean(nearest_names(name, all)), " (the catalogue: ", list,
              "; forge plan --list-gpus shows each with its figures)");
}

}  // namespace forge::plan
