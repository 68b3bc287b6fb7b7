// CPU row reductions: sum, mean, amax, amin, var, and the arg-extremes (max/min with the
// index of the first extremal element). See reduce.h for the math and memory contract.
#include "forge/backends/cpu/reduce.h"

#include <algorithm>
#include <functional>
#include <type_traits>
#include <vector>

#include "forge/backends/cpu/loops.h"
#include "forge/core/convert.h"
#include "forge/core/dispatch.h"

namespace forge::cpu {
namespace {

// The accumulator for element type T: double for floating types, int64 for integers/bool.
template <class T> inline constexpr bool kFloating = std::is_floating_point_v<acc_t<T>>;
template <class T> using Acc = std::conditional_t<kFloating<T>, double, int64_t>;

template <class T> inline Acc<T> load(T v) {
  if constexpr (kFloating<T>) return convert<double>(v);
  else return static_cast<int64_t>(v);
}

template <class A> inline bool is_nan(A v) {
  if constexpr (std::is_floating_point_v<A>) return v != v;
  else return false;
}

// kMax: is `a` strictly beyond `b` (greater for max, smaller for min)? Strict, so the first of
// equal elements is kept.
template <bool kMax, class A> inline bool beyond(A a, A b) { return kMax ? a > b : a < b; }

// sum_{c in [c0, c1)} p[c] with four independent accumulators (breaks the add latency chain).
template <class T> Acc<T> sum_range(const T* p, int64_t c0, int64_t c1) {
  Acc<T> s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t c = c0;
  for (; c + 4 <= c1; c += 4) {
    s0 += load(p[c]);
    s1 += load(p[c + 1]);
    s2 += load(p[c + 2]);
    s3 += load(p[c + 3]);
  }
  for (; c < c1; ++c) s0 += load(p[c]);
  return (s0 + s1) + (s2 + s3);
}

// Reduces every row of a (rows, cols) problem. partial(r, c0, c1) reduces columns [c0, c1)
// of row r to a P; combine(earlier, later) merges partials of adjacent column ranges;
// finish(r, p) writes row r's result. A row of at most kReduceBlock columns is one partial;
// a longer row is cut into fixed blocks reduced in parallel and combined left to right, so
// the result does not depend on the number of threads.
template <class P, class Partial, class Combine, class Finish>
void reduce_blocked(int64_t rows, int64_t cols, const Partial& partial, const Combine& combine, const Finish& finish) {
  const bool parallel = rows * cols >= kParallelGrain;
  if (cols <= kReduceBlock) {
#pragma omp parallel for schedule(static) if (parallel && rows > 1)
    for (int64_t r = 0; r < rows; ++r) finish(r, partial(r, int64_t{0}, cols));
    return;
  }
  const int64_t blocks = (cols + kReduceBlock - 1) / kReduceBlock;
  std::vector<P> parts(static_cast<size_t>(rows * blocks));
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t t = 0; t < rows * blocks; ++t) {
    const int64_t c0 = (t % blocks) * kReduceBlock;
    parts[static_cast<size_t>(t)] = partial(t / blocks, c0, std::min(cols, c0 + kReduceBlock));
  }
  for (int64_t r = 0; r < rows; ++r) {
    P acc = parts[static_cast<size_t>(r * blocks)];
    for (int64_t b = 1; b < blocks; ++b) acc = combine(acc, parts[static_cast<size_t>(r * blocks + b)]);
    finish(r, acc);
  }
}

// Count, mean and sum of squared deviations of a column range (for var).
struct Moments {
  double n = 0, mean = 0, m2 = 0;
};

// Chan et al.'s pairwise update: the moments of the union of two disjoint ranges.
Moments merge(const Moments& a, const Moments& b) {
  const double n = a.n + b.n;
  const double d = b.mean - a.mean;
  return {n, a.mean + d * (b.n / n), a.m2 + b.m2 + d * d * (a.n * b.n / n)};
}

}  // namespace

