// scaled_dot_product_attention, rope, conv2d, max_pool2d: against compositions of forge ops
// and naive loops, exact small examples, 16-bit tolerances and error messages.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "forge/forge.h"
#include "testing/tensor_testing.h"

namespace forge {
namespace {

using forge::testing::error_of;
using forge::testing::vals;
using ::testing::HasSubstr;

using namespace forge::ops;

Tensor rnd(const Shape& s, uint64_t seed, DType dt = DType::f64) {
  Generator g(seed);
  return randn(s, {.dtype = dt}, &g);
}

// ||x - ref|| / ||ref||
double rel_err(const Tensor& x, const Tensor& ref) {
  const std::vector<double> a = vals(x), b = vals(ref);
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

Tensor leaf(const Tensor& t) { return t.detach().clone().requires_grad_(); }

// ---- attention --------------------------------------------------------------------------

struct AttnConfig {
  int64_t B, H, Hkv, T, S, D;
  bool causal;
  bool use_mask;
  double scale;
};

// (T, S) allowed-mask values: random, but key 0 always allowed so no row is empty (the naive
// composition would give NaN there).
std::vector<double> random_mask(int64_t T, int64_t S, uint64_t seed) {
  const std::vector<double> u = vals(rnd({T, S}, seed));
  std::vector<double> m(u.size());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t s = 0; s < S; ++s) m[t * S + s] = (s == 0 || u[t * S + s] > -0.3) ? 1.0 : 0.0;
  return m;
}

// softmax(q k^T * scale, masked) v built from forge ops, with kv heads repeated per group.
Tensor naive_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttnConfig& c,
                       const std::vector<double>& mask) {
  const int64_t G = c.H / c.Hkv;
  auto repeat = [&](const Tensor& t) {  // (B, Hkv, S, D) -> (B, H, S, D), head h <- h / G
    Shape e{c.B, c.Hkv, G, t.size(2), t.size(3)};
    return t.unsqueeze(2).expand(e).reshape({c.B, c.H, t.size(2), t.size(3)});
  };
  const double scale = c.scale != 0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(c.D));
  Tensor scores = matmul(q, repeat(k).transpose(-1, -2)) * scale;
  std::vector<double> blocked(static_cast<size_t>(c.T * c.S), 0.0);
  for (int64_t t = 0; t < c.T; ++t)
    for (int64_t s = 0; s < c.S; ++s) {
      bool ok = !c.use_mask || mask[t * c.S + s] != 0;
      if (c.causal) ok = ok && s <= t + (c.S - c.T);
      blocked[t * c.S + s] = ok ? 0.0 : 1.0;
    }
  scores = masked_fill(scores, ne(from_vector<double>(blocked, {c.T, c.S}), 0.0), -INFINITY);
  return matmul(softmax(scores, -1), repeat(v));
}

TEST(Attention, MatchesNaiveCompositionValuesAndGradients) {
  const std::vector<AttnConfig> configs = {
      {2, 4, 4, 5, 5, 3, true, false, 0.0},     // causal MHA
      {2, 4, 4, 5, 7, 3, false, false, 0.0},    // T != S
      {2, 4, 2, 6, 6, 4, true, false, 0.0},     // GQA
      {1, 4, 1, 4, 9, 2, true, false, 0.0},     // MQA, causal bottom-right
      {2, 4, 2, 5, 8, 3, false, true, 0.0},     // mask
      {2, 4, 2, 6, 8, 3, true, true, 0.45},     // mask + causal + custom scale
      {1, 2, 1, 70, 90, 5, true, true, 0.0},    // two query blocks
      {2, 4, 2, 100, 100, 16, true, false, 0.0} // big enough to run threaded
  };
  uint64_t seed = 1;
  for (const auto& c : configs) {
    SCOPED_TRACE(::testing::Message() << "B=" << c.B << " H=" << c.H << " Hkv=" << c.Hkv << " T=" << c.T << " S=" << c.S
                                    << " D=" << c.D << " causal=" << c.causal << " mask=" << c.use_mask);
    const Tensor q0 = rnd({c.B, c.H, c.T, c.D}, seed++), k0 = rnd({c.B, c.Hkv, c.S, c.D}, seed++);
    const Tensor v0 = rnd({c.B, c.Hkv, c.S, c.D}, seed++), g = rnd({c.B, c.H, c.T, c.D}, seed++);
    const std::vector<double> m = random_mask(c.T, c.S, seed++);
    const Tensor mask = c.use_mask ? ne(from_vector<double>(m, {c.T, c.S}), 0.0) : Tensor();

    Tensor q = leaf(q0), k = leaf(k0), v = leaf(v0);
    Tensor out = scaled_dot_product_attention(q, k, v, c.causal, c.scale, mask);
    out.backward(g);
    Tensor qr = leaf(q0), kr = leaf(k0), vr = leaf(v0);
    Tensor ref = naive_attention(qr, kr, vr, c, m);
    ref.backward(g);

    EXPECT_EQ(out.shape(), (Shape{c.B, c.H, c.T, c.D}));
    EXPECT_LT(rel_err(out, ref), 1e-12);
    EXPECT_LT(rel_err(q.grad(), qr.grad()), 1e-12);
    EXPECT_LT(rel_err(k.grad(), kr.grad()), 1e-12);
    EXPECT_LT(rel_err(v.grad(), vr.grad()), 1e-12);
  }
}

