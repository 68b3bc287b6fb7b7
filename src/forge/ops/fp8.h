#pragma once
// FP8 training recipes emulated on the CPU (issue 39; docs/fp8.md): how each recipe scales a
// matrix into e4m3 / e5m2 (core/fp8.h) and what a GEMM of the quantized operands gives, so that the
// recipes' logic is tested in CI and is the reference of their GPU kernels.
//
//   auto q = fp8::quantize(x, fp8::Format::e4m3, fp8::Recipe::rowwise, fp8::Operand::activation);
//   Tensor back = fp8::dequantize(q);                       // f32, x to within the format's rounding
//   Tensor y = fp8::scaled_matmul(x, w, fp8::Recipe::blockwise);   // x (m, k) w (n, k)^T in e4m3
//
// Note [FP8 recipes]: a recipe picks the groups that share one scale. For each group the scale is
// s = max_format / amax (amax over the group's |x|; a group of zeros takes s = 1), the codes are
// x s rounded to the format (Note [FP8 rounding]), and the value a code stands for is decode / s:
//   tensorwise  one scale for the matrix (torchao's "tensorwise", Transformer Engine's per-tensor
//               current scaling);
//   rowwise     one scale per row: per token for activations (m, k), per output feature for a
//               weight (n, k), both along the reduction dimension k (torchao's "rowwise");
//   blockwise   DeepSeek-V3's: activations in 1 x 128 tiles (a scale per row per 128 columns),
//               weights in 128 x 128 blocks; the last tile or block of a dimension may be smaller.
// x is scaled in f32 before rounding (what the GPU casts do); scales are f32. Formats: forward
// operands (activations, weights) in e4m3; gradients in e5m2 under tensorwise and rowwise (the
// "hybrid" format: range over precision) and in e4m3 under blockwise, whose fine-grained scales
// leave no need for e5m2's range (DeepSeek-V3). scaled_matmul emulates the forward GEMM: both
// operands quantized in e4m3 by the recipe, the products accumulated in f64 and rounded once to
// f32 (the tensor cores' promoted f32 accumulation without its order), each product scaled by
// its operands' groups (per tile pair under blockwise: DeepSeek's promotion every 128 products).
#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "forge/core/fp8.h"
#include "forge/core/tensor.h"

