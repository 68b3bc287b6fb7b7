#pragma once
// The CPU elementwise engine: strided N-operand iteration with dim coalescing and OpenMP.
//
// All operands have the iteration shape (inputs are broadcast beforehand by giving
// broadcast dims stride 0, e.g. with Tensor::expand). for_each_run() drops size-1 dims,
// merges dims that are contiguous across every operand, and hands the body runs of
// `n` elements along the innermost dim, with each operand's pointer and byte stride.
// A fully contiguous problem becomes one run, split into chunks across threads; otherwise
// threads take ranges of the outer index and walk a multi-index counter.
#include <omp.h>

#include <array>
#include <cstdint>
#include <vector>

#include "forge/core/tensor.h"

namespace forge::cpu {

// Below this many elements a loop runs on one thread (a parallel region costs microseconds).
inline constexpr int64_t kParallelGrain = 32768;

template <size_t N> using Ptrs = std::array<char*, N>;
template <size_t N> using ByteStrides = std::array<int64_t, N>;

template <size_t N, class Body>
void for_each_run(const Shape& shape, const std::array<const Tensor*, N>& ops, Body&& body) {
  const int64_t numel = shape_numel(shape);
  if (numel == 0) return;
  // Collect dims (outer to inner), skipping size-1 dims.
  std::vector<int64_t> sizes;
  std::vector<ByteStrides<N>> strides;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    ByteStrides<N> s;
    for (size_t k = 0; k < N; ++k) s[k] = ops[k]->strides()[d] * static_cast<int64_t>(ops[k]->element_size());
    sizes.push_back(shape[d]);
    strides.push_back(s);
  }
  if (sizes.empty()) {
    sizes.push_back(1);
    strides.push_back(ByteStrides<N>{});
  }
  // Coalesce: merge dim i into the next inner one when, for every operand, stepping dim i
  // equals stepping the inner dim across its whole extent.
  std::vector<int64_t> cs{sizes.back()};
  std::vector<ByteStrides<N>> cst{strides.back()};
  for (size_t i = sizes.size() - 1; i-- > 0;) {
    bool merge = true;
    for (size_t k = 0; k < N; ++k) merge &= strides[i][k] == cst.back()[k] * cs.back();
    if (merge) {
      cs.back() *= sizes[i];
    } else {
      cs.push_back(sizes[i]);
      cst.push_back(strides[i]);
    }
  }
  // cs/cst are now inner to outer.
  const int64_t inner = cs[0];
  const ByteStrides<N> inner_st = cst[0];
  const int64_t outer = numel / inner;
  Ptrs<N> base;
  for (size_t k = 0; k < N; ++k) base[k] = static_cast<char*>(ops[k]->data_ptr());

  auto ptrs_at = [&](int64_t outer_idx) {
    Ptrs<N> p = base;
    for (size_t d = 1; d < cs.size() && outer_idx > 0; ++d) {
      const int64_t i = outer_idx % cs[d];
      outer_idx /= cs[d];
      for (size_t k = 0; k < N; ++k) p[k] += i * cst[d][k];
    }
    return p;
  };

  const bool parallel = numel >= kParallelGrain && omp_get_max_threads() > 1 && !omp_in_parallel();
  if (outer == 1 || inner >= kParallelGrain) {
    // Long runs: split each run into chunks.
    const int64_t chunk = parallel ? kParallelGrain / 2 : inner;
    const int64_t per_run = (inner + chunk - 1) / chunk;
    const int64_t tiles = outer * per_run;
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t o = t / per_run, c = t % per_run;
      Ptrs<N> p = ptrs_at(o);
      const int64_t start = c * chunk;
      for (size_t k = 0; k < N; ++k) p[k] += start * inner_st[k];
      body(p, inner_st, std::min(chunk, inner - start));
    }
    return;
  }
  // Short runs: threads take ranges of the outer index and step a counter.
#pragma omp parallel if (parallel)
  {
    const int nt = omp_get_num_threads(), tid = omp_get_thread_num();
    const int64_t begin = outer * tid / nt, end = outer * (tid + 1) / nt;
    if (begin < end) {
      std::vector<int64_t> idx(cs.size(), 0);
      int64_t rem = begin;
      for (size_t d = 1; d < cs.size(); ++d) {
        idx[d] = rem % cs[d];
        rem /= cs[d];
      }
      Ptrs<N> p = ptrs_at(begin);
      for (int64_t o = begin; o < end; ++o) {
        body(p, inner_st, inner);
        for (size_t d = 1; d < cs.size(); ++d) {  // increment the counter
          ++idx[d];
          for (size_t k = 0; k < N; ++k) p[k] += cst[d][k];
          if (idx[d] < cs[d]) break;
          for (size_t k = 0; k < N; ++k) p[k] -= cs[d] * cst[d][k];
          idx[d] = 0;
        }
      }
    }
  }
}

// out[i] = fn(in[i]...) over tensors of one shape. Out and In... are the element types;
// fn receives and returns values as the caller chooses (conversions are implicit).
template <class Out, class... In, class Fn>
void elementwise(Tensor& out, Fn fn, const std::array<const Tensor*, sizeof...(In)>& ins) {
  constexpr size_t N = sizeof...(In) + 1;
  std::array<const Tensor*, N> ops;
  ops[0] = &out;
  for (size_t k = 0; k < sizeof...(In); ++k) ops[k + 1] = ins[k];
  for_each_run<N>(out.shape(), ops, [&](Ptrs<N> p, ByteStrides<N> s, int64_t n) {
    bool contiguous = s[0] == sizeof(Out);
    {
      size_t k = 1;
      ((contiguous &= s[k] == static_cast<int64_t>(sizeof(In)), ++k), ...);
    }
    if (contiguous) {
      Out* o = reinterpret_cast<Out*>(p[0]);
      auto run = [&]<size_t... K>(std::index_sequence<K...>) {
        std::tuple<const In*...> in{reinterpret_cast<const In*>(p[K + 1])...};
        for (int64_t i = 0; i < n; ++i) o[i] = static_cast<Out>(fn(std::get<K>(in)[i]...));
      };
      run(std::index_sequence_for<In...>{});
    } else {
      auto run = [&]<size_t... K>(std::index_sequence<K...>) {
        for (int64_t i = 0; i < n; ++i)
          *reinterpret_cast<Out*>(p[0] + i * s[0]) =
              static_cast<Out>(fn(*reinterpret_cast<const In*>(p[K + 1] + i * s[K + 1])...));
      };
      run(std::index_sequence_for<In...>{});
    }
  });
}

}  // namespace forge::cpu
