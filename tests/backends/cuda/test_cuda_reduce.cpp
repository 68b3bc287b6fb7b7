// The CUDA reductions (sum, mean, amax, amin, var, max/min/argmax/argmin) and softmax /
// log_softmax against the CPU backend: every dim of a 3-D tensor and all of them, keepdim,
// contiguous / transposed / sliced inputs, f32, bf16, f16 (and f64), integer dtypes
// exactly, ties and NaN, the split paths (a scalar sum of 1e7 elements, a bias gradient
// over 32768 rows, arg-reductions over 3e6 columns), softmax along the last and other dims
// with rows up to 70001, forward and backward (through autograd).
//
// Comparisons are ||out - ref|| / ||ref|| with tolerances by dtype (f32 1e-5, bf16/f16
// 1e-2, f64 1e-12) unless a test says why it needs another; results that are exact
// (amax/amin, indices, integer sums) are compared exactly. Inputs are random, never zeros.
// Without a GPU every test reports SKIPPED.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "forge/forge.h"
#include "backends/cuda/cuda_testing.h"

namespace forge {
namespace {

using namespace cuda_testing;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// A [7, 33, 129] operand in three layouts: contiguous, a transposed view (every dim
// permuted), and a slice with step 2 along the last dim.
enum class View3 { contiguous, permuted, sliced };
constexpr View3 kViews3[] = {View3::contiguous, View3::permuted, View3::sliced};
const Shape kShape3 = {7, 33, 129};

const char* view_name(View3 v) {
  switch (v) {
    case View3::contiguous: return "contiguous";
    case View3::permuted: return "permuted";
    case View3::sliced: return "sliced";
  }
  return "?";
}

Pair operand3(View3 v, Domain domain, DType dt, uint64_t seed) {
  switch (v) {
    case View3::contiguous: return on_both(host_input(kShape3, domain, dt, seed));
    case View3::permuted:
      return view_both(on_both(host_input({129, 33, 7}, domain, dt, seed)),
                       [](const Tensor& t) { return t.permute({2, 1, 0}); });
    case View3::sliced:
      return view_both(on_both(host_input({7, 33, 258}, domain, dt, seed)),
                       [](const Tensor& t) { return t.slice(2, 1, 258, 2); });
  }
  return {};
}

// Every dim alone (also negative), pairs, and all ({}).
const std::vector<ops::Dims> kDimSets = {{0}, {1}, {2}, {-1}, {0, 2}, {0, 1}, {1, 2}, {}};

std::string dims_str(const ops::Dims& d) { return d.empty() ? std::string("all") : shape_str(d); }

// Element-wise equality with NaN == NaN (for results that must match exactly).
void expect_same(const Tensor& got, const Tensor& ref, const std::string& what) {
  ASSERT_TRUE(got.is_cuda()) << what;
  ASSERT_EQ(got.shape(), ref.shape()) << what;
  ASSERT_EQ(got.dtype(), ref.dtype()) << what;
  const auto g = got.to_vector<double>(), r = ref.to_vector<double>();
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    const bool same = (std::isnan(g[i]) && std::isnan(r[i])) || g[i] == r[i];
    if (!same && bad++ == 0) first = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << r.size() << " differ, first at " << first << ": "
                     << (bad ? g[first] : 0) << " vs " << (bad ? r[first] : 0);
}

// Non-finite elements must match exactly (NaN where NaN, the same infinity); the finite
// ones by ||got - ref|| / ||ref|| <= tol.
void expect_close_nonfinite(const Tensor& got, const Tensor& ref, double tol, const std::string& what) {
  ASSERT_TRUE(got.is_cuda()) << what;
  ASSERT_EQ(got.shape(), ref.shape()) << what;
  const auto g = got.to_vector<double>(), r = ref.to_vector<double>();
  double num = 0, den = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    if (!std::isfinite(r[i]) || !std::isfinite(g[i])) {
      EXPECT_TRUE((std::isnan(g[i]) && std::isnan(r[i])) || g[i] == r[i])
          << what << ": element " << i << " is " << g[i] << ", expected " << r[i];
      continue;
    }
    num += (g[i] - r[i]) * (g[i] - r[i]);
    den += r[i] * r[i];
  }
  EXPECT_LE(den > 0 ? std::sqrt(num / den) : std::sqrt(num), tol) << what;
}

class CudaReduce : public ::testing::TestWithParam<DType> {};

// ---- sum, mean, amax, amin ------------------------------------------------------------------

TEST_P(CudaReduce, SumMeanAmaxAminOverEveryDim) {
  FORGE_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  for (View3 v : kViews3) {
    const Pair x = operand3(v, Domain::real, dt, 11);
    for (const ops::Dims& dims : kDimSets) {
      for (bool keepdim : {false, true}) {
        const std::string what = std::string(view_name(v)) + " dims " + dims_str(dims) + (keepdim ? " keepdim" : "");
        expect_close(ops::sum(x.gpu, dims, keepdim), ops::sum(x.cpu, dims, keepdim), tolerance(dt), "sum " + what);
        expect_close(ops::mean(x.gpu, dims, keepdim), ops::mean(x.cpu, dims, keepdim), tolerance(dt), "mean " + what);
        expect_same(ops::amax(x.gpu, dims, keepdim), ops::amax(x.cpu, dims, keepdim), "amax " + what);
        expect_same(ops::amin(x.gpu, dims, keepdim), ops::amin(x.cpu, dims, keepdim), "amin " + what);
      }
    }
  }
}

TEST_P(CudaReduce, VarOverEveryDim) {
  FORGE_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  for (View3 v : kViews3) {
    const Pair x = operand3(v, Domain::real, dt, 12);
    for (const ops::Dims& dims : kDimSets) {
      for (int64_t correction : {1, 0}) {
        const std::string what = std::string(view_name(v)) + " dims " + dims_str(dims) + " correction " +
                                 std::to_string(correction);
        expect_close(ops::var(x.gpu, dims, true, correction), ops::var(x.cpu, dims, true, correction), tolerance(dt),
                     "var " + what);
      }
    }
  }
}

TEST_P(CudaReduce, BackwardThroughSumMeanVarAmax) {
  FORGE_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  // Integral values: amax has ties, whose gradient is split evenly among them.
  for (Domain domain : {Domain::real, Domain::integral}) {
    const Tensor xh = host_input(kShape3, domain, dt, 13);
    for (const ops::Dims& dims : std::vector<ops::Dims>{{0}, {2}, {0, 2}, {}}) {
      const Shape out_shape = ops::sum(xh, dims, true).shape();
      const Tensor gh = host_input(out_shape, Domain::real, dt, 14);
      auto grad_of = [&](Device d, const std::function<Tensor(const Tensor&)>& f) {
        Tensor x = xh.to(d).detach();
        x.requires_grad_();
        f(x).backward(gh.to(d));
        return x.grad();
      };
      const std::string what = " dims " + dims_str(dims);
      auto check = [&](const char* name, const std::function<Tensor(const Tensor&)>& f) {
        expect_close(grad_of(kGpu, f), grad_of(Device::cpu(), f), tolerance(dt), std::string(name) + what);
      };
      check("sum", [&](const Tensor& x) { return ops::sum(x, dims, true); });
      check("mean", [&](const Tensor& x) { return ops::mean(x, dims, true); });
      check("var", [&](const Tensor& x) { return ops::var(x, dims, true); });
      check("amax", [&](const Tensor& x) { return ops::amax(x, dims, true); });
      check("amin", [&](const Tensor& x) { return ops::amin(x, dims, true); });
    }
  }
}

// ---- max / min / argmax / argmin ------------------------------------------------------------

TEST_P(CudaReduce, ArgExtremesMatchTheCpuOnTies) {
  FORGE_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  for (View3 v : kViews3) {
    // Integers in [-3, 3]: every row has many ties for its max and min.
    const Pair x = operand3(v, Domain::integral, dt, 15);
    for (int64_t dim : {0, 1, 2, -1}) {
      for (bool keepdim : {false, true}) {
        const std::string what = std::string(view_name(v)) + " dim " + std::to_string(dim);
        const ops::ValuesIndices mg = ops::max(x.gpu, dim, keepdim), mc = ops::max(x.cpu, dim, keepdim);
        expect_same(mg.values, mc.values, "max values " + what);
        expect_equal(mg.indices, mc.indices, "max indices " + what);
        const ops::ValuesIndices ng = ops::min(x.gpu, dim, keepdim), nc = ops::min(x.cpu, dim, keepdim);
        expect_same(ng.values, nc.values, "min values " + what);
        expect_equal(ng.indices, nc.indices, "min indices " + what);
        expect_equal(ops::argmax(x.gpu, dim, keepdim), ops::argmax(x.cpu, dim, keepdim), "argmax " + what);
        expect_equal(ops::argmin(x.gpu, dim, keepdim), ops::argmin(x.cpu, dim, keepdim), "argmin " + what);
      }
    }
  }
  // The gradient of max along a dim flows to the returned index only.
  const Tensor xh = host_input({37, 129}, Domain::integral, dt, 16);
  const Tensor gh = host_input({37}, Domain::real, dt, 17);
  auto grad_of = [&](Device d) {
    Tensor x = xh.to(d).detach();
    x.requires_grad_();
    ops::max(x, 1).values.backward(gh.to(d));
    return x.grad();
  };
  expect_close(grad_of(kGpu), grad_of(Device::cpu()), tolerance(dt), "max backward");
}

INSTANTIATE_TEST_SUITE_P(FloatDTypes, CudaReduce, ::testing::ValuesIn(kFloatDTypes),
                         [](const ::testing::TestParamInfo<DType>& i) { return std::string(dtype_name(i.param)); });

TEST(CudaReduceNaN, NaNPropagatesAndTheFirstNaNWins) {
  FORGE_SKIP_WITHOUT_GPU();
  for (DType dt : {DType::f32, DType::bf16}) {
    // Rows of 1000 with NaNs at a few places (two in row 1), one row without.
    Tensor h = host_input({3, 1000}, Domain::real, DType::f32, 18);
    float* p = h.data<float>();
    p[1000 + 417] = std::numeric_limits<float>::quiet_NaN();
    p[1000 + 903] = std::numeric_limits<float>::quiet_NaN();
    p[2000 + 999] = std::numeric_limits<float>::quiet_NaN();
    const Pair x = on_both(h.to(dt));
    for (int64_t dim : {1, 0}) {
      const std::string what = std::string(dtype_name(dt)) + " dim " + std::to_string(dim);
      expect_same(ops::amax(x.gpu, {dim}), ops::amax(x.cpu, {dim}), "amax " + what);
      expect_same(ops::amin(x.gpu, {dim}), ops::amin(x.cpu, {dim}), "amin " + what);
      expect_equal(ops::argmax(x.gpu, dim), ops::argmax(x.cpu, dim), "argmax " + what);
      expect_equal(ops::argmin(x.gpu, dim), ops::argmin(x.cpu, dim), "argmin " + what);
      expect_same(ops::max(x.gpu, dim).values, ops::max(x.cpu, dim).values, "max values " + what);
    }
    EXPECT_EQ(ops::argmax(x.gpu, 1).to_vector<int64_t>()[1], 417);
  }
}

// ---- integers --------------------------------------------------------------------------------

TEST(CudaReduceIntegers, SumsAndExtremesAreExact) {
  FORGE_SKIP_WITHOUT_GPU();
  Generator gen(19);
  for (DType dt : {DType::i32, DType::i64, DType::u8, DType::boolean}) {
    const int64_t lo = dt == DType::i32 || dt == DType::i64 ? -1000 : 0, hi = dt == DType::boolean ? 2 : 200;
    const Tensor h = randint(lo, hi, {129, 33, 7}, {.dtype = DType::i64}, &gen).to(dt);
    for (bool permuted : {false, true}) {
      const Pair x = permuted ? view_both(on_both(h), [](const Tensor& t) { return t.permute({2, 1, 0}); })
                              : on_both(h);
      for (const ops::Dims& dims : kDimSets) {
        const std::string what = std::string(dtype_name(dt)) + (permuted ? " permuted" : "") + " dims " +
                                 dims_str(dims);
        const Tensor s = ops::sum(x.gpu, dims);
        EXPECT_EQ(s.dtype(), DType::i64) << what;
        expect_equal(s, ops::sum(x.cpu, dims), "sum " + what);
        expect_equal(ops::amax(x.gpu, dims, true), ops::amax(x.cpu, dims, true), "amax " + what);
        expect_equal(ops::amin(x.gpu, dims, true), ops::amin(x.cpu, dims, true), "amin " + what);
      }
      for (int64_t dim : {0, 1, 2}) {
        const std::string what = std::string(dtype_name(dt)) + " dim " + std::to_string(dim);
        expect_equal(ops::argmax(x.gpu, dim), ops::argmax(x.cpu, dim), "argmax " + what);
        expect_equal(ops::argmin(x.gpu, dim), ops::argmin(x.cpu, dim), "argmin " + what);
        expect_equal(ops::max(x.gpu, dim).values, ops::max(x.cpu, dim).values, "max values " + what);
      }
    }
  }
}

// ---- long reductions (the split paths) ------------------------------------------------------

TEST(CudaReduceLong, ScalarSumOfTenMillionElements) {
  FORGE_SKIP_WITHOUT_GPU();
  const int64_t n = 10'000'000;
  // Positive values: no cancellation, so the relative error measures the summation itself.
  // f32 partial sums in a tree: about 1e-7 relative here; the CPU sums in f64. 2e-6 leaves room.
  const Pair pos = on_both(host_input({n}, Domain::positive, DType::f32, 20));
  expect_close(pos.gpu.sum(), pos.cpu.sum(), 2e-6, "sum of 1e7 positive f32");
  expect_close(pos.gpu.mean(), pos.cpu.mean(), 2e-6, "mean of 1e7 positive f32");
  // Mixed signs: the error is bounded by the sum of magnitudes, not by the (small) result.
  const Pair x = on_both(host_input({n}, Domain::real, DType::f32, 21));
  const double l1 = ops::abs(x.cpu).sum().item<double>();
  EXPECT_NEAR(x.gpu.sum().item<double>(), x.cpu.sum().item<double>(), 1e-6 * l1) << "sum of 1e7 randn f32";
  // 16-bit inputs accumulate in f32: the only error is the final rounding.
  const Pair b = on_both(host_input({n}, Domain::positive, DType::bf16, 22));
  expect_close(b.gpu.sum(), b.cpu.sum(), tolerance(DType::bf16), "sum of 1e7 bf16");
  // A few long rows: each row is split over many blocks.
  const Pair rows = on_both(host_input({3, 4'000'001}, Domain::positive, DType::f32, 23));
  expect_close(ops::sum(rows.gpu, {1}), ops::sum(rows.cpu, {1}), 2e-6, "row sums of 4e6");
  expect_close(ops::var(rows.gpu, {1}), ops::var(rows.cpu, {1}), 1e-5, "row var of 4e6");
  expect_same(ops::amax(rows.gpu, {1}), ops::amax(rows.cpu, {1}), "row amax of 4e6");
}

TEST(CudaReduceLong, ArgExtremesOverSplitRows) {
  FORGE_SKIP_WITHOUT_GPU();
  // 2 rows of 3e6 integers in [-3, 3]: the first maximum lies in the first split, and every
  // split holds ties of it.
  const Pair x = on_both(host_input({2, 3'000'000}, Domain::integral, DType::f32, 24));
  expect_equal(ops::argmax(x.gpu, 1), ops::argmax(x.cpu, 1), "argmax over 3e6 columns");
  expect_equal(ops::argmin(x.gpu, 1), ops::argmin(x.cpu, 1), "argmin over 3e6 columns");
}

TEST(CudaReduceLong, BiasGradientOverManyRows) {
  FORGE_SKIP_WITHOUT_GPU();
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    // (B*T, C) summed over the rows: the lanes kernel with n split over blocks.
    const Pair x = on_both(host_input({32768, 768}, Domain::real, dt, 25));
    expect_close(ops::sum(x.gpu, {0}), ops::sum(x.cpu, {0}), tolerance(dt), "sum over 32768 rows");
    expect_close(ops::mean(x.gpu, {0}), ops::mean(x.cpu, {0}), tolerance(dt), "mean over 32768 rows");
    expect_same(ops::amax(x.gpu, {0}), ops::amax(x.cpu, {0}), "amax over 32768 rows");
    // The same through autograd: the gradient of a broadcast bias is sum_to.
    const Tensor bh = host_input({768}, Domain::real, dt, 26);
    const Tensor gh = host_input({32768, 768}, Domain::real, dt, 27);
    auto grad_of = [&](Device d) {
      Tensor b = bh.to(d).detach();
      b.requires_grad_();
      ops::add(x.cpu.to(d), b).backward(gh.to(d));
      return b.grad();
    };
    expect_close(grad_of(kGpu), grad_of(Device::cpu()), tolerance(dt), "bias gradient");
  }
}

