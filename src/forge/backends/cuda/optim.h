#pragma once
// CUDA optimizer kernels: multi-tensor AdamW and SGD steps, the gradient-norm pass (with
// the loss scaler's unscale fused in), clipping by a norm held on the device, the
// non-finite flag and the dynamic loss-scale update. Plain C++ declarations (no CUDA
// headers), so optim/*.cpp can include this under FORGE_WITH_CUDA; the kernels and
// Note [multi-tensor launches] live in optim.cu. The element math is
// backends/optim_functors.h, shared with the CPU backend (backends/cpu/optim.h), so both
// compute the same bits (Note [optimizer rounding]).
//
// No function here synchronises with the host: everything a step decides (skip it, clip
// or not, the bias corrections of a tensor whose earlier steps were skipped) is read on
// the device. Every tensor must be contiguous and on the same GPU; the optimizer layer
// makes strided ones contiguous first.
#include <cstdint>
#include <vector>

#include "forge/backends/optim_functors.h"
#include "forge/core/tensor.h"

namespace forge::cuda {

// ---- skipping a step on the device -------------------------------------------------------
//
// Note [skipped steps on the device]: a step may be given a flag `skip_if` (0-d f32 on the
// GPU, 0 = apply, anything else = skip: a non-finite gradient norm, an f16 overflow). The
// host cannot know its value without a sync, so it counts every attempted update of a
// parameter (`step` below: attempts including this one) and the GPU counts the skipped
// ones, in `skipped` (i64, one slot per parameter of the optimizer). A kernel that finds
// the flag set writes nothing but skipped[slot] += 1 (once per tensor); one that finds it
// clear reads t = step - skipped[slot], the parameter's true update count, and never
// writes `skipped`. Reads and writes of a slot so never meet in one launch. optim::Optimizer
// folds the counts back into its host step counts when they are asked for (Optimizer::
// state, state_dict). Without a flag, skip_if and skipped are undefined and t = step.

// ---- the lr and step counts on the device -----------------------------------------------
//
// Note [optimizer steps in a CUDA graph]: a captured update replays its kernel arguments
// as they were, but the learning rate follows a schedule and each parameter's step count (the
// bias corrections) grows. With `graph` set, the kernels read both from the device instead:
// lr = values[lr_index], and the step of the parameter in slot k = values[steps_offset + k]
// (an exact integer in f64); the host writes the values of each replay into `values` before
// launching it (optim::Optimizer::stage_graph_inputs). Undefined `values`: the arguments rule.
struct GraphInputs {
  Tensor values;  // 1-D f64 on the parameters' GPU
  int64_t lr_index = 0;
  int64_t steps_offset = 0;
  const double* lr_ptr() const { return values.defined() ? static_cast<const double*>(values.data_ptr()) + lr_index : nullptr; }
  const double* steps_ptr() const {
    return values.defined() ? static_cast<const double*>(values.data_ptr()) + steps_offset : nullptr;
  }
};

// ---- clipping inside the update -----------------------------------------------------------
//
// Note [clipping inside the update] (optim/optimizer.h, Optimizer::clip_next_step): the AdamW
// kernel can apply clip_with_norm_ (below) itself, to each gradient value it loads: when the
// 0-d f32 `norm` is finite and > max_norm, every block computes c = max_norm / (norm + 1e-6)
// in double once and reads g as T(double(g) * c), exactly the value clip_with_norm_ would
// have written, so the update is the same bits as clip-then-step. g itself is never written:
// the clip pass (one read and one write of every gradient) is gone. Undefined `norm`: no clip.
struct FusedClip {
  Tensor norm;  // 0-d f32 on the parameters' GPU, contiguous
  double max_norm = 0;
  const float* norm_ptr() const { return norm.defined() ? static_cast<const float*>(norm.data_ptr()) : nullptr; }
};

// ---- AdamW ---------------------------------------------------------------------------

// One parameter of a multi-tensor AdamW step; all of one call on one GPU.
struct AdamWParam {
  Tensor p;        // (n) f32 | bf16 | f16 | f64: read and overwritten
  Tensor g;        // (n) p's dtype: read only (with a clip too: scaled as it is loaded)
  Tensor m, v;     // (n) f32 (f64 for an f64 p): read and overwritten
  Tensor master;   // (n) f32 for a bf16/f16 p (read and overwritten; p = round(master)), else undefined
  int64_t step;    // attempted updates of this parameter, this one included (>= 1)
  int64_t slot;    // its index into `skipped`
};

// The rule of optim/adamw.h for every parameter, in as few launches as the kernel
// parameter space allows (Note [multi-tensor launches]: one per ~48 tensors of a dtype).
// hp.lr may change from call to call (a schedule): it is a kernel argument. With clip.norm
// defined, the gradients are read clipped (Note [clipping inside the update]).
void adamw_step(const std::vector<AdamWParam>& params, const fn::AdamWHyper& hp, const Tensor& skip_if,
                const Tensor& skipped, const GraphInputs& graph = {}, const FusedClip& clip = {});

// ---- SGD -----------------------------------------------------------------------------

struct SGDHyper {
  double lr = 0;
  double weight_decay = 0;
  double momentum = 0;
  double dampening = 0;
  bool nesterov = false;
};

struct SGDParam {
  Tensor p;               // (n) f32 | bf16 | f16 | f64: read and overwritten
  Tensor g;               // (n) p's dtype: read only
  Tensor buf;             // (n) p's dtype, the momentum buffer (read and overwritten); undefined iff momentum == 0
  int64_t step;           // attempted updates, this one included
  int64_t slot;           // index into `skipped`
  int64_t buf_first_step; // the true step (t) at which buf is used first (b = d); 0 for an established buffer
};

// The rule of optim/sgd.h, computed as the ops of optim/sgd.cpp compute it (rounded to
// p's dtype after each of them), so the CPU and CUDA backends agree bit for bit.
void sgd_step(const std::vector<SGDParam>& params, const SGDHyper& hp, const Tensor& skip_if, const Tensor& skipped,
              const GraphInputs& graph = {});

// ---- gradient norm, clipping, loss scaling ---------------------------------------------

// norm <- sqrt(sum over ts of sum_i t_i^2) (0-d f32), the squares accumulated in double, in
// fixed per-block partial sums reduced in a fixed order (deterministic run to run);
// found (0-d f32, optional) <- 1 if that sum is not finite, else 0. With loss_scale
// (0-d f32 s, optional) every element is first replaced in place by t_i * (1/s), 1/s
// computed in double and rounded to f32 as torch.amp.GradScaler does, and the norm is that
// of the unscaled values: unscale and norm in one pass. ts: any floating dtypes, one GPU.
void total_norm(const std::vector<Tensor>& ts, const Tensor& loss_scale, Tensor& norm, Tensor& found);

// t_i <- t_i * max_norm / (norm + 1e-6) for every tensor, in double, when the 0-d f32
// `norm` is finite and > max_norm; otherwise nothing changes. Read on the device. (AdamW
// does the same inside its update instead: FusedClip above.)
void clip_with_norm_(const std::vector<Tensor>& ts, const Tensor& norm, double max_norm);

// flag <- (x is inf or NaN) ? 1 : 0; x and flag 0-d f32.
void non_finite_flag(const Tensor& x, Tensor& flag);

// torch.amp.GradScaler's update (torch._amp_update_scale_), on the device:
//   found != 0:  scale *= backoff_factor; growth_tracker = 0
//   else:        growth_tracker += 1; when it reaches growth_interval: scale *= growth_factor
//                (unless that overflows f32) and growth_tracker = 0
// scale: 0-d f32, growth_tracker: 0-d i32, found: 0-d f32.
void update_loss_scale(Tensor& scale, Tensor& growth_tracker, const Tensor& found, double growth_factor,
                       double backoff_factor, int64_t growth_interval);

}  // namespace forge::cuda