TEST(Attention, NonContiguousQueryViewMatchesContiguous) {
  // (B, T, H, D) as a fused projection writes it, viewed as (B, H, T, D): read in place.
  const Tensor x = rnd({2, 6, 4, 8}, 11);
  const Tensor k = rnd({2, 2, 6, 8}, 12), v = rnd({2, 2, 6, 8}, 13);
  const Tensor qv = x.permute({0, 2, 1, 3});
  ASSERT_FALSE(qv.is_contiguous());
  EXPECT_LT(rel_err(scaled_dot_product_attention(qv, k, v), scaled_dot_product_attention(qv.contiguous(), k, v)),
            1e-15);
}

TEST(Attention, CausalRowZeroAttendsOnlyKeyZero) {
  const Tensor q = rnd({2, 4, 5, 3}, 21), k = rnd({2, 2, 5, 3}, 22), v = rnd({2, 2, 5, 3}, 23);
  const Tensor out = scaled_dot_product_attention(q, k, v, /*causal=*/true);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < 4; ++h) {
      const std::vector<double> o = vals(out.select(0, b).select(0, h).select(0, 0));
      const std::vector<double> v0 = vals(v.select(0, b).select(0, h / 2).select(0, 0));  // kv head h / (H/Hkv)
      for (size_t i = 0; i < o.size(); ++i) EXPECT_DOUBLE_EQ(o[i], v0[i]) << "b=" << b << " h=" << h << " i=" << i;
    }
  // Row 1 mixes keys 0 and 1 only: changing key 2..4 leaves it unchanged.
  Tensor v2 = v.clone();
  v2.narrow(2, 2, 3).fill_(100.0);
  const Tensor out2 = scaled_dot_product_attention(q, k, v2, true);
  EXPECT_EQ(vals(out.narrow(2, 0, 2)), vals(out2.narrow(2, 0, 2)));
}

TEST(Attention, CausalBottomRightWhenQueriesAreTheLastPositions) {
  // T=2 queries against S=5 keys: query t is position t + 3 and sees keys 0..t+3, so the last
  // query row sees everything (the decoding step of a KV cache).
  const Tensor q = rnd({1, 1, 2, 4}, 31), k = rnd({1, 1, 5, 4}, 32), v = rnd({1, 1, 5, 4}, 33);
  const Tensor causal = scaled_dot_product_attention(q, k, v, true);
  const Tensor full = scaled_dot_product_attention(q, k, v, false);
  EXPECT_EQ(vals(causal.narrow(2, 1, 1)), vals(full.narrow(2, 1, 1)));
  const Tensor first4 = scaled_dot_product_attention(q.narrow(2, 0, 1), k.narrow(2, 0, 4), v.narrow(2, 0, 4), false);
  EXPECT_LT(rel_err(causal.narrow(2, 0, 1), first4), 1e-15);
}