TEST(CudaReduceBroadcast, SumToForBroadcastBackward) {
  FORGE_SKIP_WITHOUT_GPU();
  for (DType dt : {DType::f32, DType::bf16}) {
    const Tensor ah = host_input({4, 1, 5}, Domain::real, dt, 28), bh = host_input({3, 5}, Domain::real, dt, 29);
    const Tensor gh = host_input({4, 3, 5}, Domain::real, dt, 30);
    auto grads = [&](Device d) {
      Tensor a = ah.to(d).detach(), b = bh.to(d).detach();
      a.requires_grad_();
      b.requires_grad_();
      ops::mul(a, b).backward(gh.to(d));
      return std::vector<Tensor>{a.grad(), b.grad()};
    };
    const auto g = grads(kGpu), c = grads(Device::cpu());
    expect_close(g[0], c[0], tolerance(dt), "d/da of a * b");
    expect_close(g[1], c[1], tolerance(dt), "d/db of a * b");
    expect_close(ops::sum_to(on_both(gh).gpu, {3, 1}), ops::sum_to(gh, {3, 1}), tolerance(dt), "sum_to [3, 1]");
  }
}

TEST(CudaReduceEmpty, EmptyReductions) {
  FORGE_SKIP_WITHOUT_GPU();
  const Tensor x = zeros({0, 5}, {.device = kGpu});
  EXPECT_EQ(ops::sum(x, {0}).to_vector<double>(), std::vector<double>(5, 0.0));
  for (double v : ops::mean(x, {0}).to_vector<double>()) EXPECT_TRUE(std::isnan(v));
  EXPECT_EQ(ops::sum(x).item<double>(), 0.0);
  EXPECT_EQ(ops::sum(x, {1}).numel(), 0);
}

