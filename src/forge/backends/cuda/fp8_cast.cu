// FP8 amaxes and casts on the GPU (contracts and Note [FP8 cast groups] in fp8.h).
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>

#include "forge/backends/cuda/blaslt.h"
#include "forge/backends/cuda/fp8.h"
#include "forge/backends/cuda/graph.h"
#include "forge/backends/cuda/runtime.h"

namespace forge::cuda {

namespace {

// Amaxes are kept as the bits of non-negative floats: for those (and +inf, and NaN with its sign
// cleared, whose bits are larger than +inf's) the unsigned order is the float order, so a max of
// bits is a max that lets NaN win, as fp8::quantize's amax does.
__device__ inline unsigned abs_bits(float v) { return __float_as_uint(fabsf(v)); }

__device__ inline float load(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ inline float load(const float* p, int64_t i) { return p[i]; }

// ---- amax -----------------------------------------------------------------------------------------
// A block reduces a region of 128 x 128 entries (256 threads: column tx + 32 cq, row ty + 8 rq). A
// grouping's groups are whole rows of the region (gr == 1), whole columns (gc == 1) or the whole
// region (both >= 128 or >= the matrix's size: one group): the host checks it.
constexpr int kRegion = 128;

struct AmaxSpec {
  unsigned* table = nullptr;
  int64_t gr = 1, gc = 1, ncg = 1;  // groups and the table's columns (ceil(C / gc))
};

template <class T>
__global__ void __launch_bounds__(256) amax_kernel(const T* __restrict__ x, int64_t R, int64_t C, AmaxSpec s0,
                                                   AmaxSpec s1, int nspec, unsigned* slot) {
  __shared__ unsigned col_part[8][kRegion];
  __shared__ unsigned warp_part[8];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t regions_c = (C + kRegion - 1) / kRegion;
  const int64_t regions = ((R + kRegion - 1) / kRegion) * regions_c;
  unsigned total = 0;
  for (int64_t reg = blockIdx.x; reg < regions; reg += gridDim.x) {
    const int64_t r0 = (reg / regions_c) * kRegion, c0 = (reg % regions_c) * kRegion;
    unsigned row_max[16], col_max[4] = {0, 0, 0, 0};
#pragma unroll
    for (int rq = 0; rq < 16; ++rq) {
      row_max[rq] = 0;
      const int64_t i = r0 + ty + 8 * rq;
#pragma unroll
      for (int cq = 0; cq < 4; ++cq) {
        const int64_t j = c0 + tx + 32 * cq;
        const unsigned v = i < R && j < C ? abs_bits(load(x, i * C + j)) : 0u;
        row_max[rq] = max(row_max[rq], v);
        col_max[cq] = max(col_max[cq], v);
      }
    }
    unsigned region = 0;
#pragma unroll
    for (int rq = 0; rq < 16; ++rq) region = max(region, row_max[rq]);
    total = max(total, region);
    for (int sp = 0; sp < nspec; ++sp) {
      const AmaxSpec& s = sp == 0 ? s0 : s1;
      if (s.gr == 1) {  // one group per row of the region: a warp's rows reduced over its lanes
        const int64_t cg = c0 / s.gc;
#pragma unroll
        for (int rq = 0; rq < 16; ++rq) {
          const unsigned m = __reduce_max_sync(0xffffffffu, row_max[rq]);
          const int64_t i = r0 + ty + 8 * rq;
          if (tx == 0 && i < R) atomicMax(&s.table[i * s.ncg + cg], m);
        }
      } else if (s.gc == 1) {  // one group per column: the 8 warps' partial maxima
#pragma unroll
        for (int cq = 0; cq < 4; ++cq) col_part[ty][tx + 32 * cq] = col_max[cq];
        __syncthreads();
        if (ty == 0) {
#pragma unroll
          for (int cq = 0; cq < 4; ++cq) {
            unsigned m = 0;
#pragma unroll
            for (int w = 0; w < 8; ++w) m = max(m, col_part[w][tx + 32 * cq]);
            const int64_t j = c0 + tx + 32 * cq;
            if (j < C) atomicMax(&s.table[(r0 / s.gr) * s.ncg + j], m);
          }
        }
        __syncthreads();
      } else {  // the region is one group
        const unsigned m = __reduce_max_sync(0xffffffffu, region);
        if (tx == 0) warp_part[ty] = m;
        __syncthreads();
        if (tx == 0 && ty == 0) {
          unsigned b = 0;
#pragma unroll
          for (int w = 0; w < 8; ++w) b = max(b, warp_part[w]);
          atomicMax(&s.table[(r0 / s.gr) * s.ncg + c0 / s.gc], b);
        }
        __syncthreads();
      }
    }
  }
  if (slot) {
    const unsigned m = __reduce_max_sync(0xffffffffu, total);
    if (tx == 0) atomicMax(slot, m);
  }
}

// ---- cast -----------------------------------------------------------------------------------------
// 32 x 32 tiles, 256 threads: a thread reads entries (r0 + ty + 8 q, c0 + tx), writes the plain
// codes from them, and the transposed codes from the tile in shared memory (out_t[j][i] with i
// along the lanes, so both writes are runs of 32 bytes).
constexpr int kTile = 32;

struct CastSpec {
  uint8_t* codes = nullptr;  // null: this orientation is not wanted
  float* inv = nullptr;
  const unsigned* amax = nullptr;
  int64_t gr = 1, gc = 1, ncg = 1;  // source groups (Note [FP8 cast groups])
  int kind = 0;                     // within a 32 x 32 tile: 0 one group, 1 one per source row, 2 one per source column
  int mode = 0;                     // Fp8ScaleMode
  int64_t out_rows = 0;             // rows of this orientation's codes
  int64_t kb_pad = 0;               // blk128: ceil4(ceil(k / 128))
};

__device__ inline float scale_from(unsigned amax_bits, float fmax) {
  const float a = __uint_as_float(amax_bits);
  return a == 0.0f ? 1.0f : (isfinite(a) ? fmax / a : __int_as_float(0x7fc00000));
}

// Note [FP8 GEMM scales]: the factor of a group whose first entry is (row, co) of this orientation.
__device__ inline void write_inv(const CastSpec& s, int64_t row, int64_t co, float scale) {
  int64_t at = 0;
  switch (s.mode) {
    case 0: at = 0; break;                                  // scalar
    case 1: at = row; break;                                // outer
    case 2: at = (co >> 7) * s.out_rows + row; break;       // vec128
    default: at = (row >> 7) * s.kb_pad + (co >> 7); break; // blk128
  }
  s.inv[at] = 1.0f / scale;
}

// A tile's scales of one orientation, into sc[]: per source row (kind 1: sc[r - r0]), per source
// column (kind 2: sc[c - c0]) or one (kind 0: sc[0]); lane tx of the first warp computes entry tx,
// and writes the factor of a group that starts in this tile. The groups are whole rows or columns
// of the tile, or the whole tile (each dimension's group 1, a multiple of 128 or the whole
// dimension; tiles start at multiples of 32), so no entry needs a division of its own.
__device__ inline void tile_scales(const CastSpec& s, bool transposed, int64_t R, int64_t C, int64_t r0, int64_t c0,
                                   int tx, float fmax, float* sc) {
  const int64_t rg = s.gr == 1 ? 0 : r0 / s.gr, cg = s.gc == 1 ? 0 : c0 / s.gc;
  int64_t i = r0, j = c0, at = 0;
  bool start = false;
  if (s.kind == 1) {  // row r0 + tx, its column group cg
    i = r0 + tx;
    if (i >= R) return;
    at = i * s.ncg + cg;
    start = c0 == cg * s.gc;
  } else if (s.kind == 2) {  // column c0 + tx, its row group rg
    j = c0 + tx;
    if (j >= C) return;
    at = rg * s.ncg + j;
    start = r0 == rg * s.gr;
  } else {
    if (tx != 0) return;
    at = rg * s.ncg + cg;
    start = r0 == rg * s.gr && c0 == cg * s.gc;
  }
  const float scale = scale_from(s.amax[at], fmax);
  sc[s.kind == 0 ? 0 : tx] = scale;
  if (start) write_inv(s, transposed ? j : i, transposed ? i : j, scale);
}

template <class T>
__global__ void __launch_bounds__(256) cast_kernel(const T* __restrict__ x, int64_t R, int64_t C, CastSpec plain,
                                                   CastSpec trans, float fmax, bool e5m2) {
  __shared__ float tile[kTile][kTile + 1];
  __shared__ float sc_plain[kTile], sc_trans[kTile];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const __nv_fp8_interpretation_t kind = e5m2 ? __NV_E5M2 : __NV_E4M3;
  const int64_t tiles_c = (C + kTile - 1) / kTile;
  const int64_t tiles = ((R + kTile - 1) / kTile) * tiles_c;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t r0 = (t / tiles_c) * kTile, c0 = (t % tiles_c) * kTile;
    if (ty == 0 && plain.codes) tile_scales(plain, false, R, C, r0, c0, tx, fmax, sc_plain);
    if (ty == 1 && trans.codes) tile_scales(trans, true, R, C, r0, c0, tx, fmax, sc_trans);
    __syncthreads();
#pragma unroll
    for (int q = 0; q < kTile / 8; ++q) {
      const int r = ty + 8 * q;
      const int64_t i = r0 + r, j = c0 + tx;
      float v = 0.0f;
      if (i < R && j < C) {
        v = load(x, i * C + j);
        if (plain.codes) {
          const float s = sc_plain[plain.kind == 1 ? r : plain.kind == 2 ? tx : 0];
          plain.codes[i * C + j] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(v * s, __NV_SATFINITE, kind));
        }
      }
      tile[r][tx] = v;
    }
    if (trans.codes) {
      __syncthreads();
#pragma unroll
      for (int q = 0; q < kTile / 8; ++q) {
        const int c = ty + 8 * q;
        const int64_t i = r0 + tx, j = c0 + c;  // source (i, j) -> transposed (j, i)
        if (i < R && j < C) {
          const float s = sc_trans[trans.kind == 1 ? tx : trans.kind == 2 ? c : 0];
          trans.codes[j * R + i] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(tile[tx][c] * s, __NV_SATFINITE, kind));
        }
      }
    }
    __syncthreads();
  }
}

