#include "forge/backends/cpu/tensor_kernels.h"

#include <algorithm>
#include <cstring>

#include "forge/backends/cpu/loops.h"
#include "forge/core/convert.h"
#include "forge/core/dispatch.h"
#include "forge/core/philox.h"

namespace forge::cpu {

namespace {

// A transposing copy (dst contiguous, same element size, src with unit stride on a dim `k`
// other than the last): element by element, one side of the copy always strides through
// memory. Instead copy (n_k x n_last) planes in 32 x 32 tiles, so both the reads and the
// writes of a tile stay within a few cache lines. Returns false when the layout is not
// of that kind.
template <class E>
bool copy_transposed_tiles(Tensor& dst, const Tensor& src) {
  const int64_t nd = src.dim();
  if (nd < 2 || !dst.is_contiguous() || src.strides()[nd - 1] == 1) return false;
  int64_t k = -1;
  for (int64_t d = nd - 2; d >= 0; --d)
    if (src.strides()[d] == 1 && src.shape()[d] > 1) {
      k = d;
      break;
    }
  if (k < 0 || src.shape()[nd - 1] < 8 || src.shape()[k] < 8) return false;
  const Shape& sh = src.shape();
  const Strides dst_st = contiguous_strides(sh);
  const int64_t rows = sh[k], cols = sh[nd - 1];
  const int64_t s_row = src.strides()[k], s_col = src.strides()[nd - 1];
  const int64_t d_row = dst_st[k], d_col = 1;
  // Every other dim is an outer index.
  int64_t outer = 1;
  for (int64_t d = 0; d < nd; ++d)
    if (d != k && d != nd - 1) outer *= sh[d];
  const E* sp = static_cast<const E*>(src.data_ptr());
  E* dp = static_cast<E*>(dst.data_ptr());
  constexpr int64_t kTile = 32;
  const int64_t row_tiles = (rows + kTile - 1) / kTile, col_tiles = (cols + kTile - 1) / kTile;
  const int64_t work = outer * row_tiles * col_tiles;
#pragma omp parallel for schedule(static) if (src.numel() >= kParallelGrain)
  for (int64_t w = 0; w < work; ++w) {
    int64_t o = w / (row_tiles * col_tiles);
    const int64_t t = w % (row_tiles * col_tiles);
    const int64_t r0 = (t / col_tiles) * kTile, c0 = (t % col_tiles) * kTile;
    int64_t so = 0, dof = 0;
    for (int64_t d = nd - 1; d >= 0; --d) {
      if (d == k || d == nd - 1) continue;
      const int64_t i = o % sh[d];
      o /= sh[d];
      so += i * src.strides()[d];
      dof += i * dst_st[d];
    }
    const int64_t r1 = std::min(rows, r0 + kTile), c1 = std::min(cols, c0 + kTile);
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = c0; c < c1; ++c) dp[dof + r * d_row + c * d_col] = sp[so + r * s_row + c * s_col];
  }
  return true;
}

}  // namespace

void copy(Tensor& dst, const Tensor& src) {
  FORGE_CHECK(dst.shape() == src.shape(), "copy: destination shape ", dst.shape(), " != source shape ", src.shape());
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    if (dst.data_ptr() != src.data_ptr()) std::memcpy(dst.data_ptr(), src.data_ptr(), dst.nbytes());
    return;
  }
  if (dst.dtype() == src.dtype()) {
    bool done = false;
    switch (dst.element_size()) {
      case 1: done = copy_transposed_tiles<uint8_t>(dst, src); break;
      case 2: done = copy_transposed_tiles<uint16_t>(dst, src); break;
      case 4: done = copy_transposed_tiles<uint32_t>(dst, src); break;
      case 8: done = copy_transposed_tiles<uint64_t>(dst, src); break;
      default: break;
    }
    if (done) return;
  }
  dispatch_all(dst.dtype(), "copy", [&]<class To>() {
    dispatch_all(src.dtype(), "copy", [&]<class From>() {
      elementwise<To, From>(dst, [](From v) { return convert<To>(v); }, {&src});
    });
  });
}

void fill(Tensor& t, double value) {
  dispatch_all(t.dtype(), "fill", [&]<class T>() {
    const T v = convert<T>(value);
    elementwise<T>(t, [v]() { return v; }, {});
  });
}

void arange(Tensor& t, double start, double step) {
  FORGE_CHECK(t.is_contiguous(), "arange: output must be contiguous");
  dispatch_numeric(t.dtype(), "arange", [&]<class T>() {
    T* p = t.data<T>();
    const int64_t n = t.numel();
#pragma omp parallel for if (n >= kParallelGrain)
    for (int64_t i = 0; i < n; ++i) p[i] = convert<T>(start + static_cast<double>(i) * step);
  });
}

namespace {
template <class Gen>
void random_fill(Tensor& t, const char* op, uint64_t seed, uint64_t block_offset, Gen gen) {
  FORGE_CHECK(t.is_contiguous(), op, ": output must be contiguous");
  dispatch_float(t.dtype(), op, [&]<class T>() {
    T* p = t.data<T>();
    const int64_t n = t.numel();
    const int64_t blocks = (n + 3) / 4;
#pragma omp parallel for if (n >= kParallelGrain)
    for (int64_t b = 0; b < blocks; ++b) {
      const Philox4 r = philox4x32_10(seed, block_offset + static_cast<uint64_t>(b));
      for (int64_t i = 4 * b; i < std::min<int64_t>(n, 4 * b + 4); ++i) p[i] = convert<T>(gen(r, static_cast<int>(i - 4 * b)));
    }
  });
}
}  // namespace

void uniform(Tensor& t, double lo, double hi, uint64_t seed, uint64_t block_offset) {
  random_fill(t, "rand", seed, block_offset, [&](const Philox4& r, int lane) {
    return lo + (hi - lo) * static_cast<double>(philox_uniform(r.v[lane]));
  });
}

void normal(Tensor& t, double mean, double std, uint64_t seed, uint64_t block_offset) {
  random_fill(t, "randn", seed, block_offset, [&](const Philox4& r, int lane) {
    return mean + std * static_cast<double>(philox_normal(r, lane));
  });
}

}  // namespace forge::cpu
