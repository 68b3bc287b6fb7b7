#pragma once
// Losses. cross_entropy is fused with log-softmax (the logits are never normalised into a
// separate tensor).
#include <cstdint>

#include "forge/core/tensor.h"

namespace forge::ops {

// How per-position losses are combined (torch's reduction='mean' | 'sum' | 'none').
enum class Reduction { mean, sum, none };

// Cross-entropy between logits and class targets, with classes on the LAST dim:
//   logits (N, V) or (B, T, V) (any (..., V)) floating; targets (N) or (B, T) (the logits'
//   shape without its last dim), i64 or i32.
//   loss_n = logsumexp(logits[n, :]) - logits[n, targets[n]], and 0 where targets[n] == ignore_index.
//   mean: sum of the losses / number of non-ignored targets (NaN when all are ignored, like
//   torch); sum: their sum; none: the per-position losses, of targets' shape. The result has
//   the logits' dtype for f32/f64 logits and is f32 for bf16/f16 logits (Note [loss dtype]:
//   as torch.autocast computes it; the log-sum-exp is accumulated in f32 either way and
//   dlogits keep the logits' dtype). For 2-D logits this is torch.nn.functional.cross_entropy(logits,
//   targets, ignore_index=..., reduction=...); for (B, T, V) it equals torch's on
//   logits.view(-1, V) and targets.view(-1) (torch itself would take dim 1 as the class dim).
// A target outside [0, V) that is not ignore_index throws forge::Error naming it (on CUDA
// the kernel checks it instead and fails with a device-side assertion, reported at the next
// synchronising call: Note [device-side index checks] in backends/cuda/reduce.cuh). On CUDA
// the reduced loss is computed on the device: the op never synchronises with the host.
// Differentiable in logits (fused: dlogits = (softmax - onehot) * g / count).
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100,
                     Reduction reduction = Reduction::mean);

const char* reduction_name(Reduction r);

// cross_entropy for a caller that never reads `logits` again (CausalLM::head_loss, whose logits
// live only inside it). On CUDA with FORGE_FUSED_CLASSIFIER=1 (the default), a reduction of mean or
// sum and a gradient wanted, the forward also computes dlogits and writes them over the logits
// (Note [dlogits in the forward], backends/cuda/loss.cu): the same loss and, for the upstream
// gradient expected (1, or a LossGradDivisor scope's, below), the same gradient bits, with one read
// of the logits less. Everywhere else exactly
// cross_entropy. The logits' storage version is bumped when they are overwritten, so a node that
// saved them fails its backward loudly instead of reading dlogits.
Tensor cross_entropy_consuming(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100,
                               Reduction reduction = Reduction::mean);
// How many cross_entropy_consuming forwards wrote dlogits over the logits; for tests.
int64_t cross_entropy_fused_forwards();

// The gradient a training loop will hand the loss's backward, said before the forward: within the
// scope (this thread), the loss will be divided by `divisor` (train.grad_accum micro-batches) and,
// when `scale` is given (f16's LossScaler: a 0-d f32 tensor on the loss's device), multiplied by
// that scale; its backward is then given what autograd forms for it in f32: 1 / divisor, or
// scale / divisor (scale itself for a divisor of 1), the latter on the device. The fused
// classifier writes dlogits for that gradient in its forward, and its backward has nothing left
// to do when it comes (Note [expected loss gradient]). Any other gradient stays right: the
// backward then multiplies dlogits by g / expected in one pass. `scale` must keep its storage and
// value from the forward to the backward (the scaler updates it after the step). Scopes nest;
// outside every scope the expected gradient is 1.
//   { ops::LossGradDivisor k(grad_accum); Tensor loss = model.head_loss(s, y); (loss / grad_accum).backward(); }
class LossGradDivisor {
 public:
  explicit LossGradDivisor(int64_t divisor, const Tensor& scale = Tensor());  // divisor >= 1
  ~LossGradDivisor();
  LossGradDivisor(const LossGradDivisor&) = delete;
  LossGradDivisor& operator=(const LossGradDivisor&) = delete;

 private:
  int64_t previous_divisor_;
  Tensor previous_scale_;
};
// The innermost LossGradDivisor scope's expectation (divisor 1 and no scale outside any scope).
struct ExpectedLossGrad {
  int64_t divisor = 1;
  Tensor scale;  // undefined: none
  // The expected gradient as f32 when it is known on the host (no scale), else 0.
  float host_value() const;
};
ExpectedLossGrad expected_loss_grad();

// cross_entropy's fused backward on its own, for a loss whose forward is assembled elsewhere
// (tp::vocab_parallel_cross_entropy: the log-sum-exp reduced over the ranks of a vocabulary-
// parallel head). Without history:
//   dlogits[n, j] = (exp(logits[n, j] - lse[n]) - [j == targets[n] - class_start]) * grad_n * scale
// and zero rows where targets[n] == ignore_index. logits (N, V) contiguous; targets (N) i64;
// lse (N) and grad (() or (N)) and scale (()) of the loss dtype (Note [loss dtype]), on the
// logits' device. class_start >= 0: the logits are the classes [class_start, class_start + V)
// and a target outside them is another rank's (its row gets the softmax term only); -1: every
// class. in_place: dlogits is written over `logits` (whose memory the caller gives up).
Tensor cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& grad,
                              const Tensor& scale, int64_t ignore_index, int64_t class_start, bool in_place);

// cross_entropy's fused forward per row, without history: for (N, V) logits and N targets in
// [0, V), lse[n] = logsumexp_j(logits[n, j]) and loss[n] = lse[n] - logits[n, targets[n]], both
// (N) of the loss dtype. No (N, V) temporary.
struct CrossEntropyRows {
  Tensor lse, loss;
};
CrossEntropyRows cross_entropy_rows(const Tensor& logits, const Tensor& targets);

// How many cross_entropy backwards wrote dlogits over the logits (Note [dlogits in place] in
// loss.cpp); for tests.
int64_t cross_entropy_backwards_in_place();

}  // namespace forge::ops