TEST(Attention, RowsWithNoAllowedKeyGiveZerosAndZeroGradients) {
  // T=4 > S=2 causal: rows 0 and 1 see no key. A mask also empties row 3.
  Tensor q = leaf(rnd({1, 2, 4, 3}, 41)), k = leaf(rnd({1, 2, 2, 3}, 42)), v = leaf(rnd({1, 2, 2, 3}, 43));
  const Tensor mask = ne(from_vector<double>({1, 1, 1, 1, 1, 1, 0, 0}, {4, 2}), 0.0);
  Tensor out = scaled_dot_product_attention(q, k, v, true, 0.0, mask);
  out.backward(rnd(out.shape(), 44));
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t t : {0, 1, 3}) {
      for (double x : vals(out.select(1, h).select(1, t))) EXPECT_EQ(x, 0.0) << "h=" << h << " t=" << t;
      for (double x : vals(q.grad().select(1, h).select(1, t))) EXPECT_EQ(x, 0.0);
    }
  for (double x : vals(out.select(2, 2))) EXPECT_NE(x, 0.0);
  for (double x : vals(out)) EXPECT_TRUE(std::isfinite(x));
}

// A NaN in a query (a NaN query weight) makes that row's output and gradient NaN, as in PyTorch:
// a row of NaN scores is not a fully masked row (issue 35: it used to give zeros, so forge eval
// reported a finite loss for NaN weights). The other rows stay finite; a NaN key reaches every
// row that may attend to it. f64 and f32 (the f32 path is the one the CPU trains with).
TEST(Attention, NanScoresPropagateAndAreNeverMistakenForMaskedRows) {
  for (DType dt : {DType::f64, DType::f32}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor q0 = rnd({1, 2, 5, 4}, 61, dt);
    q0.select(0, 0).select(0, 1).select(0, 2).narrow(0, 1, 1).fill_(std::nan(""));  // head 1, row 2
    Tensor q = leaf(q0), k = leaf(rnd({1, 2, 5, 4}, 62, dt)), v = leaf(rnd({1, 2, 5, 4}, 63, dt));
    Tensor out = scaled_dot_product_attention(q, k, v, /*causal=*/true);
    out.backward(rnd(out.shape(), 64, dt));
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t t = 0; t < 5; ++t) {
        const bool nan_row = h == 1 && t == 2;
        for (double x : vals(out.select(1, h).select(1, t))) EXPECT_EQ(std::isnan(x), nan_row) << "h=" << h << " t=" << t;
        for (double x : vals(q.grad().select(1, h).select(1, t))) EXPECT_EQ(std::isnan(x), nan_row) << "h=" << h << " t=" << t;
      }
    // A NaN key: every row of its head at or after it (causal) is NaN, the rows before are not.
    Tensor k1 = rnd({1, 2, 5, 4}, 65, dt);
    k1.select(0, 0).select(0, 0).select(0, 3).narrow(0, 0, 1).fill_(std::nan(""));  // head 0, key 3
    const Tensor o1 = scaled_dot_product_attention(rnd({1, 2, 5, 4}, 66, dt), k1, rnd({1, 2, 5, 4}, 67, dt), true);
    for (int64_t t = 0; t < 5; ++t)
      for (double x : vals(o1.select(1, 0).select(1, t))) EXPECT_EQ(std::isnan(x), t >= 3) << "t=" << t;
    for (double x : vals(o1.select(1, 1))) EXPECT_TRUE(std::isfinite(x));
  }
}

TEST(Attention, SixteenBitAndF32AgreeWithF64) {
  for (DType dt : {DType::bf16, DType::f16, DType::f32}) {
    SCOPED_TRACE(dtype_name(dt));
    // The same (rounded) inputs in f64 give the reference.
    const Tensor q16 = rnd({2, 4, 33, 16}, 51, dt), k16 = rnd({2, 2, 40, 16}, 52, dt), v16 = rnd({2, 2, 40, 16}, 53, dt);
    const Tensor g16 = rnd({2, 4, 33, 16}, 54, dt);
    const double tol = dt == DType::f32 ? 1e-5 : 1e-2;
    Tensor q = leaf(q16), k = leaf(k16), v = leaf(v16);
    Tensor out = scaled_dot_product_attention(q, k, v, true);
    out.backward(g16);
    EXPECT_EQ(out.dtype(), dt);
    Tensor qr = leaf(q16.to(DType::f64)), kr = leaf(k16.to(DType::f64)), vr = leaf(v16.to(DType::f64));
    Tensor ref = scaled_dot_product_attention(qr, kr, vr, true);
    ref.backward(g16.to(DType::f64));
    EXPECT_LT(rel_err(out, ref), tol);
    EXPECT_LT(rel_err(q.grad(), qr.grad()), tol);
    EXPECT_LT(rel_err(k.grad(), kr.grad()), tol);
    EXPECT_LT(rel_err(v.grad(), vr.grad()), tol);
  }
}

