#pragma once
// cuDNN's fused attention (the SDPA node of cuDNN's graph API, built through NVIDIA's
// header-only cudnn-frontend, third_party/cudnn-frontend) as a back-end of
// cuda::attention_forward / attention_backward. Same contract as attention.h and
// flash_attention.h (Note [attention conventions] in ops/attention.h): q (B, H, T, D), k and
// v (B, Hkv, S, D), GQA, bottom-right causal alignment, lse a contiguous f32 (B, H, T) of
// natural-log units (cuDNN's "Stats" tensor is exactly that, so a forward by one back-end
// and a backward by another agree). The design is Note [cuDNN attention] in
// cudnn_attention.cpp; which back-end runs is Note [attention back-ends] in attention.cu.
//
// Internal to backends/cuda/ (and its tests); plain C++, no cuDNN headers.
#include <cstdint>
#include <string>
#include <vector>

#include "forge/core/tensor.h"

namespace forge::cuda {

// Whether forge was built with cuDNN (FORGE_WITH_CUDNN) and the library loaded at run time
// is version 9 or newer. The version found, e.g. "9.19.0", or why not ("not built with
// cuDNN").
bool cudnn_attention_available();
std::string cudnn_version_string();

// Whether cuDNN's fused attention may take this problem: available, q/k/v bf16 or f16, 4-D,
// D == Dv, D a multiple of 8 and at most 128, no mask, 0 < T <= S when causal (every row
// then has a key: cuDNN's rows without keys are not forge's zero rows), not T == S == 1
// (cuDNN's backward refuses it), not a decoding step (T <= kDecodeQueries queries after a KV
// cache, T < S: a new graph per call, since S grows each time), and every tensor
// readable in place (unit stride in the last dim, other strides multiples of 8 elements,
// 16-byte aligned). cuDNN may still decline a problem when its graph is built (no engine):
// the calls below then return false and the caller runs another back-end.
inline constexpr int64_t kDecodeQueries = 16;
bool cudnn_attention_applies(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool causal);

// Runs the forward; false when cuDNN has no plan for it (nothing was written). out and lse as
// attention.h; out readable in place.
bool cudnn_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale, Tensor& out,
                             Tensor& lse);

// Runs the backward; false when cuDNN has no plan for it (nothing was written). Undefined
// dq / dk / dv are computed into scratch and dropped (cuDNN writes all three).
// deterministic: cuDNN's deterministic algorithm (no atomics: dq is the same bit for bit from
// run to run); false when cuDNN offers none for this problem.
bool cudnn_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                              const Tensor& lse, bool causal, double scale, bool deterministic, Tensor& dq, Tensor& dk,
                              Tensor& dv);

// How many cuDNN forward + backward calls have run, and how many distinct graphs were built
// (or refused), in this process (tests check the path is taken and the cache hit).
int64_t cudnn_attention_calls();
int64_t cudnn_attention_graphs_built();

// The execution plan of each cached graph (Note [cuDNN attention], "Which plan runs"): with
// FORGE_CUDNN_PLAN_TUNING=1 (the default) every plan cuDNN's heuristics offer is built, timed
// once on the first call's tensors outside a CUDA graph capture, and the fastest runs from then
// on; with 0, or in deterministic mode, the heuristic's first choice runs untimed. One entry per
// graph cuDNN accepted, in the order they were built.
struct CudnnAttentionPlan {
  std::string problem;  // "forward bf16 B=2 H=8 Hkv=2 T=256 S=256 D=64 causal" (" deterministic")
  bool backward = false;
  int64_t B = 0, H = 0, Hkv = 0, T = 0, S = 0, D = 0;
  bool causal = false, deterministic = false;
  bool tuning = false;         // built with tuning on: all the heuristics' candidates
  bool tuned = false;          // the candidates were timed
  int64_t candidates = 0;      // plans built (1 without tuning)
  int64_t timed = 0;           // candidates that ran and were timed
  int64_t capture_skips = 0;   // untuned calls during a CUDA graph capture (the heuristic's plan ran)
  std::string chosen;          // cuDNN's engine name of the plan that runs ("eng8_k2=..."), and of
  std::string heuristic;       //   the heuristics' first choice
  double chosen_ms = 0;        // their times on the first call (the best of a few runs); 0 when
  double heuristic_ms = 0;     //   not timed
};
std::vector<CudnnAttentionPlan> cudnn_attention_plans();
// The same as text, a line per graph, for benchmarks ("" when no graph was built).
std::string cudnn_attention_plan_report();

}  // namespace forge::cuda