// ---- softmax / log_softmax -----------------------------------------------------------------

class CudaSoftmax : public ::testing::TestWithParam<DType> {};

void check_softmax(const Pair& x, int64_t dim, bool log, DType dt, uint64_t seed, const std::string& what) {
  auto f = [&](const Tensor& t) { return log ? ops::log_softmax(t, dim) : ops::softmax(t, dim); };
  const std::string name = std::string(log ? "log_softmax " : "softmax ") + what + " dim " + std::to_string(dim);
  expect_close(f(x.gpu), f(x.cpu), tolerance(dt), name);
  const Tensor gh = host_input(x.cpu.shape(), Domain::real, dt, seed);
  auto grad_of = [&](const Tensor& xd) {
    Tensor leaf = xd.detach();
    leaf.requires_grad_();
    f(leaf).backward(gh.to(xd.device()));
    return leaf.grad();
  };
  expect_close(grad_of(x.gpu), grad_of(x.cpu), tolerance(dt), name + " backward");
}

TEST_P(CudaSoftmax, AlongEveryDim) {
  FORGE_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  for (View3 v : kViews3) {
    const Pair x = operand3(v, Domain::real, dt, 31);
    for (int64_t dim : {2, 1, 0, -1})
      for (bool log : {false, true}) check_softmax(x, dim, log, dt, 32, view_name(v));
  }
}

