#pragma once
// CUDA scaled dot-product attention, forward and backward, with the signatures, math and
// conventions of backends/cpu/attention.h (Note [attention conventions] in
// ops/attention.h: GQA, bottom-right causal, bool mask, a zero row where no key is allowed).
// Plain C++ declarations; the kernels and the decomposition are in attention.cu.
//
// bf16 / f16 with head dim 64 or 128 and no mask run the fused flash-attention kernels
// (flash_attention.h; FORGE_FLASH_ATTENTION=0 disables them). Everything else is
// composed of cuBLASLt GEMMs and a fused softmax:
//   forward   S = scale q k^T (GEMM), P = softmax(S masked) with lse (one kernel), O = P v (GEMM)
//   backward  S again (GEMM), dP = dO v^T (GEMM), P = exp(S - lse) and dS = P (dP - delta)
//             with delta = rowsum(dO * O) (one kernel), dv = P^T dO, dq = scale dS k,
//             dk = scale dS^T q (GEMMs; GQA sums over a group inside the GEMM)
// The (T, S) matrices live only in a scratch buffer, a chunk of (batch, kv head) pairs at a
// time; P is recomputed in backward from the saved lse rather than saved.
//
// Layouts: q, k, v, dout and out may be any strided views (the permuted (B, T, H, D) views
// of a fused QKV projection are read in place, through the GEMMs' leading dimensions);
// out, dq, dk, dv may be any layout too (written in place when the GEMMs can, else through
// a contiguous temporary). lse (B, H, T) is contiguous, f32 (f64 for f64 inputs).
#include <cstdint>

#include "forge/core/tensor.h"

namespace forge::cuda {

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool causal,
                       double scale, Tensor& out, Tensor& lse);

// dout: dL/d(out); out and lse: the forward's results. Undefined dq / dk / dv are skipped.
void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                        const Tensor& out, const Tensor& lse, bool causal, double scale, Tensor& dq, Tensor& dk,
                        Tensor& dv);

// Bytes per scratch buffer of (T, S) score matrices (forward uses one, backward two);
// default 256 MiB. Returns the previous value. A tuning and testing knob: smaller budgets
// mean more, smaller GEMM batches.
int64_t set_attention_scratch_bytes(int64_t bytes);

}  // namespace forge::cuda
