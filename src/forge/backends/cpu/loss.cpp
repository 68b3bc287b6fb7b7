// Cross-entropy over the class dim, fused with a numerically stable log-softmax: CPU kernels.
//
//   logits (N, V): N = B * T rows (logits (B, T, V)), V classes (the vocabulary)
//   targets (N):   a class per row, or ignore_index to skip the row
//
// Forward, per counted row n with target t = targets[n]:
//   m_n   = max_j logits[n, j]
//   lse_n = m_n + log(sum_j exp(logits[n, j] - m_n))
//   loss_n = lse_n - logits[n, t]
// and loss_n = 0 for ignored rows. The op reduces: sum = sum_n loss_n, mean = sum / count.
//
// Backward, from the upstream gradient g_n (one value for mean/sum, one per row for none)
// and scale (1 / count for mean, else 1):
//   dlogits[n, j] = (exp(logits[n, j] - lse_n) - [j == t]) * g_n * scale
// with zero rows for ignored targets.
//
// Precision: the sum of exponentials (in kLanes interleaved partial sums, a fixed order)
// and the row losses accumulate in double; exp and the elementwise math run in acc_t<T>
// (float for bf16/f16/f32, double for f64). Logits are read in their own dtype and
// converted element by element: no f32 copy of bf16 logits is ever made, not even of one
// row. lse is saved rounded to f32 for 16-bit logits. The total over rows is summed in row
// order, so it does not depend on the thread count.
//
// Memory contract: logits, targets, lse (backward) and grad are read only. The forward
// overwrites lse and, when defined, loss; the backward overwrites dlogits. Forward scratch:
// N doubles (the per-row losses, summed in order afterwards).
//
// Threads: rows are split across OpenMP threads; each row is handled by one thread.
#include "forge/backends/cpu/loss.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "forge/backends/cpu/loops.h"
#include "forge/core/convert.h"
#include "forge/core/dispatch.h"

namespace forge::cpu {
namespace {

// The row max and the sum of exponentials run in kLanes interleaved partials (element j in
// lane j % kLanes): independent dependency chains, in a fixed order.
constexpr int64_t kLanes = 8;

// Calls body(j, lane) for j in [0, n) with lane = j % kLanes.
template <class Body> void for_lanes(int64_t n, const Body& body) {
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int64_t k = 0; k < kLanes; ++k) body(j + k, k);
  for (int64_t k = 0; j < n; ++j, ++k) body(j, k);
}

struct RowsV {
  int64_t N = 0, V = 0;
};

RowsV rows_of(const char* op, const Tensor& logits, const Tensor& targets) {
  FORGE_CHECK(logits.dim() >= 1, op, ": logits must have a class dim, got shape ", logits.shape());
  const int64_t V = logits.shape().back(), N = targets.numel();
  FORGE_CHECK(logits.is_contiguous() && targets.is_contiguous() && logits.numel() == N * V, op,
              ": the CPU kernel needs contiguous logits of N * V elements and N contiguous targets, got logits ",
              logits.shape(), " and targets ", targets.shape());
  return {N, V};
}

// Range-checks every counted target (serially, before any output is written); returns the count.
template <class I>
int64_t check_targets(const char* op, const I* tg, RowsV nv, int64_t ignore_index, const Tensor& logits) {
  int64_t count = 0;
  for (int64_t n = 0; n < nv.N; ++n) {
    const int64_t t = static_cast<int64_t>(tg[n]);
    if (t == ignore_index) continue;
    FORGE_CHECK(t >= 0 && t < nv.V, op, ": target ", t, " at position ", n, " is out of range for ", nv.V,
                " classes (logits shape ", logits.shape(), "); targets must lie in [0, ", nv.V,
                ") or equal ignore_index (", ignore_index, ")");
    ++count;
  }
  return count;
}

}  // namespace

DType cross_entropy_lse_dtype(DType logits) {
  return logits == DType::bf16 || logits == DType::f16 ? DType::f32 : logits;
}

