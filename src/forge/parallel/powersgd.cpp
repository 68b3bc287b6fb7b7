// PowerSGD (Note [PowerSGD] in powersgd.h).
#include "forge/parallel/powersgd.h"

#include <algorithm>
#include <utility>

#include "forge/autograd/grad_mode.h"
#include "forge/core/error.h"
#include "forge/core/generator.h"
#include "forge/ops/binary.h"
#include "forge/ops/copy.h"
#include "forge/ops/creation.h"
#include "forge/ops/join.h"
#include "forge/ops/matmul.h"
#include "forge/ops/reduce.h"
#include "forge/ops/unary.h"

namespace forge::parallel {

namespace {

// The columns of p (n x r, f32) made orthonormal in order (classical Gram-Schmidt, as the paper's
// implementation); a column that vanishes stays zero (its norm guarded by 1e-8).
Tensor orthonormal_columns(const Tensor& p) {
  Tensor rows = p.transpose(0, 1).contiguous();  // (r, n): row j is column j
  const int64_t r = rows.size(0);
  for (int64_t j = 0; j < r; ++j) {
    Tensor v = rows.narrow(0, j, 1);
    for (int64_t i = 0; i < j; ++i) {
      const Tensor u = rows.narrow(0, i, 1);
      v.copy_(ops::sub(v, ops::mul(u, ops::sum(ops::mul(u, v)))));
    }
    v.copy_(ops::div(v, ops::add(ops::sqrt(ops::sum(ops::mul(v, v))), 1e-8)));
  }
  return rows.transpose(0, 1).contiguous();
}

// The group's average of `parts` (each f32, any shape) by one all-reduce of their concatenation;
// each part replaced by its average.
void average_together(const ProcessGroupPtr& g, std::vector<Tensor>& parts) {
  if (parts.empty()) return;
  std::vector<Tensor> flat;
  flat.reserve(parts.size());
  for (const Tensor& t : parts) flat.push_back(t.reshape({-1}));
  Tensor buf = ops::cat(flat, 0);
  g->all_reduce(buf, ReduceOp::avg)->wait();
  int64_t off = 0;
  for (Tensor& t : parts) {
    t = buf.narrow(0, off, t.numel()).view(t.shape());
    off += t.numel();
  }
}

}  // namespace

PowerSgd::PowerSgd(const DpState& st, int rank, uint64_t seed, bool compress_all) : st_(st), rank_(rank), buckets_(st.buckets.size()) {
  FORGE_CHECK(rank >= 1, "dist.powersgd_rank must be >= 1, got ", rank);
  Generator gen(seed);
  for (size_t b = 0; b < st.buckets.size(); ++b)
    for (int pi : st.buckets[b].params) {
      const DpParam& p = st.params[static_cast<size_t>(pi)];
      const int64_t n = p.t.dim() >= 2 ? p.t.size(0) : 1, m = n > 0 ? p.numel / n : 0;
      total_ += p.numel;
      if (p.t.dim() >= 2 && (compress_all || rank * (n + m) < n * m)) {
        Matrix mat;
        mat.param = pi, mat.n = n, mat.m = m;
        mat.q = randn({m, rank}, {.dtype = DType::f32, .device = st.device}, &gen);
        buckets_[b].matrices.push_back(std::move(mat));
        sent_ += rank * (n + m);
      } else {
        buckets_[b].plain.push_back(pi);
        sent_ += p.numel;
      }
    }
}

double PowerSgd::sent_fraction() const { return total_ > 0 ? static_cast<double>(sent_) / static_cast<double>(total_) : 1.0; }

void PowerSgd::reduce(int bucket, const Tensor& grads) {
  NoGradGuard no_grad;
  Bucket& b = buckets_[static_cast<size_t>(bucket)];
  const ProcessGroupPtr& g = st_.group;
  auto slice = [&](int pi) {
    const DpParam& p = st_.params[static_cast<size_t>(pi)];
    return grads.narrow(0, p.offset, p.numel);
  };
  // The uncompressed parameters: one all-reduce.
  if (!b.plain.empty()) {
    std::vector<Tensor> parts;
    for (int pi : b.plain) parts.push_back(slice(pi).to(DType::f32));
    average_together(g, parts);
    for (size_t i = 0; i < b.plain.size(); ++i) {
      Tensor dst = slice(b.plain[i]);
      dst.copy_(parts[i]);
    }
  }
  if (b.matrices.empty()) return;
  // M = G + e; P = M Q, averaged, orthonormalised.
  std::vector<Tensor> ms, ps;
  for (Matrix& mat : b.matrices) {
    Tensor m = slice(mat.param).to(DType::f32).reshape({mat.n, mat.m});
    if (mat.error.defined()) m = ops::add(m, mat.error);
    ps.push_back(ops::matmul(m, mat.q));
    ms.push_back(std::move(m));
  }
  average_together(g, ps);
  for (Tensor& p : ps) p = orthonormal_columns(p);
  // Q = M^T P, averaged; G' = P Q^T; e = M - G'.
  std::vector<Tensor> qs;
  for (size_t i = 0; i < ms.size(); ++i) qs.push_back(ops::matmul(ms[i].transpose(0, 1), ps[i]));
  average_together(g, qs);
  for (size_t i = 0; i < ms.size(); ++i) {
    Matrix& mat = b.matrices[i];
    const Tensor approx = ops::matmul(ps[i], qs[i].transpose(0, 1));
    mat.error = ops::sub(ms[i], approx);
    mat.q = qs[i].contiguous();
    Tensor dst = slice(mat.param).view({mat.n, mat.m});
    dst.copy_(approx);
  }
}

}  // namespace forge::parallel
