#pragma once
// The pieces forge's flash-attention kernels share (Note [flash attention] in flash_attention.cu):
// tile sizes and shared-memory budgets, the 16-bit element types, the tensor-core and cp.async
// helpers, and the host-side dispatch. Included by flash_attention.cu (the forward and the entry
// points) and flash_attention_backward.cu (the backward) only.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>
#include <climits>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "forge/core/dtype.h"
#include "forge/core/tensor.h"

namespace forge::cuda::flash_detail {

constexpr int kThreads = 128;  // 4 warps
constexpr int kBc = 64;        // keys per block (forward and backward)
constexpr int kBrFwd = 64;     // query rows per forward CTA
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;


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

// Calls of the flash kernels (forward and backward), for flash_attention_calls().
extern std::atomic<int64_t> g_flash_calls;

// ---- host side ---------------------------------------------------------------------------

// Note [flash document ranges]: with packed documents (Note [flash documents]) a CTA visits only
// the tiles inside an envelope: the span [lo, hi) from the first to the last of `other` (the
// keys for a block of queries, the queries for a block of keys) whose document id lies between
// the smallest and the largest id of its own `mine`. Any pair the mask allows has equal ids,
// so its partner's id lies in that interval and the partner inside the span: the tiles outside
// it are masked whole, and skipping them changes no bit. Packing numbers documents in order, so
// for a row of short documents the span is little more than the block's own documents (every
// key of the row for unpacked rows: one id). Every thread of the CTA calls it (it synchronises);
// lo == hi when no element of `other` qualifies.
__device__ inline void document_envelope(const int32_t* mine, int mine_begin, int mine_end, const int32_t* other,
                                         int other_begin, int other_end, int& lo, int& hi) {
  __shared__ int bounds[4];  // smallest and largest id of mine; first and last index of other
  if (threadIdx.x == 0) {
    bounds[0] = bounds[2] = INT_MAX;
    bounds[1] = bounds[3] = INT_MIN;
  }
  __syncthreads();
  int mn = INT_MAX, mx = INT_MIN;
  for (int i = mine_begin + static_cast<int>(threadIdx.x); i < mine_end; i += static_cast<int>(blockDim.x)) {
    mn = min(mn, mine[i]);
    mx = max(mx, mine[i]);
  }
  if (mn <= mx) {
    atomicMin(&bounds[0], mn);
    atomicMax(&bounds[1], mx);
  }
  __syncthreads();
  mn = bounds[0];
  mx = bounds[1];
  int first = INT_MAX, last = INT_MIN;
  for (int i = other_begin + static_cast<int>(threadIdx.x); i < other_end; i += static_cast<int>(blockDim.x)) {
    const int id = other[i];
    if (id >= mn && id <= mx) {
      first = min(first, i);
      last = max(last, i);
    }
  }
  if (first <= last) {
    atomicMin(&bounds[2], first);
    atomicMax(&bounds[3], last);
  }
  __syncthreads();
  lo = bounds[2] == INT_MAX ? other_begin : bounds[2];
  hi = bounds[3] == INT_MIN ? other_begin : bounds[3] + 1;
  __syncthreads();  // bounds may be reused by a later call
}

inline const uint16_t* cptr(const Tensor& t) { return static_cast<const uint16_t*>(t.data_ptr()); }
inline uint16_t* mptr(const Tensor& t) { return t.defined() ? static_cast<uint16_t*>(t.data_ptr()) : nullptr; }
inline int64_t st(const Tensor& t, int i) { return t.defined() ? t.stride(i) : 0; }

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

}  // namespace forge::cuda::flash_detail
