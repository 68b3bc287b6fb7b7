// CPU scaled dot-product attention. See attention.h for the math, the shapes and the memory
// contract; this file holds the block kernels (forward_block, backward_head) and the entry
// points that split the work across threads.
#include "forge/backends/cpu/attention.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "forge/backends/cpu/blas.h"
#include "forge/backends/cpu/loops.h"
#include "forge/backends/cpu/tensor_kernels.h"
#include "forge/core/convert.h"
#include "forge/core/dispatch.h"

namespace forge::cpu {
namespace {
// A 4-D tensor read as a stack of row-major matrices: matrix (i0, i1) starts at
// i0 * s0 + i1 * s1, row r of it at r * ld.
struct RowsView {
  int64_t s0, s1, ld;
};

RowsView rows_view(const Tensor& t) {
  const int64_t rows = t.size(2), cols = t.size(3);
  const int64_t ld = (rows <= 1 || cols == 0) ? std::max<int64_t>(1, cols) : t.stride(2);
  return {t.stride(0), t.stride(1), ld};
}

// The (rows, cols) matrix at p (row stride ld) as the compute type C: p itself when T is C,
// else a converted copy in `scratch`. `ld_out` receives the row stride of the result.
template <class C, class T>
const C* as_compute(const T* p, int64_t rows, int64_t cols, int64_t ld, std::vector<C>& scratch, int64_t& ld_out) {
  if constexpr (std::is_same_v<T, C>) {
    ld_out = ld;
    return p;
  } else {
    scratch.resize(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) scratch[static_cast<size_t>(r * cols + c)] = convert<C>(p[r * ld + c]);
    ld_out = std::max<int64_t>(1, cols);
    return scratch.data();
  }
}

// Problem sizes and the mask, shared by forward and backward.
struct Problem {
  int64_t B, H, Hkv, G, T, S, D, Dv;
  bool causal;
  double scale;
  const bool* mask = nullptr;  // element (b, h, t, j) at b*ms[0] + h*ms[1] + t*ms[2] + j*ms[3]
  int64_t ms[4] = {0, 0, 0, 0};
  const int32_t* doc_q = nullptr;  // (B, T) and (B, S), contiguous: Note [document masks]
  const int32_t* doc_k = nullptr;