TEST_P(CudaSoftmax, LongRows) {
  FORGE_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  // The vocabulary (aligned: 16-byte vectors) and a longer unaligned row (scalar path).
  for (const Shape& shape : std::vector<Shape>{{4, 50304}, {2, 70001}, {3, 1}}) {
    const Pair x = on_both(host_input(shape, Domain::real, dt, 33));
    for (bool log : {false, true}) check_softmax(x, -1, log, dt, 34, shape_str(shape));
  }
  // A long non-last dim.
  const Pair y = on_both(host_input({2, 5000, 3}, Domain::real, dt, 35));
  for (bool log : {false, true}) check_softmax(y, 1, log, dt, 36, "[2, 5000, 3]");
}

INSTANTIATE_TEST_SUITE_P(FloatDTypes, CudaSoftmax, ::testing::ValuesIn(kFloatDTypes),
                         [](const ::testing::TestParamInfo<DType>& i) { return std::string(dtype_name(i.param)); });

TEST(CudaSoftmaxEdges, NaNAndInfinities) {
  FORGE_SKIP_WITHOUT_GPU();
  // Row 0: a NaN (all NaN out); row 1: only -inf (all NaN); row 2: -inf next to finite
  // values (exact zeros there); row 3: plain.
  const std::vector<double> v = {1, kNaN, 2,     3,     -kInf, -kInf, -kInf, -kInf,
                                 -kInf, 1, -kInf, 2, 0.5,   -1,    2,     0.25};
  for (DType dt : {DType::f32, DType::bf16}) {
    const Pair x = on_both(from_vector<double>(v, {4, 4}, {.dtype = dt}));
    for (int64_t dim : {1, 0}) {
      const std::string what = std::string(dtype_name(dt)) + " dim " + std::to_string(dim);
      expect_close_nonfinite(ops::softmax(x.gpu, dim), ops::softmax(x.cpu, dim), tolerance(dt), "softmax " + what);
      expect_close_nonfinite(ops::log_softmax(x.gpu, dim), ops::log_softmax(x.cpu, dim), tolerance(dt),
                             "log_softmax " + what);
    }
  }
}

}  // namespace
}  // namespace forge
