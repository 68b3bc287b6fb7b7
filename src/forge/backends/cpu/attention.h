#pragma once
// CPU scaled dot-product attention, forward and backward, in the manner of flash attention:
// the (T, S) probability matrix is never stored; the forward saves one logsumexp per query
// row and the backward recomputes the probabilities from it, one block of query rows at a
// time.
//
// Shapes (G = H / Hkv query heads share one key/value head: query head h reads kv head h / G,
// the layout torch.repeat_interleave(k, G, dim=1) gives):
//   q    (B, H, T, D)      k (B, Hkv, S, D)      v (B, Hkv, S, Dv)
//   mask (B, H, T, S) bool, usually an expanded view (stride 0 on broadcast dims), or
//        undefined; true = the query may attend to the key
//   docs (B, T) and (B, S) i32 contiguous document ids of the queries and the keys, or both
//        undefined (Note [document masks] in ops/attention.h): a query attends only to keys
//        of its own document
//   out  (B, H, T, Dv)     lse (B, H, T)
//
// Forward, for query row t of head h (kv head g = h / G), with scale c:
//   allowed(t, j) = mask[t, j] && (!causal || j <= t + (S - T))    (bottom-right causal)
//                   && docs.q[t] == docs.k[j]                       (with document ids)
//   s_tj  = c * (q_t . k_j)  where allowed, -inf elsewhere
//   lse_t = log sum_j exp(s_tj)        p_tj = exp(s_tj - lse_t)        out_t = sum_j p_tj v_j
// A row with no allowed key gives out_t = 0 and lse_t = -inf (and zero gradients).
//
// Backward, from dO = dL/d(out):
//   delta_t = dO_t . out_t
//   dp_tj   = dO_t . v_j
//   ds_tj   = p_tj (dp_tj - delta_t)
//   dq_t    = c sum_j ds_tj k_j
//   dk_j    = c sum_{h in group, t} ds_tj q_t          dv_j = sum_{h in group, t} p_tj dO_t
//
// Memory contract:
// - q, k, v, dout are read through their strides, without a copy, when each is a stack of
//   row-major matrices: the last dim has stride 1 (or size 1) and the row stride is at least
//   the row length (or there is one row). The B and H strides are free (0 included), so the
//   (B, T, H, D) -> (B, H, T, D) permuted view of a fused QKV projection is read in place.
//   attention_rows_readable() tells the ops layer when it must make a copy first.
// - out, lse (forward) and dq, dk, dv (backward) are contiguous and overwritten, never
//   accumulated into. lse has dtype f64 for f64 inputs, else f32. In backward, an undefined
//   dq / dk / dv is not computed.
// - Scratch: per thread, one (kAttentionBlock, S) score block (and, for backward, its
//   gradient); for 16-bit dtypes also f32 copies of the q/dO block and of the kv head's k
//   and v. Backward with G > 1 (or 16-bit dtypes) accumulates dk/dv per query head in
//   (B, H, S, D) / (B, H, S, Dv) buffers of the compute type, summed over each group at the
//   end, so that no two threads ever add into the same memory.
//
// Precision: f32 and f64 run their GEMMs (cblas_sgemm / cblas_dgemm) and the softmax in
// their own type; bf16/f16 are converted to f32 per block, multiplied with f32 accumulation
// and rounded once into out / dq / dk / dv (Note [16-bit conversions] in core/half.h). The
// softmax denominators and delta_t are summed in double.
//
// Threads: forward tasks are (b, h, block of query rows), backward tasks are (b, h); both are
// spread over OpenMP threads, with OpenBLAS held to one thread meanwhile (its own threads on
// top of OpenMP's would oversubscribe the cores). A single task keeps OpenBLAS's threads.
#include <cstdint>

#include "forge/core/tensor.h"

namespace forge::cpu {

// Query rows per block: the unit of the score GEMM and of the causal key-range cut.
inline constexpr int64_t kAttentionBlock = 64;

// True when the kernels can read the 4-D tensor t in place (see the memory contract).
bool attention_rows_readable(const Tensor& t);

// The document ids of the queries (B, T) and of the keys (B, S); both undefined: none.
struct AttentionDocuments {
  Tensor q, k;
};

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool causal,
                       double scale, Tensor& out, Tensor& lse, const AttentionDocuments& docs = {});

// dout: dL/d(out); out and lse: the forward's results.
void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                        const Tensor& out, const Tensor& lse, bool causal, double scale, Tensor& dq, Tensor& dk,
                        Tensor& dv, const AttentionDocuments& docs = {});

}  // namespace forge::cpu
