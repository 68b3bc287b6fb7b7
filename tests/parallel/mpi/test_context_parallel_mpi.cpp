// Context parallelism's attention over real ranks (mpirun -np 1/2/4, the world as the
// context-parallel group): ring and Ulysses attention of each rank's part of the sequence
// (Note [context-parallel sequence layout]) against causal attention of the whole sequence in one
// piece, in f64: the outputs and the gradients of q, k and v of the rank's positions, for
// multi-head, grouped-query and multi-query attention. The inputs are random and the same on every
// rank (each takes its part), the upstream gradient too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "forge/forge.h"
#include "forge/parallel/context_parallel.h"
#include "forge/parallel/world.h"

namespace forge::parallel {
namespace {

constexpr double kTol = 1e-11;
const TensorOptions kF64{.dtype = DType::f64};

Tensor random(const Shape& s, uint64_t seed) {
  Generator gen(seed);
  return uniform(s, -1.0, 1.0, kF64, &gen);
}

void expect_near(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what << ": undefined";
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const auto a = got.to_vector<double>(), b = want.to_vector<double>();
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]) / (1 + std::abs(b[i])));
  EXPECT_LE(worst, kTol) << what;
}

// (B, T, h, D) -> this rank's (B, h, t, D) part, as the model sees it (heads after the split).
Tensor local_heads(const Tensor& whole_bthd, int rank, int size) {
  return ops::transpose(cp::local_sequence(whole_bthd, rank, size), 1, 2);
}

// `packed`: rows that pack documents (Note [context-parallel documents]), so that documents cross
// the ranks' chunks; attention within each, on both sides.
void check_attention(cp::Kind kind, int64_t H, int64_t Hkv, bool packed = false) {
  const auto g = world();
  const int W = g->size(), r = g->rank();
  const int64_t B = 2, T = 6 * W, D = 8;
  const std::string what = std::string(cp::kind_name(kind)) + " H " + std::to_string(H) + " Hkv " +
                           std::to_string(Hkv) + " on " + std::to_string(W) + " rank(s)" + (packed ? ", packed" : "");
  Tensor ids;  // (B, T) i32: row 0 documents of 5 tokens, row 1 of 7 then the rest
  if (packed) {
    std::vector<int64_t> d;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) d.push_back(b == 0 ? t / 5 : std::min<int64_t>(t / 7, 1));
    ids = from_vector(d, {B, T}).to(DType::i32);
  }
  const Tensor q = random({B, T, H, D}, 1), k = random({B, T, Hkv, D}, 2), v = random({B, T, Hkv, D}, 3);
  const Tensor dout = random({B, T, H, D}, 4);
  // The whole sequence in one piece.
  Tensor qw = q.clone().requires_grad_(), kw = k.clone().requires_grad_(), vw = v.clone().requires_grad_();
  const Tensor ow = ops::scaled_dot_product_attention(ops::transpose(qw, 1, 2), ops::transpose(kw, 1, 2),
                                                      ops::transpose(vw, 1, 2), true, 0.0, {}, ids);  // (B, H, T, D)
  ops::sum(ops::mul(ops::transpose(ow, 1, 2), dout)).backward();
  // This rank's part.
  Tensor ql = cp::local_sequence(q, r, W).requires_grad_(), kl = cp::local_sequence(k, r, W).requires_grad_(),
         vl = cp::local_sequence(v, r, W).requires_grad_();
  auto attend = kind == cp::Kind::ring ? cp::ring_attention : cp::ulysses_attention;
  const Tensor local_ids = packed ? cp::local_sequence(ids, r, W).contiguous() : Tensor();
  const Tensor ol = attend(ops::transpose(ql, 1, 2), ops::transpose(kl, 1, 2), ops::transpose(vl, 1, 2), g, local_ids);
  ops::sum(ops::mul(ops::transpose(ol, 1, 2), cp::local_sequence(dout, r, W))).backward();
  expect_near(ol, local_heads(ops::transpose(ow.detach(), 1, 2), r, W), what + ": output");
  expect_near(ql.grad(), cp::local_sequence(qw.grad(), r, W), what + ": dq");
  expect_near(kl.grad(), cp::local_sequence(kw.grad(), r, W), what + ": dk");
  expect_near(vl.grad(), cp::local_sequence(vw.grad(), r, W), what + ": dv");
}

TEST(ContextParallelMpi, RingAttentionEqualsTheWholeSequences) {
  check_attention(cp::Kind::ring, 4, 4);  // multi-head
  check_attention(cp::Kind::ring, 4, 2);  // grouped-query: only the 2 key/value heads travel
  check_attention(cp::Kind::ring, 4, 1);  // multi-query
  check_attention(cp::Kind::ring, 4, 2, /*packed=*/true);
}

TEST(ContextParallelMpi, UlyssesAttentionEqualsTheWholeSequences) {
  const int W = world()->size();
  check_attention(cp::Kind::ulysses, 2 * W, W);      // grouped-query, one key/value head per rank
  check_attention(cp::Kind::ulysses, 4 * W, 4 * W);  // multi-head
  check_attention(cp::Kind::ulysses, 2 * W, W, /*packed=*/true);
}

TEST(ContextParallelMpi, UlyssesRefusesHeadsThatDoNotDivide) {
  const auto g = world();
  const int W = g->size();
  if (W == 1) GTEST_SKIP() << "one rank: every head count divides";
  const Tensor q = random({1, 2 * W + 1, 4 * W, 8}, 5), k = random({1, 1, 4 * W, 8}, 6);
  try {
    (void)cp::ulysses_attention(q, k, k, g);
    FAIL() << "ulysses attention accepted " << q.size(1) << " heads on " << W << " ranks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dist.cp_kind = \"ring\""), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace forge::parallel