namespace forge::fp8 {

enum class Recipe : uint8_t { tensorwise, rowwise, blockwise };
enum class Operand : uint8_t { activation, weight, gradient };

// "tensorwise" | "rowwise" | "blockwise"; anything else throws naming run.fp8 and the values.
Recipe recipe_from_name(const std::string& name);
const char* recipe_name(Recipe r);
// The format of an operand under a recipe (Note [FP8 recipes]).
Format format_of(Recipe r, Operand op);

inline constexpr int64_t kBlock = 128;  // blockwise: tiles of 1 x 128, blocks of 128 x 128

struct Quantized {
  Tensor codes;   // u8 (rows, cols): the fp8 bit patterns
  Tensor scales;  // f32: (1) tensorwise, (rows) rowwise, (rows, ceil(cols / 128)) activation tiles or
                  // (ceil(rows / 128), ceil(cols / 128)) weight blocks
  Format format = Format::e4m3;
  Recipe recipe = Recipe::tensorwise;
  Operand operand = Operand::activation;
};

// x: a 2-D CPU tensor (f32, f64, bf16 or f16). Throws naming the shape otherwise. A non-finite
// entry makes its group's amax non-finite and the group's scale NaN: what a recipe's guardrail
// must detect before the scale is used.
Quantized quantize(const Tensor& x, Format format, Recipe recipe, Operand operand);
// What the codes stand for: decode(code) / scale, f32 (rows, cols).
Tensor dequantize(const Quantized& q);
// x (m, k) times w (n, k)^T with both operands quantized in e4m3 by `recipe` (x as activations, w
// as a weight): f32 (m, n).
Tensor scaled_matmul(const Tensor& x, const Tensor& w, Recipe recipe);

// a (m, r) times b_t (n, r)^T with each operand quantized by `recipe` in its role's format
// (format_of), groups along the reduction dimension r: f32 (m, n), from the dequantized operands.
Tensor quantized_matmul(const Tensor& a, Operand a_role, const Tensor& b_t, Operand b_role, Recipe recipe);

// Note [FP8 linear]: y = x w^T + b with the three GEMMs of a linear layer through `recipe`
// (torchao's float8 linear): forward x (activation) by w (weight); backward dx = dy (gradient) by
// w^T (weight, grouped along the output features it is reduced over) and dw = dy^T (gradient) by
// x^T (activation, grouped along the tokens), db = the column sums of dy in full precision. The
// gradients are those of the quantized product (straight through the rounding). x (*, k), w (n, k),
// b (n) or undefined; the result has x's dtype. On the CPU the emulation (slow, for tests); on a
// GPU the kernels (Note [FP8 on the GPU]), or ops::linear for a shape kept in the layer's dtype
// (Note [FP8 GEMM choice]).
// `layer` names the layer in guardrail events (Note [FP8 guardrails]).
//
// Note [FP8 under tensor parallelism]: a split linear must cast exactly as the whole one, so every
// scale group that spans a split dimension takes its amax over the group's ranks (`Split`,
// all_max: element-wise max in place, the tensor-parallel group's all-reduce). `k`: the reduction
// dimension (in_features) is split (a row-parallel linear); `n`: the output features are (a column-
// parallel one, or a replicated key-value head: max is indifferent to a head held twice). Which
// casts reduce: tensorwise, every operand with a split dimension (x when k; w when k or n; dy when
// n); rowwise, the groups along a split reduction dimension (x and w in the forward when k; dy and
// w^T in dx = dy w when n; none in dw, reduced over the tokens); blockwise none: its tiles and
// blocks stay inside a shard when the split dimensions are multiples of 128, which the caller
// checks. The dequantized operands are then the whole linear's slices, and the product summed over
// the ranks is the whole product up to the order of the sum.
struct Split {
  bool k = false, n = false;
  std::function<void(std::vector<float>&)> all_max;
};
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b, Recipe recipe, const std::string& layer = "linear",
              const Split& split = {});

// Note [FP8 guardrails]: an inf or NaN in a tensor makes its group's amax, and so its scale, non-
// finite; cast with it the whole group would be garbage. fp8::linear checks the scales of each cast
// (x and w in forward, dy in backward) and records an event naming the layer and the operand; the
// trainer logs the events after each step (the step itself is then skipped by the non-finite
// loss/norm check, as without FP8).
struct GuardEvent {
  std::string layer;
  Operand operand = Operand::activation;
  double amax = 0;    // the first non-finite group's
  int64_t step = 0;   // the step queue_step_records named (0: recorded at once, the CPU path)
};
// The events recorded since the last call, in order (process-wide), and clears them. The GPU's
// slots are read now (a host wait for the work queued so far), those queued earlier too.
std::vector<GuardEvent> take_guard_events();
// Note [FP8 guardrails one step late]: on a GPU, a copy of the slots to pinned memory queued
// behind the step's work (and the slots cleared behind it), read when the next step's records
// are queued, so the trainer never waits for a step it has just queued: queue_step_records(step)
// after each training step, then take_queued_guard_events() returns the events of the steps
// queued before this one (each with its step); take_guard_events() at the end reads the rest.
// Nothing on the CPU, whose events are recorded at once.
void queue_step_records(int64_t step);
std::vector<GuardEvent> take_queued_guard_events();
const char* operand_name(Operand op);  // "activation" | "weight" | "gradient"

