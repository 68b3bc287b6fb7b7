#pragma once
// CPU cross-entropy over the last (class) dim, fused with log-softmax, and its fused
// backward (see loss.cpp for the math and the memory contract). Targets are i32 or i64;
// every target that is not ignore_index is range-checked before anything is written.
#include <cstdint>

#include "forge/core/tensor.h"

namespace forge::cpu {

// The dtype of the saved per-row log-sum-exp: f32 for bf16/f16 logits, else the logits' dtype.
DType cross_entropy_lse_dtype(DType logits);

struct CrossEntropyTotals {
  double sum = 0;     // sum of the per-row losses over the counted rows, in double, in row order
  int64_t count = 0;  // rows whose target is not ignore_index
};

// loss_n = logsumexp_j(logits[n, j]) - logits[n, targets[n]], 0 where targets[n] == ignore_index.
//   logits  (N, V)  contiguous, floating (any shape (..., V) with N rows)
//   targets (N)     contiguous, i32/i64 (any shape of N elements)
//   loss    (N)     contiguous, cross_entropy_lse_dtype (f32 for 16-bit logits); overwritten, or undefined (not written)
//   lse     (N)     contiguous, cross_entropy_lse_dtype; overwritten (0 for ignored rows)
CrossEntropyTotals cross_entropy_forward(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                         Tensor& loss, Tensor& lse);

// dlogits[n, j] = (softmax(logits[n])_j - [j == targets[n]]) * grad_n * scale, zero rows where
// targets[n] == ignore_index.
//   grad    ()  or (N)  contiguous, cross_entropy_lse_dtype: one upstream gradient for every row, or one per row
//   dlogits (N, V)      contiguous, logits' dtype; overwritten (may be logits itself: in place)
// class_start >= 0: the logits are one slice of the classes, [class_start, class_start + V) (a
// vocabulary-parallel head), lse the log-sum-exp over all of them and the targets whole-vocabulary
// classes; a target outside the slice is another rank's, and its row gets the softmax term only.
// class_start = -1 (default): the logits hold every class and each target must lie in [0, V).
void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& grad,
                            double scale, int64_t ignore_index, Tensor& dlogits, int64_t class_start = -1);

}  // namespace forge::cpu