TEST(Attention, ErrorsNameTheOpAndShapes) {
  const Tensor q = rnd({1, 3, 4, 8}, 61), k = rnd({1, 2, 4, 8}, 62), v = rnd({1, 2, 4, 8}, 63);
  std::string e = error_of([&] { scaled_dot_product_attention(q, k, v); });
  EXPECT_THAT(e, HasSubstr("scaled_dot_product_attention"));
  EXPECT_THAT(e, HasSubstr("H=3"));
  EXPECT_THAT(e, HasSubstr("Hkv=2"));
  EXPECT_THAT(e, HasSubstr("[1, 3, 4, 8]"));

  const Tensor q4 = rnd({1, 2, 4, 8}, 64), k6 = rnd({1, 2, 4, 6}, 65);
  e = error_of([&] { scaled_dot_product_attention(q4, k6, k6); });
  EXPECT_THAT(e, HasSubstr("scaled_dot_product_attention"));
  EXPECT_THAT(e, HasSubstr("head dim"));
  EXPECT_THAT(e, HasSubstr("[1, 2, 4, 8]"));
  EXPECT_THAT(e, HasSubstr("[1, 2, 4, 6]"));

  e = error_of([&] { scaled_dot_product_attention(q4, k, rnd({1, 2, 5, 8}, 66)); });
  EXPECT_THAT(e, HasSubstr("k and v must have the same (Hkv, S)"));

  e = error_of([&] { scaled_dot_product_attention(q4, k, v, true, 0.0, ones({3, 4}, {.dtype = DType::boolean})); });
  EXPECT_THAT(e, HasSubstr("mask of shape [3, 4] cannot be broadcast to (B, H, T, S) = [1, 2, 4, 4]"));

  e = error_of([&] { scaled_dot_product_attention(q4, k, v, true, 0.0, ones({4, 4})); });
  EXPECT_THAT(e, HasSubstr("mask must be bool"));

  e = error_of([&] { scaled_dot_product_attention(q4, k.to(DType::f32), v); });
  EXPECT_THAT(e, HasSubstr("one floating dtype"));
  EXPECT_THAT(e, HasSubstr("f64, f32, f64"));

  e = error_of([&] { scaled_dot_product_attention(rnd({2, 4, 8}, 67), k, v); });
  EXPECT_THAT(e, HasSubstr("expected 4-D q (B, H, T, D)"));
}

// ---- rope -------------------------------------------------------------------------------

TEST(Rope, MatchesTheRotateHalfFormula) {
  const int64_t D = 6, half = 3;
  const Tensor x = rnd({1, 2, 5, D}, 71);
  const double theta = 10000.0;
  const int64_t offset = 7;
  const std::vector<double> xv = vals(x), yv = vals(rope(x, offset, theta));
  for (int64_t row = 0; row < 10; ++row) {
    const int64_t t = row % 5;
    for (int64_t i = 0; i < half; ++i) {
      const double a = static_cast<double>(offset + t) * std::pow(theta, -2.0 * static_cast<double>(i) / D);
      const double x1 = xv[row * D + i], x2 = xv[row * D + i + half];
      EXPECT_NEAR(yv[row * D + i], x1 * std::cos(a) - x2 * std::sin(a), 1e-14);
      EXPECT_NEAR(yv[row * D + i + half], x2 * std::cos(a) + x1 * std::sin(a), 1e-14);
    }
  }
}

TEST(Rope, PreservesTheNormOfEveryPair) {
  const int64_t D = 8, half = 4;
  const Tensor x = rnd({2, 3, 6, D}, 72);
  const std::vector<double> xv = vals(x), yv = vals(rope(x, 11));
  for (size_t r = 0; r < xv.size() / D; ++r)
    for (int64_t i = 0; i < half; ++i) {
      const size_t a = r * D + i, b = a + half;
      EXPECT_NEAR(yv[a] * yv[a] + yv[b] * yv[b], xv[a] * xv[a] + xv[b] * xv[b], 1e-12);
    }
}

