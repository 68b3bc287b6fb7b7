// Neural-network ops: embedding, layer_norm, rms_norm, dropout, cross_entropy. Values
// against hand-computed / closed-form results and against compositions of primitive ops,
// 16-bit inputs against f64 references, determinism (same seed -> same mask; the weight
// gradients bit-identical for any thread count), and errors that name the op and shapes.
// Finite-difference gradients of every op live in grad_cases_nn.cpp; the comparison with
// PyTorch in tests/python/nn_reference.py.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "forge/core/env.h"
#include "forge/forge.h"
#include "testing/tensor_testing.h"

namespace forge {
namespace {

using forge::testing::seq;
using forge::testing::vals;
using ops::Reduction;

using ::testing::ElementsAre;
using ::testing::HasSubstr;

Tensor f64(const std::vector<double>& v, const Shape& shape) { return from_vector<double>(v, shape); }
Tensor i64(const std::vector<int64_t>& v, const Shape& shape) { return from_vector<int64_t>(v, shape); }

Tensor randn64(const Shape& s, uint64_t seed) {
  Generator g(seed);
  return randn(s, {.dtype = DType::f64}, &g);
}

// ||a - b|| / ||b|| over all elements (any dtypes).
double rel_err(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = vals(a), y = vals(b);
  EXPECT_EQ(x.size(), y.size());
  double d = 0, n = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    d += (x[i] - y[i]) * (x[i] - y[i]);
    n += y[i] * y[i];
  }
  return n > 0 ? std::sqrt(d / n) : std::sqrt(d);
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.contiguous().data_ptr(), b.contiguous().data_ptr(), a.nbytes()) == 0;
}

// `fn` must throw forge::Error whose message contains every one of `parts`.
void expect_error(const std::function<void()>& fn, std::initializer_list<const char*> parts) {
  try {
    fn();
    ADD_FAILURE() << "expected a forge::Error mentioning " << *parts.begin();
  } catch (const Error& e) {
    for (const char* p : parts) EXPECT_THAT(e.what(), HasSubstr(p));
  }
}

// Runs fn with OpenMP limited to `threads`, restoring the previous limit.
template <class Fn> auto with_threads(int threads, Fn fn) {
  const int prev = omp_get_max_threads();
  omp_set_num_threads(threads);
  auto r = fn();
  omp_set_num_threads(prev);
  return r;
}

// ---- embedding ----------------------------------------------------------------------

TEST(NNEmbedding, PicksRowsAndKeepsIdsShape) {
  Tensor w = seq(0, {4, 3});  // row v = 3v, 3v+1, 3v+2
  Tensor out = ops::embedding(w, i64({2, 0, 2}, {3}));
  EXPECT_EQ(out.shape(), (Shape{3, 3}));
  EXPECT_THAT(vals(out), ElementsAre(6, 7, 8, 0, 1, 2, 6, 7, 8));
  Tensor out2 = ops::embedding(w, from_vector<int32_t>({3, 1, 1, 0}, {2, 2}));
  EXPECT_EQ(out2.shape(), (Shape{2, 2, 3}));
  EXPECT_THAT(vals(out2), ElementsAre(9, 10, 11, 3, 4, 5, 3, 4, 5, 0, 1, 2));
  Tensor scalar_id = ops::embedding(w, i64({1}, {}));
  EXPECT_EQ(scalar_id.shape(), (Shape{3}));
  EXPECT_THAT(vals(scalar_id), ElementsAre(3, 4, 5));
}

TEST(NNEmbedding, NonContiguousWeightAndIds) {
  Tensor base = seq(0, {3, 4});  // weight = base.t(): (4, 3), weight[v][c] = 4c + v
  Tensor sids = i64({3, 7, 0, 7, 1, 7}, {6}).slice(0, 0, 6, 2);  // strided ids 3, 0, 1
  Tensor out = ops::embedding(base.t(), sids);
  EXPECT_THAT(vals(out), ElementsAre(3, 7, 11, 0, 4, 8, 1, 5, 9));
}

