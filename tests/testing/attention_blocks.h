#pragma once
// Note [attention blocks] (ops/attention.h) checked on any device: causal attention over a sequence
// of two chunks assembled from three blocks, as ring attention assembles it (the first chunk's
// queries against its own keys, causal; the second chunk's against the first chunk's keys, in
// full, and against its own, causal), the pieces merged by their logsumexp, and the backward of
// each block given the merged output and logsumexp. Outputs and the gradients of q, k and v must
// equal scaled_dot_product_attention of the whole sequence computed in f64 on the CPU from the
// same values. Used by tests/ops/test_attention_blocks.cpp (CPU) and
// tests/backends/cuda/test_cuda_attention.cpp (GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "forge/autograd/grad_mode.h"
#include "forge/forge.h"
#include "forge/ops/attention.h"

namespace forge::attention_blocks_testing {

inline double max_rel(const Tensor& got, const Tensor& want) {
  const auto a = got.to(Device::cpu(), DType::f64).contiguous().to_vector<double>();
  const auto b = want.to(Device::cpu(), DType::f64).contiguous().to_vector<double>();
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return scale == 0 ? diff : diff / scale;
}

// B x H heads over Hkv key/value heads, a sequence of 2c positions, head dim D, on `device` in `dtype`;
// `docs` (2c ids, every row's): packed documents (Note [document masks]), each block given its ids.
inline void check_blocks(Device device, DType dtype, int64_t B, int64_t H, int64_t Hkv, int64_t c, int64_t D,
                         double tol, uint64_t seed, const std::vector<int64_t>& docs = {}) {
  const std::string what = std::string(dtype_name(dtype)) + " on " + device.str() + " H " + std::to_string(H) +
                           " Hkv " + std::to_string(Hkv) + " c " + std::to_string(c) + " D " + std::to_string(D);
  const int64_t T = 2 * c;
  Generator gen(seed);
  const TensorOptions f64{.dtype = DType::f64};
  // The values rounded to dtype first, so both sides start from the same numbers.
  auto make = [&](const Shape& s) { return uniform(s, -1.0, 1.0, f64, &gen).to(dtype).to(DType::f64); };
  const Tensor q = make({B, H, T, D}), k = make({B, Hkv, T, D}), v = make({B, Hkv, T, D}), dout = make({B, H, T, D});
  // The reference: the whole sequence, f64, CPU.
  Tensor ids;  // (B, T) i32, every row the same
  if (!docs.empty()) {
    std::vector<int64_t> all;
    for (int64_t b = 0; b < B; ++b) all.insert(all.end(), docs.begin(), docs.end());
    ids = from_vector(all, {B, T}).to(DType::i32);
  }
  Tensor qr = q.clone().requires_grad_(), kr = k.clone().requires_grad_(), vr = v.clone().requires_grad_();
  const Tensor ref = ops::scaled_dot_product_attention(qr, kr, vr, true, 0.0, {}, ids);
  ops::sum(ops::mul(ref, dout)).backward();
  // The blocks, on the device in dtype.
  NoGradGuard no_grad;
  const DType acc = dtype == DType::f64 ? DType::f64 : DType::f32;  // what the merge computes in
  auto dev = [&](const Tensor& t) { return t.to(dtype).to(device); };
  const Tensor qd = dev(q), kd = dev(k), vd = dev(v), gd = dev(dout);
  auto rows = [&](const Tensor& t, int64_t part) { return ops::narrow(t, 2, part * c, c); };
  const Tensor id = ids.defined() ? ids.to(device) : Tensor();
  auto doc = [&](int64_t part) { return id.defined() ? ops::narrow(id, 1, part * c, c).contiguous() : Tensor(); };
  const Tensor d0 = doc(0), d1 = doc(1);
  const ops::AttentionBlock b1 = ops::attention_block_forward(rows(qd, 0), rows(kd, 0), rows(vd, 0), true, 0.0, d0, d0);
  const ops::AttentionBlock b2 = ops::attention_block_forward(rows(qd, 1), rows(kd, 0), rows(vd, 0), false, 0.0, d1, d0);
  const ops::AttentionBlock b3 = ops::attention_block_forward(rows(qd, 1), rows(kd, 1), rows(vd, 1), true, 0.0, d1, d1);
  const Tensor l2 = b2.lse.to(acc), l3 = b3.lse.to(acc);
  // (With documents a row of b2 may see no key: lse -inf there, a weight of 0; b3 always has the
  // diagonal, so the max is finite.)
  const Tensor m = ops::maximum(l2, l3);
  const Tensor l23 = ops::add(m, ops::log(ops::add(ops::exp(ops::sub(l2, m)), ops::exp(ops::sub(l3, m)))));
  const Tensor o23 = ops::add(ops::mul(b2.out.to(acc), ops::unsqueeze(ops::exp(ops::sub(l2, l23)), -1)),
                              ops::mul(b3.out.to(acc), ops::unsqueeze(ops::exp(ops::sub(l3, l23)), -1)));
  const Tensor out = ops::cat({b1.out.to(acc), o23}, 2).to(dtype);
  const Tensor lse = ops::cat({b1.lse.to(acc), l23}, 2);
  EXPECT_LE(max_rel(out, ref.detach()), tol) << what << ": output";
  const ops::AttentionBlockGrads g1 =
      ops::attention_block_backward(rows(gd, 0), rows(qd, 0), rows(kd, 0), rows(vd, 0), rows(out, 0), rows(lse, 0), true,
                                    0.0, d0, d0);
  const ops::AttentionBlockGrads g2 = ops::attention_block_backward(
      rows(gd, 1), rows(qd, 1), rows(kd, 0), rows(vd, 0), rows(out, 1), rows(lse, 1), false, 0.0, d1, d0);
  const ops::AttentionBlockGrads g3 =
      ops::attention_block_backward(rows(gd, 1), rows(qd, 1), rows(kd, 1), rows(vd, 1), rows(out, 1), rows(lse, 1), true,
                                    0.0, d1, d1);
  auto wide = [acc](const Tensor& t) { return t.to(acc); };
  const Tensor dq = ops::cat({wide(g1.dq), ops::add(wide(g2.dq), wide(g3.dq))}, 2);
  const Tensor dk = ops::cat({ops::add(wide(g1.dk), wide(g2.dk)), wide(g3.dk)}, 2);
  const Tensor dv = ops::cat({ops::add(wide(g1.dv), wide(g2.dv)), wide(g3.dv)}, 2);
  EXPECT_LE(max_rel(dq, qr.grad()), tol) << what << ": dq";
  EXPECT_LE(max_rel(dk, kr.grad()), tol) << what << ": dk";
  EXPECT_LE(max_rel(dv, vr.grad()), tol) << what << ": dv";
}

}  // namespace forge::attention_blocks_testing