TEST(Rope, PositionZeroIsTheIdentity) {
  const Tensor x = rnd({2, 2, 4, 6}, 73);
  const Tensor y = rope(x);
  EXPECT_EQ(vals(y.narrow(2, 0, 1)), vals(x.narrow(2, 0, 1)));
  EXPECT_NE(vals(y.narrow(2, 1, 1)), vals(x.narrow(2, 1, 1)));
}

TEST(Rope, OffsetEqualsSliceOfTheFullSequence) {
  // Rotating rows 3.. with offset 3 equals rows 3.. of the whole rotated sequence (KV cache).
  const Tensor x = rnd({1, 2, 9, 4}, 74);
  EXPECT_LT(rel_err(rope(x.narrow(2, 3, 6), 3), rope(x).narrow(2, 3, 6)), 1e-15);
}

TEST(Rope, BackwardIsTheInverseRotation) {
  Tensor x = leaf(rnd({2, 2, 5, 4}, 75));
  Tensor y = rope(x, 4, 100.0);
  y.backward(y.detach());  // R^T (R x) = x
  EXPECT_LT(rel_err(x.grad(), x), 1e-14);
}

TEST(Rope, SixteenBitAgreesWithF64) {
  for (DType dt : {DType::bf16, DType::f16, DType::f32}) {
    const Tensor x = rnd({2, 4, 16, 32}, 76, dt);
    EXPECT_LT(rel_err(rope(x, 3), rope(x.to(DType::f64), 3)), dt == DType::f32 ? 1e-6 : 1e-2) << dtype_name(dt);
  }
}

TEST(Rope, ErrorsNameTheOpAndShape) {
  std::string e = error_of([] { rope(rnd({1, 2, 3, 5}, 77)); });
  EXPECT_THAT(e, HasSubstr("rope"));
  EXPECT_THAT(e, HasSubstr("must be even"));
  EXPECT_THAT(e, HasSubstr("[1, 2, 3, 5]"));
  e = error_of([] { rope(rnd({2, 3, 4}, 78)); });
  EXPECT_THAT(e, HasSubstr("rope: expected x of shape (B, H, T, D), got [2, 3, 4]"));
  e = error_of([] { rope(rnd({1, 1, 2, 4}, 79), -1); });
  EXPECT_THAT(e, HasSubstr("position_offset"));
}

// ---- conv2d -----------------------------------------------------------------------------

// By definition, in f64.
std::vector<double> naive_conv2d(const Tensor& x, const Tensor& w, const Tensor& b, Size2 st, Size2 pd) {
  const int64_t N = x.size(0), Ci = x.size(1), H = x.size(2), W = x.size(3);
  const int64_t Co = w.size(0), kh = w.size(2), kw = w.size(3);
  const int64_t Ho = (H + 2 * pd[0] - kh) / st[0] + 1, Wo = (W + 2 * pd[1] - kw) / st[1] + 1;
  const std::vector<double> xv = vals(x), wv = vals(w), bv = b.defined() ? vals(b) : std::vector<double>{};
  std::vector<double> out(static_cast<size_t>(N * Co * Ho * Wo));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t co = 0; co < Co; ++co)
      for (int64_t oy = 0; oy < Ho; ++oy)
        for (int64_t ox = 0; ox < Wo; ++ox) {
          double s = bv.empty() ? 0.0 : bv[co];
          for (int64_t ci = 0; ci < Ci; ++ci)
            for (int64_t i = 0; i < kh; ++i)
              for (int64_t j = 0; j < kw; ++j) {
                const int64_t iy = oy * st[0] - pd[0] + i, ix = ox * st[1] - pd[1] + j;
                if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
                s += xv[((n * Ci + ci) * H + iy) * W + ix] * wv[((co * Ci + ci) * kh + i) * kw + j];
              }
          out[((n * Co + co) * Ho + oy) * Wo + ox] = s;
        }
  return out;
}

