// matmul / mm / bmm: exact small products, every rank combination, the BLAS layouts
// (transposed without a copy, packed), dtypes and error messages.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "forge/forge.h"
#include "testing/tensor_testing.h"

namespace forge {
namespace {

using forge::testing::error_of;
using forge::testing::seq;
using forge::testing::vals;

using namespace forge::ops;

// ||x - ref|| / ||ref||
double rel_err(const Tensor& x, const Tensor& ref) {
  const std::vector<double> a = vals(x), b = vals(ref);
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / den);
}

// The reference product of two 2-D f64 tensors, by definition.
std::vector<double> naive_mm(const Tensor& a, const Tensor& b) {
  const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
  const std::vector<double> av = vals(a), bv = vals(b);
  std::vector<double> out(static_cast<size_t>(M * N), 0.0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) out[m * N + n] += av[m * K + k] * bv[k * N + n];
  return out;
}

Tensor rnd(const Shape& s, uint64_t seed, DType dt = DType::f64) {
  Generator g(seed);
  return randn(s, {.dtype = dt}, &g);
}

TEST(Matmul, ExactTwoByThreeTimesThreeByTwo) {
  Tensor a = from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = from_vector<double>({7, 8, 9, 10, 11, 12}, {3, 2});
  Tensor c = matmul(a, b);
  EXPECT_EQ(c.shape(), (Shape{2, 2}));
  EXPECT_EQ(vals(c), (std::vector<double>{58, 64, 139, 154}));
  EXPECT_EQ(vals(mm(a, b)), (std::vector<double>{58, 64, 139, 154}));
  EXPECT_EQ(vals(a.matmul(b)), (std::vector<double>{58, 64, 139, 154}));
}

TEST(Matmul, OneDimensionalOperands) {
  Tensor v = from_vector<double>({1, 2, 3}, {3});
  Tensor w = from_vector<double>({4, 5, 6}, {3});
  Tensor dot = matmul(v, w);
  EXPECT_EQ(dot.dim(), 0);
  EXPECT_EQ(dot.item(), 32.0);
  Tensor m = from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor mv = matmul(m, v);  // (2, 3) @ (3) -> (2)
  EXPECT_EQ(mv.shape(), (Shape{2}));
  EXPECT_EQ(vals(mv), (std::vector<double>{14, 32}));
  Tensor u = from_vector<double>({1, 2}, {2});
  Tensor vm = matmul(u, m);  // (2) @ (2, 3) -> (3)
  EXPECT_EQ(vm.shape(), (Shape{3}));
  EXPECT_EQ(vals(vm), (std::vector<double>{9, 12, 15}));
  // Batched with a vector on either side.
  Tensor bm = stack({m, mul(m, 2.0)});  // (2, 2, 3)
  EXPECT_EQ(matmul(bm, v).shape(), (Shape{2, 2}));
  EXPECT_EQ(vals(matmul(bm, v)), (std::vector<double>{14, 32, 28, 64}));
  EXPECT_EQ(matmul(u, bm).shape(), (Shape{2, 3}));
  EXPECT_EQ(vals(matmul(u, bm)), (std::vector<double>{9, 12, 15, 18, 24, 30}));
}

TEST(Matmul, BroadcastBatchDims) {
  Tensor a = rnd({2, 1, 3, 4}, 1), b = rnd({5, 4, 2}, 2);
  Tensor c = matmul(a, b);
  ASSERT_EQ(c.shape(), (Shape{2, 5, 3, 2}));
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 5; ++j) {
      const std::vector<double> ref = naive_mm(a.select(0, i).select(0, 0), b.select(0, j));
      const std::vector<double> got = vals(c.select(0, i).select(0, j));
      for (size_t k = 0; k < ref.size(); ++k) EXPECT_NEAR(got[k], ref[k], 1e-12);
    }
}