__global__ void delayed_amax_kernel(float* amax, float* history, int32_t* meta, int h, bool push) {
  const float cur = amax[0];
  const int pos = meta[0], count = meta[1];
  unsigned m = 0;
  for (int i = 0; i < count; ++i) m = max(m, __float_as_uint(history[i]));
  if (count > 0 && isfinite(cur)) amax[0] = __uint_as_float(m);
  if (push && isfinite(cur)) {
    history[pos] = cur;
    meta[0] = (pos + 1) % h;
    meta[1] = min(count + 1, h);
  }
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

void check_source(const Tensor& x, const char* op) {
  FORGE_CHECK(x.defined() && x.is_cuda() && x.dim() == 2 && x.is_contiguous() &&
                  (x.dtype() == DType::bf16 || x.dtype() == DType::f32),
              op, ": expected a contiguous 2-D bf16 or f32 CUDA matrix, got ",
              x.defined() ? x.shape() : Shape{}, x.defined() ? std::string(" ") + dtype_name(x.dtype()) : "");
}

// A grouping the kernels take: each dimension's group 1, a multiple of 128, or the whole dimension.
void check_groups(const Tensor& x, Fp8Groups g, const char* op) {
  const auto ok = [](int64_t gsz, int64_t dim) { return gsz == 1 || gsz % kRegion == 0 || gsz >= dim; };
  FORGE_CHECK(g.rows >= 1 && g.cols >= 1 && ok(g.rows, x.size(0)) && ok(g.cols, x.size(1)) &&
                  !(g.rows == 1 && g.cols == 1),
              op, ": groups of ", g.rows, " x ", g.cols, " for a ", x.shape(),
              " matrix: each must be 1, a multiple of 128 or the whole dimension, and not both 1");
}

unsigned blocks_for(int device, int64_t work_items) {
  const int64_t cap = static_cast<int64_t>(multiprocessor_count(device)) * 8;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(work_items, cap)));
}