TEST(NNEmbedding, BackwardSumsRepeatedIds) {
  Tensor w = randn64({5, 2}, 1).requires_grad_();
  Tensor ids = i64({1, 3, 1, 1, 0}, {5});
  Tensor out = ops::embedding(w, ids);
  Tensor g = f64({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, {5, 2});
  out.backward(g);
  // row 1 gets positions 0, 2, 3; row 3 position 1; row 0 position 4; rows 2 and 4 nothing.
  EXPECT_THAT(vals(w.grad()), ElementsAre(9, 10, 1 + 5 + 7, 2 + 6 + 8, 0, 0, 3, 4, 0, 0));
}

TEST(NNEmbedding, Bf16WeightIsCopiedExactly) {
  Tensor w = randn64({6, 8}, 2).to(DType::bf16);
  Tensor out = ops::embedding(w, i64({5, 0}, {2}));
  EXPECT_EQ(out.dtype(), DType::bf16);
  EXPECT_TRUE(bitwise_equal(out.select(0, 0), w.select(0, 5)));
  EXPECT_TRUE(bitwise_equal(out.select(0, 1), w.select(0, 0)));
}

TEST(NNEmbedding, Bf16GradientAccumulatesInFloat) {
  // 200 repeats of one id, each gradient 0.01 (in bf16): summing in bf16 would stall far below 2.
  Tensor w = zeros({3, 4}, {.dtype = DType::bf16}).requires_grad_();
  Tensor ids = full({200}, 2.0, {.dtype = DType::i64});
  Tensor out = ops::embedding(w, ids);
  out.backward(full({200, 4}, 0.01, {.dtype = DType::bf16}));
  const std::vector<double> g = vals(w.grad());
  for (int c = 0; c < 4; ++c) EXPECT_NEAR(g[8 + c], 200 * static_cast<double>(static_cast<float>(bf16(0.01f))), 1e-2);
  EXPECT_EQ(g[0], 0.0);
}

TEST(NNEmbedding, BackwardIsDeterministicAcrossThreadCounts) {
  Generator gen(3);
  Tensor ids = randint(0, 37, {64, 64}, {.dtype = DType::i64}, &gen);
  Tensor g = randn({64, 64, 48}, {.dtype = DType::f32}, &gen);
  Tensor w = randn({37, 48}, {.dtype = DType::f32}, &gen);
  auto grad_with = [&](int threads) {
    return with_threads(threads, [&] {
      Tensor wl = w.detach().clone().requires_grad_();
      ops::embedding(wl, ids).backward(g);
      return wl.grad();
    });
  };
  Tensor one = grad_with(1), many = grad_with(std::max(2, omp_get_max_threads()));
  EXPECT_TRUE(bitwise_equal(one, many));
  // Against a reference summed in f64.
  std::vector<double> ref(37 * 48, 0.0);
  const std::vector<int64_t> iv = ids.to_vector<int64_t>();
  const std::vector<double> gv = vals(g);
  for (size_t n = 0; n < iv.size(); ++n)
    for (size_t c = 0; c < 48; ++c) ref[static_cast<size_t>(iv[n]) * 48 + c] += gv[n * 48 + c];
  EXPECT_LT(rel_err(one, f64(ref, {37, 48})), 1e-6);
}

TEST(NNEmbedding, Errors) {
  Tensor w = randn64({5, 3}, 4);
  expect_error([&] { ops::embedding(w, i64({1, 5}, {2})); }, {"embedding", "id 5", "V = 5", "[2]"});
  expect_error([&] { ops::embedding(w, i64({-1}, {1})); }, {"embedding", "id -1", "V = 5"});
  expect_error([&] { ops::embedding(randn64({5}, 5), i64({1}, {1})); }, {"embedding", "2-D", "[5]"});
  expect_error([&] { ops::embedding(w, f64({1.0}, {1})); }, {"embedding", "i64 or i32", "f64", "[5, 3]"});
  expect_error([&] { ops::embedding(arange(6).reshape({3, 2}), i64({1}, {1})); }, {"embedding", "floating", "i64"});
}

// ---- layer_norm ---------------------------------------------------------------------

// Per-row mean and biased variance of a 2-D f64 tensor.
void row_moments(const Tensor& y, std::vector<double>& mean, std::vector<double>& var) {
  const int64_t R = y.shape()[0], C = y.shape()[1];
  const std::vector<double> v = vals(y);
  mean.assign(static_cast<size_t>(R), 0);
  var.assign(static_cast<size_t>(R), 0);
  for (int64_t r = 0; r < R; ++r) {
    double s = 0, ss = 0;
    for (int64_t c = 0; c < C; ++c) s += v[static_cast<size_t>(r * C + c)];
    const double m = s / static_cast<double>(C);
    for (int64_t c = 0; c < C; ++c) {
      const double d = v[static_cast<size_t>(r * C + c)] - m;
      ss += d * d;
    }
    mean[static_cast<size_t>(r)] = m;
    var[static_cast<size_t>(r)] = ss / static_cast<double>(C);
  }
}

TEST(NNLayerNorm, RowsHaveMeanZeroAndVarianceOne) {
  Tensor x = ops::add(ops::mul(randn64({8, 64}, 5), 3.0), 7.0);
  Tensor y = ops::layer_norm(x, Tensor(), Tensor(), 0.0);
  EXPECT_EQ(y.shape(), x.shape());
  std::vector<double> m, v;
  row_moments(y, m, v);
  for (size_t r = 0; r < m.size(); ++r) {
    EXPECT_NEAR(m[r], 0.0, 1e-13);
    EXPECT_NEAR(v[r], 1.0, 1e-12);
  }
  // With eps the variance is var / (var + eps).
  std::vector<double> mx, vx;
  row_moments(x, mx, vx);
  row_moments(ops::layer_norm(x, Tensor(), Tensor(), 0.5), m, v);
  for (size_t r = 0; r < m.size(); ++r) EXPECT_NEAR(v[r], vx[r] / (vx[r] + 0.5), 1e-12);
}

TEST(NNLayerNorm, HandComputedRowWithWeightAndBias) {
  // x = (1, 2, 3, 6): mean 3, var (4 + 1 + 0 + 9) / 4 = 3.5.
  Tensor x = f64({1, 2, 3, 6}, {1, 4});
  Tensor w = f64({1, 2, -1, 0.5}, {4}), b = f64({0, 1, 2, 3}, {4});
  Tensor y = ops::layer_norm(x, w, b, 1e-5);
  const double rs = 1.0 / std::sqrt(3.5 + 1e-5);
  const std::vector<double> want = {-2 * rs * 1 + 0, -1 * rs * 2 + 1, 0 * rs * -1 + 2, 3 * rs * 0.5 + 3};
  const std::vector<double> got = vals(y);
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(got[i], want[i], 1e-14);
}

TEST(NNLayerNorm, MatchesCompositeOpsIn3D) {
  Tensor x = randn64({2, 3, 16}, 6).requires_grad_();
  Tensor w = randn64({16}, 7).requires_grad_(), b = randn64({16}, 8).requires_grad_();
  Tensor gy = randn64({2, 3, 16}, 9);
  Tensor y = ops::layer_norm(x, w, b);
  y.backward(gy);
  const Tensor gx = x.grad(), gw = w.grad(), gb = b.grad();
  x.zero_grad();
  w.zero_grad();
  b.zero_grad();
  Tensor mu = ops::mean(x, {-1}, true), var = ops::var(x, {-1}, true, 0);
  Tensor ref = ops::add(ops::mul(ops::mul(ops::sub(x, mu), ops::rsqrt(ops::add(var, 1e-5))), w), b);
  ref.backward(gy);
  EXPECT_LT(rel_err(y, ref), 1e-14);
  EXPECT_LT(rel_err(gx, x.grad()), 1e-12);
  EXPECT_LT(rel_err(gw, w.grad()), 1e-13);
  EXPECT_LT(rel_err(gb, b.grad()), 1e-14);
}

TEST(NNLayerNorm, Bf16AndF32MatchF64) {
  Tensor x64 = ops::add(randn64({16, 96}, 10), 2.0), w64 = randn64({96}, 11), b64 = randn64({96}, 12);
  Tensor gy64 = randn64({16, 96}, 13);
  auto run = [&](DType dt) {
    Tensor x = x64.to(dt).detach().requires_grad_();
    Tensor w = w64.to(dt).detach().requires_grad_(), b = b64.to(dt).detach().requires_grad_();
    Tensor y = ops::layer_norm(x, w, b);
    EXPECT_EQ(y.dtype(), dt);
    y.backward(gy64.to(dt));
    return TensorList{y, x.grad(), w.grad(), b.grad()};
  };
  // The reference sees the inputs rounded to bf16 too, so only the kernel's error remains.
  auto run_rounded = [&]() {
    Tensor x = x64.to(DType::bf16).to(DType::f64).detach().requires_grad_();
    Tensor w = w64.to(DType::bf16).to(DType::f64).detach().requires_grad_();
    Tensor b = b64.to(DType::bf16).to(DType::f64).detach().requires_grad_();
    Tensor y = ops::layer_norm(x, w, b);
    y.backward(gy64.to(DType::bf16).to(DType::f64));
    return TensorList{y, x.grad(), w.grad(), b.grad()};
  };
  const TensorList ref = run(DType::f64), f32 = run(DType::f32), h = run(DType::bf16), href = run_rounded();
  for (size_t k = 0; k < 4; ++k) {
    EXPECT_LT(rel_err(f32[k], ref[k]), 1e-5) << "output " << k;
    EXPECT_LT(rel_err(h[k], href[k]), 1e-2) << "output " << k;
  }
}

TEST(NNLayerNorm, Bf16RowWithLargeOffsetKeepsPrecision) {
  // Statistics in f32 or better: a row 1000 + small noise normalises to the noise's shape.
  Tensor noise = randn64({1, 256}, 14);
  Tensor x = ops::add(noise, 1000.0).to(DType::f16);
  Tensor y = ops::layer_norm(x);
  Tensor ref = ops::layer_norm(x.to(DType::f64));
  EXPECT_LT(rel_err(y, ref), 1e-2);
}

TEST(NNLayerNorm, WeightGradientIsDeterministicAcrossThreadCounts) {
  Tensor x = randn({1000, 96}, {.dtype = DType::f32}), gy = randn({1000, 96}, {.dtype = DType::f32});
  Tensor w = randn({96}, {.dtype = DType::f32}), b = randn({96}, {.dtype = DType::f32});
  auto grads_with = [&](int threads) {
    return with_threads(threads, [&] {
      Tensor xl = x.clone().requires_grad_(), wl = w.clone().requires_grad_(), bl = b.clone().requires_grad_();
      ops::layer_norm(xl, wl, bl).backward(gy);
      return TensorList{xl.grad(), wl.grad(), bl.grad()};
    });
  };
  const TensorList one = grads_with(1), many = grads_with(std::max(3, omp_get_max_threads()));
  for (size_t k = 0; k < 3; ++k) EXPECT_TRUE(bitwise_equal(one[k], many[k])) << "gradient " << k;
}

TEST(NNLayerNorm, OnlyTheNeededGradientsAreComputed) {
  Tensor x = randn64({3, 4}, 15), w = randn64({4}, 16).requires_grad_();
  ops::layer_norm(x, w).sum().backward();
  EXPECT_TRUE(w.grad().defined());
  EXPECT_FALSE(x.grad().defined());
  // dw = sum over rows of dy * xhat, with dy = 1.
  EXPECT_LT(rel_err(w.grad(), ops::sum(ops::layer_norm(x), {0})), 1e-14);
}

TEST(NNLayerNorm, Errors) {
  Tensor x = randn64({2, 8}, 17);
  expect_error([&] { ops::layer_norm(x, randn64({7}, 1)); }, {"layer_norm", "weight", "[8]", "[2, 8]", "[7]"});
  expect_error([&] { ops::layer_norm(x, randn64({8}, 1), randn64({2, 8}, 1)); }, {"layer_norm", "bias", "[2, 8]"});
  expect_error([&] { ops::layer_norm(x, randn64({8}, 1).to(DType::f32)); }, {"layer_norm", "weight", "f32", "f64"});
  expect_error([&] { ops::layer_norm(arange(8).reshape({2, 4})); }, {"layer_norm", "floating", "i64", "[2, 4]"});
  expect_error([&] { ops::layer_norm(scalar_tensor(1.0)); }, {"layer_norm", "0-d"});
  expect_error([&] { ops::layer_norm(x, Tensor(), Tensor(), -1.0); }, {"layer_norm", "eps"});
}

// ---- rms_norm -----------------------------------------------------------------------

TEST(NNRmsNorm, HandComputedFormula) {
  // x = (3, 4): mean(x^2) = 12.5.
  Tensor x = f64({3, 4, -1, 0}, {2, 2});
  Tensor w = f64({2, -0.5}, {2});
  Tensor y = ops::rms_norm(x, w, 1e-6);
  const double r0 = 1.0 / std::sqrt(12.5 + 1e-6), r1 = 1.0 / std::sqrt(0.5 + 1e-6);
  const std::vector<double> got = vals(y);
  const std::vector<double> want = {3 * r0 * 2, 4 * r0 * -0.5, -1 * r1 * 2, 0};
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(got[i], want[i], 1e-14);
  // Without weight: unit root-mean-square rows (eps aside).
  Tensor z = ops::rms_norm(randn64({5, 32}, 18), Tensor(), 0.0);
  const std::vector<double> zv = vals(z);
  for (int r = 0; r < 5; ++r) {
    double ss = 0;
    for (int c = 0; c < 32; ++c) ss += zv[static_cast<size_t>(r * 32 + c)] * zv[static_cast<size_t>(r * 32 + c)];
    EXPECT_NEAR(ss / 32, 1.0, 1e-12);
  }
}

TEST(NNRmsNorm, MatchesCompositeOps) {
  Tensor x = randn64({2, 4, 12}, 19).requires_grad_(), w = randn64({12}, 20).requires_grad_();
  Tensor gy = randn64({2, 4, 12}, 21);
  Tensor y = ops::rms_norm(x, w);
  y.backward(gy);
  const Tensor gx = x.grad(), gw = w.grad();
  x.zero_grad();
  w.zero_grad();
  Tensor ref = ops::mul(ops::mul(x, ops::rsqrt(ops::add(ops::mean(ops::mul(x, x), {-1}, true), 1e-6))), w);
  ref.backward(gy);
  EXPECT_LT(rel_err(y, ref), 1e-14);
  EXPECT_LT(rel_err(gx, x.grad()), 1e-12);
  EXPECT_LT(rel_err(gw, w.grad()), 1e-13);
}

TEST(NNRmsNorm, Bf16MatchesF64) {
  Tensor x64 = randn64({8, 128}, 22).to(DType::bf16).to(DType::f64);
  Tensor w64 = randn64({128}, 23).to(DType::bf16).to(DType::f64);
  Tensor gy64 = randn64({8, 128}, 24).to(DType::bf16).to(DType::f64);
  auto run = [&](DType dt) {
    Tensor x = x64.to(dt).detach().requires_grad_(), w = w64.to(dt).detach().requires_grad_();
    Tensor y = ops::rms_norm(x, w);
    y.backward(gy64.to(dt));
    return TensorList{y, x.grad(), w.grad()};
  };
  const TensorList ref = run(DType::f64), h = run(DType::bf16), f = run(DType::f16);
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(h[k].dtype(), DType::bf16);
    EXPECT_LT(rel_err(h[k], ref[k]), 1e-2) << "bf16 output " << k;
    EXPECT_LT(rel_err(f[k], ref[k]), 2e-3) << "f16 output " << k;
  }
}