TEST(Conv2d, MatchesNaiveLoops) {
  struct Case {
    Shape x, w;
    bool bias;
    Size2 stride, padding;
  };
  const std::vector<Case> cases = {
      {{2, 3, 7, 7}, {4, 3, 3, 3}, true, {1, 1}, {1, 1}},
      {{2, 3, 7, 8}, {5, 3, 3, 3}, false, {2, 2}, {1, 1}},
      {{1, 2, 6, 9}, {3, 2, 2, 4}, true, {2, 3}, {0, 2}},
      {{3, 4, 5, 5}, {2, 4, 1, 1}, true, {1, 1}, {0, 0}},
      {{2, 1, 4, 4}, {1, 1, 4, 4}, false, {1, 1}, {0, 0}},
      {{8, 16, 12, 12}, {8, 16, 3, 3}, true, {1, 1}, {1, 1}},  // threaded over samples
  };
  uint64_t seed = 81;
  for (const auto& c : cases) {
    SCOPED_TRACE(::testing::Message() << "x " << shape_str(c.x) << " w " << shape_str(c.w));
    const Tensor x = rnd(c.x, seed++), w = rnd(c.w, seed++), b = c.bias ? rnd({c.w[0]}, seed++) : Tensor();
    const Tensor y = conv2d(x, w, b, c.stride, c.padding);
    const std::vector<double> ref = naive_conv2d(x, w, b, c.stride, c.padding);
    const std::vector<double> got = vals(y);
    ASSERT_EQ(got.size(), ref.size());
    for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(got[i], ref[i], 1e-12 * (1 + std::abs(ref[i]))) << i;
  }
}

TEST(Conv2d, NonContiguousInputAndSixteenBit) {
  const Tensor xn = rnd({2, 6, 6, 3}, 91).permute({0, 3, 1, 2});  // NHWC storage
  const Tensor w = rnd({4, 3, 3, 3}, 92), b = rnd({4}, 93);
  EXPECT_LT(rel_err(conv2d(xn, w, b, {2, 2}, {1, 1}), conv2d(xn.contiguous(), w, b, {2, 2}, {1, 1})), 1e-15);
  for (DType dt : {DType::bf16, DType::f16, DType::f32}) {
    const Tensor x16 = xn.to(dt), w16 = w.to(dt), b16 = b.to(dt);
    const Tensor y = conv2d(x16, w16, b16, {1, 1}, {1, 1});
    EXPECT_EQ(y.dtype(), dt);
    const Tensor ref = conv2d(x16.to(DType::f64), w16.to(DType::f64), b16.to(DType::f64), {1, 1}, {1, 1});
    EXPECT_LT(rel_err(y, ref), dt == DType::f32 ? 1e-6 : 1e-2) << dtype_name(dt);
  }
}

TEST(Conv2d, GradientsOfSixteenBitAgreeWithF64) {
  const Tensor x0 = rnd({2, 3, 6, 6}, 94, DType::bf16), w0 = rnd({4, 3, 3, 3}, 95, DType::bf16);
  const Tensor b0 = rnd({4}, 96, DType::bf16), g0 = rnd({2, 4, 3, 3}, 97, DType::bf16);
  Tensor x = leaf(x0), w = leaf(w0), b = leaf(b0);
  conv2d(x, w, b, {2, 2}, {1, 1}).backward(g0);
  Tensor xr = leaf(x0.to(DType::f64)), wr = leaf(w0.to(DType::f64)), br = leaf(b0.to(DType::f64));
  conv2d(xr, wr, br, {2, 2}, {1, 1}).backward(g0.to(DType::f64));
  EXPECT_LT(rel_err(x.grad(), xr.grad()), 1e-2);
  EXPECT_LT(rel_err(w.grad(), wr.grad()), 1e-2);
  EXPECT_LT(rel_err(b.grad(), br.grad()), 1e-2);
}