  Problem(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& m, bool causal_, double scale_,
          const AttentionDocuments& docs)
      : B(q.size(0)),
        H(q.size(1)),
        Hkv(k.size(1)),
        G(Hkv > 0 ? H / Hkv : 1),
        T(q.size(2)),
        S(k.size(2)),
        D(q.size(3)),
        Dv(v.size(3)),
        causal(causal_),
        scale(scale_) {
    if (m.defined()) {
      mask = m.data<bool>();
      for (int d = 0; d < 4; ++d) ms[d] = m.stride(d);
    }
    if (docs.q.defined()) {
      FORGE_CHECK(docs.k.defined() && docs.q.dtype() == DType::i32 && docs.k.dtype() == DType::i32 &&
                      docs.q.is_contiguous() && docs.k.is_contiguous() && docs.q.shape() == Shape({B, T}) &&
                      docs.k.shape() == Shape({B, S}),
                  "cpu::attention: document ids must be contiguous i32 (B, T) = (", B, ", ", T, ") and (B, S) = (", B,
                  ", ", S, "), got ", docs.q.shape(), " and ", docs.k.shape());
      doc_q = docs.q.data<int32_t>();
      doc_k = docs.k.data<int32_t>();
    }
  }
  int64_t blocks() const { return (T + kAttentionBlock - 1) / kAttentionBlock; }
  // Keys at or past this index are masked (causally) for every row of the block [t0, t0 + rows).
  int64_t key_end(int64_t t0, int64_t rows) const {
    return causal ? std::clamp<int64_t>(t0 + rows + (S - T), 0, S) : S;
  }
  // Overwrites the row's scores for keys [0, n) with -inf where query t may not attend.
  template <class C> void mask_row(C* row, int64_t b, int64_t h, int64_t t, int64_t n) const {
    const C neg_inf = -std::numeric_limits<C>::infinity();
    if (causal) {
      const int64_t last = t + (S - T);  // the last key t may attend to
      for (int64_t j = std::max<int64_t>(last + 1, 0); j < n; ++j) row[j] = neg_inf;
    }
    if (mask) {
      const bool* mrow = mask + b * ms[0] + h * ms[1] + t * ms[2];
      for (int64_t j = 0; j < n; ++j)
        if (!mrow[j * ms[3]]) row[j] = neg_inf;
    }
    if (doc_q) {
      const int32_t d = doc_q[b * T + t];
      const int32_t* krow = doc_k + b * S;
      for (int64_t j = 0; j < n; ++j)
        if (krow[j] != d) row[j] = neg_inf;
    }
  }
};

// One block of query rows [t0, t0 + rows) of head (b, h): out rows and lse entries.
template <class T>
struct ForwardScratch {
  using C = acc_t<T>;
  std::vector<C> scores, q, k, v, o;
};

template <class T>
void forward_block(const Problem& p, const T* qp, const RowsView& rq, const T* kp, const RowsView& rk, const T* vp,
                   const RowsView& rv, T* out, acc_t<T>* lse, int64_t b, int64_t h, int64_t t0, int64_t rows,
                   ForwardScratch<T>& s) {
  using C = acc_t<T>;
  const int64_t g = h / p.G;
  const int64_t bh = b * p.H + h;
  T* out_block = out + (bh * p.T + t0) * p.Dv;
  C* lse_block = lse + bh * p.T + t0;
  const int64_t n = p.key_end(t0, rows);
  if (n == 0) {  // every row of the block is causally masked: zeros
    for (int64_t i = 0; i < rows * p.Dv; ++i) out_block[i] = convert<T>(0.0);
    for (int64_t r = 0; r < rows; ++r) lse_block[r] = -std::numeric_limits<C>::infinity();
    return;
  }
  int64_t ldq, ldk, ldv;
  const C* Q = as_compute<C>(qp + b * rq.s0 + h * rq.s1 + t0 * rq.ld, rows, p.D, rq.ld, s.q, ldq);
  const C* K = as_compute<C>(kp + b * rk.s0 + g * rk.s1, n, p.D, rk.ld, s.k, ldk);
  const C* V = as_compute<C>(vp + b * rv.s0 + g * rv.s1, n, p.Dv, rv.ld, s.v, ldv);
  s.scores.resize(static_cast<size_t>(rows * n));
  C* P = s.scores.data();
  // scores = c * Q K^T   (rows, n)
  gemm<C>(CblasNoTrans, CblasTrans, rows, n, p.D, static_cast<C>(p.scale), Q, ldq, K, ldk, C(0), P, n);
  for (int64_t r = 0; r < rows; ++r) {
    C* row = P + r * n;
    p.mask_row(row, b, h, t0 + r, n);
    // The row's max; a NaN score (a NaN in q or k) makes it NaN, so the row's output and its
    // logsumexp are NaN as in PyTorch, never mistaken for a fully masked row.
    C m = -std::numeric_limits<C>::infinity();
    for (int64_t j = 0; j < n; ++j)
      if (row[j] > m || std::isnan(row[j])) m = row[j];
    if (m == -std::numeric_limits<C>::infinity()) {  // no key allowed: a zero row
      std::fill(row, row + n, C(0));
      lse_block[r] = m;
      continue;
    }
    double sum = 0;
    for (int64_t j = 0; j < n; ++j) {
      const C e = std::exp(row[j] - m);  // exp(-inf) = 0 for masked keys
      row[j] = e;
      sum += e;
    }
    const C inv = static_cast<C>(1.0 / sum);
    for (int64_t j = 0; j < n; ++j) row[j] *= inv;
    lse_block[r] = static_cast<C>(static_cast<double>(m) + std::log(sum));
  }
  // out = P V   (rows, Dv)
  const int64_t ldo = std::max<int64_t>(1, p.Dv);
  if constexpr (std::is_same_v<T, C>) {
    gemm<C>(CblasNoTrans, CblasNoTrans, rows, p.Dv, n, C(1), P, n, V, ldv, C(0), out_block, ldo);
  } else {
    s.o.resize(static_cast<size_t>(rows * p.Dv));
    gemm<C>(CblasNoTrans, CblasNoTrans, rows, p.Dv, n, C(1), P, n, V, ldv, C(0), s.o.data(), ldo);
    for (int64_t i = 0; i < rows * p.Dv; ++i) out_block[i] = convert<T>(s.o[static_cast<size_t>(i)]);
  }
}

template <class T>
struct BackwardScratch {
  using C = acc_t<T>;
  std::vector<C> p, dp, q, k, v, dout, dq;
  std::vector<double> delta;
};

// Everything head (b, h) contributes: its dq rows (written), and its share of dk / dv
// (added into dk_acc / dv_acc, (S, D) / (S, Dv) matrices of the compute type).
template <class T>
void backward_head(const Problem& p, const T* gp, const RowsView& rg, const T* qp, const RowsView& rq, const T* kp,
                   const RowsView& rk, const T* vp, const RowsView& rv, const T* outp, const acc_t<T>* lse, T* dq,
                   acc_t<T>* dk_acc, acc_t<T>* dv_acc, int64_t b, int64_t h, BackwardScratch<T>& s) {
  using C = acc_t<T>;
  const int64_t g = h / p.G;
  const int64_t bh = b * p.H + h;
  const int64_t S = p.S, D = p.D, Dv = p.Dv;
  // This head's keys and values, converted once for all its query blocks.
  int64_t ldk, ldv;
  const C* K = as_compute<C>(kp + b * rk.s0 + g * rk.s1, S, D, rk.ld, s.k, ldk);
  const C* V = as_compute<C>(vp + b * rv.s0 + g * rv.s1, S, Dv, rv.ld, s.v, ldv);
  const int64_t ldd = std::max<int64_t>(1, D), lddv = std::max<int64_t>(1, Dv);
  for (int64_t blk = 0; blk < p.blocks(); ++blk) {
    const int64_t t0 = blk * kAttentionBlock, rows = std::min(kAttentionBlock, p.T - t0);
    const int64_t n = p.key_end(t0, rows);
    T* dq_block = dq ? dq + (bh * p.T + t0) * D : nullptr;
    if (n == 0) {  // causally masked rows: no gradient anywhere
      if (dq_block)
        for (int64_t i = 0; i < rows * D; ++i) dq_block[i] = convert<T>(0.0);
      continue;
    }
    int64_t ldq, ldg;
    const C* Q = as_compute<C>(qp + b * rq.s0 + h * rq.s1 + t0 * rq.ld, rows, D, rq.ld, s.q, ldq);
    const C* dO = as_compute<C>(gp + b * rg.s0 + h * rg.s1 + t0 * rg.ld, rows, Dv, rg.ld, s.dout, ldg);
    const C* lse_block = lse + bh * p.T + t0;
    // delta_t = dO_t . out_t
    s.delta.assign(static_cast<size_t>(rows), 0.0);
    const T* out_block = outp + (bh * p.T + t0) * Dv;
    for (int64_t r = 0; r < rows; ++r) {
      double acc = 0;
      for (int64_t c = 0; c < Dv; ++c)
        acc += static_cast<double>(dO[r * ldg + c]) * convert<double>(out_block[r * Dv + c]);
      s.delta[static_cast<size_t>(r)] = acc;
    }
    // P = exp(c * Q K^T - lse), recomputed   (rows, n)
    s.p.resize(static_cast<size_t>(rows * n));
    C* P = s.p.data();
    gemm<C>(CblasNoTrans, CblasTrans, rows, n, D, static_cast<C>(p.scale), Q, ldq, K, ldk, C(0), P, n);
    for (int64_t r = 0; r < rows; ++r) {
      C* row = P + r * n;
      const C l = lse_block[r];
      if (l == -std::numeric_limits<C>::infinity()) {
        std::fill(row, row + n, C(0));
        continue;
      }
      p.mask_row(row, b, h, t0 + r, n);
      for (int64_t j = 0; j < n; ++j) row[j] = std::exp(row[j] - l);
    }
    // dv += P^T dO   (n, Dv)
    if (dv_acc) gemm<C>(CblasTrans, CblasNoTrans, n, Dv, rows, C(1), P, n, dO, ldg, C(1), dv_acc, lddv);
    if (!dq && !dk_acc) continue;
    // dP = dO V^T   (rows, n);  dS = c * P * (dP - delta)
    s.dp.resize(static_cast<size_t>(rows * n));
    C* dS = s.dp.data();
    gemm<C>(CblasNoTrans, CblasTrans, rows, n, Dv, C(1), dO, ldg, V, ldv, C(0), dS, n);
    for (int64_t r = 0; r < rows; ++r) {
      const double delta = s.delta[static_cast<size_t>(r)];
      for (int64_t j = 0; j < n; ++j) {
        const int64_t at = r * n + j;
        dS[at] = static_cast<C>(p.scale * static_cast<double>(P[at]) * (static_cast<double>(dS[at]) - delta));
      }
    }
    // dq = dS K   (rows, D)
    if (dq_block) {
      if constexpr (std::is_same_v<T, C>) {
        gemm<C>(CblasNoTrans, CblasNoTrans, rows, D, n, C(1), dS, n, K, ldk, C(0), dq_block, ldd);
      } else {
        s.dq.resize(static_cast<size_t>(rows * D));
        gemm<C>(CblasNoTrans, CblasNoTrans, rows, D, n, C(1), dS, n, K, ldk, C(0), s.dq.data(), ldd);
        for (int64_t i = 0; i < rows * D; ++i) dq_block[i] = convert<T>(s.dq[static_cast<size_t>(i)]);
      }
    }
    // dk += dS^T Q   (n, D)
    if (dk_acc) gemm<C>(CblasTrans, CblasNoTrans, n, D, rows, C(1), dS, n, Q, ldq, C(1), dk_acc, ldd);
  }
}

void check_rows(const Tensor& t, const char* what) {
  FORGE_CHECK(t.dim() == 4 && attention_rows_readable(t), "cpu::attention: ", what,
              " must be a 4-D stack of row-major matrices (last stride 1), got shape ", t.shape(), " strides ",
              t.strides());
}

void check_blas_range(const Problem& p) {
  constexpr int64_t kMax = std::numeric_limits<blasint>::max();
  FORGE_CHECK(p.S <= kMax && p.D <= kMax && p.Dv <= kMax && kAttentionBlock * p.S <= kMax && p.S * p.D <= kMax &&
                  p.S * p.Dv <= kMax,
              "scaled_dot_product_attention: sizes S=", p.S, " D=", p.D, " Dv=", p.Dv,
              " exceed the BLAS integer range");
}

bool run_parallel(int64_t tasks, int64_t work) {
  return tasks > 1 && work >= kParallelGrain && omp_get_max_threads() > 1 && !omp_in_parallel();
}

}  // namespace

bool attention_rows_readable(const Tensor& t) {
  const int64_t rows = t.size(2), cols = t.size(3);
  return (cols <= 1 || t.stride(3) == 1) && (rows <= 1 || t.stride(2) >= cols);
}

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool causal,
                       double scale, Tensor& out, Tensor& lse, const AttentionDocuments& docs) {
  check_rows(q, "q");
  check_rows(k, "k");
  check_rows(v, "v");
  FORGE_CHECK(out.is_contiguous() && lse.is_contiguous(), "cpu::attention_forward: out and lse must be contiguous");
  const Problem p(q, k, v, mask, causal, scale, docs);
  if (p.B * p.H * p.T == 0) return;
  check_blas_range(p);
  dispatch_float(q.dtype(), "scaled_dot_product_attention", [&]<class T>() {
    using C = acc_t<T>;
    const RowsView rq = rows_view(q), rk = rows_view(k), rv = rows_view(v);
    const T* qp = q.data<T>();
    const T* kp = k.data<T>();
    const T* vp = v.data<T>();
    T* op = out.data<T>();
    C* lp = lse.data<C>();
    const int64_t nblk = p.blocks(), tasks = p.B * p.H * nblk;
    const bool parallel = run_parallel(tasks, p.B * p.H * p.T * std::max<int64_t>(p.S, 1));
    SerialBlasScope serial_blas(parallel);
#pragma omp parallel if (parallel)
    {
      ForwardScratch<T> scratch;
#pragma omp for schedule(dynamic)
      for (int64_t task = 0; task < tasks; ++task) {
        const int64_t bh = task / nblk, blk = task % nblk;
        const int64_t t0 = blk * kAttentionBlock;
        forward_block<T>(p, qp, rq, kp, rk, vp, rv, op, lp, bh / p.H, bh % p.H, t0,
                         std::min(kAttentionBlock, p.T - t0), scratch);
      }
    }
  });
}

