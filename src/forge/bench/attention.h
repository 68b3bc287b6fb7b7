#pragma once
// `forge bench attention` (docs/bench.md): scaled dot-product attention forward and backward,
// each of forge's back-ends timed on the same inputs, as TFLOP/s.
//
// Back-ends (Note [attention back-ends] in backends/cuda/attention.cu): on a GPU "cudnn"
// (cuDNN's fused attention), "cudnn-det" (its deterministic backward), "flash" (forge's own
// flash-attention kernels) and "composed" (GEMMs + fused softmax); on the CPU "cpu". A back-end
// that does not take a shape (e.g. flash for head dim 96, or cuDNN declining a graph) is
// reported as skipped with the reason, never timed on another back-end.
//
// FLOPs (the convention of FlashAttention's and PyTorch's benchmarks): forward 4 B H T S D (two
// GEMMs of 2 B H T S D), halved when causal with T == S; backward 2.5 x forward (five GEMMs).
// Times are medians of `repeats` runs (CUDA events on a GPU, steady_clock on the CPU), after
// warm-up runs; the backward is timed alone, from the forward's saved output and logsumexp.
//
// benchmarks/attention/run.sh puts these beside PyTorch's scaled_dot_product_attention (cuDNN
// and flash back-ends) on the same shapes, in one run.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "forge/core/device.h"
#include "forge/core/dtype.h"

namespace forge::bench {

struct AttentionShape {
  int64_t batch = 0, heads = 0, kv_heads = 0, seq = 0, head_dim = 0;
  bool causal = true;
};

// "BxHxHKVxTxD" with an optional ",full" (not causal), e.g. "4x32x8x2048x128". Throws naming
// the format on anything else, or when a size is not positive or kv_heads does not divide heads.
AttentionShape parse_attention_shape(const std::string& spec);
std::string shape_str(const AttentionShape& s);

// GPU: causal, 16k tokens per call (batch = 16384 / T), T in 1k..8k, for head dim 64 (GPT-2:
// 12 heads, and 16 heads over 4 kv heads) and 128 (LLaMA 0.85B: 32 heads over 8 kv heads);
// CPU: one small causal shape.
std::vector<AttentionShape> default_attention_shapes(Device device);
std::vector<std::string> default_attention_backends(Device device);  // cuda: cudnn, flash; cpu: cpu
// Throws on an unknown name or one the device does not have.
std::vector<std::string> parse_attention_backends(const std::string& spec, Device device);

double attention_forward_flops(const AttentionShape& s);
double attention_backward_flops(const AttentionShape& s);  // 2.5 x forward

struct AttentionOptions {
  Device device = Device::cpu();
  DType dtype = DType::bf16;  // bf16 or f16 on a GPU; f32 on the CPU
  std::vector<AttentionShape> shapes;
  std::vector<std::string> backends;
  int warmup_runs = 3;
  int repeats = 20;
  // How the tensors lie in memory (Note [attention layouts] in attention.cpp): "bhsd", each one
  // (B, H, T, D)-contiguous; "bshd", (B, T, H, D) memory viewed as (B, H, T, D), as forge's GPT
  // and LLaMA attention get q, k, v from their projections and allocate out and the gradients.
  std::string layout = "bhsd";
};

struct AttentionResult {
  AttentionShape shape;
  std::string backend;
  double fwd_ms = 0, bwd_ms = 0;
  double fwd_tflops = 0, bwd_tflops = 0;
  std::string skipped;  // non-empty: not timed, and why
};

struct AttentionReport {
  std::string device, device_name, timer, cudnn_version;
  AttentionOptions options;
  std::vector<AttentionResult> results;
};

AttentionReport run_attention(const AttentionOptions& opt);
nlohmann::json to_json(const AttentionReport& r);

}  // namespace forge::bench