TEST(NNRmsNorm, Errors) {
  Tensor x = randn64({3, 6}, 25);
  expect_error([&] { ops::rms_norm(x, randn64({3}, 1)); }, {"rms_norm", "weight", "[6]", "[3, 6]", "[3]"});
  expect_error([&] { ops::rms_norm(x, randn64({6}, 1).to(DType::bf16)); }, {"rms_norm", "bf16", "f64"});
  expect_error([&] { ops::rms_norm(arange(4)); }, {"rms_norm", "floating", "i64"});
}

// ---- dropout ------------------------------------------------------------------------

TEST(NNDropout, KeepsAboutOneMinusPAndScalesSurvivors) {
  Generator gen(26);
  const int64_t n = 200000;
  for (double p : {0.1, 0.5, 0.8}) {
    Tensor y = ops::dropout(ones({n}, {.dtype = DType::f64}), p, true, &gen);
    int64_t kept = 0;
    for (double v : vals(y)) {
      if (v != 0) {
        ++kept;
        EXPECT_DOUBLE_EQ(v, 1.0 / (1.0 - p));
      }
    }
    // Binomial: sd = sqrt(n p (1 - p)) <= 224; allow 5 sd.
    EXPECT_NEAR(static_cast<double>(kept) / n, 1.0 - p, 5 * std::sqrt(p * (1 - p) / n)) << "p = " << p;
  }
}

