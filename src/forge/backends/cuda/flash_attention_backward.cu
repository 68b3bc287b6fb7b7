// The backward of forge's flash attention: the delta and dQ-conversion kernels, flash_bwd_kernel
// and flash_attention_backward (Note [flash attention] in flash_attention.cu; the shared helpers
// in flash_attention_common.cuh).
#include "forge/backends/cuda/blaslt.h"
#include "forge/backends/cuda/flash_attention.h"
#include "forge/backends/cuda/flash_attention_common.cuh"
#include "forge/backends/cuda/runtime.h"
#include "forge/backends/cuda/tensor_kernels.h"

namespace forge::cuda {
namespace {

using namespace flash_detail;

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
  const int32_t *doc_q, *doc_k;  // (B, T) and (B, S) document ids; null: none (Note [flash documents])
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
  // Note [flash documents]: the keys' document ids, and the queries' row of ids.
  const int32_t* doc_q = p.doc_q ? p.doc_q + static_cast<int64_t>(b) * T : nullptr;
  int doc0 = 0, doc1 = 0;
  if (p.doc_k) {
    const int32_t* dk_ids = p.doc_k + static_cast<int64_t>(b) * S;
    doc0 = j0 < S ? dk_ids[j0] : 0;
    doc1 = j1 < S ? dk_ids[j1] : 0;
  }
  // The first query that may see key kbase (causal), as a block index; with documents, the
  // query blocks of the keys' documents only (Note [flash document ranges]).
  int qstart = p.causal ? max(0, kbase - shift) / Br : 0, qend = (T + Br - 1) / Br;
  if (p.doc_k) {
    int lo = 0, hi = 0;
    document_envelope(p.doc_k + static_cast<int64_t>(b) * S, kbase, min(kbase + Bc, S), doc_q, qstart * Br, T, lo, hi);
    qstart = lo / Br;
    qend = lo < hi ? (hi + Br - 1) / Br : qstart;
  }

  // dQ tile split: MT row tiles of 16, WPM warps per row tile, NPW 8-column tiles per warp.
  constexpr int MT = Br / 16, WPM = 4 / MT, NPW = ND / WPM;
  const int mt = warp / WPM, nb = (warp % WPM) * NPW;

  // The iterations: every query block that can see this key block, of every query head of the
  // group (it = hg * nq + block). The loads of iteration it + 1 (cp.async into the other stage;
  // lse and D_i through registers) run while iteration it is computed.
  const int nq = max(0, qend - qstart), total = p.G * nq;
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
      const bool need_mask =
          doc_q != nullptr || kbase + Bc > S || q0 + Br > T || (p.causal && kbase + Bc - 1 > q0 + shift);
#pragma unroll
      for (int n = 0; n < NQ; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int tl = n * 8 + 2 * c + (e & 1);  // query row within the block
          float pv = exp2f(s[n][e] * p.scale_log2 - sL[tl]);
          if (need_mask) {
            const int t = q0 + tl, j = e < 2 ? j0 : j1;
            if (j >= S || t >= T || (p.causal && j > t + shift) || (doc_q && doc_q[t] != (e < 2 ? doc0 : doc1)))
              pv = 0.f;
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

template <class Tag, int D> void launch_bwd(const BwdParams& p, int device, int64_t blocks) {
  constexpr size_t smem = bwd_smem<D>();
  FORGE_CUDA_CHECK(
      cudaFuncSetAttribute(flash_bwd_kernel<Tag, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  flash_bwd_kernel<Tag, D><<<static_cast<unsigned>(blocks), kThreads, smem, current_stream(device)>>>(p);
}

}  // namespace

void flash_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                              const Tensor& lse, bool causal, double scale, Tensor& dq, Tensor& dk, Tensor& dv,
                              const Tensor& doc_q, const Tensor& doc_k) {
  FORGE_CHECK(flash_attention_applies(q, k, v, Tensor()) && flash_attention_layout_ok(dout) &&
                  flash_attention_layout_ok(out) && flash_attention_layout_ok(dq) && flash_attention_layout_ok(dk) &&
                  flash_attention_layout_ok(dv) && lse.dtype() == DType::f32 && lse.is_contiguous(),
              "flash_attention_backward: unsupported problem q ", q.shape(), " k ", k.shape());
  check_flash_documents(q, k, doc_q, doc_k);
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
  p.doc_q = doc_q.defined() ? doc_q.data<int32_t>() : nullptr;
  p.doc_k = doc_k.defined() ? doc_k.data<int32_t>() : nullptr;
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
