#pragma once
// CUDA scaled dot-product attention, forward and backward, with the signatures, math and
// conventions of backends/cpu/attention.h (Note [attention conventions] in
// ops/attention.h: GQA, bottom-right causal, bool mask, a zero row where no key is allowed).
// Plain C++ declarations; the kernels and the decomposition are in attention.cu.
//
// bf16 / f16 problems without a mask run fused kernels: cuDNN's fused attention
// (cudnn_attention.h) or forge's flash-attention kernels (flash_attention.h), chosen as Note
// [attention back-ends] in attention.cu says. Everything else is composed of cuBLASLt GEMMs
// and a fused softmax:
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

// doc_q (B, T) / doc_k (B, S): contiguous i32 document ids (Note [document masks] in
// ops/attention.h), both or neither, instead of a mask: the flash kernels take them where
// document_attention_applies (Note [flash documents]); elsewhere their dense mask is made for the
// composed path.
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool causal,
                       double scale, Tensor& out, Tensor& lse, const Tensor& doc_q = {}, const Tensor& doc_k = {});

// dout: dL/d(out); out and lse: the forward's results. Undefined dq / dk / dv are skipped.
void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                        const Tensor& out, const Tensor& lse, bool causal, double scale, Tensor& dq, Tensor& dk,
                        Tensor& dv, const Tensor& doc_q = {}, const Tensor& doc_k = {});

// Whether attention_forward and attention_backward take document ids for this problem: the
// flash kernels apply (bf16 / f16, head size 64 or 128, layouts they read), the back-end setting
// allows them and the backward is not deterministic (the deterministic one is the composed path).
bool document_attention_applies(const Tensor& q, const Tensor& k, const Tensor& v);

// Which back-ends may run (Note [attention back-ends]): automatic = cuDNN, then flash, then
// the composed path; flash = forge's flash kernels, then the composed path; composed = only
// the composed path. Process-wide; forge train sets it from run.attention.
enum class AttentionBackend : uint8_t { automatic, flash, composed };
void set_attention_backend(AttentionBackend b);
AttentionBackend attention_backend();

// Whether a fused back-end (cuDNN or forge's flash kernels) takes this problem under the current
// setting: then any row layout of out and the gradients is read and written in place.
bool fused_attention_applies(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool causal);

// Deterministic backward (no atomics: dq, dk, dv the same bit for bit from run to run):
// process-wide; forge train sets it from run.deterministic.
void set_deterministic_attention(bool on);
bool deterministic_attention();

// Bytes per scratch buffer of (T, S) score matrices (forward uses one, backward two);
// default 256 MiB. Returns the previous value. A tuning and testing knob: smaller budgets
// mean more, smaller GEMM batches.
int64_t set_attention_scratch_bytes(int64_t bytes);

}  // namespace forge::cuda