TEST(NNDropout, SameSeedSameMaskAndTheMaskIsThePhiloxStream) {
  Tensor x = randn64({33, 17}, 27);
  Generator a(99), b(99), c(100);
  Tensor ya = ops::dropout(x, 0.3, true, &a), yb = ops::dropout(x, 0.3, true, &b), yc = ops::dropout(x, 0.3, true, &c);
  EXPECT_TRUE(bitwise_equal(ya, yb));
  EXPECT_FALSE(bitwise_equal(ya, yc));
  // Element i is kept iff the i-th uniform of the generator's stream is >= p.
  Generator d(99);
  const std::vector<double> u = vals(rand({33, 17}, {.dtype = DType::f32}, &d));
  const std::vector<double> y = vals(ya);
  for (size_t i = 0; i < u.size(); ++i) EXPECT_EQ(y[i] != 0, u[i] >= 0.3) << "element " << i;
  // The generator advanced by the uniforms drawn (blocks of four).
  EXPECT_EQ(a.offset(), (33u * 17u + 3u) / 4u);
  // A second draw from the same generator gives a new mask.
  EXPECT_FALSE(bitwise_equal(ops::dropout(x, 0.3, true, &a), ya));
}

TEST(NNDropout, SameMaskForEveryDtype) {
  Tensor x = ops::add(randn64({8, 40}, 28), 5.0);  // away from zero, so zeros mean dropped
  auto mask_of = [&](DType dt) {
    Generator g(5);
    std::vector<bool> m;
    for (double v : vals(ops::dropout(x.to(dt), 0.4, true, &g))) m.push_back(v != 0);
    return m;
  };
  const std::vector<bool> m64 = mask_of(DType::f64);
  EXPECT_EQ(mask_of(DType::f32), m64);
  EXPECT_EQ(mask_of(DType::bf16), m64);
  EXPECT_EQ(mask_of(DType::f16), m64);
}