void reduce_rows(RowReduce op, const Tensor& x, Tensor& out) {
  const int64_t rows = x.shape()[0], cols = x.shape()[1];
  FORGE_CHECK(op != RowReduce::mean || is_floating(x.dtype()), "reduce_rows: mean needs a floating dtype, got ",
              dtype_name(x.dtype()));
  FORGE_CHECK(out.dtype() == x.dtype() || (op == RowReduce::sum && out.dtype() == DType::i64 && !is_floating(x.dtype())),
              "reduce_rows: cannot reduce ", dtype_name(x.dtype()), " into ", dtype_name(out.dtype()));
  FORGE_CHECK(cols > 0 || op == RowReduce::sum, "reduce_rows: only sum can reduce empty rows");
  dispatch_all(x.dtype(), "reduce", [&]<class T>() {
    using A = Acc<T>;
    const T* in = x.data<T>();
    auto run = [&]<class O>() {
      O* o = out.data<O>();
      if (op == RowReduce::sum || op == RowReduce::mean) {
        reduce_blocked<A>(
            rows, cols, [&](int64_t r, int64_t c0, int64_t c1) { return sum_range(in + r * cols, c0, c1); },
            std::plus<A>{},
            [&](int64_t r, A s) {
              if constexpr (kFloating<T>) o[r] = convert<O>(op == RowReduce::mean ? s / static_cast<double>(cols) : s);
              else o[r] = convert<O>(s);
            });
        return;
      }
      auto extreme = [&]<bool kMax>() {
        reduce_blocked<A>(
            rows, cols,
            [&](int64_t r, int64_t c0, int64_t c1) {
              const T* p = in + r * cols;
              A m = load(p[c0]);
              for (int64_t c = c0 + 1; c < c1; ++c) {
                const A v = load(p[c]);
                if (is_nan(v)) return v;  // NaN propagates
                if (beyond<kMax>(v, m)) m = v;
              }
              return m;
            },
            [](A a, A b) { return is_nan(a) || !(is_nan(b) || beyond<kMax>(b, a)) ? a : b; },
            [&](int64_t r, A m) { o[r] = convert<O>(m); });
      };
      if (op == RowReduce::amax) extreme.template operator()<true>();
      else extreme.template operator()<false>();
    };
    if (out.dtype() == x.dtype()) run.template operator()<T>();
    else run.template operator()<int64_t>();
  });
}

void reduce_lanes(RowReduce op, const Tensor& x, Tensor& out, int64_t outer, int64_t n, int64_t inner) {
  FORGE_CHECK(op != RowReduce::mean || is_floating(x.dtype()), "reduce_lanes: mean needs a floating dtype, got ",
              dtype_name(x.dtype()));
  FORGE_CHECK(out.dtype() == x.dtype() || (op == RowReduce::sum && out.dtype() == DType::i64 && !is_floating(x.dtype())),
              "reduce_lanes: cannot reduce ", dtype_name(x.dtype()), " into ", dtype_name(out.dtype()));
  FORGE_CHECK(n > 0 || op == RowReduce::sum, "reduce_lanes: only sum can reduce empty rows");
  const int64_t per_outer = (inner + kReduceLanes - 1) / kReduceLanes;
  const bool parallel = outer * n * inner >= kParallelGrain;
  dispatch_all(x.dtype(), "reduce", [&]<class T>() {
    using A = Acc<T>;
    const T* in = x.data<T>();
    auto run = [&]<class O>() {
      O* o = out.data<O>();
#pragma omp parallel for schedule(static) if (parallel && outer * per_outer > 1)
      for (int64_t t = 0; t < outer * per_outer; ++t) {
        const int64_t i0 = (t % per_outer) * kReduceLanes, lanes = std::min(kReduceLanes, inner - i0);
        const T* p = in + (t / per_outer) * n * inner + i0;  // element (j, l) at p[j * inner + l]
        O* dst = o + (t / per_outer) * inner + i0;
        A acc[kReduceLanes];
        if (op == RowReduce::sum || op == RowReduce::mean) {
          for (int64_t l = 0; l < lanes; ++l) acc[l] = 0;
          for (int64_t j = 0; j < n; ++j)
            for (int64_t l = 0; l < lanes; ++l) acc[l] += load(p[j * inner + l]);
          for (int64_t l = 0; l < lanes; ++l) {
            if constexpr (kFloating<T>)
              dst[l] = convert<O>(op == RowReduce::mean ? acc[l] / static_cast<double>(n) : acc[l]);
            else dst[l] = convert<O>(acc[l]);
          }
          continue;
        }
        auto extreme = [&]<bool kMax>() {
          for (int64_t l = 0; l < lanes; ++l) acc[l] = load(p[l]);
          for (int64_t j = 1; j < n; ++j)
            for (int64_t l = 0; l < lanes; ++l) {
              const A v = load(p[j * inner + l]);
              if (is_nan(v) || beyond<kMax>(v, acc[l])) acc[l] = is_nan(acc[l]) ? acc[l] : v;  // NaN sticks
            }
          for (int64_t l = 0; l < lanes; ++l) dst[l] = convert<O>(acc[l]);
        };
        if (op == RowReduce::amax) extreme.template operator()<true>();
        else extreme.template operator()<false>();
      }
    };
    if (out.dtype() == x.dtype()) run.template operator()<T>();
    else run.template operator()<int64_t>();
  });
}