TEST(Matmul, BatchedTimesMatrixFoldsAndMatchesPerBatch) {
  Tensor a = rnd({3, 4, 5}, 3), b = rnd({5, 6}, 4);
  Tensor c = matmul(a, b);
  ASSERT_EQ(c.shape(), (Shape{3, 4, 6}));
  for (int64_t i = 0; i < 3; ++i) {
    const std::vector<double> ref = naive_mm(a.select(0, i), b), got = vals(c.select(0, i));
    for (size_t k = 0; k < ref.size(); ++k) EXPECT_NEAR(got[k], ref[k], 1e-12);
  }
  // A non-foldable (permuted) batch goes through the batched path and agrees.
  Tensor ap = rnd({4, 3, 5}, 5).permute({1, 0, 2});  // (3, 4, 5), batch stride 5
  EXPECT_LT(rel_err(matmul(ap, b), matmul(ap.contiguous(), b)), 1e-14);
}

TEST(Matmul, TransposedOperandsGiveTheContiguousNumbers) {
  for (DType dt : {DType::f32, DType::f64}) {
    Tensor at = rnd({5, 7}, 6, dt).t();  // (7, 5), strides (1, 7): CblasTrans, no copy
    Tensor bt = rnd({3, 5}, 7, dt).t();  // (5, 3), strides (1, 5)
    ASSERT_FALSE(at.is_contiguous());
    Tensor ref = matmul(at.contiguous(), bt.contiguous());
    const double tol = dt == DType::f32 ? 1e-6 : 1e-14;
    EXPECT_LT(rel_err(matmul(at, bt), ref), tol);
    EXPECT_LT(rel_err(matmul(at, bt.contiguous()), ref), tol);
    EXPECT_LT(rel_err(matmul(at.contiguous(), bt), ref), tol);
    // Batched, transposed in the last two dims.
    Tensor ab = rnd({2, 5, 7}, 8, dt).transpose(1, 2);
    Tensor bb = rnd({2, 5, 3}, 9, dt);
    EXPECT_LT(rel_err(bmm(ab, bb), bmm(ab.contiguous(), bb)), tol);
  }
}

TEST(Matmul, RowSlicedAndStridedOperands) {
  // A row-sliced matrix (ld > cols) goes to BLAS directly; a column-strided one is packed.
  Tensor wide = rnd({4, 10}, 10);
  Tensor rows = wide.narrow(1, 2, 5);          // (4, 5), strides (10, 1)
  Tensor every_other = wide.slice(1, 0, 10, 2);  // (4, 5), strides (10, 2)
  Tensor b = rnd({5, 3}, 11);
  EXPECT_LT(rel_err(matmul(rows, b), matmul(rows.contiguous(), b)), 1e-14);
  EXPECT_LT(rel_err(matmul(every_other, b), matmul(every_other.contiguous(), b)), 1e-14);
  // Stride-0 (expanded) matrix.
  Tensor row = rnd({1, 5}, 12);
  Tensor ex = row.expand({4, 5});
  EXPECT_LT(rel_err(matmul(ex, b), matmul(ex.contiguous(), b)), 1e-14);
}

TEST(Matmul, F32AndF64AgreeOnRandom64x48x32) {
  Tensor a = rnd({64, 48}, 13), b = rnd({48, 32}, 14);
  Tensor c64 = matmul(a, b);
  Tensor c32 = matmul(a.to(DType::f32), b.to(DType::f32));
  EXPECT_EQ(c32.dtype(), DType::f32);
  EXPECT_LT(rel_err(c32, c64), 1e-5);
  const std::vector<double> ref = naive_mm(a, b), got = vals(c64);
  for (size_t k = 0; k < ref.size(); ++k) EXPECT_NEAR(got[k], ref[k], 1e-10);
}