void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                        const Tensor& out, const Tensor& lse, bool causal, double scale, Tensor& dq, Tensor& dk,
                        Tensor& dv, const AttentionDocuments& docs) {
  check_rows(dout, "dout");
  check_rows(q, "q");
  check_rows(k, "k");
  check_rows(v, "v");
  FORGE_CHECK(out.is_contiguous() && lse.is_contiguous(), "cpu::attention_backward: out and lse must be contiguous");
  for (const Tensor* t : {&dq, &dk, &dv})
    FORGE_CHECK(!t->defined() || t->is_contiguous(), "cpu::attention_backward: gradients must be contiguous");
  const Problem p(q, k, v, mask, causal, scale, docs);
  // Zero-size problems: whatever gradient exists is zero.
  if (p.B * p.H * p.T == 0 || p.S == 0 || p.Dv == 0) {
    for (Tensor* t : {&dq, &dk, &dv})
      if (t->defined()) fill(*t, 0.0);
    return;
  }
  check_blas_range(p);
  dispatch_float(q.dtype(), "scaled_dot_product_attention_backward", [&]<class T>() {
    using C = acc_t<T>;
    const RowsView rg = rows_view(dout), rq = rows_view(q), rk = rows_view(k), rv = rows_view(v);
    const bool need_k = dk.defined(), need_v = dv.defined();
    // dk/dv: straight into the outputs when each kv head has one query head and the output
    // type is the compute type; else per-query-head buffers summed over each group below.
    const bool direct = p.G == 1 && std::is_same_v<T, C>;
    std::vector<C> dk_heads, dv_heads;
    C* dk_base = nullptr;
    C* dv_base = nullptr;
    if (direct) {
      if constexpr (std::is_same_v<T, C>) {
        if (need_k) {
          fill(dk, 0.0);
          dk_base = dk.data<T>();
        }
        if (need_v) {
          fill(dv, 0.0);
          dv_base = dv.data<T>();
        }
      }
    } else {
      if (need_k) {
        dk_heads.assign(static_cast<size_t>(p.B * p.H * p.S * p.D), C(0));
        dk_base = dk_heads.data();
      }
      if (need_v) {
        dv_heads.assign(static_cast<size_t>(p.B * p.H * p.S * p.Dv), C(0));
        dv_base = dv_heads.data();
      }
    }
    const T* gp = dout.data<T>();
    const T* qp = q.data<T>();
    const T* kp = k.data<T>();
    const T* vp = v.data<T>();
    const T* op = out.data<T>();
    const C* lp = lse.data<C>();
    T* dqp = dq.defined() ? dq.data<T>() : nullptr;
    const int64_t tasks = p.B * p.H;
    const bool parallel = run_parallel(tasks, p.B * p.H * p.T * p.S);
    {
      SerialBlasScope serial_blas(parallel);
#pragma omp parallel if (parallel)
      {
        BackwardScratch<T> scratch;
#pragma omp for schedule(dynamic)
        for (int64_t bh = 0; bh < tasks; ++bh) {
          // Direct: head (b, h) is kv head (b, h) of dk/dv; buffered: row bh of the buffers.
          C* dk_acc = dk_base ? dk_base + bh * p.S * p.D : nullptr;
          C* dv_acc = dv_base ? dv_base + bh * p.S * p.Dv : nullptr;
          backward_head<T>(p, gp, rg, qp, rq, kp, rk, vp, rv, op, lp, dqp, dk_acc, dv_acc, bh / p.H, bh % p.H,
                           scratch);
        }
      }
    }
    if (direct) return;
    // dk[b, g] = sum_{i < G} dk_heads[b, g * G + i], likewise dv; rounded once to T.
    auto reduce_group = [&](const std::vector<C>& heads, Tensor& grad, int64_t width) {
      T* dst = grad.data<T>();
      const int64_t per_head = p.S * width, kv_heads = p.B * p.Hkv;
#pragma omp parallel for if (kv_heads * p.G * per_head >= kParallelGrain)
      for (int64_t bg = 0; bg < kv_heads; ++bg) {
        const C* src = heads.data() + bg * p.G * per_head;  // (b, g) -> query heads b*H + g*G ...
        for (int64_t e = 0; e < per_head; ++e) {
          C acc = 0;
          for (int64_t i = 0; i < p.G; ++i) acc += src[i * per_head + e];
          dst[bg * per_head + e] = convert<T>(acc);
        }
      }
    };
    if (need_k) reduce_group(dk_heads, dk, p.D);
    if (need_v) reduce_group(dv_heads, dv, p.Dv);
  });
}

}  // namespace forge::cpu