void var_rows(const Tensor& x, Tensor& out, int64_t correction) {
  const int64_t rows = x.shape()[0], cols = x.shape()[1];
  FORGE_CHECK(cols > 0, "var_rows: cannot reduce empty rows");
  // max(N - correction, 0), as torch.var: a non-positive divisor gives inf (or NaN for 0/0).
  const double divisor = static_cast<double>(std::max<int64_t>(cols - correction, 0));
  dispatch_float(x.dtype(), "var", [&]<class T>() {
    const T* in = x.data<T>();
    T* o = out.data<T>();
    reduce_blocked<Moments>(
        rows, cols,
        [&](int64_t r, int64_t c0, int64_t c1) {
          // Two passes over the range: the mean, then the squared deviations from it.
          const T* p = in + r * cols;
          Moments m;
          m.n = static_cast<double>(c1 - c0);
          m.mean = sum_range(p, c0, c1) / m.n;
          for (int64_t c = c0; c < c1; ++c) {
            const double d = load(p[c]) - m.mean;
            m.m2 += d * d;
          }
          return m;
        },
        merge, [&](int64_t r, const Moments& m) { o[r] = convert<T>(m.m2 / divisor); });
  });
}

void arg_reduce_rows(ArgReduce op, const Tensor& x, Tensor* values, Tensor& indices) {
  const int64_t rows = x.shape()[0], cols = x.shape()[1];
  FORGE_CHECK(cols > 0, "arg_reduce_rows: cannot reduce empty rows");
  FORGE_CHECK(indices.dtype() == DType::i64, "arg_reduce_rows: indices must be i64, got ", dtype_name(indices.dtype()));
  dispatch_all(x.dtype(), "arg_reduce", [&]<class T>() {
    using A = Acc<T>;
    struct Best {
      A v = 0;
      int64_t i = 0;
    };
    const T* in = x.data<T>();
    T* vals = values ? values->data<T>() : nullptr;
    int64_t* idx = indices.data<int64_t>();
    auto run = [&]<bool kMax>() {
      reduce_blocked<Best>(
          rows, cols,
          [&](int64_t r, int64_t c0, int64_t c1) {
            const T* p = in + r * cols;
            Best b{load(p[c0]), c0};
            if (is_nan(b.v)) return b;
            for (int64_t c = c0 + 1; c < c1; ++c) {
              const A v = load(p[c]);
              if (is_nan(v)) return Best{v, c};  // the first NaN wins, as in PyTorch
              if (beyond<kMax>(v, b.v)) b = Best{v, c};
            }
            return b;
          },
          // `a` covers earlier columns, so it wins ties.
          [](const Best& a, const Best& b) { return is_nan(a.v) || !(is_nan(b.v) || beyond<kMax>(b.v, a.v)) ? a : b; },
          [&](int64_t r, const Best& b) {
            idx[r] = b.i;
            if (vals) vals[r] = in[r * cols + b.i];
          });
    };
    if (op == ArgReduce::max) run.template operator()<true>();
    else run.template operator()<false>();
  });
}

}  // namespace forge::cpu