AmaxSpec amax_spec(const Tensor& x, Fp8Groups g, Tensor& table) {
  return {static_cast<unsigned*>(table.data_ptr()), g.rows, g.cols, ceil_div(x.size(1), g.cols)};
}

void launch_amax(const Tensor& x, const AmaxSpec& s0, const AmaxSpec& s1, int nspec, float* slot) {
  const int device = x.device().index;
  const int64_t R = x.size(0), C = x.size(1);
  const unsigned blocks = blocks_for(device, ceil_div(R, kRegion) * ceil_div(C, kRegion));
  const dim3 threads(32, 8);
  auto* sl = reinterpret_cast<unsigned*>(slot);
  const cudaStream_t st = current_stream(device);
  if (x.dtype() == DType::bf16)
    amax_kernel<<<blocks, threads, 0, st>>>(static_cast<const __nv_bfloat16*>(x.data_ptr()), R, C, s0, s1, nspec, sl);
  else
    amax_kernel<<<blocks, threads, 0, st>>>(static_cast<const float*>(x.data_ptr()), R, C, s0, s1, nspec, sl);
  FORGE_CUDA_LAUNCH_CHECK("fp8 amax of ", x.shape());
}

Tensor zero_table(const Tensor& x, Fp8Groups g) {
  const int device = x.device().index;
  Tensor t = blas::device_empty(device, {ceil_div(x.size(0), g.rows), ceil_div(x.size(1), g.cols)}, DType::f32);
  FORGE_CUDA_CHECK(cudaMemsetAsync(t.data_ptr(), 0, static_cast<size_t>(t.numel()) * sizeof(float),
                                   current_stream(device)));
  return t;
}

