// CPU indexing kernels: index_select, gather, scatter_add.
//
//   index_select  out[o, j, i] = x[o, index[j], i]
//   gather        out[o, j, i] = x[o, index[o, j, i], i]
//   scatter_add   out[o, index[o, j, i], i] += src[o, j, i]
//
// where o runs over the dims before `dim` (flattened), j along `dim` and i over the dims
// after it. Shapes: index_select x (O, S, I), index (n), out (O, n, I); gather and
// scatter_add iterate over index's shape (O, n, I), which may be smaller than x's on
// every dim but `dim`.
//
// Memory contract:
// - Operands are strided: each is addressed through per-(o) and per-(i) element-offset
//   tables built from its own strides over the iteration shape, so broadcast (stride-0)
//   and transposed inputs are read in place. index_select copies whole contiguous inner
//   runs with memcpy when x's inner block is contiguous.
// - index_select and gather overwrite their contiguous `out`; scatter_add accumulates
//   into a contiguous `out` (the op hands it a fresh copy of x).
// - Every index is checked against the indexed dim's size before anything is written,
//   outside the parallel regions (exceptions never cross an OpenMP region).
// - scatter_add is race-free under OpenMP: two updates can hit the same element only if
//   they share (o, i), so threads take disjoint tiles of (o, i) and each walks j serially,
//   in order (the result is deterministic). 16-bit floats accumulate each update in f32
//   and round once per update.
#include "forge/backends/cpu/index.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "forge/backends/cpu/loops.h"
#include "forge/core/convert.h"
#include "forge/core/dispatch.h"

namespace forge::cpu {
namespace {

// Element offsets for walking a tensor (given by its strides) over an iteration shape
// split at `dim` into (outer, dim, inner).
struct Walk {
  std::vector<int64_t> outer;  // one per flattened index of the dims before dim
  std::vector<int64_t> inner;  // one per flattened index of the dims after dim
  int64_t step = 0;            // the stride of dim
  int64_t at(int64_t o, int64_t j, int64_t i) const {
    return outer[static_cast<size_t>(o)] + j * step + inner[static_cast<size_t>(i)];
  }
};

// Offsets of the row-major positions of shape[begin, end) under `strides`.
std::vector<int64_t> block_offsets(const Shape& shape, const Strides& strides, int64_t begin, int64_t end) {
  int64_t n = 1;
  for (int64_t d = begin; d < end; ++d) n *= shape[d];
  std::vector<int64_t> offs(static_cast<size_t>(n));
  std::vector<int64_t> idx(static_cast<size_t>(std::max<int64_t>(end - begin, 0)), 0);
  int64_t off = 0;
  for (int64_t k = 0; k < n; ++k) {
    offs[static_cast<size_t>(k)] = off;
    for (int64_t d = end; d-- > begin;) {
      const size_t q = static_cast<size_t>(d - begin);
      off += strides[d];
      if (++idx[q] < shape[d]) break;
      off -= shape[d] * strides[d];
      idx[q] = 0;
    }
  }
  return offs;
}

Walk make_walk(const Strides& strides, const Shape& shape, int64_t dim) {
  const int64_t nd = static_cast<int64_t>(shape.size());
  return {block_offsets(shape, strides, 0, dim), block_offsets(shape, strides, dim + 1, nd), strides[dim]};
}

// Throws if any index (read at walk positions over (outer, n, inner)) is outside [0, size).
template <class I>
void check_indices(const char* op, const I* idx, const Walk& w, int64_t outer, int64_t n, int64_t inner,
                   int64_t size, int64_t dim, const Shape& x_shape) {
  const int64_t rows = outer * n;
  int64_t first_bad_row = std::numeric_limits<int64_t>::max();
#pragma omp parallel for reduction(min : first_bad_row) if (rows * inner >= kParallelGrain && rows > 1)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t o = r / n, j = r % n;
    for (int64_t i = 0; i < inner; ++i) {
      const int64_t v = static_cast<int64_t>(idx[w.at(o, j, i)]);
      if (v < 0 || v >= size) {
        first_bad_row = std::min(first_bad_row, r);
        break;
      }
    }
  }
  if (first_bad_row == std::numeric_limits<int64_t>::max()) return;
  const int64_t o = first_bad_row / n, j = first_bad_row % n;
  for (int64_t i = 0; i < inner; ++i) {
    const int64_t v = static_cast<int64_t>(idx[w.at(o, j, i)]);
    FORGE_CHECK(v >= 0 && v < size, op, ": index ", v, " is out of range for dim ", dim, " of size ", size,
                " (input shape ", x_shape, ")");
  }
}

int64_t prod(const Shape& s, int64_t begin, int64_t end) {
  int64_t n = 1;
  for (int64_t d = begin; d < end; ++d) n *= s[d];
  return n;
}

}  // namespace