TEST(NNDropout, BackwardUsesTheSameMask) {
  Tensor x = ops::add(randn64({50, 20}, 29), 10.0).requires_grad_();
  Generator gen(30);
  Tensor y = ops::dropout(x, 0.25, true, &gen);
  Tensor g = randn64({50, 20}, 31);
  y.backward(g);
  const std::vector<double> yv = vals(y), xv = vals(x), gx = vals(x.grad()), gv = vals(g);
  for (size_t i = 0; i < yv.size(); ++i) {
    if (yv[i] == 0) {
      EXPECT_EQ(gx[i], 0.0);
    } else {
      EXPECT_DOUBLE_EQ(gx[i], gv[i] / 0.75);
      EXPECT_DOUBLE_EQ(yv[i], xv[i] / 0.75);
    }
  }
}

TEST(NNDropout, IdentityWhenPIsZeroOrNotTraining) {
  Tensor x = randn64({4, 4}, 32);
  EXPECT_TRUE(ops::dropout(x, 0.0, true).is_same(x));
  EXPECT_TRUE(ops::dropout(x, 0.7, false).is_same(x));
}

TEST(NNDropout, Errors) {
  Tensor x = randn64({2, 3}, 33);
  expect_error([&] { ops::dropout(x, 1.0, true); }, {"dropout", "[0, 1)", "1", "[2, 3]"});
  expect_error([&] { ops::dropout(x, -0.1, true); }, {"dropout", "[0, 1)"});
  expect_error([&] { ops::dropout(arange(4), 0.5, true); }, {"dropout", "floating", "i64"});
}

// ---- cross_entropy ------------------------------------------------------------------

TEST(NNCrossEntropy, UniformLogitsGiveLogV) {
  for (int64_t V : {2, 10, 50257}) {
    Tensor logits = full({3, V}, 1.5, {.dtype = DType::f64});
    Tensor loss = ops::cross_entropy(logits, i64({0, V - 1, V / 2}, {3}));
    EXPECT_EQ(loss.shape(), Shape{});
    EXPECT_NEAR(loss.item(), std::log(static_cast<double>(V)), 1e-12) << "V = " << V;
  }
}