// The groups of one orientation in its own coordinates, and the factors' layout checked against them.
CastSpec cast_spec(const Tensor& x, const Tensor& amax, Fp8Groups g, Fp8ScaleMode mode, bool transposed,
                   Fp8Operand& out, Format format) {
  const int64_t R = x.size(0), C = x.size(1);
  const int64_t rows = transposed ? C : R, k = transposed ? R : C;
  const int64_t gro = std::min(transposed ? g.cols : g.rows, rows), gco = std::min(transposed ? g.rows : g.cols, k);
  FORGE_CHECK(amax.defined() && amax.is_cuda() && amax.dtype() == DType::f32 && amax.is_contiguous() &&
                  amax.numel() == ceil_div(R, g.rows) * ceil_div(C, g.cols),
              "fp8 cast: the amax table must be the f32 (", ceil_div(R, g.rows), ", ", ceil_div(C, g.cols),
              ") of fp8_group_amax for groups ", g.rows, " x ", g.cols);
  int64_t inv_n = 1, kb_pad = 0;
  switch (mode) {
    case Fp8ScaleMode::scalar:
      FORGE_CHECK(gro == rows && gco == k, "fp8 cast: scalar factors need one group, got ", g.rows, " x ", g.cols,
                  " of ", x.shape());
      break;
    case Fp8ScaleMode::outer:
      FORGE_CHECK(gro == 1 && gco == k, "fp8 cast: outer factors need one group per row of the ",
                  transposed ? "transposed " : "", "codes, got groups ", g.rows, " x ", g.cols, " of ", x.shape());
      break;
    case Fp8ScaleMode::vec128:
      FORGE_CHECK(gro == 1 && (transposed ? g.rows : g.cols) == 128, "fp8 cast: vec128 factors need 1 x 128 groups of the ",
                  transposed ? "transposed " : "", "codes, got ", g.rows, " x ", g.cols, " of ", x.shape());
      break;
    case Fp8ScaleMode::blk128:
      FORGE_CHECK(g.rows == 128 && g.cols == 128, "fp8 cast: blk128 factors need 128 x 128 groups, got ", g.rows,
                  " x ", g.cols);
      kb_pad = (ceil_div(k, 128) + 3) / 4 * 4;
      break;
  }
  inv_n = fp8_factor_count(mode, rows, k);
  const int device = x.device().index;
  out.codes = blas::device_empty(device, {rows, k}, DType::u8);
  out.inv_scales = blas::device_empty(device, {inv_n}, DType::f32);
  if (mode == Fp8ScaleMode::blk128)  // (the padding entries are never read; defined all the same)
    FORGE_CUDA_CHECK(cudaMemsetAsync(out.inv_scales.data_ptr(), 0, static_cast<size_t>(inv_n) * sizeof(float),
                                     current_stream(device)));
  out.format = format;
  out.mode = mode;
  CastSpec s;
  s.codes = static_cast<uint8_t*>(out.codes.data_ptr());
  s.inv = static_cast<float*>(out.inv_scales.data_ptr());
  s.amax = static_cast<const unsigned*>(amax.data_ptr());
  s.gr = g.rows;
  s.gc = g.cols;
  s.ncg = ceil_div(C, g.cols);
  s.kind = g.rows == 1 ? 1 : g.cols == 1 ? 2 : 0;
  s.mode = static_cast<int>(mode);
  s.out_rows = rows;
  s.kb_pad = kb_pad;
  return s;
}