CrossEntropyTotals cross_entropy_forward(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                         Tensor& loss, Tensor& lse) {
  const RowsV nv = rows_of("cross_entropy", logits, targets);
  const int64_t N = nv.N, V = nv.V;  // not a structured binding: OpenMP regions capture these (clang)
  FORGE_CHECK(lse.is_contiguous() && lse.numel() == N && lse.dtype() == cross_entropy_lse_dtype(logits.dtype()),
              "cross_entropy: bad lse buffer");
  FORGE_CHECK(!loss.defined() ||
                  (loss.is_contiguous() && loss.numel() == N && loss.dtype() == cross_entropy_lse_dtype(logits.dtype())),
              "cross_entropy: bad loss buffer");
  CrossEntropyTotals totals;
  dispatch_index(targets.dtype(), "cross_entropy", [&]<class I>() {
    const I* tg = targets.data<I>();
    totals.count = check_targets("cross_entropy", tg, nv, ignore_index, logits);
    dispatch_float(logits.dtype(), "cross_entropy", [&]<class T>() {
      using M = acc_t<T>;
      using S = acc_t<T>;
      const T* px = logits.data<T>();
      S* pl = lse.data<S>();
      S* po = loss.defined() ? loss.data<S>() : nullptr;
      std::vector<double> row_loss(static_cast<size_t>(N));
#pragma omp parallel for schedule(static) if (N * V >= kParallelGrain && N > 1)
      for (int64_t n = 0; n < N; ++n) {
        const int64_t t = static_cast<int64_t>(tg[n]);
        double l = 0;
        if (t == ignore_index) {
          pl[n] = S(0);
        } else {
          const T* xr = px + n * V;
          M lm[kLanes];
          std::fill(lm, lm + kLanes, -std::numeric_limits<M>::infinity());
          for_lanes(V, [&](int64_t j, int64_t k) { lm[k] = std::max(lm[k], convert<M>(xr[j])); });
          const M m = *std::max_element(lm, lm + kLanes);  // a NaN never wins, but poisons the sum
          double ls[kLanes] = {};
          for_lanes(V, [&](int64_t j, int64_t k) { ls[k] += static_cast<double>(std::exp(convert<M>(xr[j]) - m)); });
          double s = 0;
          for (double v : ls) s += v;
          const double row_lse = static_cast<double>(m) + std::log(s);
          pl[n] = static_cast<S>(row_lse);
          l = row_lse - static_cast<double>(convert<M>(xr[t]));
        }
        row_loss[static_cast<size_t>(n)] = l;
        if (po) po[n] = static_cast<S>(l);
      }
      double sum = 0;
      for (int64_t n = 0; n < N; ++n) sum += row_loss[static_cast<size_t>(n)];
      totals.sum = sum;
    });
  });
  return totals;
}

void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& grad,
                            double scale, int64_t ignore_index, Tensor& dlogits, int64_t class_start) {
  const RowsV nv = rows_of("cross_entropy_backward", logits, targets);
  const int64_t N = nv.N, V = nv.V;  // not a structured binding: OpenMP regions capture these (clang)
  FORGE_CHECK(lse.is_contiguous() && lse.numel() == N && lse.dtype() == cross_entropy_lse_dtype(logits.dtype()),
              "cross_entropy_backward: bad lse buffer");
  FORGE_CHECK(grad.is_contiguous() && grad.dtype() == cross_entropy_lse_dtype(logits.dtype()) &&
                  (grad.dim() == 0 || grad.numel() == N),
              "cross_entropy_backward: grad must be 0-d or hold one value per row, contiguous, of the loss dtype; "
              "got ", grad.shape(), " ", dtype_name(grad.dtype()), " for ", N, " rows");
  FORGE_CHECK(dlogits.is_contiguous() && dlogits.numel() == N * V && dlogits.dtype() == logits.dtype(),
              "cross_entropy_backward: bad dlogits buffer");
  dispatch_index(targets.dtype(), "cross_entropy_backward", [&]<class I>() {
    const I* tg = targets.data<I>();
    if (class_start < 0) check_targets("cross_entropy_backward", tg, nv, ignore_index, logits);
    dispatch_float(logits.dtype(), "cross_entropy_backward", [&]<class T>() {
      using M = acc_t<T>;
      using S = acc_t<T>;
      const T* px = logits.data<T>();
      const S* pl = lse.data<S>();
      const S* pg = grad.data<S>();
      const int64_t gstep = grad.dim() == 0 ? 0 : 1;
      T* pd = dlogits.data<T>();
      const T zero = convert<T>(0.0);
#pragma omp parallel for schedule(static) if (N * V >= kParallelGrain && N > 1)
      for (int64_t n = 0; n < N; ++n) {
        T* dr = pd + n * V;
        const int64_t t = static_cast<int64_t>(tg[n]);
        if (t == ignore_index) {
          std::fill(dr, dr + V, zero);
          continue;
        }
        const T* xr = px + n * V;
        const M gs = static_cast<M>(static_cast<double>(pg[n * gstep]) * scale);
        const M l = static_cast<M>(pl[n]);
        // The target's column in these logits (none: another rank's class).
        const int64_t c = class_start < 0 ? t : t - class_start;
        const bool here = c >= 0 && c < V;
        const M xt = here ? convert<M>(xr[c]) : M(0);  // read first: dlogits may be the logits (in place)
        for (int64_t j = 0; j < V; ++j) dr[j] = convert<T>(std::exp(convert<M>(xr[j]) - l) * gs);
        if (here) dr[c] = convert<T>((std::exp(xt - l) - M(1)) * gs);
      }
    });
  });
}

}  // namespace forge::cpu
