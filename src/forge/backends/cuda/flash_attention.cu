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
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "forge/backends/cuda/flash_attention.h"
#include "forge/backends/cuda/blaslt.h"
#include "forge/backends/cuda/runtime.h"
#include "forge/backends/cuda/tensor_kernels.h"
#include "forge/core/env.h"

namespace forge::cuda {
namespace {

constexpr int kThreads = 128;  // 4 warps
constexpr int kBc = 64;        // keys per block (forward and backward)
constexpr int kBrFwd = 64;     // query rows per forward CTA
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

std::atomic<int64_t> g_flash_calls{0};

// Backward query rows per block: 32 for D = 128 keeps dK, dV, S^T and dP^T in registers.
template <int D> constexpr int br_bwd() { return D == 64 ? 64 : 32; }

// Shared memory (bytes) of the kernels, in 16-bit elements then floats.
template <int D> constexpr size_t fwd_smem() {
  return sizeof(uint16_t) * (size_t(kBrFwd) + 4 * size_t(kBc)) * (D + 8);  // Q, 2 x (K, V)
}
template <int D> constexpr size_t bwd_smem() {
  constexpr int Br = br_bwd<D>();
  return sizeof(uint16_t) * (2 * size_t(kBc) * (D + 8)    // K, V
                             + 4 * size_t(Br) * (D + 8)   // 2 stages of Q, dO
                             + size_t(Br) * (kBc + 8)) +  // dS
         sizeof(float) * 4 * Br;                          // 2 stages of lse, D_i
}

// ---- 16-bit element types ----------------------------------------------------------------

struct Bf16Tag {};
struct F16Tag {};

template <class Tag> __device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t r;
  if constexpr (std::is_same_v<Tag, Bf16Tag>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x = lo (low half)
    memcpy(&r, &v, 4);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    memcpy(&r, &v, 4);
  }
  return r;
}
template <class Tag> __device__ __forceinline__ uint16_t round16(float x) {
  if constexpr (std::is_same_v<Tag, Bf16Tag>) return __bfloat16_as_ushort(__float2bfloat16_rn(x));
  else return __half_as_ushort(__float2half_rn(x));
}
template <class Tag> __device__ __forceinline__ float to_f32(uint16_t x) {
  if constexpr (std::is_same_v<Tag, Bf16Tag>) return __bfloat162float(__ushort_as_bfloat16(x));
  else return __half2float(__ushort_as_half(x));
}

// c += a b, one m16n8k16 tensor-core product (layouts in Note [flash attention]).
template <class Tag>
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<Tag, Bf16Tag>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

__device__ __forceinline__ uint32_t lds32(const uint16_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

// The A fragment of the 16x16 block at (row0, col0) of a row-major shared tile (stride ld).
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const uint16_t* s, int ld, int row0, int col0, int g,
                                       int c) {
  const uint16_t* p = s + (row0 + g) * ld + col0 + 2 * c;
  a[0] = lds32(p);
  a[1] = lds32(p + 8 * ld);
  a[2] = lds32(p + 8);
  a[3] = lds32(p + 8 * ld + 8);
}

// The B fragment of B[k][n] = s[n][k] (s row-major, stride ld): n-block at n0, k-block at k0.
__device__ __forceinline__ void load_b(uint32_t& b0, uint32_t& b1, const uint16_t* s, int ld, int n0, int k0, int g,
                                       int c) {
  const uint16_t* p = s + (n0 + g) * ld + k0 + 2 * c;
  b0 = lds32(p);
  b1 = lds32(p + 8);
}

// The B fragment of B[k][n] = s[k0 + k][n0 + n] (s row-major with the k index along rows,
// stride ld): two 8x8 blocks (k0..k0+7 and k0+8..k0+15) loaded transposed by ldmatrix.trans;
// lanes 0-15 give the row addresses (16-byte aligned: ld and n0 multiples of 8), lane l
// receives elements [2(l%4)][l/4] and [2(l%4)+1][l/4] of each block, exactly reg0 / reg1.
__device__ __forceinline__ void load_b_trans(uint32_t& b0, uint32_t& b1, const uint16_t* s, int ld, int k0, int n0,
                                             int lane) {
  const uint16_t* p = s + (k0 + (lane & 15)) * ld + n0;
  const auto addr = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n" : "=r"(b0), "=r"(b1) : "r"(addr));
}

// The A fragment of a 16-wide k-slice from the C fragments of two adjacent 8-column tiles.
template <class Tag> __device__ __forceinline__ void c_to_a(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
  a[0] = pack2<Tag>(c0[0], c0[1]);
  a[1] = pack2<Tag>(c0[2], c0[3]);
  a[2] = pack2<Tag>(c1[0], c1[1]);
  a[3] = pack2<Tag>(c1[2], c1[3]);
}

// Rows [row0, row0 + R) of a (rows, D) matrix (row stride ld elements; rows >= nrows read
// as zeros) into the row-major shared tile dst (row stride ds). 16-byte global loads, all
// issued before the stores; consecutive threads read consecutive 16-byte chunks of a row.
template <int R, int D>
__device__ __forceinline__ void load_tile(const uint16_t* __restrict__ src, int64_t ld, int row0, int nrows,
                                          uint16_t* dst, int ds) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  static_assert((R * kChunks) % kThreads == 0, "tile must split evenly over the threads");
  constexpr int N = R * kChunks / kThreads;
  uint4 buf[N];
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const int idx = static_cast<int>(threadIdx.x) + i * kThreads;
    const int r = idx / kChunks, col = (idx % kChunks) * 8;
    buf[i] = row0 + r < nrows ? *reinterpret_cast<const uint4*>(src + static_cast<int64_t>(row0 + r) * ld + col)
                              : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const int idx = static_cast<int>(threadIdx.x) + i * kThreads;
    const int r = idx / kChunks, col = (idx % kChunks) * 8;
    *reinterpret_cast<uint4*>(dst + r * ds + col) = buf[i];
  }
}