TEST(Conv2d, ErrorsNameTheOpAndShapes) {
  const Tensor x = rnd({2, 3, 5, 5}, 98);
  std::string e = error_of([&] { conv2d(x, rnd({4, 2, 3, 3}, 99)); });
  EXPECT_THAT(e, HasSubstr("conv2d: input channels differ"));
  EXPECT_THAT(e, HasSubstr("[2, 3, 5, 5]"));
  EXPECT_THAT(e, HasSubstr("[4, 2, 3, 3]"));
  e = error_of([&] { conv2d(x, rnd({4, 3, 6, 6}, 100)); });
  EXPECT_THAT(e, HasSubstr("conv2d: kernel [6, 6] is larger than the padded input"));
  EXPECT_THAT(e, HasSubstr("[2, 3, 5, 5]"));
  EXPECT_EQ(conv2d(x, rnd({4, 3, 6, 6}, 100), {}, {1, 1}, {1, 1}).shape(), (Shape{2, 4, 2, 2}));
  e = error_of([&] { conv2d(x, rnd({4, 3, 3, 3}, 101), rnd({3}, 102)); });
  EXPECT_THAT(e, HasSubstr("conv2d: bias must have shape [4]"));
  e = error_of([&] { conv2d(x, rnd({4, 3, 3, 3}, 101), {}, {0, 1}); });
  EXPECT_THAT(e, HasSubstr("conv2d: stride must be positive"));
  e = error_of([&] { conv2d(rnd({3, 5, 5}, 103), rnd({4, 3, 3, 3}, 101)); });
  EXPECT_THAT(e, HasSubstr("conv2d: expected x (N, Cin, H, W)"));
}

// ---- max_pool2d -------------------------------------------------------------------------

TEST(MaxPool2d, SmallExactExample) {
  // 1 x 1 x 4 x 4, 2x2 windows, stride 2.
  Tensor x = from_vector<double>({1, 5, 2, 0,   //
                                  3, 4, 8, 7,   //
                                  -1, -2, 6, 6.5,  //
                                  -3, -0.5, 9, 1},
                                 {1, 1, 4, 4})
                 .requires_grad_();
  const ValuesIndices r = max_pool2d_with_indices(x, {2, 2});
  EXPECT_EQ(r.values.shape(), (Shape{1, 1, 2, 2}));
  EXPECT_EQ(vals(r.values), (std::vector<double>{5, 8, -0.5, 9}));
  EXPECT_EQ(r.indices.to_vector<int64_t>(), (std::vector<int64_t>{1, 6, 13, 14}));
  r.values.backward(from_vector<double>({10, 20, 30, 40}, {1, 1, 2, 2}));
  EXPECT_EQ(vals(x.grad()), (std::vector<double>{0, 10, 0, 0, 0, 0, 20, 0, 0, 0, 0, 0, 0, 30, 40, 0}));
}

TEST(MaxPool2d, OverlappingWindowsAccumulateAndPaddingIsNeverChosen) {
  // 3x3 windows at stride 1 with padding 1 over an all-negative 3x3: the centre 9 windows.
  Tensor x = from_vector<double>({-9, -8, -7, -6, -1, -5, -4, -3, -2}, {1, 1, 3, 3}).requires_grad_();
  Tensor y = max_pool2d(x, {3, 3}, {1, 1}, {1, 1});
  EXPECT_EQ(vals(y), (std::vector<double>{-1, -1, -1, -1, -1, -1, -1, -1, -1}));
  y.backward(ones_like(y));
  EXPECT_EQ(vals(x.grad()), (std::vector<double>{0, 0, 0, 0, 9, 0, 0, 0, 0}));
  // Ties: the first maximum in row-major window order wins; a NaN wins over numbers.
  const Tensor t = from_vector<double>({2, 2, 2, 2, NAN, 1, 0, 3}, {1, 2, 2, 2});
  const ValuesIndices r = max_pool2d_with_indices(t, {2, 2});
  EXPECT_EQ(r.indices.to_vector<int64_t>(), (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(vals(r.values)[0], 2.0);
  EXPECT_TRUE(std::isnan(vals(r.values)[1]));
}

TEST(MaxPool2d, MatchesWindowMaximaOnRandomInputAndSixteenBit) {
  const Tensor x = rnd({2, 3, 9, 8}, 111);
  const Tensor y = max_pool2d(x, {3, 2}, {2, 2}, {1, 1});
  EXPECT_EQ(y.shape(), (Shape{2, 3, 5, 5}));
  const std::vector<double> xv = vals(x), yv = vals(y);
  for (int64_t p = 0; p < 6; ++p)
    for (int64_t oy = 0; oy < 5; ++oy)
      for (int64_t ox = 0; ox < 5; ++ox) {
        double m = -INFINITY;
        for (int64_t iy = oy * 2 - 1; iy < oy * 2 + 2; ++iy)
          for (int64_t ix = ox * 2 - 1; ix < ox * 2 + 1; ++ix)
            if (iy >= 0 && iy < 9 && ix >= 0 && ix < 8) m = std::max(m, xv[(p * 9 + iy) * 8 + ix]);
        EXPECT_EQ(yv[(p * 5 + oy) * 5 + ox], m);
      }
  const Tensor xb = x.to(DType::bf16);
  EXPECT_EQ(vals(max_pool2d(xb, {3, 2}, {2, 2}, {1, 1})), vals(max_pool2d(xb.to(DType::f64), {3, 2}, {2, 2}, {1, 1})));
}

TEST(MaxPool2d, ErrorsNameTheOpAndShapes) {
  const Tensor x = rnd({1, 2, 3, 3}, 112);
  std::string e = error_of([&] { max_pool2d(x, {4, 4}); });
  EXPECT_THAT(e, HasSubstr("max_pool2d: kernel [4, 4] is larger than the padded input"));
  EXPECT_THAT(e, HasSubstr("[1, 2, 3, 3]"));
  e = error_of([&] { max_pool2d(x, {2, 2}, {1, 1}, {2, 0}); });
  EXPECT_THAT(e, HasSubstr("max_pool2d: padding [2, 0] must be at most half the kernel [2, 2]"));
  e = error_of([&] { max_pool2d(rnd({2, 3}, 113), {1, 1}); });
  EXPECT_THAT(e, HasSubstr("max_pool2d: expected x of shape (N, C, H, W), got [2, 3]"));
}

}  // namespace
}  // namespace forge

