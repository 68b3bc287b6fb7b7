// Fused flash attention (FlashAttention-2, Dao 2023) for bf16 / f16 and head dim 64 / 128.
// Contract in flash_attention.h; the reference semantics are backends/cpu/attention.cpp.
//
// Note [flash attention]
// Shapes: q (B, H, T, D), k and v (B, Hkv, S, D), G = H / Hkv; query head h reads kv head
// h / G. Query t may attend key j iff j < S and, when causal, j <= t + (S - T) (bottom-right
// alignment). Scores are s = scale q.k; the kernels work in log2 units, x = s * scale * log2(e),
// so exp(s - m) = exp2(x - m'); lse is stored in natural-log units (x / log2(e)).
//
// Tensor cores: mma.sync m16n8k16 (bf16 or f16 inputs, f32 accumulation) through inline
// PTX. Fragment layouts (g = lane / 4, c = lane % 4; each 32-bit register holds two
// consecutive 16-bit elements, the lower index in the low half):
//   A 16x16 row-major: reg0 (row g,   cols 2c, 2c+1)   reg1 (row g+8, cols 2c, 2c+1)
//                      reg2 (row g,   cols 2c+8, +9)  reg3 (row g+8, cols 2c+8, +9)
//   B 16x8 (k x n):    reg0 (k 2c, 2c+1; col g)        reg1 (k 2c+8, 2c+9; col g)
//   C 16x8 f32:        c0, c1 (row g, cols 2c, 2c+1)   c2, c3 (row g+8, cols 2c, 2c+1)
// Every tile sits in shared memory row-major as in global memory ([row][d]). A B operand
// B[k][n] whose tile is B^T row-major (K for Q K^T: B[d][key] = K[key][d]; pairs consecutive
// along k) is read with 32-bit loads; one whose tile is B itself row-major (V for P V, and
// dO, Q, K in the backward's products over keys / queries) with ldmatrix.trans (load_b_trans).
// The C fragments of two adjacent 8-column tiles are exactly the A fragment of one 16-wide
// k-slice (reg0 = C[2i] c0c1, reg1 = C[2i] c2c3, reg2 = C[2i+1] c0c1, reg3 = C[2i+1] c2c3):
// P (and dS) go from one product into the next in registers, rounded to bf16 / f16.
// Shared-memory rows are padded by 8 elements (16 bytes): the eight rows g of a fragment
// load then start on banks 4g apart (or 20g for 40-element rows), so the 32 words of a warp's
// fragment load hit 32 distinct banks.
//
// Forward (flash_fwd_kernel): one CTA of 4 warps per (query block of Br = 64 rows, b, h);
// warp w owns query rows 16w..16w+15 and keeps their Q fragments in registers. For each key
// block of Bc = 64 keys (K and V staged in shared memory by cp.async, double buffered: block
// kb + 1 loads while block kb computes): S = Q K^T (16 x 64 per warp), masked to -inf where not allowed, online
// softmax per row (running max m and sum l in f32; the four lanes of a quad share a row and
// combine with two shuffles), O = O * exp2(m_old - m_new) + P V. Causal: key blocks past the
// block's last allowed key are never loaded, and the per-element mask runs only on blocks
// that cross the diagonal (or the end of S). A row whose max is still -inf uses 0 as its
// reference so exp2 never sees -inf - -inf; at the end l = 0 (no allowed key) gives a zero
// row and lse = -inf. Blocks are launched heaviest (last query block) first.
//
// Backward: D_i = rowsum(dO o O) by flash_delta_kernel (f32), then flash_bwd_kernel, one CTA
// per (key block of Bc = 64 keys, b, kv head); warp w owns keys 16w..16w+15 and accumulates
// their dK and dV (16 x D each) in registers while it walks every query head of the group
// and every query block (Br = 64 rows for D = 64, 32 for D = 128 to bound registers) that
// can see the key block (causal: from the block of the first query allowed to see key
// kbase). Per query block, with Q, dO, lse and D_i staged in shared memory (double buffered:
// cp.async for Q and dO, registers for lse and D_i, the next block's loads overlap this one):
//   S^T  = K Q^T              (16 keys x Br per warp)
//   P^T  = exp2(S^T * c - lse * log2 e), 0 where not allowed (lse = -inf rows: 0 too)
//   dP^T = V dO^T
//   dS^T = P^T o (dP^T - D)
//   dV  += P^T dO,  dK += dS^T Q          (k = the Br queries; P^T, dS^T from registers)
//   dQ  += scale dS K: dS goes to shared memory as (Br, Bc), the 4 warps split the (Br, D)
//          product and add it with f32 atomicAdd into an f32 scratch dQ (B, H, T, D).
// dK is scaled once at the end; dK, dV are written directly (GQA sums over the group's heads
// inside the CTA, so no atomics there). flash_dq_convert_kernel rounds the f32 dQ into dq.
// The atomics make dq non-deterministic in its last bits (summation order across CTAs);
// dk and dv are deterministic.
//
// Layouts: q, k, v, dout, out and the gradients are read / written in place through their
// (b, h, t) strides (unit stride in the last dim, 16-byte aligned rows): the (B, T, H, D)
// views of GPT-2's fused c_attn output are not copied.
//
// Note [flash documents]: packed documents (Note [document masks] in ops/attention.h). With the
// rows' and the keys' document ids (i32, (B, T) and (B, S)), an element is allowed only where the
// two ids are equal as well: the forward reads its two rows' ids once and the key's id per
// element of every block (from global memory: (B, S) ids are small and stay in L1/L2); the
// backward reads its two keys' ids once and the query's per element. Every block then takes the
// masked path. The key blocks outside the rows' documents are not visited at all (Note [flash
// document ranges] in flash_attention_common.cuh), nor, in the backward, the query blocks outside
// the keys' documents: a row of short documents costs a fraction of an unpacked row.
//
// This file: the forward kernel and the entry points; the backward kernels are in
// flash_attention_backward.cu, the shared helpers in flash_attention_common.cuh.
#include <cmath>

