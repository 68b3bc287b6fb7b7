// Reductions (sum, mean, var, amax, amin, max/min/argmax/argmin) and softmax/log_softmax:
// exact values on small hand-computed examples, dtypes, NaN and tie rules, long rows,
// non-contiguous inputs, gradients that finite differences cannot check (ties), and errors.
// Finite-difference gradients of every op live in grad_cases_reduce.cpp.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <functional>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "forge/backends/cpu/reduce.h"
#include "forge/forge.h"
#include "testing/tensor_testing.h"

namespace forge {
namespace {

using forge::testing::error_of;
using forge::testing::seq;
using forge::testing::vals;

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::vector<int64_t> ivals(const Tensor& t) { return t.to_vector<int64_t>(); }

Tensor f64(const std::vector<double>& v, const Shape& shape) { return from_vector<double>(v, shape); }
Tensor f32(const std::vector<float>& v, const Shape& shape) { return from_vector<float>(v, shape); }

void expect_all_near(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "element " << i;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = vals(a), y = vals(b);
  EXPECT_EQ(x.size(), y.size());
  double m = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
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

// ---- sum, mean ----------------------------------------------------------------

TEST(Reduce, SumOverDims0And2OfArange) {
  // x[i][j][k] = 12 i + 4 j + k; summing over i and k: 8 * 4 j + 4 * 12 + 2 * 6 = 32 j + 60.
  Tensor x = arange(24, {.dtype = DType::f32}).reshape({2, 3, 4});
  Tensor k = ops::sum(x, {0, 2}, true);
  EXPECT_EQ(k.shape(), (Shape{1, 3, 1}));
  EXPECT_EQ(k.dtype(), DType::f32);
  EXPECT_THAT(vals(k), ElementsAre(60, 92, 124));
  Tensor s = ops::sum(x, {2, 0});
  EXPECT_EQ(s.shape(), (Shape{3}));
  EXPECT_THAT(vals(s), ElementsAre(60, 92, 124));
}

TEST(Reduce, SumAllDimsAndNegativeDims) {
  Tensor x = f64({0, 1, 2, 3, 4, 5}, {2, 3});
  Tensor all = ops::sum(x);
  EXPECT_EQ(all.shape(), Shape{});
  EXPECT_EQ(all.item(), 15.0);
  EXPECT_EQ(ops::sum(x, {}, true).shape(), (Shape{1, 1}));
  EXPECT_THAT(vals(ops::sum(x, {-1})), ElementsAre(3, 12));
  EXPECT_THAT(vals(ops::sum(x, {-2})), ElementsAre(3, 5, 7));
  EXPECT_THAT(vals(x.sum({-1, 0})), ElementsAre(15));
}

TEST(Reduce, IntegerAndBoolSumsProduceI64) {
  for (DType dt : {DType::i32, DType::i64, DType::u8}) {
    Tensor x = arange(24, {.dtype = dt}).reshape({2, 3, 4});
    Tensor s = ops::sum(x);
    EXPECT_EQ(s.dtype(), DType::i64) << dtype_name(dt);
    EXPECT_EQ(s.item<int64_t>(), 276) << dtype_name(dt);
    Tensor rows = ops::sum(x, {0, 2}, true);
    EXPECT_EQ(rows.dtype(), DType::i64);
    EXPECT_THAT(ivals(rows), ElementsAre(60, 92, 124));
  }
  Tensor b = ops::gt(arange(10, {.dtype = DType::i64}), 6.0);  // 3 trues
  EXPECT_EQ(ops::sum(b).dtype(), DType::i64);
  EXPECT_EQ(ops::sum(b).item<int64_t>(), 3);
  // Accumulated in i64: 300 * 200 overflows u8.
  EXPECT_EQ(ops::sum(full({300}, 200, {.dtype = DType::u8})).item<int64_t>(), 60000);
}

TEST(Reduce, EmptySumIsZeroAndEmptyMeanIsNaN) {
  Tensor e = zeros({3, 0});
  EXPECT_THAT(vals(ops::sum(e, {1})), ElementsAre(0, 0, 0));
  EXPECT_EQ(ops::sum(e).item(), 0.0);
  EXPECT_TRUE(std::isnan(ops::mean(e).item()));
  EXPECT_EQ(ops::mean(e, {0}).shape(), (Shape{0}));
}

TEST(Reduce, MeanValues) {
  Tensor x = f32({1, 2, 3, 4}, {2, 2});
  EXPECT_EQ(ops::mean(x).item(), 2.5);
  EXPECT_THAT(vals(ops::mean(x, {0})), ElementsAre(2, 3));
  Tensor k = ops::mean(x, {-1}, true);
  EXPECT_EQ(k.shape(), (Shape{2, 1}));
  EXPECT_THAT(vals(k), ElementsAre(1.5, 3.5));
  EXPECT_EQ(ops::mean(x, {0, 1}).dtype(), DType::f32);
}

TEST(Reduce, MeanGradientIsOneOverN) {
  Tensor x = f64({1, 2, 3, 4, 5, 6}, {2, 3}).requires_grad_();
  ops::mean(x, {1}).sum().backward();
  expect_all_near(vals(x.grad()), {1. / 3, 1. / 3, 1. / 3, 1. / 3, 1. / 3, 1. / 3}, 1e-15);
}

// ---- var ----------------------------------------------------------------------

TEST(Reduce, VarWithCorrection0And1) {
  // mean 2.5, squared deviations 2.25 + 0.25 + 0.25 + 2.25 = 5.
  Tensor x = f64({1, 2, 3, 4}, {4});
  EXPECT_DOUBLE_EQ(ops::var(x).item(), 5.0 / 3);
  EXPECT_DOUBLE_EQ(ops::var(x, {}, false, 0).item(), 1.25);
  Tensor m = f32({1, 2, 3, 4, 6, 8}, {2, 3});
  expect_all_near(vals(ops::var(m, {1})), {1, 4}, 1e-6);
  expect_all_near(vals(ops::var(m, {-1}, false, 0)), {2. / 3, 8. / 3}, 1e-6);
  Tensor k = ops::var(m, {0}, true);
  EXPECT_EQ(k.shape(), (Shape{1, 3}));
  expect_all_near(vals(k), {4.5, 8, 12.5}, 1e-6);
  EXPECT_EQ(k.dtype(), DType::f32);
}

TEST(Reduce, VarIsAccurateFarFromZero) {
  // A one-pass sum-of-squares formula loses every digit here; two passes in double do not.
  Tensor x = f64({1e9 + 1, 1e9 + 2, 1e9 + 3, 1e9 + 4}, {4});
  EXPECT_NEAR(ops::var(x).item(), 5.0 / 3, 1e-9);
  Tensor y = f32({10001, 10002, 10003, 10004}, {4});
  EXPECT_NEAR(ops::var(y).item(), 5.0 / 3, 1e-6);
}

TEST(Reduce, VarOfTooFewElements) {
  // As torch.var: the divisor max(N - correction, 0) is zero, so 0/0 = NaN.
  EXPECT_TRUE(std::isnan(ops::var(scalar_tensor(3.0)).item()));
  EXPECT_EQ(ops::var(scalar_tensor(3.0), {}, false, 0).item(), 0.0);
  EXPECT_TRUE(std::isnan(ops::var(zeros({0})).item()));
}

TEST(Reduce, VarGradient) {
  // d var / d x_i = 2 (x_i - mean) / (N - 1) = 2 (x_i - 2.5) / 3.
  Tensor x = f64({1, 2, 3, 4}, {4}).requires_grad_();
  ops::var(x).backward();
  expect_all_near(vals(x.grad()), {-1, -1. / 3, 1. / 3, 1}, 1e-15);
}

// ---- amax, amin ---------------------------------------------------------------

TEST(Reduce, AmaxAminValues) {
  Tensor x = f32({3, -1, 7, 0, 9, -4}, {2, 3});
  EXPECT_EQ(ops::amax(x).item(), 9.0);
  EXPECT_EQ(ops::amin(x).item(), -4.0);
  EXPECT_THAT(vals(ops::amax(x, {0})), ElementsAre(3, 9, 7));
  Tensor k = ops::amin(x, {1}, true);
  EXPECT_EQ(k.shape(), (Shape{2, 1}));
  EXPECT_THAT(vals(k), ElementsAre(-1, -4));
  Tensor xi = x.to(DType::i32);
  EXPECT_EQ(ops::amax(xi, {0, 1}).dtype(), DType::i32);
  EXPECT_EQ(ops::amax(xi, {0, 1}).item<int64_t>(), 9);
  Tensor three = arange(24, {.dtype = DType::i64}).reshape({2, 3, 4});
  EXPECT_THAT(ivals(ops::amax(three, {0, 2})), ElementsAre(15, 19, 23));
  EXPECT_THAT(ivals(ops::amin(three, {-1, -3}, true)), ElementsAre(0, 4, 8));
}

TEST(Reduce, AmaxAminGradientIsSplitAmongTies) {
  Tensor x = f64({1, 3, 3, 2}, {4}).requires_grad_();
  ops::amax(x).backward();
  EXPECT_THAT(vals(x.grad()), ElementsAre(0, 0.5, 0.5, 0));
  Tensor y = f64({2, 2, 5, 1, 4, 1}, {2, 3}).requires_grad_();
  ops::amin(y, {1}).sum().backward();
  EXPECT_THAT(vals(y.grad()), ElementsAre(0.5, 0.5, 0, 0.5, 0, 0.5));
  Tensor z = f64({7, 7, 7, 7}, {2, 2}).requires_grad_();
  ops::amax(z).backward();
  EXPECT_THAT(vals(z.grad()), ElementsAre(0.25, 0.25, 0.25, 0.25));
}

// ---- max, min, argmax, argmin -----------------------------------------------------

TEST(ReduceArg, MaxMinReturnTheFirstIndexOnTies) {
  Tensor x = f32({1, 5, 5, 7, 7, 2}, {2, 3});
  ops::ValuesIndices mx = ops::max(x, 1);
  EXPECT_THAT(vals(mx.values), ElementsAre(5, 7));
  EXPECT_THAT(ivals(mx.indices), ElementsAre(1, 0));
  EXPECT_EQ(mx.indices.dtype(), DType::i64);
  EXPECT_EQ(mx.values.dtype(), DType::f32);
  ops::ValuesIndices mn = ops::min(x, -1);
  EXPECT_THAT(vals(mn.values), ElementsAre(1, 2));
  EXPECT_THAT(ivals(mn.indices), ElementsAre(0, 2));
  ops::ValuesIndices col = ops::max(x, 0, true);
  EXPECT_EQ(col.values.shape(), (Shape{1, 3}));
  EXPECT_EQ(col.indices.shape(), (Shape{1, 3}));
  EXPECT_THAT(vals(col.values), ElementsAre(7, 7, 5));
  EXPECT_THAT(ivals(col.indices), ElementsAre(1, 1, 0));
}

TEST(ReduceArg, ArgmaxArgminTieGoesToTheFirstIndex) {
  Tensor x = f32({1, 5, 5, 7, 7, 2}, {2, 3});
  Tensor a = ops::argmax(x, 1);
  EXPECT_EQ(a.dtype(), DType::i64);
  EXPECT_FALSE(a.requires_grad());
  EXPECT_THAT(ivals(a), ElementsAre(1, 0));
  Tensor k = ops::argmax(x, -1, true);
  EXPECT_EQ(k.shape(), (Shape{2, 1}));
  EXPECT_THAT(ivals(ops::argmin(x, 0)), ElementsAre(0, 0, 1));
  EXPECT_THAT(ivals(ops::argmin(from_vector<int64_t>({3, 1, 1, 2}, {4}), 0)), ElementsAre(1));
  EXPECT_THAT(ivals(ops::argmax(from_vector<int32_t>({3, 9, 1, 9}, {4}), 0)), ElementsAre(1));
  // Along an inner dim of a 3-d tensor.
  Tensor three = arange(24, {.dtype = DType::f64}).reshape({2, 3, 4});
  EXPECT_THAT(ivals(ops::argmax(three, 1)), ElementsAre(2, 2, 2, 2, 2, 2, 2, 2));
  EXPECT_THAT(ivals(ops::argmin(three, -3)), ElementsAre(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0));
}

TEST(ReduceArg, GradientFlowsToTheSelectedIndexOnly) {
  Tensor x = f64({1, 5, 5, 7, 7, 2}, {2, 3}).requires_grad_();
  ops::ValuesIndices mx = ops::max(x, 1);
  EXPECT_TRUE(mx.values.requires_grad());
  EXPECT_FALSE(mx.indices.requires_grad());
  ops::mul(mx.values, f64({2, 3}, {2})).sum().backward();
  EXPECT_THAT(vals(x.grad()), ElementsAre(0, 2, 0, 3, 0, 0));
  Tensor y = f64({4, 1, 1, 0, 6, 0}, {2, 3}).requires_grad_();
  ops::min(y, 0, true).values.sum().backward();
  EXPECT_THAT(vals(y.grad()), ElementsAre(0, 1, 0, 1, 0, 1));
}

TEST(ReduceArg, NaNPropagatesAndItsFirstIndexWins) {
  Tensor x = f32({1, NAN, 3, NAN}, {4});
  ops::ValuesIndices mx = ops::max(x, 0);
  EXPECT_TRUE(std::isnan(mx.values.item()));
  EXPECT_EQ(mx.indices.item<int64_t>(), 1);
  EXPECT_EQ(ops::argmin(x, 0).item<int64_t>(), 1);
  EXPECT_TRUE(std::isnan(ops::amax(x).item()));
  EXPECT_TRUE(std::isnan(ops::amin(x).item()));
  Tensor first = f64({kNaN, 2, 5}, {3});
  EXPECT_EQ(ops::argmax(first, 0).item<int64_t>(), 0);
  EXPECT_TRUE(std::isnan(ops::amax(first).item()));
}

TEST(ReduceArg, ZeroDimInputs) {
  Tensor s = scalar_tensor(4.5);
  ops::ValuesIndices m = ops::max(s, 0);
  EXPECT_EQ(m.values.shape(), Shape{});
  EXPECT_EQ(m.values.item(), 4.5);
  EXPECT_EQ(m.indices.item<int64_t>(), 0);
  EXPECT_EQ(ops::argmin(s, -1).item<int64_t>(), 0);
  EXPECT_EQ(ops::amax(s).item(), 4.5);
  EXPECT_EQ(ops::amin(s, {0}).item(), 4.5);
  EXPECT_EQ(ops::sum(s, {-1}).item(), 4.5);
  EXPECT_EQ(ops::mean(s).item(), 4.5);
  EXPECT_EQ(ops::amax(s, {}, true).shape(), Shape{});
}

// ---- long rows, non-contiguous inputs, dtypes -----------------------------------

TEST(Reduce, LongRowsAreBlockedAndThreadCountIndependent) {
  const int64_t n = 3 * cpu::kReduceBlock + 123;
  // arange sums exactly in double; its variance is n (n + 1) / 12 with correction 1.
  Tensor r = arange(0.0, static_cast<double>(n), 1.0, {.dtype = DType::f64});
  EXPECT_EQ(ops::sum(r).item(), static_cast<double>(n) * (n - 1) / 2);
  EXPECT_NEAR(ops::var(r).item() / (static_cast<double>(n) * (n + 1) / 12), 1.0, 1e-12);
  EXPECT_EQ(ops::mean(r).item(), static_cast<double>(n - 1) / 2);

  Generator gen(7);
  Tensor x = randn({3, n}, {.dtype = DType::f32}, &gen);
  std::vector<float> xv = x.to_vector<float>();
  // Plant the extremes in later blocks, with a tie after the first occurrence.
  xv[static_cast<size_t>(n + 70000)] = 50.f;
  xv[static_cast<size_t>(n + 90000)] = 50.f;
  xv[static_cast<size_t>(2 * n + cpu::kReduceBlock)] = -50.f;
  xv[static_cast<size_t>(2 * n + 100)] = NAN;
  x = from_vector<float>(xv, {3, n});
  // Host references: the first index of the max / min of a row (the first NaN, if any, wins).
  auto host_arg = [&](int64_t row, bool want_max) {
    const float* p = xv.data() + row * n;
    int64_t best = 0;
    for (int64_t c = 0; c < n; ++c) {
      if (std::isnan(p[c])) return c;
      if (want_max ? p[c] > p[best] : p[c] < p[best]) best = c;
    }
    return best;
  };
  double row0_sum = 0;
  for (int64_t i = 0; i < n; ++i) row0_sum += xv[static_cast<size_t>(i)];

  auto run = [&] {
    return std::vector<Tensor>{ops::sum(x, {1}), ops::mean(x, {1}), ops::var(x, {1}), ops::amax(x, {1}),
                               ops::argmax(x, 1), ops::argmin(x, 1), ops::sum(x)};
  };
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const std::vector<Tensor> one = run();
  omp_set_num_threads(threads);
  const std::vector<Tensor> many = run();
  for (size_t i = 0; i < one.size(); ++i) {
    const std::vector<double> a = vals(one[i]), b = vals(many[i]);
    for (size_t j = 0; j < a.size(); ++j)
      EXPECT_TRUE(a[j] == b[j] || (std::isnan(a[j]) && std::isnan(b[j]))) << "result " << i << " row " << j;
  }
  EXPECT_NEAR(vals(many[0])[0], row0_sum, 1e-3);
  for (int64_t row = 0; row < 3; ++row) {
    EXPECT_EQ(ivals(many[4])[static_cast<size_t>(row)], host_arg(row, true)) << "argmax row " << row;
    EXPECT_EQ(ivals(many[5])[static_cast<size_t>(row)], host_arg(row, false)) << "argmin row " << row;
  }
  EXPECT_EQ(ivals(many[4])[1], 70000);  // the first of two tied maxima, in the third block
  EXPECT_EQ(vals(many[3])[1], 50.0);
  EXPECT_EQ(ivals(many[4])[2], 100);  // the NaN wins argmax and argmin
  EXPECT_EQ(ivals(many[5])[2], 100);
  EXPECT_TRUE(std::isnan(vals(many[3])[2]));
  EXPECT_TRUE(std::isnan(vals(many[2])[2]));
}

TEST(Reduce, LeadingAndMiddleDimsAreReducedInPlace) {
  // Reduced dims before kept ones take the lane kernel (no transposing copy). 70 outputs per
  // outer index: a full block of cpu::kReduceLanes lanes and a partial one.
  const int64_t outer = 3, n = 5, inner = 70;
  Generator gen(17);
  Tensor x = randn({outer, n, inner}, {.dtype = DType::f64}, &gen);
  const std::vector<double> xv = vals(x);
  std::vector<double> sum_ref, max_ref, min_ref;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      double s = 0, mx = -INFINITY, mn = INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        const double v = xv[static_cast<size_t>((o * n + j) * inner + i)];
        s += v;
        mx = std::max(mx, v);
        mn = std::min(mn, v);
      }
      sum_ref.push_back(s);
      max_ref.push_back(mx);
      min_ref.push_back(mn);
    }
  expect_all_near(vals(ops::sum(x, {1})), sum_ref, 1e-13);
  std::vector<double> mean_ref = sum_ref;
  for (double& m : mean_ref) m /= n;
  expect_all_near(vals(ops::mean(x, {-2}, true)), mean_ref, 1e-14);
  EXPECT_EQ(ops::mean(x, {-2}, true).shape(), (Shape{outer, 1, inner}));
  EXPECT_EQ(vals(ops::amax(x, {1})), max_ref);
  EXPECT_EQ(vals(ops::amin(x, {1})), min_ref);
  // Leading dims, with a size-1 dim in between that must not break the block.
  Tensor y = x.reshape({outer, 1, n, inner});
  expect_all_near(vals(ops::sum(y, {0, 2})), vals(ops::sum(ops::sum(x, {1}), {0})), 1e-13);
  expect_all_near(vals(ops::sum(y, {0, 1, 2})), vals(ops::sum(y.permute({3, 0, 1, 2}), {1, 2, 3})), 1e-13);
  // Integers accumulate exactly in i64.
  Tensor xi = arange(24, {.dtype = DType::i32}).reshape({2, 3, 4});
  EXPECT_THAT(ivals(ops::sum(xi, {0})), ElementsAre(12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34));
  EXPECT_THAT(ivals(ops::amax(xi, {0, 1})), ElementsAre(20, 21, 22, 23));
  // NaN propagates per lane; empty leading dims sum to 0 and average to NaN.
  Tensor z = f32({1, NAN, 3, 4, 5, 0}, {2, 3});
  const std::vector<double> zmax = vals(ops::amax(z, {0}));
  EXPECT_EQ(zmax[0], 4);
  EXPECT_TRUE(std::isnan(zmax[1]));
  EXPECT_EQ(zmax[2], 3);
  EXPECT_THAT(vals(ops::sum(zeros({0, 3}), {0})), ElementsAre(0, 0, 0));
  EXPECT_TRUE(std::isnan(vals(ops::mean(zeros({0, 3}), {0}))[1]));
  // The gradient of a leading-dim reduction broadcasts back.
  Tensor leaf = f64({1, 2, 3, 4, 5, 6}, {3, 2}).requires_grad_();
  ops::mean(leaf, {0}).backward(f64({3, 6}, {2}));
  EXPECT_THAT(vals(leaf.grad()), ElementsAre(1, 2, 1, 2, 1, 2));
}

TEST(Reduce, NonContiguousInputsMatchContiguousCopies) {
  Generator gen(3);
  Tensor base = randn({6, 8}, {.dtype = DType::f64}, &gen);
  for (const Tensor& v : {base.t(), base.slice(1, 0, 8, 2), base.t().slice(0, 1, 8, 3)}) {
    ASSERT_FALSE(v.is_contiguous());
    Tensor c = v.contiguous();
    EXPECT_EQ(max_abs_diff(ops::sum(v, {1}), ops::sum(c, {1})), 0);
    EXPECT_EQ(max_abs_diff(ops::mean(v, {0}), ops::mean(c, {0})), 0);
    EXPECT_EQ(max_abs_diff(ops::var(v, {-1}), ops::var(c, {-1})), 0);
    EXPECT_EQ(max_abs_diff(ops::amax(v, {0}), ops::amax(c, {0})), 0);
    EXPECT_EQ(max_abs_diff(ops::argmin(v, 1), ops::argmin(c, 1)), 0);
    EXPECT_EQ(max_abs_diff(ops::softmax(v, 0), ops::softmax(c, 0)), 0);
    EXPECT_EQ(max_abs_diff(ops::log_softmax(v, 1), ops::log_softmax(c, 1)), 0);
  }
}

TEST(Reduce, HalfPrecisionInputsWork) {
  Generator gen(5);
  Tensor x = randn({4, 33}, {.dtype = DType::f32}, &gen);
  for (DType dt : {DType::bf16, DType::f16}) {
    Tensor h = x.to(dt);
    Tensor hf = h.to(DType::f32);  // the exact values the half tensor holds
    const double tol = dt == DType::bf16 ? 1e-2 : 1e-3;
    Tensor s = ops::sum(h, {1});
    EXPECT_EQ(s.dtype(), dt);
    // Accumulated in double, rounded once: within one half ulp of the f32 sum of the same values.
    Tensor sf = ops::sum(hf, {1});
    for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(vals(s)[i], vals(sf)[i], tol * (1 + std::abs(vals(sf)[i])));
    EXPECT_LE(max_abs_diff(ops::mean(h, {0}), ops::mean(hf, {0})), tol);
    EXPECT_LE(max_abs_diff(ops::var(h, {1}), ops::var(hf, {1})), tol * 2);
    EXPECT_EQ(max_abs_diff(ops::amax(h, {1}), ops::amax(hf, {1})), 0);
    EXPECT_EQ(max_abs_diff(ops::min(h, 0).values, ops::min(hf, 0).values), 0);
    EXPECT_EQ(max_abs_diff(ops::argmax(h, 1), ops::argmax(hf, 1)), 0);
    Tensor p = ops::softmax(h, 1);
    EXPECT_EQ(p.dtype(), dt);
    EXPECT_LE(max_abs_diff(p, ops::softmax(hf, 1)), tol);
    EXPECT_LE(max_abs_diff(ops::log_softmax(h, 0), ops::log_softmax(hf, 0)), tol * 8);
    // Backward in the half dtype.
    Tensor leaf = h.detach().requires_grad_();
    ops::mul(ops::softmax(leaf, 1), h.detach()).sum().backward();
    EXPECT_EQ(leaf.grad().dtype(), dt);
    Tensor leaf32 = hf.detach().requires_grad_();
    ops::mul(ops::softmax(leaf32, 1), hf).sum().backward();
    EXPECT_LE(max_abs_diff(leaf.grad(), leaf32.grad()), tol * 4);
  }
}

TEST(Reduce, NoHistoryForIntegerResultsOrWithoutGradMode) {
  Tensor x = f64({1, 2, 3, 4}, {2, 2}).requires_grad_();
  EXPECT_TRUE(ops::var(x).requires_grad());
  EXPECT_FALSE(ops::argmax(x, 0).requires_grad());
  EXPECT_FALSE(ops::sum(arange(4, {.dtype = DType::i64})).requires_grad());
  NoGradGuard no_grad;
  EXPECT_FALSE(ops::mean(x).requires_grad());
  EXPECT_FALSE(ops::softmax(x, 0).requires_grad());
}

// ---- softmax, log_softmax ---------------------------------------------------------

TEST(ReduceSoftmax, KnownValues) {
  Tensor x = f64({0, std::log(2.0), std::log(3.0)}, {3});
  expect_all_near(vals(ops::softmax(x, 0)), {1. / 6, 2. / 6, 3. / 6}, 1e-15);
  expect_all_near(vals(ops::log_softmax(x, -1)), {std::log(1. / 6), std::log(2. / 6), std::log(3. / 6)}, 1e-15);
}

TEST(ReduceSoftmax, RowsSumToOneAndLargeInputsAreStable) {
  Tensor x = f32({1000, 1000, 1000, 1000, 0, -1000, -1000, -1000, -999}, {3, 3});
  Tensor p = ops::softmax(x, 1);
  const std::vector<double> pv = vals(p);
  for (double v : pv) EXPECT_TRUE(std::isfinite(v));
  // Row 2 is (-1000, -1000, -999): the shift leaves (0, 0, 1), so 1 / (2 + e) twice and e / (2 + e).
  const double e = std::exp(1.0);
  expect_all_near(pv, {1. / 3, 1. / 3, 1. / 3, 1, 0, 0, 1 / (2 + e), 1 / (2 + e), e / (2 + e)}, 1e-6);
  expect_all_near(vals(ops::sum(p, {1})), {1, 1, 1}, 1e-6);
  Tensor lp = ops::log_softmax(x, 1);
  expect_all_near(vals(lp), {-std::log(3.0), -std::log(3.0), -std::log(3.0), 0, -1000, -2000,
                             -std::log(2 + e), -std::log(2 + e), 1 - std::log(2 + e)},
                  1e-4);

  Generator gen(9);
  Tensor r = ops::mul(randn({5, 37}, {.dtype = DType::f64}, &gen), 10.0);
  expect_all_near(vals(ops::sum(ops::softmax(r, 1), {1})), std::vector<double>(5, 1.0), 1e-14);
  expect_all_near(vals(ops::sum(ops::softmax(r, 0), {0})), std::vector<double>(37, 1.0), 1e-14);
}

TEST(ReduceSoftmax, LogSoftmaxIsLogOfSoftmax) {
  Generator gen(11);
  Tensor x = randn({3, 5, 20}, {.dtype = DType::f64}, &gen);
  for (int64_t dim : {0, 1, 2, -1}) {
    EXPECT_LT(max_abs_diff(ops::log_softmax(x, dim), ops::log(ops::softmax(x, dim))), 1e-14) << "dim " << dim;
  }
}

TEST(ReduceSoftmax, AnyDimMatchesTheLastDimOfAPermutedCopy) {
  // dim 0 and 1 use the inner > 1 kernel path (37 lanes: two full blocks and a partial one).
  Generator gen(13);
  Tensor x = randn({5, 3, 37}, {.dtype = DType::f64}, &gen);
  for (bool log : {false, true}) {
    auto f = [log](const Tensor& t, int64_t d) { return log ? ops::log_softmax(t, d) : ops::softmax(t, d); };
    Tensor moved0 = x.transpose(0, 2).contiguous();  // (37, 3, 5)
    EXPECT_LT(max_abs_diff(f(x, 0), f(moved0, 2).transpose(0, 2)), 1e-15);
    Tensor moved1 = x.transpose(1, 2).contiguous();  // (5, 37, 3)
    EXPECT_LT(max_abs_diff(f(x, -2), f(moved1, -1).transpose(1, 2)), 1e-15);
  }
}

TEST(ReduceSoftmax, BackwardValues) {
  // softmax: dx = y (g - sum g y); log_softmax: dx = g - exp(y) sum g.
  Tensor x = f64({0, std::log(2.0), std::log(3.0)}, {3}).requires_grad_();
  Tensor g = f64({1, 0, 0}, {3});
  ops::softmax(x, 0).backward(g);
  // y = (1/6, 1/3, 1/2), sum g y = 1/6.
  expect_all_near(vals(x.grad()), {1. / 6 * (5. / 6), -1. / 3 / 6, -1. / 2 / 6}, 1e-15);
  x.zero_grad();
  ops::log_softmax(x, 0).backward(g);
  expect_all_near(vals(x.grad()), {1 - 1. / 6, -1. / 3, -1. / 2}, 1e-15);
}

TEST(ReduceSoftmax, ZeroDimAndEmptyInputs) {
  Tensor s = scalar_tensor(3.0);
  EXPECT_EQ(ops::softmax(s, 0).item(), 1.0);
  EXPECT_EQ(ops::log_softmax(s, -1).item(), 0.0);
  Tensor e = ops::softmax(zeros({2, 0}), 1);
  EXPECT_EQ(e.shape(), (Shape{2, 0}));
  EXPECT_EQ(ops::log_softmax(zeros({0, 4}), 1).shape(), (Shape{0, 4}));
}

TEST(ReduceSoftmax, NaNRowGivesNaNOnlyInThatRow) {
  Tensor x = f32({1, NAN, 2, 1, 2, 3}, {2, 3});
  const std::vector<double> p = vals(ops::softmax(x, 1));
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(std::isnan(p[i]));
  for (int i = 3; i < 6; ++i) EXPECT_TRUE(std::isfinite(p[i]));
}

// ---- errors ---------------------------------------------------------------------

TEST(ReduceErrors, EmptyDimensionsNameTheOpAndShape) {
  expect_error([] { ops::amax(zeros({3, 0}), {1}); }, {"amax", "[3, 0]"});
  expect_error([] { ops::amin(zeros({0})); }, {"amin", "[0]"});
  expect_error([] { ops::max(zeros({2, 0}), 1); }, {"max", "[2, 0]"});
  expect_error([] { ops::min(zeros({0, 2}), 0, true); }, {"min", "[0, 2]"});
  expect_error([] { ops::argmax(zeros({0}), 0); }, {"argmax", "[0]"});
  expect_error([] { ops::argmin(zeros({0, 4}), 0); }, {"argmin", "[0, 4]"});
}

TEST(ReduceErrors, BadDimsNameTheOpAndShape) {
  Tensor x = zeros({2, 3});
  expect_error([&] { ops::sum(x, {2}); }, {"sum", "[2, 3]", "dim 2"});
  expect_error([&] { ops::mean(x, {-3}); }, {"mean", "[2, 3]"});
  expect_error([&] { ops::var(x, {0, -2}); }, {"var", "[2, 3]", "more than once"});
  expect_error([&] { ops::amax(x, {1, 1}); }, {"amax", "[2, 3]"});
  expect_error([&] { ops::max(x, 5); }, {"max", "[2, 3]"});
  expect_error([&] { ops::min(x, -3); }, {"min", "[2, 3]"});
  expect_error([&] { ops::argmax(x, -3); }, {"argmax", "[2, 3]"});
  expect_error([&] { ops::argmin(x, 2, true); }, {"argmin", "[2, 3]"});
  expect_error([&] { ops::softmax(x, 2); }, {"softmax", "[2, 3]"});
  expect_error([&] { ops::log_softmax(x, -3); }, {"log_softmax", "[2, 3]"});
  expect_error([] { ops::softmax(scalar_tensor(1.0), 1); }, {"softmax", "[]"});
}

TEST(ReduceErrors, IntegerInputsToFloatingOpsNameTheOpShapeAndDtype) {
  Tensor i = arange(6, {.dtype = DType::i64}).reshape({2, 3});
  expect_error([&] { ops::mean(i); }, {"mean", "[2, 3]", "i64"});
  expect_error([&] { ops::var(i.to(DType::i32), {1}); }, {"var", "[2, 3]", "i32"});
  expect_error([&] { ops::softmax(i, 1); }, {"softmax", "[2, 3]", "i64"});
  expect_error([&] { ops::log_softmax(i.to(DType::u8), 0); }, {"log_softmax", "[2, 3]", "u8"});
}

}  // namespace
}  // namespace forge