// cp.async: 16 bytes global -> shared without a register round trip; zero-filled when !valid
// (the source is then not read). A committed group completes at cp_async_wait<N>.
__device__ __forceinline__ void cp_async16(uint16_t* smem, const uint16_t* gmem, bool valid) {
  const auto s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// load_tile through cp.async (the caller commits and waits): rows >= nrows are zero-filled.
template <int R, int D>
__device__ __forceinline__ void load_tile_async(const uint16_t* __restrict__ src, int64_t ld, int row0, int nrows,
                                                uint16_t* dst, int ds) {
  constexpr int kChunks = D / 8;
  static_assert((R * kChunks) % kThreads == 0, "tile must split evenly over the threads");
#pragma unroll
  for (int i = 0; i < R * kChunks / kThreads; ++i) {
    const int idx = static_cast<int>(threadIdx.x) + i * kThreads;
    const int r = idx / kChunks, col = (idx % kChunks) * 8;
    const bool ok = row0 + r < nrows;
    cp_async16(dst + r * ds + col, ok ? src + static_cast<int64_t>(row0 + r) * ld + col : src, ok);
  }
}

extern __shared__ __align__(16) unsigned char flash_smem[];

// ---- forward -----------------------------------------------------------------------------

struct FwdParams {
  const uint16_t *q, *k, *v;
  uint16_t* o;
  float* lse;  // (B, H, T) contiguous
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
  const int n_kb = (kend + Bc - 1) / Bc;

  // Pipeline: Q and key block 0 first; the loads of block kb + 1 (cp.async into the other
  // stage) run while block kb is computed.
  load_tile_async<Br, D>(qbase, p.q_st, q0, T, sQ, KS);
  if (n_kb > 0) {
    load_tile_async<Bc, D>(kbase_p, p.k_st, 0, S, sKV, KS);
    load_tile_async<Bc, D>(vbase_p, p.v_st, 0, S, sKV + Bc * KS, KS);
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  uint32_t qa[NK][4];
#pragma unroll
  for (int kk = 0; kk < NK; ++kk) load_a(qa[kk], sQ, KS, warp * 16, kk * 16, g, c);

  const int r0 = q0 + warp * 16 + g, r1 = r0 + 8;  // this thread's two query rows
  float o[ND][4];
#pragma unroll
  for (int n = 0; n < ND; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  const float ninf = -INFINITY;
  float m0 = ninf, m1 = ninf, l0 = 0.f, l1 = 0.f;

  for (int kb = 0; kb < n_kb; ++kb) {
    const int kbase = kb * Bc;
    const bool prefetch = kb + 1 < n_kb;
    if (prefetch) {  // the other stage was last read in iteration kb - 1, which ended with a barrier
      uint16_t* next = sKV + ((kb + 1) & 1) * 2 * Bc * KS;
      load_tile_async<Bc, D>(kbase_p, p.k_st, kbase + Bc, S, next, KS);
      load_tile_async<Bc, D>(vbase_p, p.v_st, kbase + Bc, S, next + Bc * KS, KS);
      cp_async_commit();
    }
    const uint16_t* sK = sKV + (kb & 1) * 2 * Bc * KS;
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
    const bool need_mask = kbase + Bc > S || (p.causal && kbase + Bc - 1 > q0 + shift);
    float mx0 = ninf, mx1 = ninf;
#pragma unroll
    for (int n = 0; n < NS; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[n][e] * p.scale_log2;
        if (need_mask) {
          const int j = kbase + n * 8 + 2 * c + (e & 1), t = e < 2 ? r0 : r1;
          if (j >= S || (p.causal && j > t + shift)) x = ninf;
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
    __syncthreads();  // block kb + 1 visible to all; block kb's stage free for kb + 2
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
    if (c == 0) p.lse[bh * T + r0] = l0 > 0.f ? (m0 + log2f(l0)) * kLn2 : ninf;
  }
  if (r1 < T) {
    uint16_t* orow = obase + static_cast<int64_t>(r1) * p.o_st + 2 * c;
#pragma unroll
    for (int n = 0; n < ND; ++n)
      *reinterpret_cast<uint32_t*>(orow + n * 8) = pack2<Tag>(o[n][2] * inv1, o[n][3] * inv1);
    if (c == 0) p.lse[bh * T + r1] = l1 > 0.f ? (m1 + log2f(l1)) * kLn2 : ninf;
  }
}

// ---- backward ----------------------------------------------------------------------------

// delta[(b*H + h)*T + t] = sum_d dO[b,h,t,d] * O[b,h,t,d] in f32; one warp per row.
template <class Tag>
__global__ void __launch_bounds__(256) flash_delta_kernel(const uint16_t* __restrict__ dout, int64_t do_sb,
                                                          int64_t do_sh, int64_t do_st, const uint16_t* __restrict__ out,
                                                          int64_t o_sb, int64_t o_sh, int64_t o_st,
                                                          float* __restrict__ delta, int H, int T, int D,
                                                          int64_t rows) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * 8 + (threadIdx.x >> 5);
  const int lane = static_cast<int>(threadIdx.x & 31);
  if (r >= rows) return;
  const int64_t t = r % T, bh = r / T, h = bh % H, b = bh / H;
  const uint16_t* go = dout + b * do_sb + h * do_sh + t * do_st;
  const uint16_t* o = out + b * o_sb + h * o_sh + t * o_st;
  float acc = 0.f;
  for (int d = 2 * lane; d < D; d += 64) {
    const uint32_t x = lds32(go + d), y = lds32(o + d);  // 4-byte aligned: D even, rows 16-byte aligned
    acc += to_f32<Tag>(static_cast<uint16_t>(x & 0xffffu)) * to_f32<Tag>(static_cast<uint16_t>(y & 0xffffu)) +
           to_f32<Tag>(static_cast<uint16_t>(x >> 16)) * to_f32<Tag>(static_cast<uint16_t>(y >> 16));
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) delta[r] = acc;
}

// dq[b,h,t,d] = round(acc[((b*H + h)*T + t)*D + d]), two elements per thread.
template <class Tag>
__global__ void __launch_bounds__(256) flash_dq_convert_kernel(const float* __restrict__ acc, uint16_t* __restrict__ dq,
                                                               int64_t sb, int64_t sh, int64_t st, int H, int T,
                                                               int D, int64_t pairs) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= pairs) return;
  const int half = D / 2;
  const int64_t r = i / half;
  const int d = static_cast<int>(i % half) * 2;
  const int64_t t = r % T, bh = r / T, h = bh % H, b = bh / H;
  const float2 v = *reinterpret_cast<const float2*>(acc + r * D + d);
  *reinterpret_cast<uint32_t*>(dq + b * sb + h * sh + t * st + d) = pack2<Tag>(v.x, v.y);
}

struct BwdParams {
  const uint16_t *q, *k, *v, *dout;
  const float* lse;    // (B, H, T)
  const float* delta;  // (B, H, T)
  float* dq_acc;       // (B, H, T, D) f32, zeroed; null: dq not needed
  uint16_t *dk, *dv;   // null: not needed
  int64_t q_sb, q_sh, q_st, k_sb, k_sh, k_st, v_sb, v_sh, v_st, do_sb, do_sh, do_st;
  int64_t dk_sb, dk_sh, dk_st, dv_sb, dv_sh, dv_st;
  int B, H, Hkv, G, T, S;
  float scale, scale_log2;
  bool causal;
};

template <class Tag, int D>
__global__ void __launch_bounds__(kThreads) flash_bwd_kernel(const BwdParams p) {
  constexpr int Br = br_bwd<D>(), Bc = kBc;
  constexpr int KS = D + 8, DSS = Bc + 8;
  constexpr int ND = D / 8, NK = D / 16, NQ = Br / 8;
  // K, V; two stages of (Q, dO); dS; two stages of (lse in log2 units (+inf: P = 0), D_i).
  uint16_t* sK = reinterpret_cast<uint16_t*>(flash_smem);  // [Bc][KS]
  uint16_t* sV = sK + Bc * KS;                              // [Bc][KS]
  uint16_t* sQdO = sV + Bc * KS;                            // 2 x ([Br][KS] Q, [Br][KS] dO)
  uint16_t* sdS = sQdO + 4 * Br * KS;                       // [Br][DSS]
  float* sLD = reinterpret_cast<float*>(sdS + Br * DSS);    // 2 x ([Br] lse, [Br] D_i)

  const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
  const int64_t BK = static_cast<int64_t>(p.B) * p.Hkv;
  const int64_t bid = blockIdx.x;
  const int kb = static_cast<int>(bid / BK);  // key block 0 sees the most queries: launched first
  const int64_t bk = bid % BK;
  const int b = static_cast<int>(bk / p.Hkv), hk = static_cast<int>(bk % p.Hkv);
  const int kbase = kb * Bc, T = p.T, S = p.S, shift = S - T;
  const bool need_dq = p.dq_acc != nullptr;


  float dk[ND][4], dv[ND][4];
#pragma unroll
  for (int n = 0; n < ND; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[n][e] = dv[n][e] = 0.f;

  const int j0 = kbase + warp * 16 + g, j1 = j0 + 8;  // this thread's two keys
  // The first query that may see key kbase (causal), as a block index.
  const int qstart = p.causal ? max(0, kbase - shift) / Br : 0;

  // dQ tile split: MT row tiles of 16, WPM warps per row tile, NPW 8-column tiles per warp.
  constexpr int MT = Br / 16, WPM = 4 / MT, NPW = ND / WPM;
  const int mt = warp / WPM, nb = (warp % WPM) * NPW;

  // The iterations: every query block that can see this key block, of every query head of the
  // group (it = hg * nq + block). The loads of iteration it + 1 (cp.async into the other stage;
  // lse and D_i through registers) run while iteration it is computed.
  const int nq = max(0, (T + Br - 1) / Br - qstart), total = p.G * nq;
  auto issue = [&](int it, int st) {
    const int h = hk * p.G + it / nq, q0 = (qstart + it % nq) * Br;
    uint16_t* dst = sQdO + 2 * st * Br * KS;
    load_tile_async<Br, D>(p.q + b * p.q_sb + h * p.q_sh, p.q_st, q0, T, dst, KS);
    load_tile_async<Br, D>(p.dout + b * p.do_sb + h * p.do_sh, p.do_st, q0, T, dst + Br * KS, KS);
  };
  auto fetch_rows = [&](int it, float& L, float& Di) {  // threads tid < Br: row tid of iteration it
    const int h = hk * p.G + it / nq, t = (qstart + it % nq) * Br + tid;
    L = INFINITY;
    Di = 0.f;
    if (t < T) {
      const int64_t i = (static_cast<int64_t>(b) * p.H + h) * T + t;
      const float l = p.lse[i];
      L = l == -INFINITY ? INFINITY : l * kLog2e;  // a row with no key: P = exp2(-inf) = 0
      Di = p.delta[i];
    }
  };

  load_tile_async<Bc, D>(p.k + b * p.k_sb + hk * p.k_sh, p.k_st, kbase, S, sK, KS);
  load_tile_async<Bc, D>(p.v + b * p.v_sb + hk * p.v_sh, p.v_st, kbase, S, sV, KS);
  if (total > 0) issue(0, 0);
  cp_async_commit();
  if (total > 0 && tid < Br) fetch_rows(0, sLD[tid], sLD[Br + tid]);
  cp_async_wait<0>();
  __syncthreads();

  for (int it = 0; it < total; ++it) {
    const int st = it & 1;
    const int h = hk * p.G + it / nq, q0 = (qstart + it % nq) * Br;
    const int64_t bh = static_cast<int64_t>(b) * p.H + h;
    const bool prefetch = it + 1 < total;
    float next_L = 0.f, next_Di = 0.f;
    if (prefetch) {  // the other stage was last read in iteration it - 1, which ended with a barrier
      issue(it + 1, st ^ 1);
      cp_async_commit();
      if (tid < Br) fetch_rows(it + 1, next_L, next_Di);
    }
    const uint16_t* sQ = sQdO + 2 * st * Br * KS;
    const uint16_t* sdO = sQ + Br * KS;
    const float* sL = sLD + 2 * st * Br;
    const float* sDi = sL + Br;
    {
      // S^T = K Q^T and dP^T = V dO^T: A = K / V rows of this warp, B[k = d][n = t] = Q[t][d].
      float s[NQ][4], dp[NQ][4];
#pragma unroll
      for (int n = 0; n < NQ; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] = dp[n][e] = 0.f;
#pragma unroll
      for (int kk = 0; kk < NK; ++kk) {
        uint32_t ka[4], va[4];
        load_a(ka, sK, KS, warp * 16, kk * 16, g, c);
        load_a(va, sV, KS, warp * 16, kk * 16, g, c);
#pragma unroll
        for (int n = 0; n < NQ; ++n) {
          uint32_t b0, b1;
          load_b(b0, b1, sQ, KS, n * 8, kk * 16, g, c);
          mma<Tag>(s[n], ka, b0, b1);
          load_b(b0, b1, sdO, KS, n * 8, kk * 16, g, c);
          mma<Tag>(dp[n], va, b0, b1);
        }
      }

      // P^T and dS^T = P^T (dP^T - D_i), in place in s and dp.
      const bool need_mask = kbase + Bc > S || q0 + Br > T || (p.causal && kbase + Bc - 1 > q0 + shift);
#pragma unroll
      for (int n = 0; n < NQ; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int tl = n * 8 + 2 * c + (e & 1);  // query row within the block
          float pv = exp2f(s[n][e] * p.scale_log2 - sL[tl]);
          if (need_mask) {
            const int t = q0 + tl, j = e < 2 ? j0 : j1;
            if (j >= S || t >= T || (p.causal && j > t + shift)) pv = 0.f;
          }
          s[n][e] = pv;
          dp[n][e] = pv * (dp[n][e] - sDi[tl]);
        }
      }

      // dV += P^T dO, dK += dS^T Q: k = query rows, B[k = t][n = d] = dO[t][d] (ldmatrix.trans).
#pragma unroll
      for (int kk = 0; kk < Br / 16; ++kk) {
        uint32_t pa[4], da[4];
        c_to_a<Tag>(pa, s[2 * kk], s[2 * kk + 1]);
        c_to_a<Tag>(da, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
        for (int n = 0; n < ND; ++n) {
          uint32_t b0, b1;
          load_b_trans(b0, b1, sdO, KS, kk * 16, n * 8, lane);
          mma<Tag>(dv[n], pa, b0, b1);
          load_b_trans(b0, b1, sQ, KS, kk * 16, n * 8, lane);
          mma<Tag>(dk[n], da, b0, b1);
        }
      }

      if (need_dq) {
        // dS (Br, Bc) row-major in shared memory: element (t, key) of this thread's dS^T.
#pragma unroll
        for (int n = 0; n < NQ; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            sdS[(n * 8 + 2 * c + (e & 1)) * DSS + warp * 16 + g + (e < 2 ? 0 : 8)] = round16<Tag>(dp[n][e]);
        __syncthreads();
        // dQ (Br, D) += scale dS K: A = dS rows, B[k = key][n = d] = K[key][d] (ldmatrix.trans).
        float acc[NPW][4];
#pragma unroll
        for (int i = 0; i < NPW; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < Bc / 16; ++kk) {
          uint32_t a[4];
          load_a(a, sdS, DSS, mt * 16, kk * 16, g, c);
#pragma unroll
          for (int i = 0; i < NPW; ++i) {
            uint32_t b0, b1;
            load_b_trans(b0, b1, sK, KS, kk * 16, (nb + i) * 8, lane);
            mma<Tag>(acc[i], a, b0, b1);
          }
        }
        const int t0 = q0 + mt * 16 + g, t1 = t0 + 8;
        float* dq0 = p.dq_acc + (bh * T + t0) * D + 2 * c;
        float* dq1 = dq0 + 8 * D;
#pragma unroll
        for (int i = 0; i < NPW; ++i) {
          const int d = (nb + i) * 8;
          if (t0 < T) {
            atomicAdd(dq0 + d, acc[i][0] * p.scale);
            atomicAdd(dq0 + d + 1, acc[i][1] * p.scale);
          }
          if (t1 < T) {
            atomicAdd(dq1 + d, acc[i][2] * p.scale);
            atomicAdd(dq1 + d + 1, acc[i][3] * p.scale);
          }
        }
      }
    }
    if (prefetch) {
      if (tid < Br) {
        sLD[2 * (st ^ 1) * Br + tid] = next_L;
        sLD[2 * (st ^ 1) * Br + Br + tid] = next_Di;
      }
      cp_async_wait<0>();
    }
    __syncthreads();  // iteration it + 1's stage visible to all; this stage and dS free
  }

  // dK = scale dS^T Q, dV = P^T dO for keys j0, j1 of this thread.
  if (p.dk) {
    uint16_t* base = p.dk + b * p.dk_sb + hk * p.dk_sh + 2 * c;
#pragma unroll
    for (int n = 0; n < ND; ++n) {
      if (j0 < S)
        *reinterpret_cast<uint32_t*>(base + j0 * p.dk_st + n * 8) = pack2<Tag>(dk[n][0] * p.scale, dk[n][1] * p.scale);
      if (j1 < S)
        *reinterpret_cast<uint32_t*>(base + j1 * p.dk_st + n * 8) = pack2<Tag>(dk[n][2] * p.scale, dk[n][3] * p.scale);
    }
  }
  if (p.dv) {
    uint16_t* base = p.dv + b * p.dv_sb + hk * p.dv_sh + 2 * c;
#pragma unroll
    for (int n = 0; n < ND; ++n) {
      if (j0 < S) *reinterpret_cast<uint32_t*>(base + j0 * p.dv_st + n * 8) = pack2<Tag>(dv[n][0], dv[n][1]);
      if (j1 < S) *reinterpret_cast<uint32_t*>(base + j1 * p.dv_st + n * 8) = pack2<Tag>(dv[n][2], dv[n][3]);
    }
  }
}

// ---- host side ---------------------------------------------------------------------------

const uint16_t* cptr(const Tensor& t) { return static_cast<const uint16_t*>(t.data_ptr()); }
uint16_t* mptr(const Tensor& t) { return t.defined() ? static_cast<uint16_t*>(t.data_ptr()) : nullptr; }
int64_t st(const Tensor& t, int i) { return t.defined() ? t.stride(i) : 0; }

template <class Tag, int D> void launch_fwd(const FwdParams& p, int device, int64_t blocks) {
  constexpr size_t smem = fwd_smem<D>();
  FORGE_CUDA_CHECK(
      cudaFuncSetAttribute(flash_fwd_kernel<Tag, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  flash_fwd_kernel<Tag, D><<<static_cast<unsigned>(blocks), kThreads, smem, current_stream(device)>>>(p);
}

template <class Tag, int D> void launch_bwd(const BwdParams& p, int device, int64_t blocks) {
  constexpr size_t smem = bwd_smem<D>();
  FORGE_CUDA_CHECK(
      cudaFuncSetAttribute(flash_bwd_kernel<Tag, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  flash_bwd_kernel<Tag, D><<<static_cast<unsigned>(blocks), kThreads, smem, current_stream(device)>>>(p);
}

// Calls f.template operator()<Tag, D>() for the problem's dtype and head dim.
template <class F> void dispatch_flash(DType dtype, int64_t D, F&& f) {
  if (dtype == DType::bf16) {
    if (D == 64) f.template operator()<Bf16Tag, 64>();
    else f.template operator()<Bf16Tag, 128>();
  } else {
    if (D == 64) f.template operator()<F16Tag, 64>();
    else f.template operator()<F16Tag, 128>();
  }
}

constexpr int64_t kMaxInt = std::numeric_limits<int>::max();

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

void flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale, Tensor& out,
                             Tensor& lse) {
  FORGE_CHECK(flash_attention_applies(q, k, v, Tensor()) && flash_attention_layout_ok(out) &&
                  out.dtype() == q.dtype() && out.shape() == q.shape() && lse.dtype() == DType::f32 &&
                  lse.is_contiguous(),
              "flash_attention_forward: unsupported problem q ", q.shape(), " k ", k.shape(), " out ", out.shape());
  const int device = q.device().index;
  DeviceGuard guard(device);
  ++g_flash_calls;
  FwdParams p{};
  p.q = cptr(q);
  p.k = cptr(k);
  p.v = cptr(v);
  p.o = mptr(out);
  p.lse = static_cast<float*>(lse.data_ptr());
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

void flash_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                              const Tensor& lse, bool causal, double scale, Tensor& dq, Tensor& dk, Tensor& dv) {
  FORGE_CHECK(flash_attention_applies(q, k, v, Tensor()) && flash_attention_layout_ok(dout) &&
                  flash_attention_layout_ok(out) && flash_attention_layout_ok(dq) && flash_attention_layout_ok(dk) &&
                  flash_attention_layout_ok(dv) && lse.dtype() == DType::f32 && lse.is_contiguous(),
              "flash_attention_backward: unsupported problem q ", q.shape(), " k ", k.shape());
  if (!dq.defined() && !dk.defined() && !dv.defined()) return;
  const int device = q.device().index;
  DeviceGuard guard(device);
  ++g_flash_calls;
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3), Hkv = k.size(1), S = k.size(2);
  const cudaStream_t stream = current_stream(device);

  // D_i = rowsum(dO o O)
  Tensor delta = blas::device_empty(device, {B, H, T}, DType::f32);
  const int64_t rows = B * H * T;
  Tensor dq_acc;
  if (dq.defined()) {
    dq_acc = blas::device_empty(device, {B, H, T, D}, DType::f32);
    fill(dq_acc, 0.0);
  }
  BwdParams p{};
  p.q = cptr(q);
  p.k = cptr(k);
  p.v = cptr(v);
  p.dout = cptr(dout);
  p.lse = static_cast<const float*>(lse.data_ptr());
  p.delta = static_cast<const float*>(delta.data_ptr());
  p.dq_acc = dq.defined() ? static_cast<float*>(dq_acc.data_ptr()) : nullptr;
  p.dk = mptr(dk);
  p.dv = mptr(dv);
  p.q_sb = q.stride(0), p.q_sh = q.stride(1), p.q_st = q.stride(2);
  p.k_sb = k.stride(0), p.k_sh = k.stride(1), p.k_st = k.stride(2);
  p.v_sb = v.stride(0), p.v_sh = v.stride(1), p.v_st = v.stride(2);
  p.do_sb = dout.stride(0), p.do_sh = dout.stride(1), p.do_st = dout.stride(2);
  p.dk_sb = st(dk, 0), p.dk_sh = st(dk, 1), p.dk_st = st(dk, 2);
  p.dv_sb = st(dv, 0), p.dv_sh = st(dv, 1), p.dv_st = st(dv, 2);
  p.B = static_cast<int>(B);
  p.H = static_cast<int>(H);
  p.Hkv = static_cast<int>(Hkv);
  p.G = static_cast<int>(H / Hkv);
  p.T = static_cast<int>(T);
  p.S = static_cast<int>(S);
  p.scale = static_cast<float>(scale);
  p.scale_log2 = static_cast<float>(scale) * kLog2e;
  p.causal = causal;
  const int64_t blocks = B * Hkv * ((S + kBc - 1) / kBc);

  dispatch_flash(q.dtype(), D, [&]<class Tag, int Dh>() {
    flash_delta_kernel<Tag><<<static_cast<unsigned>((rows + 7) / 8), 256, 0, stream>>>(
        cptr(dout), dout.stride(0), dout.stride(1), dout.stride(2), cptr(out), out.stride(0), out.stride(1),
        out.stride(2), static_cast<float*>(delta.data_ptr()), p.H, p.T, Dh, rows);
    FORGE_CUDA_LAUNCH_CHECK("scaled_dot_product_attention flash backward delta: q ", q.shape());
    launch_bwd<Tag, Dh>(p, device, blocks);
    FORGE_CUDA_LAUNCH_CHECK("scaled_dot_product_attention flash backward: q ", q.shape(), " k ", k.shape());
    if (dq.defined()) {
      const int64_t pairs = rows * (Dh / 2);
      flash_dq_convert_kernel<Tag><<<static_cast<unsigned>((pairs + 255) / 256), 256, 0, stream>>>(
          p.dq_acc, mptr(dq), dq.stride(0), dq.stride(1), dq.stride(2), p.H, p.T, Dh, pairs);
      FORGE_CUDA_LAUNCH_CHECK("scaled_dot_product_attention flash backward dq: q ", q.shape());
    }
  });
}

}  // namespace forge::cuda
