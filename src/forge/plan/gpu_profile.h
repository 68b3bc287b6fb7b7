#pragma once
// Efficiency profiles: what a GPU achieves, measured by `forge bench calibrate` (or, for a GPU
// forge has not run on, derived from the vendor's figures and said so), from which `forge plan`
// prices each kernel of a step instead of assuming one utilisation for all of them.
//
// Note [efficiency profiles]. A step's compute is not one rate: a transformer's large linears run
// near the GEMM roof, the attention core at the attention kernel's rate (which grows with the
// sequence and the head size), and the norms, residual adds, activations, rotary embeddings and
// the cross-entropy move bytes at the memory's rate. A single MFU cannot know the mix (GPT-2 124M
// and a 3.6B LLaMA differ by ten points on the same GPU). The profile holds, per GPU:
//   gemm      per precision: the sustained rate of a large GEMM (the median over large shapes,
//             run back to back, so under the card's power limit), the output tile its kernels use
//             (for wave quantisation), k_half (a tile's fixed cost in multiply-adds along k: a
//             product of depth k runs at k / (k + k_half) of the rate) and a fixed time per GEMM;
//             optionally measured points (m, n, k, TFLOP/s), used for the shapes they match;
//   attention the fused causal attention kernel's forward and backward TFLOP/s by (sequence, head
//             size), interpolated in log(sequence) at the nearest head size;
//   memory    the achieved copy bandwidth (bytes read + written per second), for the memory-bound
//             kernels and the optimizer step.
// gemm_seconds(m, n, k) = max(2mnk / (R · waves(m, n) · k / (k + k_half)), bytes / memory) + fixed,
// with waves(m, n) = tiles / (ceil(tiles / SMs) · SMs), tiles = ceil(m / tile_m) · ceil(n / tile_n):
// the share of the last wave's SMs that have work. A measured point of the same shape replaces
// the formula. The model's constants are fitted to `forge bench` microbenchmarks of the GPU (GEMM
// shapes, attention shapes, copies), never to a training run: the planner's predictions can then
// be compared with runs (docs/plan.md, Validation).
#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "forge/plan/gpu_catalog.h"

namespace forge::plan {

struct GemmPoint {
  int64_t m = 0, n = 0, k = 0;
  double tflops = 0;
};

struct GemmEfficiency {
  double sustained_tflops = 0;  // a large GEMM's rate under sustained load
  int64_t tile_m = 128, tile_n = 256;
  double k_half = 64;           // multiply-adds along k a tile's prologue and epilogue cost
  double fixed_us = 4;          // per GEMM (launch, tail), beyond the rate
  std::vector<GemmPoint> points;
};

struct AttentionPoint {
  int64_t seq = 0, head_dim = 0;
  double fwd_tflops = 0, bwd_tflops = 0;  // causal, FLOPs as forge bench attention counts them
};

struct GpuProfile {
  std::string gpu;         // the catalogue entry it describes ("H100 SXM")
  std::string measured_on; // the device name forge bench saw ("NVIDIA H100 80GB HBM3"), or "" when derived
  std::string source;      // how each figure was obtained
  int64_t sms = 0;         // streaming multiprocessors (wave quantisation)
  std::map<Precision, GemmEfficiency> gemm;
  std::vector<AttentionPoint> attention;  // bf16
  double memory_gbs = 0;   // achieved copy bandwidth, GB/s (read + written)
};

// The shipped profiles (each figure's source in `source`), and the one for a catalogue entry
// (nullptr when none ships).
const std::vector<GpuProfile>& shipped_profiles();
const GpuProfile* shipped_profile(const GpuSpec& gpu);

// JSON (what `forge bench calibrate` writes and `forge plan --profile` reads). from_json checks
// every field (untrusted input): a missing or non-positive rate, an unknown precision or a tile of
// zero throws forge::Error naming the field and the file.
nlohmann::json to_json(const GpuProfile& p);
GpuProfile profile_from_json(const nlohmann::json& j, const std::string& where);
GpuProfile read_profile(const std::filesystem::path& file);

// Seconds of one GEMM (m x k) (k x n) in precision `p` on the profile's GPU (Note [efficiency
// profiles]); throws when the profile has no rate for `p`.
double gemm_seconds(const GpuProfile& prof, Precision p, int64_t m, int64_t n, int64_t k);
// The attention kernel's forward and backward rates (FLOP/s) at sequence `seq` and head size
// `head_dim` (interpolated; the nearest head size measured).
struct AttentionRate {
  double fwd = 0, bwd = 0;
};
AttentionRate attention_rate(const GpuProfile& prof, int64_t seq, int64_t head_dim);
// Achieved memory bandwidth in bytes/s.
double memory_bytes_per_s(const GpuProfile& prof);
// The GEMM model of precision `p` (bf16's for fp16); throws naming the GPU when the profile has none.
const GemmEfficiency& gemm_efficiency(const GpuProfile& prof, Precision p);

// Fits a GemmEfficiency's sustained rate and k_half to measured GEMMs (forge bench calibrate): the
// pair (k_half on a grid of 8 in [0, 1024], the rate in closed form for each) that minimises the
// squared log-error of the model over every point. `peak_tflops` > 0 bounds the rate (the dense
// peak: a few shapes can trade a rate above it against a long k_half, the first H100 calibration
// did); for each k_half the rate is then the closed form's clamped to it (the error is convex in
// log rate, so that is the bounded optimum). The points are kept (exact shapes use them).
GemmEfficiency fit_gemm(const std::vector<GemmPoint>& points, int64_t sms, int64_t tile_m, int64_t tile_n,
                        double peak_tflops = 0);

}  // namespace forge::plan
