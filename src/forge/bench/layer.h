#pragma once
// `forge bench layer` (docs/bench.md): one GPT block (nn::GPTBlock: pre-LN, causal multi-head
// attention through ops::scaled_dot_product_attention, a 4x GELU MLP) forward + backward at a
// given (batch, seq, width, heads, dtype), timed as a whole and part by part, each part run alone
// with autograd on inputs of its shape through the same ops the block uses.
//
// Model FLOPs per forward (h = width, b = batch, s = seq):
//   ffn       = 16 b s h^2           (mlp fc 8 b s h^2 + mlp proj 8 b s h^2)
//   attention = 8 b s h^2 + 4 b s^2 h (qkv 6 b s h^2 + out proj 2 b s h^2 + scores and
//                                      weighted sum 4 b s^2 h, counted without the causal half)
// and the backward counts twice the forward. Norms, activations and residual adds have no model
// FLOPs: they report GB/s of the bytes they must move (layer_parts documents the counts).
//
//   bench::LayerOptions o;  o.device = Device::cpu();  o.config = {1, 16, 32, 2, DType::f32};
//   bench::LayerReport r = bench::run_layer(o);    // r.block.tflops, r.parts[i].share
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "forge/core/device.h"
#include "forge/core/dtype.h"

namespace forge::bench {

struct LayerConfig {
  int64_t batch = 0, seq = 0, width = 0, heads = 0;
  DType dtype = DType::f32;
};

// GPU: batch 16, seq 1024, width 768, heads 12, bf16 (a GPT-2 124M block at batch 16);
// CPU: batch 2, seq 64, width 128, heads 4, f32.
LayerConfig default_layer_config(Device device);
// Throws forge::Error when a field is not positive or heads does not divide width.
void validate(const LayerConfig& c);

double layer_ffn_flops(const LayerConfig& c);        // 16 b s h^2, forward
double layer_attention_flops(const LayerConfig& c);  // 8 b s h^2 + 4 b s^2 h, forward
double layer_forward_flops(const LayerConfig& c);    // ffn + attention
double layer_training_flops(const LayerConfig& c);   // 3 x forward (backward = 2 x forward)

// One part of the block. kind: gemm, attention, norm, activation, residual.
struct LayerPart {
  std::string name, kind;
  double flops_fwd = 0, flops_bwd = 0;   // model FLOPs (0 for norm/activation/residual)
  double bytes_fwd = 0, bytes_bwd = 0;   // bytes the part must read + write at least
  double op_flops_fwd = 0, op_flops_bwd = 0;  // arithmetic FLOPs: model FLOPs, or a rough
                                              // per-element count for the others (roofline only)
};
// The parts in block order. fused_gelu: the MLP up-projection and its GELU are one cuBLASLt GEMM
// (ops::linear_gelu, CUDA with FORGE_GELU_FUSION unset or != 0) -> one part "mlp_fc_gelu";
// otherwise "mlp_fc" (gemm) and "gelu" (activation).
std::vector<LayerPart> layer_parts(const LayerConfig& c, bool fused_gelu);

struct LayerOptions {
  Device device = Device::cpu();
  LayerConfig config;
  int warmup_runs = 3;
  double warmup_ms = 50;
  int repeats = 20;
};

struct LayerTiming {
  double fwd_ms = 0, bwd_ms = 0;  // medians over the repeats
  double total_ms() const { return fwd_ms + bwd_ms; }
};

struct LayerPartResult {
  LayerPart part;
  LayerTiming time;
  double tflops = 0;  // (flops_fwd + flops_bwd) / total time (0: no model FLOPs)
  double gbs = 0;     // (bytes_fwd + bytes_bwd) / total time
  double share = 0;   // total time / the block's total time
};

struct LayerReport {
  std::string device, device_name, timer;
  LayerOptions options;
  bool fused_gelu = false;
  LayerTiming block;
  double block_flops = 0;   // layer_training_flops
  double block_tflops = 0;
  double parts_ms = 0;      // the parts' fwd + bwd times summed
  std::vector<LayerPartResult> parts;
};

LayerReport run_layer(const LayerOptions& opt);
nlohmann::json to_json(const LayerReport& r);

}  // namespace forge::bench
