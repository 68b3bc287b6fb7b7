#pragma once
// Scaled dot-product attention (fused, flash-attention style on the CPU) with grouped-query
// attention, causal masking and an optional boolean mask.
//
//   q (B, H, T, D), k (B, Hkv, S, D), v (B, Hkv, S, Dv)  ->  (B, H, T, Dv)
//   out = softmax(scale * q k^T  masked) v
//
// Conventions (Note [attention conventions]):
// - Grouped-query attention: H must be a multiple of Hkv; query head h uses kv head
//   h / (H / Hkv) (torch.repeat_interleave(k, H / Hkv, dim=1)). Hkv == H is multi-head,
//   Hkv == 1 multi-query attention.
// - causal: query t attends to keys s <= t + (S - T), the bottom-right alignment of
//   flash-attn >= 2.1 and of PyTorch's causal_lower_right bias: the T queries are the last T
//   positions of the S keys (decoding with a KV cache). With T == S this is s <= t. (PyTorch's
//   F.scaled_dot_product_attention(is_causal=True) aligns top-left instead; the two differ
//   only when T != S.)
// - mask: optional bool, broadcastable to (B, H, T, S) (e.g. (T, S) or (B, 1, 1, S) for
//   padding); true = may attend. It combines with `causal` (both must allow a key); PyTorch
//   refuses the combination, forge takes the intersection.
// - scale: 0 means 1/sqrt(D).
// - A query row with no key allowed (by mask and/or causality, e.g. T > S causal) gives a
//   zero output row and zero gradients, as flash attention does; PyTorch's math path gives
//   NaN there.
// - Differentiable in q, k and v (dk and dv sum over the query heads of a group); the
//   mask gets no gradient. Saves the forward output and one logsumexp per query row, never
//   the (T, S) probabilities.
// Dtypes: f32, f64, bf16, f16 (one dtype for q, k, v; 16-bit computes in f32). On CUDA
// the kernel is composed of cuBLASLt GEMMs and a fused softmax (backends/cuda/attention.h;
// S and P are rounded to the compute dtype between the GEMMs) and the result may be a
// non-contiguous view (dense in q's memory order, so the usual transpose(1, 2).reshape()
// after attention is a view).
#include <string>

#include "forge/core/tensor.h"
#include "forge/ops/rope.h"

namespace forge::ops {

// Which CUDA attention kernels may run (Note [attention back-ends] in
// backends/cuda/attention.cu): "auto" (cuDNN's fused attention, then forge's flash kernels,
// then the composed GEMM path, each where it applies), "flash" (forge's flash kernels, then
// the composed path), "composed" (the composed path only). Process-wide; forge train sets it
// from run.attention. Throws naming the valid values on any other name. No effect on the CPU.
void set_attention_backend(const std::string& name);
std::string attention_backend();
// The names set_attention_backend takes, e.g. for a config check.
bool is_attention_backend(const std::string& name);

// Deterministic attention backward on CUDA: no atomics, so gradients are the same bit for bit
// from run to run (cuDNN's deterministic algorithm, else the composed path; a few percent of
// the step slower). Process-wide; forge train sets it from run.deterministic. The CPU kernels
// are always deterministic.
void set_deterministic(bool on);
bool deterministic();

// Note [document masks]: a row that packs several documents (data.packing = "documents") attends
// within each document only. `documents` (B, S) i32 is the document id of every key position; the T
// queries are the last T of the S positions (bottom-right, as with causal), so query t has id
// documents[b, S - T + t], and it attends key j only when the two ids are equal (and causality
// allows). Ids are compared, not ordered: any labelling works. A packed row's positions restart at
// each document too (ops::rope with a positions tensor; GPT's position table), which is the
// caller's part. Not differentiable in the ids; not combined with `mask` (give one or the other).
// CPU: the kernels compare ids as they mask, no (T, S) mask is made. CUDA: forge's flash kernels
// take the ids (bf16 / f16, head size 64 or 128, not the deterministic backward: Note [flash
// documents] in backends/cuda/flash_attention.cu); elsewhere the backend makes their (B, 1, T, S)
// mask for the composed GEMM path. cuDNN's fused attention is not used with ids.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal = true,
                                    double scale = 0.0, const Tensor& mask = {}, const Tensor& documents = {});

// Note [attention blocks]: attention assembled from pieces (ring attention across the ranks of
// a context-parallel group, parallel/context_parallel.h) runs the kernels on one (query block,
// key block) pair at a time, without autograd, and combines the pieces itself:
//   attention_block_forward   the block's output (q's dtype) and its rows' logsumexp (f32; f64
//                             for f64 inputs); a row with no allowed key: output 0, lse -inf
//   attention_block_backward  dq, dk, dv of the block, given the upstream gradient and the
//                             output and logsumexp of the WHOLE attention (the pieces combined):
//                             then p = exp(s - lse) is the row's true probability and
//                             delta = dO . out the true one, so the block's gradients are its
//                             exact share of the whole's (dq summed over the key blocks, dk and
//                             dv over the query blocks).
// Shapes and conventions are scaled_dot_product_attention's (no mask; causal bottom-right).
// `out` and `lse` may be any tensors of the block's row shapes (copied when the kernel cannot
// read them in place); dq, dk, dv come back in q's, k's and v's dtype.
struct AttentionBlock {
  Tensor out;  // (B, H, T, Dv)
  Tensor lse;  // (B, H, T)
};
// doc_q (B, T) and doc_k (B, S) i32: the block's document ids (Note [document masks]), both or neither.
AttentionBlock attention_block_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale = 0.0,
                                       const Tensor& doc_q = {}, const Tensor& doc_k = {});
struct AttentionBlockGrads {
  Tensor dq, dk, dv;
};
AttentionBlockGrads attention_block_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                             const Tensor& out, const Tensor& lse, bool causal, double scale = 0.0,
                                             const Tensor& doc_q = {}, const Tensor& doc_k = {});
// Multi-head attention straight from a fused QKV projection:
//   qkv (B, T, 3 C) = [q | k | v] along the last dim, C = n_head * D  ->  (B, T, C)
// the same values as splitting qkv into three (B, T, n_head, D) head views, attending
// (scaled_dot_product_attention, no mask) and merging the heads back. One autograd node: the
// backward writes dq, dk and dv side by side into one (B, T, 3 C) gradient, which is qkv's
// gradient as it stands (split + views would give three zero-filled (B, T, 3 C) gradients and
// two full-size additions: Note [packed QKV attention] in attention.cpp).
Tensor qkv_attention(const Tensor& qkv, int64_t n_head, bool causal = true, double scale = 0.0);

// LLaMA's attention straight from one packed projection (Note [packed LLaMA attention] in
// attention.cpp):
//   qkv (B, T, (H + 2 Hkv) D) = [q | k | v], H = n_head query heads, Hkv = n_kv_head
//   -> (B, T, H D): rope(q) and rope(k) at positions position_offset.. (ops::rope, theta and
//   scaling), causal grouped-query attention (scale 1/sqrt(D)), heads merged.
// The same values as splitting qkv into head views, ops::rope and scaled_dot_product_attention.
// One autograd node: the backward writes dq, dk and dv side by side into one gradient of qkv's
// shape, so q, k and v can come from one GEMM (three narrow views would each zero-fill it).
Tensor qkv_rope_attention(const Tensor& qkv, int64_t n_head, int64_t n_kv_head, int64_t position_offset = 0,
                          double theta = 10000.0, const RopeScaling& scaling = RopeScaling::none(),
                          bool causal = true);

}  // namespace forge::ops
