#pragma once
// Fused causal / non-causal flash attention (FlashAttention-2) for bf16 and f16, head dim
// 64 or 128: the fast path of cuda::attention_forward / attention_backward (attention.cu
// dispatches here when flash_attention_applies; everything else takes the GEMM path).
// Same contract as attention.h (Note [attention conventions] in ops/attention.h): q
// (B, H, T, D), k and v (B, Hkv, S, D), GQA (query head h reads kv head h / (H / Hkv)),
// bottom-right causal alignment, a row with no allowed key gives a zero output row and
// lse = -inf; lse is a contiguous f32 (B, H, T) of natural-log units.
// The design is Note [flash attention] in flash_attention.cu.
//
// Internal to backends/cuda/ (and its tests); plain C++, no CUDA headers.
#include <cstdint>

#include "forge/core/tensor.h"

namespace forge::cuda {

// False when the environment has FORGE_FLASH_ATTENTION=0 (core/env.h: read once per process;
// a test toggles it with env::Override): attention then always takes the GEMM path.
bool flash_attention_enabled();

// Whether the flash kernels take this problem: enabled, q/k/v bf16 or f16, 4-D, D == Dv in
// {64, 128}, no explicit mask, T > 0 and S > 0, and q, k, v readable in place
// (flash_attention_layout_ok).
bool flash_attention_applies(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask);

// A 4-D view the kernels read or write in place: unit stride in the last dim, the other
// strides multiples of 8 elements (16 bytes) and a 16-byte aligned data pointer. An
// undefined tensor is ok (nothing to read or write).
bool flash_attention_layout_ok(const Tensor& t);

// Preconditions: flash_attention_applies(q, k, v, {}), out (B, H, T, D) of q's dtype and lse
// as attention.h; out / dout / dq / dk / dv flash_attention_layout_ok. Undefined dq / dk /
// dv are skipped.
// doc_q (B, T) and doc_k (B, S): contiguous i32 document ids on q's device (Note [flash documents]
// in flash_attention.cu), both or neither.
void flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale, Tensor& out,
                             Tensor& lse, const Tensor& doc_q = {}, const Tensor& doc_k = {});
void flash_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                              const Tensor& lse, bool causal, double scale, Tensor& dq, Tensor& dk, Tensor& dv,
                              const Tensor& doc_q = {}, const Tensor& doc_k = {});
// Throws unless the ids are both undefined, or contiguous i32 (B, T) and (B, S) on q's device.
void check_flash_documents(const Tensor& q, const Tensor& k, const Tensor& doc_q, const Tensor& doc_k);
// Throws unless both are contiguous i32 (B, n) of one B on one CUDA device.
void check_flash_documents_shape(const Tensor& doc_q, const Tensor& doc_k);

// How many flash forward + backward calls have run in this process (tests check the path is
// taken).
int64_t flash_attention_calls();

}  // namespace forge::cuda