// Note [FP8 delayed scaling]: under current scaling (the default) a cast's scale comes from the
// amax of the tensor being cast. Delayed scaling (run.fp8_scaling = "delayed", tensorwise only:
// Transformer Engine's per-tensor recipe) takes it from the largest amax of the same layer's and
// operand's last `history` casts (run.fp8_amax_history), the current one excluded, so that on a
// GPU the scale is known before the tensor is read; the current amax then joins the history (the
// oldest leaves). A layer's first cast, with no history yet, is scaled by its own amax. Values
// above what the delayed scale covers saturate to the format's largest (Note [FP8 rounding]). A
// non-finite amax is not entered into a history (the guardrail reports it, the step is skipped).
// The histories are the run's state: forge train saves them in the checkpoint and restores them,
// so that a resumed run scales exactly as an uninterrupted one.
enum class Scaling : uint8_t { current, delayed };
struct ScalingOptions {
  Scaling scaling = Scaling::current;
  int64_t history = 16;  // casts remembered per layer and operand (delayed)
};
// Sets the process's scaling and clears every history.
void set_training_scaling(ScalingOptions o);
ScalingOptions training_scaling();
// The histories (oldest first) by layer, then operand (activation, weight, gradient), and back.
using AmaxHistories = std::map<std::string, std::array<std::vector<float>, 3>>;
AmaxHistories amax_histories();
void restore_amax_histories(const AmaxHistories& h);
// Delayed scaling under data parallelism: each training cast's amax is maxed over the data-parallel
// group (`all_max`, element-wise in place) before it joins the history, so that every rank keeps the
// same histories and scales alike (and rank 0's, in a checkpoint, resumes them all). Empty: none.
// A collective per training cast: every rank makes the same casts in the same order.
void set_amax_reduce(std::function<void(std::vector<float>&)> all_max);
// The same on the GPU: `all_max` maxes a one-element f32 CUDA tensor over the group in place (queued
// on the current stream: NCCL's all-reduce), once per training cast under delayed scaling.
void set_amax_reduce_device(std::function<void(Tensor&)> all_max);
// The largest amax of each layer's casts per operand since the last call (-1: no cast of that
// operand), for telemetry.fp8_amax; clears the record.
std::map<std::string, std::array<double, 3>> take_amax_record();

// Note [FP8 on the GPU]: on CUDA, fp8::linear casts x, w (forward) and dy (backward) with the
// kernels of backends/cuda/fp8.h, which write each operand's codes in its own layout and, for the
// backward, transposed (k contiguous for every GEMM: Note [FP8 GEMM layout]), and runs the three
// GEMMs through cuBLASLt with the recipe's scales (tensorwise one per tensor, rowwise one per row,
// blockwise 1 x 128 tiles and 128 x 128 weight blocks). It keeps only the transposed FP8 codes of x
// and w for the backward (no bf16 copy of x). The codes and scales are those of fp8::quantize (the
// same f32 arithmetic; tested code for code), and the GEMMs accumulate in f32 and write the layer's
// dtype. Delayed scaling keeps each layer's and operand's history on the device (one thread's
// kernel picks the scale and pushes the amax: no host synchronisation; read back only for a
// checkpoint). Not yet on the GPU: tensor parallelism (refused with the reason).
//
// Note [FP8 GEMM choice]: not every GEMM gains from FP8: the casts read and write each operand once
// more, which a small GEMM does not earn back. On the GPU, the first time a linear of shape
// (tokens m, out n, in k) runs (outside a CUDA graph capture), its forward and backward GEMMs are
// timed both ways on random data of that shape (casts included, median of 9) and the faster kept
// for the run (`measured`, the default); `all` takes FP8 wherever the GEMM can run it (dimensions
// multiples of 16, of 128 for blockwise; rowwise and blockwise need Hopper and cuBLASLt 12.9). The
// choices, with both times, are reported by gemm_choices (forge train logs them after the first step).
enum class Selection : uint8_t { measured, all };
void set_selection(Selection s);  // clears the choices made so far
Selection selection();
struct GemmChoice {
  int64_t m = 0, n = 0, k = 0;
  Recipe recipe = Recipe::tensorwise;
  DType dtype = DType::bf16;
  bool fp8 = false;
  double bf16_ms = 0, fp8_ms = 0;  // the three GEMMs each way (0: not measured)
  std::string reason;
};
std::vector<GemmChoice> gemm_choices();

// The recipe of the linear layers' GEMMs for this process (nn::Linear reads it; forge train sets
// it from run.fp8): none (off) by default.
void set_training_recipe(std::optional<Recipe> recipe);
std::optional<Recipe> training_recipe();

}  // namespace forge::fp8