void index_select(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out) {
  FORGE_CHECK(out.is_contiguous() && out.dtype() == x.dtype(), "cpu::index_select: bad output");
  const Shape& xs = x.shape();
  const int64_t nd = x.dim(), size = xs[dim], n = index.numel();
  const int64_t outer = prod(xs, 0, dim), inner = prod(xs, dim + 1, nd);
  const Walk xw = make_walk(x.strides(), xs, dim);
  const int64_t istride = index.dim() == 0 ? 0 : index.strides()[0];
  dispatch_index(index.dtype(), "index_select", [&]<class I>() {
    const I* pi = index.data<I>();
    // The index as a (1, n, 1) walk.
    const Walk iw{{0}, {0}, istride};
    check_indices("index_select", pi, iw, 1, n, 1, size, dim, xs);
    if (out.numel() == 0) return;
    bool inner_contiguous = true;
    for (int64_t i = 0; i < inner && inner_contiguous; ++i) inner_contiguous = xw.inner[static_cast<size_t>(i)] == i;
    dispatch_all(x.dtype(), "index_select", [&]<class T>() {
      const T* px = x.data<T>();
      T* po = out.data<T>();
      const int64_t rows = outer * n;
#pragma omp parallel for if (rows * inner >= kParallelGrain && rows > 1)
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t o = r / n, j = r % n;
        const T* src = px + xw.outer[static_cast<size_t>(o)] + static_cast<int64_t>(pi[j * istride]) * xw.step;
        T* dst = po + r * inner;
        if (inner_contiguous) {
          std::memcpy(static_cast<void*>(dst), static_cast<const void*>(src), static_cast<size_t>(inner) * sizeof(T));
        } else {
          for (int64_t i = 0; i < inner; ++i) dst[i] = src[xw.inner[static_cast<size_t>(i)]];
        }
      }
    });
  });
}

void gather(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out) {
  FORGE_CHECK(out.is_contiguous() && out.dtype() == x.dtype() && out.shape() == index.shape(),
              "cpu::gather: bad output");
  const Shape& is = index.shape();
  const int64_t nd = index.dim(), n = is[dim];
  const int64_t outer = prod(is, 0, dim), inner = prod(is, dim + 1, nd);
  const Walk xw = make_walk(x.strides(), is, dim), iw = make_walk(index.strides(), is, dim);
  dispatch_index(index.dtype(), "gather", [&]<class I>() {
    const I* pi = index.data<I>();
    check_indices("gather", pi, iw, outer, n, inner, x.shape()[dim], dim, x.shape());
    if (out.numel() == 0) return;
    dispatch_all(x.dtype(), "gather", [&]<class T>() {
      const T* px = x.data<T>();
      T* po = out.data<T>();
      const int64_t rows = outer * n;
#pragma omp parallel for if (rows * inner >= kParallelGrain && rows > 1)
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t o = r / n, j = r % n;
        const T* xo = px + xw.outer[static_cast<size_t>(o)];
        T* dst = po + r * inner;
        for (int64_t i = 0; i < inner; ++i) {
          const int64_t v = static_cast<int64_t>(pi[iw.at(o, j, i)]);
          dst[i] = xo[v * xw.step + xw.inner[static_cast<size_t>(i)]];
        }
      }
    });
  });
}

void scatter_add_(Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) {
  FORGE_CHECK(out.is_contiguous() && out.dtype() == src.dtype(), "cpu::scatter_add_: bad output");
  const Shape& is = index.shape();
  const int64_t nd = index.dim(), n = is[dim];
  const int64_t outer = prod(is, 0, dim), inner = prod(is, dim + 1, nd);
  const Walk ow = make_walk(out.strides(), is, dim), iw = make_walk(index.strides(), is, dim),
             sw = make_walk(src.strides(), is, dim);
  dispatch_index(index.dtype(), "scatter_add", [&]<class I>() {
    const I* pi = index.data<I>();
    check_indices("scatter_add", pi, iw, outer, n, inner, out.shape()[dim], dim, out.shape());
    if (index.numel() == 0) return;
    dispatch_numeric(out.dtype(), "scatter_add", [&]<class T>() {
      using A = acc_t<T>;
      const T* ps = src.data<T>();
      T* po = out.data<T>();
      // Tiles of (o, a chunk of i): enough of them to feed every thread; j stays serial.
      const bool parallel = outer * n * inner >= kParallelGrain && omp_get_max_threads() > 1 && !omp_in_parallel();
      const int64_t want = parallel ? 4 * static_cast<int64_t>(omp_get_max_threads()) : 1;
      const int64_t per_outer = std::clamp<int64_t>((want + outer - 1) / outer, 1, std::max<int64_t>(inner, 1));
      const int64_t chunk = (inner + per_outer - 1) / per_outer;
      const int64_t tiles = outer * per_outer;
#pragma omp parallel for schedule(static) if (parallel)
      for (int64_t t = 0; t < tiles; ++t) {
        const int64_t o = t / per_outer, i0 = (t % per_outer) * chunk, i1 = std::min(inner, i0 + chunk);
        for (int64_t j = 0; j < n; ++j) {
          for (int64_t i = i0; i < i1; ++i) {
            const int64_t v = static_cast<int64_t>(pi[iw.at(o, j, i)]);
            T& dst = po[ow.outer[static_cast<size_t>(o)] + v * ow.step + ow.inner[static_cast<size_t>(i)]];
            dst = convert<T>(convert<A>(dst) + convert<A>(ps[sw.at(o, j, i)]));
          }
        }
      }
    });
  });
}

}  // namespace forge::cpu