TEST(Matmul, HalfPrecisionWithinTolerance) {
  for (DType dt : {DType::bf16, DType::f16}) {
    Tensor a = rnd({33, 40}, 15, dt), b = rnd({40, 17}, 16, dt);
    Tensor c = matmul(a, b);
    EXPECT_EQ(c.dtype(), dt);
    Tensor ref = matmul(a.to(DType::f64), b.to(DType::f64));
    EXPECT_LT(rel_err(c, ref), 1e-2) << dtype_name(dt);
    // Transposed and batched-broadcast half operands take the same path.
    Tensor at = rnd({40, 33}, 17, dt).t();
    EXPECT_LT(rel_err(matmul(at, b), matmul(at.to(DType::f64), b.to(DType::f64))), 1e-2);
    Tensor ab = rnd({3, 1, 5, 40}, 18, dt);
    EXPECT_LT(rel_err(matmul(ab, b), matmul(ab.to(DType::f64), b.to(DType::f64))), 1e-2);
  }
}

TEST(Matmul, IntegerProductsAreExact) {
  Tensor a = from_vector<int64_t>({1, -2, 3, 4, 5, -6}, {2, 3});
  Tensor b = from_vector<int64_t>({7, 8, 9, 10, 11, 12}, {3, 2});
  Tensor c = matmul(a, b);
  EXPECT_EQ(c.dtype(), DType::i64);
  EXPECT_EQ(c.to_vector<int64_t>(), (std::vector<int64_t>{22, 24, 7, 10}));
  Tensor c32 = matmul(a.to(DType::i32), b.to(DType::i32).t().contiguous().t());
  EXPECT_EQ(c32.dtype(), DType::i32);
  EXPECT_EQ(c32.to_vector<int64_t>(), (std::vector<int64_t>{22, 24, 7, 10}));
  Tensor v = from_vector<int64_t>({1, 1, 1}, {3});
  EXPECT_EQ(matmul(a, v).to_vector<int64_t>(), (std::vector<int64_t>{2, 3}));
}

TEST(Matmul, EmptyDims) {
  Tensor c = matmul(zeros({2, 0}), zeros({0, 3}));  // an empty sum: zeros
  EXPECT_EQ(c.shape(), (Shape{2, 3}));
  EXPECT_EQ(vals(c), std::vector<double>(6, 0.0));
  EXPECT_EQ(matmul(zeros({0, 3}), ones({3, 2})).shape(), (Shape{0, 2}));
  EXPECT_EQ(matmul(ones({4, 0, 3}), ones({3, 2})).shape(), (Shape{4, 0, 2}));
}

TEST(Matmul, BackwardValues) {
  Tensor a = from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3}).requires_grad_();
  Tensor b = from_vector<double>({1, 0, 2, 1, 0, 3}, {3, 2}).requires_grad_();
  matmul(a, b).sum().backward();
  // d sum(ab)/da = 1 b^T: every row is b's row sums; d/db = a^T 1: every column is a's column sums.
  EXPECT_EQ(vals(a.grad()), (std::vector<double>{1, 3, 3, 1, 3, 3}));
  EXPECT_EQ(vals(b.grad()), (std::vector<double>{5, 5, 7, 7, 9, 9}));
}

TEST(Matmul, BackwardShapesAndMask) {
  Tensor a = rnd({2, 1, 3, 4}, 19).requires_grad_();
  Tensor b = rnd({5, 4, 2}, 20);  // no grad: only a's gradient is computed
  matmul(a, b).sum().backward();
  EXPECT_EQ(a.grad().shape(), (Shape{2, 1, 3, 4}));
  EXPECT_FALSE(b.grad().defined());
  Tensor v = rnd({4}, 21).requires_grad_();
  Tensor m = rnd({2, 4, 3}, 22).requires_grad_();
  matmul(v, m).sum().backward();
  EXPECT_EQ(v.grad().shape(), (Shape{4}));
  EXPECT_EQ(m.grad().shape(), (Shape{2, 4, 3}));
  Tensor x = rnd({3}, 23).requires_grad_(), y = rnd({3}, 24).requires_grad_();
  matmul(x, y).backward();
  EXPECT_LT(rel_err(x.grad(), y), 1e-15);
  EXPECT_LT(rel_err(y.grad(), x), 1e-15);
}

