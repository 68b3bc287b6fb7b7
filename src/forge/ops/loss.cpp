// cross_entropy: argument checks, the fused CPU and CUDA kernels (backends/*/loss.h) and
// the reduction; the backward is one fused kernel.
#include "forge/ops/loss.h"

#include <atomic>
#include <limits>

#include "forge/autograd/engine.h"
#include "forge/autograd/node.h"
#include "forge/autograd/grad_mode.h"
#include "forge/backends/cpu/loss.h"
#include "forge/core/env.h"
#include "forge/ops/copy.h"
#include "forge/ops/creation.h"
#include "forge/ops/dispatch_device.h"
#include "forge/ops/registry.h"

#ifdef FORGE_WITH_CUDA
#include "forge/backends/cuda/loss.h"
#endif

namespace forge::ops {

using autograd::GradMask;
using autograd::record;

// The differentiable ops this file defines (Note [op registry] in ops/registry.h).
[[maybe_unused]] const bool kRegisteredOps = register_ops({"cross_entropy"});

const char* reduction_name(Reduction r) {
  switch (r) {
    case Reduction::mean: return "mean";
    case Reduction::sum: return "sum";
    case Reduction::none: return "none";
  }
  return "?";
}

// Backward (fused, cpu::cross_entropy_backward / cuda::cross_entropy_backward):
//   dlogits[n, j] = (softmax(logits[n])_j - [j == targets[n]]) * g_n * scale
// with g_n = g (mean, sum) or g[n] (none), scale = 1 / count for mean, else 1, and zero
// rows for ignored targets. On the CPU the forward returns the reduced loss and the count
// as host numbers; on CUDA the total and the scale stay on the device (a 0-d tensor the
// backward reads), so the op never synchronises with the host (Note [cross-entropy on the
// device] in backends/cuda/loss.cu).
namespace {
std::atomic<int64_t> g_dlogits_in_place{0};
std::atomic<int64_t> g_fused_forwards{0};

void check_cross_entropy_args(const Tensor& logits, const Tensor& targets);
}  // namespace

int64_t cross_entropy_backwards_in_place() { return g_dlogits_in_place.load(); }
int64_t cross_entropy_fused_forwards() { return g_fused_forwards.load(); }

// Note [expected loss gradient]: the fused classifier writes dlogits in the forward, before the
// backward's gradient g exists, so it writes them for a gradient it expects, and the backward
// compares (on the device: no synchronisation) and multiplies only when g is another. A training
// loop with K micro-batches backpropagates loss / K: autograd's div backward forms 1.0f / K in f32
// (IEEE division on both backends), so the expectation is that value, and with it the fused
// forward's dlogits are the two kernels' bits for g = 1 / K, as with K = 1. With f16's loss scale
// S (a 0-d f32 tensor on the device) the loop backpropagates (loss / K) * S: mul's backward hands
// loss / K the value 1 * S = S, div's hands the loss S / K, so the kernels form S / f32(K) on the
// device (S itself for K = 1), the same division, and read S where the backward reads it: after the
// forward and before the scaler's update, which changes S only after the step. Thread-local like
// the grad mode: the scope covers this thread's forward only.
namespace {
thread_local int64_t t_loss_grad_divisor = 1;
thread_local Tensor t_loss_grad_scale;
}  // namespace

LossGradDivisor::LossGradDivisor(int64_t divisor, const Tensor& scale)
    : previous_divisor_(t_loss_grad_divisor), previous_scale_(t_loss_grad_scale) {
  FORGE_CHECK(divisor >= 1, "LossGradDivisor: the loss's divisor must be >= 1 (train.grad_accum), got ", divisor);
  FORGE_CHECK(divisor <= (int64_t{1} << 24), "LossGradDivisor: the loss's divisor must be <= 2^24 (exact in f32), got ",
              divisor);
  if (scale.defined())
    FORGE_CHECK(scale.dim() == 0 && scale.dtype() == DType::f32,
                "LossGradDivisor: the loss scale must be a 0-d f32 tensor (LossScaler::scale_tensor()), got ",
                dtype_name(scale.dtype()), " of shape ", scale.shape());
  t_loss_grad_divisor = divisor;
  t_loss_grad_scale = scale;
}
LossGradDivisor::~LossGradDivisor() {
  t_loss_grad_divisor = previous_divisor_;
  t_loss_grad_scale = previous_scale_;
}
float ExpectedLossGrad::host_value() const {
  return scale.defined() ? 0.0f : 1.0f / static_cast<float>(divisor);
}
ExpectedLossGrad expected_loss_grad() { return {t_loss_grad_divisor, t_loss_grad_scale}; }

Tensor cross_entropy_consuming(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                               Reduction reduction) {
#ifdef FORGE_WITH_CUDA
  // (Undefined or mismatched arguments fall through to cross_entropy, whose checks name them.)
  const ExpectedLossGrad expected = expected_loss_grad();  // Note [expected loss gradient]
  // A scale on another device than the logits' (a scaler not bound yet) is not read: two kernels.
  const bool scale_usable =
      !expected.scale.defined() || (logits.defined() && expected.scale.device() == logits.device());
  if (logits.defined() && targets.defined() && logits.is_cuda() && reduction != Reduction::none && grad_enabled() &&
      logits.requires_grad() && logits.is_contiguous() && scale_usable && env::flag("FORGE_FUSED_CLASSIFIER")) {
    check_cross_entropy_args(logits, targets);
    const DType lse_dtype = cpu::cross_entropy_lse_dtype(logits.dtype());
    const TensorOptions opt{.dtype = lse_dtype, .device = logits.device()};
    Tensor ls = logits.detach();  // the logits' own memory: dlogits is written there
    const Tensor ts = contiguous(targets.detach());
    Tensor lse = empty({targets.numel()}, opt), total = empty({}, opt), scale_t = empty({}, opt);
    const cuda::ExpectedGrad eg{expected.host_value(), expected.scale, expected.divisor};
    if (cuda::cross_entropy_fused(ls, ts, ignore_index, reduction == Reduction::mean, lse, total, scale_t, eg)) {
      ++g_fused_forwards;
      ls.storage()->bump_version();  // the logits are gone: a saved copy of them must not be used
      record("cross_entropy", total, {logits}, [ls, eg](const Tensor& g, const GradMask&) {
        // ls holds dlogits for an upstream gradient of `expected`: times g / expected, in place
        // (nothing when they are equal) unless the graph is kept for another backward (then ls
        // must stay as it is).
        Tensor out = autograd::retaining_graph() ? empty(ls.shape(), {.dtype = ls.dtype(), .device = ls.device()}) : ls;
        cuda::scale_dlogits(ls, contiguous(g), out, eg);
        return TensorList{out};
      }, {ls});
      return total;
    }
  }
#endif
  return cross_entropy(logits, targets, ignore_index, reduction);
}

namespace {
void check_cross_entropy_args(const Tensor& logits, const Tensor& targets) {
  FORGE_CHECK(logits.defined() && targets.defined(), "cross_entropy: logits and targets must be defined tensors");
  detail::check_same_device("cross_entropy", {logits, targets});
  FORGE_CHECK(is_floating(logits.dtype()), "cross_entropy: logits must be floating-point (f32, f64, bf16, f16), got ",
              dtype_name(logits.dtype()), " of shape ", logits.shape());
  FORGE_CHECK(targets.dtype() == DType::i64 || targets.dtype() == DType::i32,
              "cross_entropy: targets must be i64 or i32 class indices, got ", dtype_name(targets.dtype()),
              " of shape ", targets.shape(), " (logits shape ", logits.shape(), ")");
  FORGE_CHECK(logits.dim() >= 1, "cross_entropy: logits must have a class dim ((N, V) or (B, T, V)), got a 0-d tensor");
  const Shape lead(logits.shape().begin(), logits.shape().end() - 1);
  FORGE_CHECK(targets.shape() == lead, "cross_entropy: targets of shape ", targets.shape(),
              " do not match logits of shape ", logits.shape(), ": expected targets of shape ", lead,
              " (the logits' shape without the class dim, which is last)");
}
}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index, Reduction reduction) {
  check_cross_entropy_args(logits, targets);
  // Note [loss dtype]: the loss is f32 for bf16/f16 logits (the dtype of the log-sum-exp it
  // accumulates in), as under torch.autocast: a 16-bit loss of ~10 would be rounded to steps of
  // 0.06. f32 and f64 logits give a loss of their own dtype.
  const DType lse_dtype = cpu::cross_entropy_lse_dtype(logits.dtype());
  const TensorOptions opt{.dtype = lse_dtype, .device = logits.device()};
  Tensor loss = reduction == Reduction::none ? empty(targets.shape(), opt) : Tensor();
  Tensor lse = empty({targets.numel()}, {.dtype = lse_dtype, .device = logits.device()});
  const Tensor ls = contiguous(logits.detach()), ts = contiguous(targets.detach());
  double scale = 1;  // CPU: the backward's scale
  Tensor scale_t;    // CUDA: the same, a 0-d device tensor of lse's dtype (undefined: 1)
  if (lse.is_cpu()) {
    const cpu::CrossEntropyTotals totals = cpu::cross_entropy_forward(ls, ts, ignore_index, loss, lse);
    if (reduction == Reduction::mean) {
      const double value = totals.count > 0 ? totals.sum / static_cast<double>(totals.count)
                                            : std::numeric_limits<double>::quiet_NaN();
      loss = full({}, value, opt);
      // With nothing counted every row of dlogits is zero; the scale is never used.
      scale = totals.count > 0 ? 1.0 / static_cast<double>(totals.count) : 0.0;
    } else if (reduction == Reduction::sum) {
      loss = full({}, totals.sum, opt);
    }
  } else {
#ifdef FORGE_WITH_CUDA
    Tensor total = reduction == Reduction::none ? Tensor() : empty({}, opt);
    if (reduction == Reduction::mean) scale_t = empty({}, {.dtype = lse_dtype, .device = logits.device()});
    cuda::cross_entropy_forward(ls, ts, ignore_index, reduction == Reduction::mean, loss, lse, total, scale_t);
    if (reduction != Reduction::none) loss = total;
#else
    detail::throw_no_cuda("cross_entropy");
#endif
  }
  record("cross_entropy", loss, {logits},
         [ls, ts, lse, scale, scale_t, ignore_index](const Tensor& g, const GradMask&) {
           // Note [dlogits in place]: the logits are saved only for this backward, and for a
           // language model's head they are the largest tensor of the step ((B T, V): 1.6 GB
           // in bf16 for GPT-2 at batch 16). When this closure holds the only reference to
           // their memory (the caller dropped the logits, as CausalLM::head_loss does) and the
           // graph is not retained for another backward, dlogits is written over them: each
           // element is read once and written once by the same thread, so the kernels allow it,
           // and the peak memory of the step (at the start of backward) drops by their size.
           const bool reuse = !autograd::retaining_graph() && ls.storage().use_count() == 1 && ls.is_contiguous();
           if (reuse) ++g_dlogits_in_place;
           Tensor dlogits = reuse ? ls : empty(ls.shape(), {.dtype = ls.dtype(), .device = ls.device()});
           if (dlogits.is_cpu()) cpu::cross_entropy_backward(ls, ts, lse, contiguous(g), scale, ignore_index, dlogits);
           else FORGE_ON_CUDA("cross_entropy",
                              cuda::cross_entropy_backward(ls, ts, lse, contiguous(g), scale_t, ignore_index, dlogits));
           return TensorList{dlogits};
         }, {ls, ts, lse});
  return loss;
}

