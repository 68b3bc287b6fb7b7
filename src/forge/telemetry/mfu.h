#pragma once
// Model FLOPs utilisation (MFU): the model's arithmetic per second over the device's dense
// peak for the compute dtype.
//
// Note [MFU]
// FLOPs per trained token (forward + backward) of a decoder-only transformer, following
// PaLM (Chowdhery et al. 2022, appendix B) and llm.c:
//     6·N + 12·L·T·d
// - N: the parameters that take part in a matrix multiply, i.e. all parameters except
//   embedding tables that are only looked up (GPT's learned positions; LLaMA's input
//   embedding, whose output head is a separate matrix). A tied GPT input/output matrix is
//   counted once, as the output head. 2 FLOPs per multiply-add forward, 4 backward: 6·N.
//   (Norm and bias parameters are counted too; they are < 0.1% of N.)
// - 12·L·T·d: attention's two T×T products (QKᵀ and PV) per layer, forward and backward,
//   for context T and width d, without halving for the causal mask (the convention of
//   PaLM and llm.c, so MFUs compare across tools).
// Recomputation (activation checkpointing) is not counted: that would be hardware FLOPs
// utilisation, not MFU. The peak is the datasheet's DENSE tensor-core figure for the
// dtype (never the 2:4-sparse one), from plan/gpu_catalog; unknown devices (and CPUs) give
// no MFU rather than a made-up one.
#include <optional>
#include <string>

#include "forge/core/device.h"
#include "forge/core/dtype.h"

#include <cstdint>

namespace forge::telemetry {

double transformer_flops_per_token(double matmul_params, int64_t n_layer, int64_t seq_len, int64_t width);

// The dense peak FLOP/s of `device` in `dtype` (f32 means plain FP32, not TF32), if the GPU
// catalogue knows the device; nullopt for the CPU and unknown GPUs.
std::optional<double> device_peak_flops(Device device, DType dtype);

// The GPU catalogue's name for a driver-reported device name ("NVIDIA H100 80GB HBM3" ->
// "H100 SXM"); nullopt for form factors the catalogue does not list (H100 NVL, A100 PCIe, ...).
std::optional<std::string> catalogue_name(const std::string& device_name);

// "NVIDIA H100 80GB HBM3" for a GPU; "cpu" for the CPU.
std::string device_name(Device device);

}  // namespace forge::telemetry
