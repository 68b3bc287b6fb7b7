#pragma once
// CUDA cross-entropy over the last (class) dim, fused with log-softmax, and its fused
// backward: the counterparts of backends/cpu/loss.h (see loss.cu for the math, the memory
// contract and Note [cross-entropy on the device]).
//
// Unlike the CPU kernel, which returns the reduced loss as host numbers
// (cpu::CrossEntropyTotals), the CUDA forward reduces on the device and writes the result
// and the backward's scale into device tensors, so neither the op nor its backward
// synchronises with the host. Out-of-range targets fail a device-side check (Note
// [device-side index checks] in reduce.cuh) instead of throwing.
#include <cstdint>

#include "forge/core/tensor.h"

namespace forge::cuda {

// loss_n = logsumexp_j(logits[n, j]) - logits[n, targets[n]], 0 where targets[n] == ignore_index.
//   logits  (N, V)  contiguous, floating (any shape (..., V) with N rows)
//   targets (N)     contiguous, i32/i64 (any shape of N elements)
//   loss    (N)     contiguous, logits' dtype; overwritten, or undefined (not written)
//   lse     (N)     contiguous, cpu::cross_entropy_lse_dtype(logits); overwritten (0 for ignored rows)
//   total   ()      logits' dtype; overwritten with sum_n loss_n, divided by the number of
//                   counted rows when `mean` (NaN when none is counted); or undefined
//   scale   ()      lse's dtype; overwritten with the backward's scale: 1 / count for mean
//                   (0 when none is counted), else 1; or undefined
void cross_entropy_forward(const Tensor& logits, const Tensor& targets, int64_t ignore_index, bool mean,
                           Tensor& loss, Tensor& lse, Tensor& total, Tensor& scale);

// dlogits[n, j] = (softmax(logits[n])_j - [j == targets[n]]) * grad_n * scale, zero rows where
// targets[n] == ignore_index.
//   grad    ()  or (N)  contiguous, logits' dtype: one upstream gradient for every row, or one per row
//   scale   ()          lse's dtype on the device (the forward's), or undefined for 1
//   dlogits (N, V)      contiguous, logits' dtype; overwritten (may be logits itself: in place)
// class_start: as cpu::cross_entropy_backward's (>= 0: the logits are the classes [class_start,
// class_start + V) of a vocabulary-parallel head; -1: every class).
void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& grad,
                            const Tensor& scale, int64_t ignore_index, Tensor& dlogits, int64_t class_start = -1);

// The upstream gradient the fused classifier writes dlogits for (Note [expected loss gradient] in
// ops/loss.cpp): `value` when `scale` is undefined, else scale / divisor formed on the device in
// f32 (scale itself for a divisor of 1); scale a 0-d f32 tensor on the logits' device.
struct ExpectedGrad {
  float value = 1.0f;
  Tensor scale;
  int64_t divisor = 1;
};

// The forward and, for an upstream gradient of `expected` (1; a training loop's 1 / grad_accum,
// Note [expected loss gradient] in ops/loss.cpp), the backward in one pass (Note [dlogits in the
// forward] in loss.cu): lse, total and scale as cross_entropy_forward's (all three defined), and
// the logits overwritten with dlogits = (softmax - onehot) * expected * scale, the bits of
// cross_entropy_backward with grad `expected`. Returns false, having written nothing, where it
// does not apply (f64; V not whole 16-byte vectors or the logits unaligned; a row larger than a
// block's shared memory); the caller then runs the two kernels.
bool cross_entropy_fused(Tensor& logits, const Tensor& targets, int64_t ignore_index, bool mean, Tensor& lse,
                         Tensor& total, Tensor& scale, const ExpectedGrad& expected = {});

// out = dlogits * (grad / expected) (grad 0-d, the loss dtype, on the device; dlogits written for
// an upstream gradient of `expected`, > 0). out may be dlogits itself: then nothing is done when
// grad equals expected (decided on the device, where a scale is read).
void scale_dlogits(const Tensor& dlogits, const Tensor& grad, Tensor& out, const ExpectedGrad& expected = {});

}  // namespace forge::cuda