Tensor cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& grad,
                              const Tensor& scale, int64_t ignore_index, int64_t class_start, bool in_place) {
  FORGE_CHECK(logits.dim() == 2 && logits.is_contiguous() && targets.numel() == logits.size(0),
              "cross_entropy_backward: contiguous (N, V) logits and N targets, got ", logits.shape(), " and ",
              targets.shape());
  detail::check_same_device("cross_entropy_backward", {logits, targets, lse, grad, scale});
  Tensor dlogits = in_place ? logits : empty(logits.shape(), {.dtype = logits.dtype(), .device = logits.device()});
  if (logits.is_cpu()) {
    cpu::cross_entropy_backward(logits, contiguous(targets), contiguous(lse), contiguous(grad), scale.item<double>(),
                                ignore_index, dlogits, class_start);
  } else {
    FORGE_ON_CUDA("cross_entropy_backward",
                  cuda::cross_entropy_backward(logits, contiguous(targets), contiguous(lse), contiguous(grad), scale,
                                               ignore_index, dlogits, class_start));
  }
  return dlogits;
}

CrossEntropyRows cross_entropy_rows(const Tensor& logits, const Tensor& targets) {
  FORGE_CHECK(logits.dim() == 2 && targets.numel() == logits.size(0) && is_floating(logits.dtype()),
              "cross_entropy_rows: floating (N, V) logits and N targets, got ", logits.shape(), " and ",
              targets.shape());
  detail::check_same_device("cross_entropy_rows", {logits, targets});
  const TensorOptions opt{.dtype = cpu::cross_entropy_lse_dtype(logits.dtype()), .device = logits.device()};
  CrossEntropyRows r{empty({logits.size(0)}, opt), empty({logits.size(0)}, opt)};
  const Tensor ls = contiguous(logits.detach()), ts = contiguous(targets.detach());
  constexpr int64_t kNoIgnore = -1;  // (the targets lie in [0, V): every row counts)
  if (ls.is_cpu()) {
    cpu::cross_entropy_forward(ls, ts, kNoIgnore, r.loss, r.lse);
  } else {
    Tensor total, scale;  // (not wanted)
    FORGE_ON_CUDA("cross_entropy_rows", cuda::cross_entropy_forward(ls, ts, kNoIgnore, false, r.loss, r.lse, total, scale));
  }
  return r;
}

}  // namespace forge::ops