TEST(Matmul, BadShapesNameOpAndShapes) {
  std::string m = error_of([] { matmul(zeros({2, 3}), zeros({4, 5})); });
  EXPECT_NE(m.find("matmul: shapes [2, 3] and [4, 5] cannot be multiplied (3 != 4)"), std::string::npos) << m;
  m = error_of([] { matmul(zeros({3}), zeros({4})); });
  EXPECT_NE(m.find("matmul"), std::string::npos) << m;
  EXPECT_NE(m.find("[3]"), std::string::npos) << m;
  EXPECT_NE(m.find("[4]"), std::string::npos) << m;
  m = error_of([] { matmul(zeros({2, 3, 4}), zeros({3, 4, 5})); });
  EXPECT_NE(m.find("matmul"), std::string::npos) << m;
  EXPECT_NE(m.find("[2, 3, 4]"), std::string::npos) << m;
  EXPECT_NE(m.find("[3, 4, 5]"), std::string::npos) << m;
  m = error_of([] { matmul(zeros({}), zeros({3})); });
  EXPECT_NE(m.find("matmul"), std::string::npos) << m;
}

TEST(Matmul, DtypeMismatchIsAnError) {
  const std::string m = error_of([] { matmul(zeros({2, 3}), zeros({3, 4}, {.dtype = DType::f64})); });
  EXPECT_NE(m.find("matmul"), std::string::npos) << m;
  EXPECT_NE(m.find("f32"), std::string::npos) << m;
  EXPECT_NE(m.find("f64"), std::string::npos) << m;
  EXPECT_NE(m.find("[2, 3]"), std::string::npos) << m;
  EXPECT_NE(m.find("[3, 4]"), std::string::npos) << m;
  EXPECT_THROW(matmul(ones({2, 2}, {.dtype = DType::boolean}), ones({2, 2}, {.dtype = DType::boolean})), Error);
}

TEST(MatmulMm, RequiresTwoDims) {
  const std::string m = error_of([] { mm(zeros({2, 3, 4}), zeros({4, 5})); });
  EXPECT_NE(m.find("mm"), std::string::npos) << m;
  EXPECT_NE(m.find("[2, 3, 4]"), std::string::npos) << m;
  EXPECT_NE(m.find("[4, 5]"), std::string::npos) << m;
  const std::string k = error_of([] { mm(zeros({2, 3}), zeros({2, 3})); });
  EXPECT_NE(k.find("mm: shapes [2, 3] and [2, 3] cannot be multiplied (3 != 2)"), std::string::npos) << k;
}

TEST(MatmulBmm, RequiresThreeDimsAndEqualBatch) {
  Tensor a = rnd({3, 2, 4}, 25), b = rnd({3, 4, 5}, 26);
  Tensor c = bmm(a, b);
  EXPECT_EQ(c.shape(), (Shape{3, 2, 5}));
  for (int64_t i = 0; i < 3; ++i) {
    const std::vector<double> ref = naive_mm(a.select(0, i), b.select(0, i)), got = vals(c.select(0, i));
    for (size_t k = 0; k < ref.size(); ++k) EXPECT_NEAR(got[k], ref[k], 1e-12);
  }
  std::string m = error_of([] { bmm(zeros({2, 3, 4}), zeros({3, 4, 5})); });
  EXPECT_NE(m.find("bmm"), std::string::npos) << m;
  EXPECT_NE(m.find("[2, 3, 4]"), std::string::npos) << m;
  EXPECT_NE(m.find("[3, 4, 5]"), std::string::npos) << m;
  m = error_of([] { bmm(zeros({3, 4}), zeros({4, 5})); });
  EXPECT_NE(m.find("bmm"), std::string::npos) << m;
  EXPECT_NE(m.find("[3, 4]"), std::string::npos) << m;
}

}  // namespace
}  // namespace forge