void launch_cast(const Tensor& x, Format format, const CastSpec& plain, const CastSpec& trans) {
  const int device = x.device().index;
  const int64_t R = x.size(0), C = x.size(1);
  const unsigned blocks = blocks_for(device, ceil_div(R, kTile) * ceil_div(C, kTile));
  const dim3 threads(32, 8);
  const auto fmax = static_cast<float>(fp8::info(format).max);
  const bool e5m2 = format == Format::e5m2;
  const cudaStream_t st = current_stream(device);
  if (x.dtype() == DType::bf16)
    cast_kernel<<<blocks, threads, 0, st>>>(static_cast<const __nv_bfloat16*>(x.data_ptr()), R, C, plain, trans, fmax,
                                            e5m2);
  else
    cast_kernel<<<blocks, threads, 0, st>>>(static_cast<const float*>(x.data_ptr()), R, C, plain, trans, fmax, e5m2);
  FORGE_CUDA_LAUNCH_CHECK("fp8 cast of ", x.shape(), " to ", fp8::format_name(format));
}

}  // namespace

Tensor fp8_group_amax(const Tensor& x, Fp8Groups g, float* slot) {
  check_source(x, "fp8_group_amax");
  check_groups(x, g, "fp8_group_amax");
  DeviceGuard guard(x.device().index);
  Tensor t = zero_table(x, g);
  if (x.numel() > 0) launch_amax(x, amax_spec(x, g, t), AmaxSpec{}, 1, slot);
  return t;
}

void fp8_group_amax2(const Tensor& x, Fp8Groups g0, Tensor& amax0, Fp8Groups g1, Tensor& amax1, float* slot) {
  check_source(x, "fp8_group_amax2");
  check_groups(x, g0, "fp8_group_amax2");
  check_groups(x, g1, "fp8_group_amax2");
  DeviceGuard guard(x.device().index);
  amax0 = zero_table(x, g0);
  amax1 = zero_table(x, g1);
  if (x.numel() > 0) launch_amax(x, amax_spec(x, g0, amax0), amax_spec(x, g1, amax1), 2, slot);
}

Fp8Operand fp8_cast(const Tensor& x, Format format, const Tensor& amax, Fp8Groups g, Fp8ScaleMode mode,
                    bool transposed) {
  check_source(x, "fp8_cast");
  check_groups(x, g, "fp8_cast");
  DeviceGuard guard(x.device().index);
  Fp8Operand out;
  const CastSpec s = cast_spec(x, amax, g, mode, transposed, out, format);
  if (x.numel() > 0) launch_cast(x, format, transposed ? CastSpec{} : s, transposed ? s : CastSpec{});
  return out;
}

void fp8_cast2(const Tensor& x, Format format, const Tensor& amax0, Fp8Groups g0, Fp8ScaleMode m0, Fp8Operand& out0,
               const Tensor& amax1, Fp8Groups g1, Fp8ScaleMode m1, Fp8Operand& out1) {
  check_source(x, "fp8_cast2");
  check_groups(x, g0, "fp8_cast2");
  check_groups(x, g1, "fp8_cast2");
  DeviceGuard guard(x.device().index);
  const CastSpec s0 = cast_spec(x, amax0, g0, m0, false, out0, format);
  const CastSpec s1 = cast_spec(x, amax1, g1, m1, true, out1, format);
  if (x.numel() > 0) launch_cast(x, format, s0, s1);
}

void fp8_delayed_amax(Tensor& amax, float* history, int32_t* meta, int64_t h, bool push) {
  FORGE_CHECK(amax.defined() && amax.is_cuda() && amax.dtype() == DType::f32 && amax.numel() == 1,
              "fp8_delayed_amax: expected a one-element f32 CUDA amax (a tensorwise table)");
  FORGE_CHECK(h >= 1 && h <= (int64_t{1} << 20), "fp8_delayed_amax: history length ", h, " out of range");
  const int device = amax.device().index;
  DeviceGuard guard(device);
  delayed_amax_kernel<<<1, 1, 0, current_stream(device)>>>(static_cast<float*>(amax.data_ptr()), history, meta,
                                                         static_cast<int>(h), push);
  FORGE_CUDA_LAUNCH_CHECK("fp8 delayed amax");
}

bool fp8_capturing(int device) { return is_capturing(device); }

}  // namespace forge::cuda