namespace forge {
namespace {

// Note [packed LLaMA attention]: qkv_rope_attention gives the values and the gradient of the
// unfused path (head views of q, k, v; ops::rope on q and k; scaled_dot_product_attention;
// heads merged), and its errors name the shapes.
TEST(QkvRopeAttention, MatchesRopeAndAttentionOnHeadViews) {
  struct Case {
    int64_t B, T, H, Hk, D, offset;
    bool causal;
    ops::RopeScaling scaling;
  };
  const ops::RopeScaling llama3{.factor = 8.0, .low_freq_factor = 1.0, .high_freq_factor = 4.0,
                                .original_context = 8192.0};
  for (const Case& c : {Case{2, 7, 4, 2, 8, 0, true, {}}, Case{1, 5, 3, 3, 4, 2, false, {}},
                        Case{2, 6, 4, 1, 8, 3000, true, llama3}}) {
    const int64_t W = (c.H + 2 * c.Hk) * c.D;
    const Tensor base = rnd({c.B, c.T, W}, 900 + static_cast<uint64_t>(c.H * 10 + c.Hk));
    const Tensor g = rnd({c.B, c.T, c.H * c.D}, 950);
    const double theta = 5000.0;
    Tensor a = leaf(base), b = leaf(base);
    const Tensor ya = ops::qkv_rope_attention(a, c.H, c.Hk, c.offset, theta, c.scaling, c.causal);
    auto heads = [&](const Tensor& t, int64_t first, int64_t n) {
      return transpose(reshape(narrow(t, 2, first * c.D, n * c.D), {c.B, c.T, n, c.D}), 1, 2);
    };
    const Tensor q = rope(heads(b, 0, c.H), c.offset, theta, c.scaling);
    const Tensor k = rope(heads(b, c.H, c.Hk), c.offset, theta, c.scaling);
    const Tensor yb = reshape(transpose(scaled_dot_product_attention(q, k, heads(b, c.H + c.Hk, c.Hk), c.causal), 1, 2),
                              {c.B, c.T, c.H * c.D});
    EXPECT_LT(rel_err(ya, yb), 1e-13) << "H " << c.H << " Hkv " << c.Hk;
    ya.backward(g);
    yb.backward(g);
    EXPECT_LT(rel_err(a.grad(), b.grad()), 1e-13) << "H " << c.H << " Hkv " << c.Hk;
  }
  EXPECT_THAT(error_of([] { ops::qkv_rope_attention(rnd({1, 3, 30}, 1), 4, 2); }), HasSubstr("(n_head + 2 n_kv_head) x D"));
  EXPECT_THAT(error_of([] { ops::qkv_rope_attention(rnd({1, 3, 32}, 1), 4, 3); }), HasSubstr("multiple of n_kv_head"));
}

}  // namespace
}  // namespace forge