#include "forge/backends/cuda/flash_attention.h"
#include "forge/backends/cuda/flash_attention_common.cuh"
#include "forge/backends/cuda/runtime.h"
#include "forge/backends/cuda/tensor_kernels.h"
#include "forge/core/env.h"

namespace forge::cuda {

namespace flash_detail {
std::atomic<int64_t> g_flash_calls{0};
}  // namespace flash_detail

namespace {

using namespace flash_detail;

// ---- forward -----------------------------------------------------------------------------

struct FwdParams {
  const uint16_t *q, *k, *v;
  uint16_t* o;
  float* lse;  // (B, H, T) contiguous
  const int32_t *doc_q, *doc_k;  // (B, T) and (B, S) document ids, contiguous; null: none (Note [flash documents])
  int64_t q_sb, q_sh, q_st, k_sb, k_sh, k_st, v_sb, v_sh, v_st, o_sb, o_sh, o_st;
  int B, H, G, T, S, n_qblocks;
  float scale_log2;  // scale * log2(e)
  bool causal;
};

template <class Tag, int D>
__global__ void __launch_bounds__(kThreads) flash_fwd_kernel(const FwdParams p) {
  constexpr int Br = kBrFwd, Bc = kBc, KS = D + 8;
  constexpr int ND = D / 8, NK = D / 16, NS = Bc / 8;
  // Q, then two stages of (K, V): stage i's K at sKV + 2i * Bc * KS, its V after it.
  uint16_t* sQ = reinterpret_cast<uint16_t*>(flash_smem);  // [Br][KS]
  uint16_t* sKV = sQ + Br * KS;                             // 2 x ([Bc][KS] K, [Bc][KS] V)
  const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
  const int64_t BH = static_cast<int64_t>(p.B) * p.H;
  const int64_t bid = blockIdx.x;
  const int qb = p.n_qblocks - 1 - static_cast<int>(bid / BH);  // heaviest (last) query blocks first
  const int64_t bh = bid % BH;
  const int b = static_cast<int>(bh / p.H), h = static_cast<int>(bh % p.H), hk = h / p.G;
  const int q0 = qb * Br, T = p.T, S = p.S, shift = S - T;
  const uint16_t* qbase = p.q + b * p.q_sb + h * p.q_sh;
  const uint16_t* kbase_p = p.k + b * p.k_sb + hk * p.k_sh;
  const uint16_t* vbase_p = p.v + b * p.v_sb + hk * p.v_sh;

  // Keys [0, kend) may be seen by some row of the block.
  int kend = S;
  if (p.causal) {
    const int last = min(q0 + Br, T) - 1;
    kend = min(S, max(0, last + shift + 1));
  }
  // Note [flash document ranges]: with documents, only the key blocks of the rows' documents.
  int kb_begin = 0, kb_end = (kend + Bc - 1) / Bc;
  if (p.doc_q) {
    int lo = 0, hi = 0;
    document_envelope(p.doc_q + static_cast<int64_t>(b) * T, q0, min(q0 + Br, T), p.doc_k + static_cast<int64_t>(b) * S,
                      0, kend, lo, hi);
    kb_begin = lo / Bc;
    kb_end = lo < hi ? (hi + Bc - 1) / Bc : kb_begin;
  }
  const int n_kb = kb_end - kb_begin;

  // Pipeline: Q and the first key block first; the loads of block kb + 1 (cp.async into the
  // other stage) run while block kb is computed.
  load_tile_async<Br, D>(qbase, p.q_st, q0, T, sQ, KS);
  if (n_kb > 0) {
    load_tile_async<Bc, D>(kbase_p, p.k_st, kb_begin * Bc, S, sKV, KS);
    load_tile_async<Bc, D>(vbase_p, p.v_st, kb_begin * Bc, S, sKV + Bc * KS, KS);
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  uint32_t qa[NK][4];
#pragma unroll
  for (int kk = 0; kk < NK; ++kk) load_a(qa[kk], sQ, KS, warp * 16, kk * 16, g, c);

  const int r0 = q0 + warp * 16 + g, r1 = r0 + 8;  // this thread's two query rows
  // Note [flash documents]: the rows' document ids, and the keys' row of ids.
  const int32_t* doc_k = p.doc_k ? p.doc_k + static_cast<int64_t>(b) * S : nullptr;
  int doc0 = 0, doc1 = 0;
  if (p.doc_q) {
    const int32_t* dq = p.doc_q + static_cast<int64_t>(b) * T;
    doc0 = r0 < T ? dq[r0] : 0;
    doc1 = r1 < T ? dq[r1] : 0;
  }
  float o[ND][4];
#pragma unroll
  for (int n = 0; n < ND; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  const float ninf = -INFINITY;
  float m0 = ninf, m1 = ninf, l0 = 0.f, l1 = 0.f;

  for (int i = 0; i < n_kb; ++i) {  // iteration i: key block kb_begin + i, in stage i & 1
    const int kbase = (kb_begin + i) * Bc;
    const bool prefetch = i + 1 < n_kb;
    if (prefetch) {  // the other stage was last read in iteration i - 1, which ended with a barrier
      uint16_t* next = sKV + ((i + 1) & 1) * 2 * Bc * KS;
      load_tile_async<Bc, D>(kbase_p, p.k_st, kbase + Bc, S, next, KS);
      load_tile_async<Bc, D>(vbase_p, p.v_st, kbase + Bc, S, next + Bc * KS, KS);
      cp_async_commit();
    }
    const uint16_t* sK = sKV + (i & 1) * 2 * Bc * KS;
    const uint16_t* sV = sK + Bc * KS;

    // S = Q K^T: B[k = d][n = key] = K[key][d], K row-major.
    float s[NS][4];
#pragma unroll
    for (int n = 0; n < NS; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < NK; ++kk) {
#pragma unroll
      for (int n = 0; n < NS; ++n) {
        uint32_t b0, b1;
        load_b(b0, b1, sK, KS, n * 8, kk * 16, g, c);
        mma<Tag>(s[n], qa[kk], b0, b1);
      }
    }

    // Scale to log2 units; mask only blocks crossing the diagonal or the end of S.
    const bool need_mask = doc_k != nullptr || kbase + Bc > S || (p.causal && kbase + Bc - 1 > q0 + shift);
    float mx0 = ninf, mx1 = ninf;
#pragma unroll
    for (int n = 0; n < NS; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[n][e] * p.scale_log2;
        if (need_mask) {
          const int j = kbase + n * 8 + 2 * c + (e & 1), t = e < 2 ? r0 : r1;
          if (j >= S || (p.causal && j > t + shift) || (doc_k && doc_k[j] != (e < 2 ? doc0 : doc1))) x = ninf;
        }
        s[n][e] = x;
      }
      mx0 = fmaxf(mx0, fmaxf(s[n][0], s[n][1]));
      mx1 = fmaxf(mx1, fmaxf(s[n][2], s[n][3]));
    }
    // The four lanes of a quad (same g) hold one row.
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    const float ref0 = mn0 == ninf ? 0.f : mn0, ref1 = mn1 == ninf ? 0.f : mn1;
    const float alpha0 = exp2f(m0 - ref0), alpha1 = exp2f(m1 - ref1);  // m = -inf: 0
    m0 = mn0;
    m1 = mn1;
    float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
    for (int n = 0; n < NS; ++n) {
      s[n][0] = exp2f(s[n][0] - ref0);
      s[n][1] = exp2f(s[n][1] - ref0);
      s[n][2] = exp2f(s[n][2] - ref1);
      s[n][3] = exp2f(s[n][3] - ref1);
      sum0 += s[n][0] + s[n][1];
      sum1 += s[n][2] + s[n][3];
    }
    l0 = l0 * alpha0 + sum0;  // a partial sum of this lane's columns; combined at the end
    l1 = l1 * alpha1 + sum1;
#pragma unroll
    for (int n = 0; n < ND; ++n) {
      o[n][0] *= alpha0;
      o[n][1] *= alpha0;
      o[n][2] *= alpha1;
      o[n][3] *= alpha1;
    }

    // O += P V: A = P from registers, B[k = key][n = d] = V[key][d] (ldmatrix.trans).
#pragma unroll
    for (int kk = 0; kk < Bc / 16; ++kk) {
      uint32_t pa[4];
      c_to_a<Tag>(pa, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
      for (int n = 0; n < ND; ++n) {
        uint32_t b0, b1;
        load_b_trans(b0, b1, sV, KS, kk * 16, n * 8, lane);
        mma<Tag>(o[n], pa, b0, b1);
      }
    }
    if (prefetch) cp_async_wait<0>();
    __syncthreads();  // the next block visible to all; this block's stage free for the one after
  }

  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
  uint16_t* obase = p.o + b * p.o_sb + h * p.o_sh;
  if (r0 < T) {
    uint16_t* orow = obase + static_cast<int64_t>(r0) * p.o_st + 2 * c;
#pragma unroll
    for (int n = 0; n < ND; ++n)
      *reinterpret_cast<uint32_t*>(orow + n * 8) = pack2<Tag>(o[n][0] * inv0, o[n][1] * inv0);
    // A NaN score makes l NaN: its logsumexp stays NaN (a fully masked row, l = 0, gets -inf), so
    // the backward pass propagates it too.
    if (c == 0) p.lse[bh * T + r0] = l0 > 0.f ? (m0 + log2f(l0)) * kLn2 : (l0 != l0 ? l0 : ninf);
  }
  if (r1 < T) {
    uint16_t* orow = obase + static_cast<int64_t>(r1) * p.o_st + 2 * c;
#pragma unroll
    for (int n = 0; n < ND; ++n)
      *reinterpret_cast<uint32_t*>(orow + n * 8) = pack2<Tag>(o[n][2] * inv1, o[n][3] * inv1);
    if (c == 0) p.lse[bh * T + r1] = l1 > 0.f ? (m1 + log2f(l1)) * kLn2 : (l1 != l1 ? l1 : ninf);
  }
}

template <class Tag, int D> void launch_fwd(const FwdParams& p, int device, int64_t blocks) {
  constexpr size_t smem = fwd_smem<D>();
  FORGE_CUDA_CHECK(
      cudaFuncSetAttribute(flash_fwd_kernel<Tag, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  flash_fwd_kernel<Tag, D><<<static_cast<unsigned>(blocks), kThreads, smem, current_stream(device)>>>(p);
}

}  // namespace

bool flash_attention_enabled() { return env::flag("FORGE_FLASH_ATTENTION"); }

bool flash_attention_layout_ok(const Tensor& t) {
  if (!t.defined()) return true;
  if (t.dim() != 4 || (t.dtype() != DType::bf16 && t.dtype() != DType::f16)) return false;
  if (t.size(3) > 1 && t.stride(3) != 1) return false;
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) return false;
  for (int i = 0; i < 3; ++i)
    if (t.size(i) > 1 && t.stride(i) % 8 != 0) return false;
  return true;
}

bool flash_attention_applies(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask) {
  if (!flash_attention_enabled() || mask.defined()) return false;
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4) return false;
  if (q.dtype() != k.dtype() || q.dtype() != v.dtype()) return false;
  if (q.dtype() != DType::bf16 && q.dtype() != DType::f16) return false;
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3), Hkv = k.size(1), S = k.size(2);
  if (D != 64 && D != 128) return false;
  if (k.size(3) != D || v.size(3) != D || k.size(0) != B || v.size(0) != B || v.size(1) != Hkv || v.size(2) != S)
    return false;
  if (Hkv <= 0 || H % Hkv != 0 || B <= 0 || T <= 0 || S <= 0) return false;
  // Grid and int indices: rows and blocks stay in int range.
  if (T > kMaxInt / 2 || S > kMaxInt / 2 || B * H * ((T + kBrFwd - 1) / kBrFwd) > kMaxInt ||
      B * Hkv * ((S + kBc - 1) / kBc) > kMaxInt || B * H > kMaxInt)
    return false;
  return flash_attention_layout_ok(q) && flash_attention_layout_ok(k) && flash_attention_layout_ok(v);
}

int64_t flash_attention_calls() { return g_flash_calls.load(); }

void check_flash_documents_shape(const Tensor& doc_q, const Tensor& doc_k) {
  auto ok = [](const Tensor& d) { return d.defined() && d.dtype() == DType::i32 && d.is_contiguous() && d.dim() == 2; };
  FORGE_CHECK(ok(doc_q) && ok(doc_k) && doc_q.size(0) == doc_k.size(0) && doc_q.device() == doc_k.device() &&
                  doc_q.is_cuda(),
              "attention: document ids must be contiguous i32 (B, T) and (B, S) on one CUDA device, got ",
              doc_q.defined() ? doc_q.shape() : Shape{}, " and ", doc_k.defined() ? doc_k.shape() : Shape{});
}

void check_flash_documents(const Tensor& q, const Tensor& k, const Tensor& doc_q, const Tensor& doc_k) {
  if (!doc_q.defined() && !doc_k.defined()) return;
  auto ok = [&](const Tensor& d, int64_t n) {
    return d.defined() && d.dtype() == DType::i32 && d.is_contiguous() && d.device() == q.device() &&
           d.shape() == Shape({q.size(0), n});
  };
  FORGE_CHECK(ok(doc_q, q.size(2)) && ok(doc_k, k.size(2)), "flash attention: document ids must be contiguous i32 (B, T) ",
              "and (B, S) on ", q.device().str(), " for q ", q.shape(), " and k ", k.shape());
}

void flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale, Tensor& out,
                             Tensor& lse, const Tensor& doc_q, const Tensor& doc_k) {
  FORGE_CHECK(flash_attention_applies(q, k, v, Tensor()) && flash_attention_layout_ok(out) &&
                  out.dtype() == q.dtype() && out.shape() == q.shape() && lse.dtype() == DType::f32 &&
                  lse.is_contiguous(),
              "flash_attention_forward: unsupported problem q ", q.shape(), " k ", k.shape(), " out ", out.shape());
  check_flash_documents(q, k, doc_q, doc_k);
  const int device = q.device().index;
  DeviceGuard guard(device);
  ++g_flash_calls;
  FwdParams p{};
  p.q = cptr(q);
  p.k = cptr(k);
  p.v = cptr(v);
  p.o = mptr(out);
  p.lse = static_cast<float*>(lse.data_ptr());
  p.doc_q = doc_q.defined() ? doc_q.data<int32_t>() : nullptr;
  p.doc_k = doc_k.defined() ? doc_k.data<int32_t>() : nullptr;
  p.q_sb = q.stride(0), p.q_sh = q.stride(1), p.q_st = q.stride(2);
  p.k_sb = k.stride(0), p.k_sh = k.stride(1), p.k_st = k.stride(2);
  p.v_sb = v.stride(0), p.v_sh = v.stride(1), p.v_st = v.stride(2);
  p.o_sb = out.stride(0), p.o_sh = out.stride(1), p.o_st = out.stride(2);
  p.B = static_cast<int>(q.size(0));
  p.H = static_cast<int>(q.size(1));
  p.G = static_cast<int>(q.size(1) / k.size(1));
  p.T = static_cast<int>(q.size(2));
  p.S = static_cast<int>(k.size(2));
  p.n_qblocks = (p.T + kBrFwd - 1) / kBrFwd;
  p.scale_log2 = static_cast<float>(scale) * kLog2e;
  p.causal = causal;
  const int64_t blocks = int64_t{p.B} * p.H * p.n_qblocks;
  dispatch_flash(q.dtype(), q.size(3), [&]<class Tag, int D>() { launch_fwd<Tag, D>(p, device, blocks); });
  FORGE_CUDA_LAUNCH_CHECK("scaled_dot_product_attention flash forward: q ", q.shape(), " k ", k.shape());
}

}  // namespace forge::cuda