// Note [dlogits in place]: when the logits are dropped after the loss (as a language model's
// head does), the backward writes dlogits over them; kept logits, a retained graph and the
// in-place path all give the same gradient, and kept logits are left untouched.
TEST(NNCrossEntropy, DlogitsInPlaceOnlyWhenTheLogitsAreDropped) {
  for (DType dt : {DType::f32, DType::bf16}) {
    Generator gen(77);
    const Tensor x = randn({6, 5}, {.dtype = dt}, &gen), w = randn({11, 5}, {.dtype = dt}, &gen);
    const Tensor targets = i64({0, 3, -100, 10, 7, 1}, {6});
    auto grad_of_x = [&](bool keep, bool retain, Tensor* kept) {
      Tensor leaf = x.detach().requires_grad_();
      Tensor loss;
      {
        Tensor logits = ops::matmul(leaf, w.t());  // (6, 11): not saved by matmul's backward
        loss = ops::cross_entropy(logits, targets);
        if (keep) *kept = logits;
      }
      loss.backward(Tensor(), retain);
      Tensor g1 = leaf.grad().clone();
      if (retain) {  // a second backward over the retained graph sees intact logits
        leaf.zero_grad();
        loss.backward();
        EXPECT_EQ(leaf.grad().to(DType::f64).to_vector<double>(), g1.to(DType::f64).to_vector<double>())
            << "second backward of a retained graph [" << dtype_name(dt) << "]";
      }
      return g1.to(DType::f64).to_vector<double>();
    };
    Tensor kept;
    int64_t before = ops::cross_entropy_backwards_in_place();
    const auto in_place = grad_of_x(false, false, nullptr);
    EXPECT_EQ(ops::cross_entropy_backwards_in_place(), before + 1) << "dropped logits: in place";
    before = ops::cross_entropy_backwards_in_place();
    const auto with_kept = grad_of_x(true, false, &kept);
    EXPECT_EQ(ops::cross_entropy_backwards_in_place(), before) << "kept logits: not in place";
    // A retained graph: the first backward leaves the logits; the second (not retained) may reuse them.
    const auto retained = grad_of_x(false, true, nullptr);
    EXPECT_EQ(ops::cross_entropy_backwards_in_place(), before + 1) << "only the last backward of a retained graph";
    EXPECT_EQ(in_place, with_kept) << dtype_name(dt);
    EXPECT_EQ(in_place, retained) << dtype_name(dt);
    // The kept logits still hold x w^T.
    const Tensor ref = ops::matmul(x, w.t());
    EXPECT_EQ(kept.to(DType::f64).to_vector<double>(), ref.to(DType::f64).to_vector<double>()) << dtype_name(dt);
  }
}

// cross_entropy_consuming on the CPU (and wherever the fused classifier does not apply) is exactly
// cross_entropy: the same loss and gradient, nothing fused, the switch on or off.
TEST(NNCrossEntropy, ConsumingIsCrossEntropyOnTheCpu) {
  for (const char* on : {"0", "1"}) {
    env::Override o("FORGE_FUSED_CLASSIFIER", on);
    const Tensor x = f64({0.5, -1, 2, 0.25, 3, -0.5, 1, 1.5}, {2, 4});
    const Tensor targets = i64({3, 1}, {2});
    Tensor a = x.clone().requires_grad_(), b = x.clone().requires_grad_();
    const int64_t before = ops::cross_entropy_fused_forwards();
    const Tensor la = ops::cross_entropy_consuming(ops::mul(a, 2.0), targets);
    const Tensor lb = ops::cross_entropy(ops::mul(b, 2.0), targets);
    EXPECT_EQ(vals(la), vals(lb)) << on;
    la.backward();
    lb.backward();
    EXPECT_EQ(vals(a.grad()), vals(b.grad())) << on;
    EXPECT_EQ(ops::cross_entropy_fused_forwards(), before) << on;
  }
}

// Note [expected loss gradient]: LossGradDivisor's scopes nest and restore (a scaled one names its
// scale, and no host value); bad divisors and scales are refused; inside a scope the CPU loss is
// still exactly cross_entropy's; and the expectation is the very f32 gradient autograd hands a
// loss divided by K (the fused classifier's backward skips only on equality, so this must hold
// bit for bit).
TEST(NNCrossEntropy, LossGradDivisorIsTheGradientOfTheDividedLoss) {
  EXPECT_EQ(ops::expected_loss_grad().host_value(), 1.0f);
  const Tensor s = full({}, 1024.0, {.dtype = DType::f32});
  {
    const ops::LossGradDivisor three(3);
    EXPECT_EQ(ops::expected_loss_grad().host_value(), 1.0f / 3.0f);
    EXPECT_EQ(ops::expected_loss_grad().divisor, 3);
    {
      const ops::LossGradDivisor scaled(7, s);  // f16's device-held loss scale: no host value
      EXPECT_EQ(ops::expected_loss_grad().host_value(), 0.0f);
      EXPECT_EQ(ops::expected_loss_grad().divisor, 7);
      EXPECT_TRUE(ops::expected_loss_grad().scale.is_same(s));
    }
    EXPECT_EQ(ops::expected_loss_grad().host_value(), 1.0f / 3.0f);
    EXPECT_FALSE(ops::expected_loss_grad().scale.defined());
  }
  EXPECT_EQ(ops::expected_loss_grad().host_value(), 1.0f);
  expect_error([] { const ops::LossGradDivisor none(0); }, {"LossGradDivisor", ">= 1", "got 0"});
  expect_error([&] { const ops::LossGradDivisor bad(2, full({1}, 2.0, {.dtype = DType::f32})); },
               {"LossGradDivisor", "0-d f32"});
  expect_error([&] { const ops::LossGradDivisor bad(2, full({}, 2.0, {.dtype = DType::f64})); },
               {"LossGradDivisor", "0-d f32", "f64"});
  EXPECT_EQ(ops::expected_loss_grad().host_value(), 1.0f);
  for (const int64_t K : {1, 2, 3, 5, 6, 7, 10, 12, 24, 100, 1000}) {
    const ops::LossGradDivisor expect(K);
    // What autograd hands a 0-d f32 loss's producer for (loss / K).backward().
    Tensor l = full({}, 2.5, {.dtype = DType::f32}).requires_grad_();
    (ops::mul(l, 1.0) / static_cast<double>(K)).backward();
    EXPECT_EQ(l.grad().item(), static_cast<double>(ops::expected_loss_grad().host_value())) << "K " << K;
    // With a loss scale S: ((loss / K) * S).backward() hands the loss S / f32(K) (S for K = 1).
    Tensor m = full({}, 2.5, {.dtype = DType::f32}).requires_grad_();
    Tensor div = K == 1 ? ops::mul(m, 1.0) : ops::mul(m, 1.0) / static_cast<double>(K);
    ops::mul(div, s).backward();
    EXPECT_EQ(m.grad().item(), static_cast<double>(K == 1 ? 1024.0f : 1024.0f / static_cast<float>(K))) << "K " << K;
    // The CPU loss under the scope: cross_entropy's, bit for bit.
    const Tensor x = f64({0.5, -1, 2, 0.25, 3, -0.5, 1, 1.5}, {2, 4});
    const Tensor targets = i64({3, 1}, {2});
    Tensor a = x.clone().requires_grad_(), b = x.clone().requires_grad_();
    (ops::cross_entropy_consuming(a, targets) / static_cast<double>(K)).backward();
    (ops::cross_entropy(b, targets) / static_cast<double>(K)).backward();
    EXPECT_EQ(vals(a.grad()), vals(b.grad())) << "K " << K;
  }
}

