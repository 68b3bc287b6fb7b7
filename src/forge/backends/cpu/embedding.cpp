// Embedding lookup: CPU kernels.
//
//   forward   out[n, c]     = weight[ids[n], c]
//   backward  dweight[v, c] = sum over n with ids[n] == v of dout[n, c]
//
//   weight, dweight (V, C)   V rows (the vocabulary), C features
//   ids             (N)      N = B * T positions for token ids (B, T)
//   out, dout       (N, C)   i.e. (B, T, C)
//
// Memory contract: weight, ids and dout are read only. The forward overwrites out; the
// backward overwrites the whole of dweight (rows that no id names are written as zeros).
// Backward scratch: the positions bucketed by id, (V + 1) + V + N int64.
//
// The backward is a gather per row, not a scatter: the positions are bucketed by id with a
// stable counting sort (serial, O(N + V)), then threads take disjoint rows v of dweight and
// each sums its row's positions in increasing n into a double accumulator, rounding to the
// output dtype once. No two threads write one row and the summation order is fixed, so the
// result is race-free, needs no atomics, and is bit-identical for any thread count.
// Repeated ids accumulate; an id that appears once is copied exactly.
#include "forge/backends/cpu/embedding.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "forge/backends/cpu/loops.h"
#include "forge/core/convert.h"
#include "forge/core/dispatch.h"

namespace forge::cpu {
namespace {

// Throws (before any output is written) if an id lies outside [0, V).
template <class I> void check_ids(const char* op, const I* ids, int64_t N, int64_t V, const Shape& ids_shape) {
  for (int64_t n = 0; n < N; ++n) {
    const int64_t v = static_cast<int64_t>(ids[n]);
    FORGE_CHECK(v >= 0 && v < V, op, ": id ", v, " at position ", n, " of ids (shape ", ids_shape,
                ") is out of range for a vocabulary of V = ", V, " rows (valid ids are 0 .. ", V - 1, ")");
  }
}

}  // namespace

void embedding_forward(const Tensor& weight, const Tensor& ids, Tensor& out) {
  FORGE_CHECK(weight.dim() == 2 && weight.is_contiguous() && ids.is_contiguous() && out.is_contiguous() &&
                  out.dtype() == weight.dtype() && out.numel() == ids.numel() * weight.shape()[1],
              "embedding: the CPU kernel needs a contiguous (V, C) weight, contiguous ids and a contiguous (N, C) "
              "output, got weight ", weight.shape(), ", ids ", ids.shape(), ", out ", out.shape());
  const int64_t V = weight.shape()[0], C = weight.shape()[1], N = ids.numel();
  dispatch_index(ids.dtype(), "embedding", [&]<class I>() {
    const I* pi = ids.data<I>();
    check_ids("embedding", pi, N, V, ids.shape());
    if (N == 0 || C == 0) return;
    const size_t row_bytes = static_cast<size_t>(C) * weight.element_size();
    const char* pw = static_cast<const char*>(weight.data_ptr());
    char* po = static_cast<char*>(out.data_ptr());
#pragma omp parallel for schedule(static) if (N * C >= kParallelGrain && N > 1)
    for (int64_t n = 0; n < N; ++n)
      std::memcpy(po + static_cast<size_t>(n) * row_bytes, pw + static_cast<size_t>(pi[n]) * row_bytes, row_bytes);
  });
}

void embedding_backward(const Tensor& dout, const Tensor& ids, Tensor& dweight) {
  FORGE_CHECK(dweight.dim() == 2 && dweight.is_contiguous() && ids.is_contiguous() && dout.is_contiguous() &&
                  dout.dtype() == dweight.dtype() && dout.numel() == ids.numel() * dweight.shape()[1],
              "embedding_backward: the CPU kernel needs a contiguous (N, C) dout, contiguous ids and a contiguous "
              "(V, C) dweight, got dout ", dout.shape(), ", ids ", ids.shape(), ", dweight ", dweight.shape());
  const int64_t V = dweight.shape()[0], C = dweight.shape()[1], N = ids.numel();
  dispatch_index(ids.dtype(), "embedding_backward", [&]<class I>() {
    const I* pi = ids.data<I>();
    check_ids("embedding_backward", pi, N, V, ids.shape());
    // Stable counting sort of the positions by id: positions of id v are
    // order[start[v] .. start[v + 1]), in increasing n.
    std::vector<int64_t> start(static_cast<size_t>(V) + 1, 0);
    for (int64_t n = 0; n < N; ++n) ++start[static_cast<size_t>(pi[n]) + 1];
    for (int64_t v = 0; v < V; ++v) start[static_cast<size_t>(v) + 1] += start[static_cast<size_t>(v)];
    std::vector<int64_t> cursor(start.begin(), start.end() - 1), order(static_cast<size_t>(N));
    for (int64_t n = 0; n < N; ++n) order[static_cast<size_t>(cursor[static_cast<size_t>(pi[n])]++)] = n;
    if (C == 0) return;
    dispatch_float(dweight.dtype(), "embedding_backward", [&]<class T>() {
      using M = acc_t<T>;
      const T* pg = dout.data<T>();
      T* pd = dweight.data<T>();
      const T zero = convert<T>(0.0);
      const bool parallel = (V + N) * C >= kParallelGrain && V > 1;
#pragma omp parallel if (parallel)
      {
        std::vector<double> acc(static_cast<size_t>(C));
#pragma omp for schedule(dynamic, 16)
        for (int64_t v = 0; v < V; ++v) {
          T* row = pd + v * C;
          const int64_t b = start[static_cast<size_t>(v)], e = start[static_cast<size_t>(v) + 1];
          if (b == e) {
            std::fill(row, row + C, zero);
          } else if (e - b == 1) {
            std::memcpy(static_cast<void*>(row), static_cast<const void*>(pg + order[static_cast<size_t>(b)] * C),
                        static_cast<size_t>(C) * sizeof(T));
          } else {
            std::fill(acc.begin(), acc.end(), 0.0);
            for (int64_t k = b; k < e; ++k) {
              const T* src = pg + order[static_cast<size_t>(k)] * C;
              for (int64_t c = 0; c < C; ++c) acc[static_cast<size_t>(c)] += static_cast<double>(convert<M>(src[c]));
            }
            for (int64_t c = 0; c < C; ++c) row[c] = convert<T>(acc[static_cast<size_t>(c)]);
          }
        }
      }
    });
  });
}

}  // namespace forge::cpu