TEST(NNCrossEntropy, HandComputedRows) {
  Tensor logits = f64({1, 2, 3, 0, 0, 10}, {2, 3});
  Tensor targets = i64({2, 0}, {2});
  const double l0 = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0)) - 3;
  const double l1 = std::log(2 + std::exp(10.0)) - 0;
  Tensor none = ops::cross_entropy(logits, targets, -100, Reduction::none);
  EXPECT_EQ(none.shape(), (Shape{2}));
  const std::vector<double> nv = vals(none);
  EXPECT_NEAR(nv[0], l0, 1e-14);
  EXPECT_NEAR(nv[1], l1, 1e-13);
  EXPECT_NEAR(ops::cross_entropy(logits, targets, -100, Reduction::sum).item(), l0 + l1, 1e-13);
  EXPECT_NEAR(ops::cross_entropy(logits, targets).item(), (l0 + l1) / 2, 1e-13);
}

TEST(NNCrossEntropy, MatchesLogSoftmaxGatherWithGradients) {
  Tensor logits = ops::mul(randn64({6, 9}, 34), 3.0).requires_grad_();
  Tensor targets = i64({8, 0, 3, 3, 5, 1}, {6});
  for (Reduction red : {Reduction::mean, Reduction::sum, Reduction::none}) {
    Tensor gout = red == Reduction::none ? randn64({6}, 35) : f64({0.7}, {});
    Tensor loss = ops::cross_entropy(logits, targets, -100, red);
    loss.backward(gout);
    const Tensor g = logits.grad();
    logits.zero_grad();
    Tensor per = ops::neg(ops::gather(ops::log_softmax(logits, -1), 1, targets.reshape({6, 1}))).reshape({6});
    Tensor ref = red == Reduction::none ? per : red == Reduction::sum ? ops::sum(per) : ops::mean(per);
    ref.backward(gout);
    EXPECT_LT(rel_err(loss, ref), 1e-14) << ops::reduction_name(red);
    EXPECT_LT(rel_err(g, logits.grad()), 1e-13) << ops::reduction_name(red);
    logits.zero_grad();
  }
}

TEST(NNCrossEntropy, GradientIsSoftmaxMinusOneHotOverCount) {
  Tensor logits = randn64({4, 5}, 36).requires_grad_();
  Tensor targets = i64({1, -100, 4, 0}, {4});
  ops::cross_entropy(logits, targets).backward();
  const std::vector<double> sm = vals(ops::softmax(logits.detach(), -1)), g = vals(logits.grad());
  const int64_t t[] = {1, -100, 4, 0};
  for (int64_t n = 0; n < 4; ++n)
    for (int64_t j = 0; j < 5; ++j) {
      const size_t i = static_cast<size_t>(n * 5 + j);
      const double want = t[n] == -100 ? 0.0 : (sm[i] - (j == t[n] ? 1.0 : 0.0)) / 3.0;
      EXPECT_NEAR(g[i], want, 1e-15) << n << ", " << j;
    }
}

TEST(NNCrossEntropy, IgnoreIndex) {
  Tensor logits = randn64({5, 4}, 37);
  Tensor targets = i64({3, -100, 0, -100, 2}, {5});
  const std::vector<double> per = vals(ops::cross_entropy(logits, targets, -100, Reduction::none));
  EXPECT_EQ(per[1], 0.0);
  EXPECT_EQ(per[3], 0.0);
  const double sum = per[0] + per[2] + per[4];
  EXPECT_NEAR(ops::cross_entropy(logits, targets, -100, Reduction::sum).item(), sum, 1e-14);
  EXPECT_NEAR(ops::cross_entropy(logits, targets).item(), sum / 3, 1e-14);  // divides by 3, not 5
  // A custom ignore_index that is also a valid class.
  Tensor t2 = i64({3, 1, 0, 1, 2}, {5});
  EXPECT_NEAR(ops::cross_entropy(logits, t2, 1).item(), sum / 3, 1e-14);
}

TEST(NNCrossEntropy, AllIgnoredMeanIsNaNWithZeroGradient) {
  Tensor logits = randn64({3, 4}, 38).requires_grad_();
  Tensor targets = i64({-100, -100, -100}, {3});
  Tensor loss = ops::cross_entropy(logits, targets);
  EXPECT_TRUE(std::isnan(loss.item()));
  loss.backward();
  for (double g : vals(logits.grad())) EXPECT_EQ(g, 0.0);
  EXPECT_EQ(ops::cross_entropy(logits, targets, -100, Reduction::sum).item(), 0.0);
}

TEST(NNCrossEntropy, ThreeDimLogitsEqualFlattened) {
  Tensor logits = randn64({2, 3, 7}, 39);
  Tensor targets = i64({6, 0, -100, 2, 2, 5}, {2, 3});
  Tensor l3 = ops::cross_entropy(logits, targets);
  Tensor l2 = ops::cross_entropy(logits.reshape({6, 7}), targets.reshape({6}));
  EXPECT_EQ(l3.item(), l2.item());
  Tensor n3 = ops::cross_entropy(logits, targets, -100, Reduction::none);
  EXPECT_EQ(n3.shape(), (Shape{2, 3}));
  EXPECT_EQ(vals(n3), vals(ops::cross_entropy(logits.reshape({6, 7}), targets.reshape({6}), -100, Reduction::none)));
  // i32 targets give the same result.
  EXPECT_EQ(ops::cross_entropy(logits, targets.to(DType::i32)).item(), l3.item());
}

TEST(NNCrossEntropy, LargeLogitsStayFinite) {
  Tensor logits = f64({1e4, 1e4 - 1, -1e4, 3e4, 3e4, 0}, {2, 3});
  Tensor loss = ops::cross_entropy(logits, i64({1, 2}, {2}), -100, Reduction::none);
  const std::vector<double> l = vals(loss);
  EXPECT_NEAR(l[0], std::log1p(std::exp(1.0)) + std::log1p(std::exp(-20001.0)), 1e-12);
  EXPECT_NEAR(l[1], 3e4 + std::log(2.0), 1e-9);
}

TEST(NNCrossEntropy, Bf16LogitsMatchF64) {
  // A GPT-2-sized vocabulary row; the reference sees the same bf16-rounded logits.
  const int64_t V = 50304;
  Tensor logits = ops::mul(randn64({4, V}, 40), 2.0).to(DType::bf16);
  Tensor targets = i64({17, V - 1, -100, 4000}, {4});
  Tensor lh = logits.detach().requires_grad_(), l64 = logits.to(DType::f64).detach().requires_grad_();
  Tensor loss_h = ops::cross_entropy(lh, targets), loss_64 = ops::cross_entropy(l64, targets);
  EXPECT_EQ(loss_h.dtype(), DType::f32);  // Note [loss dtype]: f32 for 16-bit logits
  // Accumulated in f32 from the same bf16 logits, and not rounded back to bf16.
  EXPECT_NEAR(loss_h.item(), loss_64.item(), 1e-5 * std::abs(loss_64.item()));
  loss_h.backward();
  loss_64.backward();
  EXPECT_EQ(lh.grad().dtype(), DType::bf16);
  EXPECT_LT(rel_err(lh.grad(), l64.grad()), 1e-2);
  // f32 logits are close to f64.
  Tensor l32 = logits.to(DType::f32);
  EXPECT_NEAR(ops::cross_entropy(l32, targets).item(), loss_64.item(), 1e-5 * std::abs(loss_64.item()));
}

TEST(NNCrossEntropy, NonContiguousLogits) {
  Tensor base = randn64({5, 4}, 41);
  Tensor t = i64({0, 4, 2, 1}, {4});
  EXPECT_NEAR(ops::cross_entropy(base.t(), t).item(), ops::cross_entropy(base.t().contiguous(), t).item(), 1e-15);
}

TEST(NNCrossEntropy, Errors) {
  Tensor logits = randn64({4, 5}, 42);
  expect_error([&] { ops::cross_entropy(logits, i64({0, 5, 1, 2}, {4})); },
               {"cross_entropy", "target 5", "position 1", "5 classes", "[4, 5]"});
  expect_error([&] { ops::cross_entropy(logits, i64({0, 1, -1, 2}, {4})); }, {"cross_entropy", "target -1"});
  expect_error([&] { ops::cross_entropy(logits, i64({0, 1, 2}, {3})); },
               {"cross_entropy", "targets of shape [3]", "logits of shape [4, 5]", "[4]"});
  expect_error([&] { ops::cross_entropy(logits, i64({0, 1, 2, 3}, {4, 1})); }, {"cross_entropy", "[4, 1]", "[4, 5]"});
  expect_error([&] { ops::cross_entropy(logits, f64({0, 1, 2, 3}, {4})); },
               {"cross_entropy", "i64 or i32", "f64", "[4, 5]"});
  expect_error([&] { ops::cross_entropy(arange(20).reshape({4, 5}), i64({0, 1, 2, 3}, {4})); },
               {"cross_entropy", "floating", "i64", "[4, 5]"});
  expect_error([&] { ops::cross_entropy(scalar_tensor(1.0), i64({0}, {})); }, {"cross_entropy", "0-d"});
  // Nothing was computed before the error: a bad target in a tensor that requires grad leaves no history.
  Tensor lg = randn64({2, 3}, 43).requires_grad_();
  expect_error([&] { ops::cross_entropy(lg, i64({0, 3}, {2})); }, {"cross_entropy", "target 3"});
}

}  // namespace
}  // namespace forge
