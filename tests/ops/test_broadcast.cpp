// Broadcasting, type promotion and error messages of the elementwise ops.
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

TEST(Broadcast, ShapesFollowNumPyRules) {
  EXPECT_EQ(broadcast_shapes({2, 1, 3}, {4, 1}, "t"), (Shape{2, 4, 3}));
  EXPECT_EQ(broadcast_shapes({}, {3}, "t"), (Shape{3}));
  EXPECT_EQ(broadcast_shapes({5, 0}, {1}, "t"), (Shape{5, 0}));
  EXPECT_THROW(broadcast_shapes({2, 3}, {3, 2}, "t"), Error);
}

TEST(Broadcast, ValuesOfABroadcastAdd) {
  Tensor a = from_vector<double>({1, 2}, {2, 1});
  Tensor b = from_vector<double>({10, 20, 30}, {3});
  Tensor c = add(a, b);
  EXPECT_EQ(c.shape(), (Shape{2, 3}));
  EXPECT_EQ(vals(c), (std::vector<double>{11, 21, 31, 12, 22, 32}));
  EXPECT_EQ(vals(sub(b, a)), (std::vector<double>{9, 19, 29, 8, 18, 28}));
  EXPECT_EQ(vals(add(a, b, 2.0)), (std::vector<double>{21, 41, 61, 22, 42, 62}));
}

TEST(Broadcast, NonContiguousOperands) {
  Tensor m = arange(0.0, 6.0, 1.0, {.dtype = DType::f64}).view({2, 3});
  Tensor t = m.t();  // (3, 2)
  Tensor r = mul(t, from_vector<double>({1, 100}, {2}));
  EXPECT_EQ(vals(r), (std::vector<double>{0, 300, 1, 400, 2, 500}));
}

TEST(Broadcast, MismatchErrorNamesOpAndShapes) {
  const std::string m = error_of([] { add(zeros({2, 3}), zeros({4})); });
  EXPECT_NE(m.find("add"), std::string::npos) << m;
  EXPECT_NE(m.find("[2, 3]"), std::string::npos) << m;
  EXPECT_NE(m.find("[4]"), std::string::npos) << m;
}

TEST(Promotion, ResultDtypesMatchPyTorch) {
  auto t = [](DType d) { return ones({2}, {.dtype = d}); };
  EXPECT_EQ(add(t(DType::i32), t(DType::i64)).dtype(), DType::i64);
  EXPECT_EQ(add(t(DType::u8), t(DType::i32)).dtype(), DType::i32);
  EXPECT_EQ(add(t(DType::boolean), t(DType::i32)).dtype(), DType::i32);
  EXPECT_EQ(add(t(DType::i64), t(DType::f16)).dtype(), DType::f16);
  EXPECT_EQ(add(t(DType::f16), t(DType::bf16)).dtype(), DType::f32);
  EXPECT_EQ(mul(t(DType::bf16), t(DType::f32)).dtype(), DType::f32);
  EXPECT_EQ(div(t(DType::i64), t(DType::i64)).dtype(), DType::f32);  // true division
  EXPECT_EQ(add(t(DType::i64), 2.0).dtype(), DType::i64);            // like a Python int
  EXPECT_EQ(add(t(DType::i64), 2.5).dtype(), DType::f32);            // like a Python float
  EXPECT_EQ(mul(t(DType::bf16), 3.0).dtype(), DType::bf16);
  EXPECT_EQ(lt(t(DType::f32), t(DType::i32)).dtype(), DType::boolean);
  EXPECT_EQ(vals(div(from_vector<int64_t>({7}, {1}), from_vector<int64_t>({2}, {1}))), (std::vector<double>{3.5}));
  const std::string m = error_of([] { add(ones({2}, {.dtype = DType::boolean}), ones({2}, {.dtype = DType::boolean})); });
  EXPECT_NE(m.find("bool"), std::string::npos) << m;
}

TEST(Elementwise, ComparisonsWhereMaskedFill) {
  Tensor a = from_vector<double>({1, 5, 3}, {3});
  Tensor b = from_vector<double>({2, 5, 1}, {3});
  EXPECT_EQ(lt(a, b).to_vector<uint8_t>(), (std::vector<uint8_t>{1, 0, 0}));
  EXPECT_EQ(le(a, b).to_vector<uint8_t>(), (std::vector<uint8_t>{1, 1, 0}));
  EXPECT_EQ(eq(a, b).to_vector<uint8_t>(), (std::vector<uint8_t>{0, 1, 0}));
  EXPECT_EQ(ne(a, 5.0).to_vector<uint8_t>(), (std::vector<uint8_t>{1, 0, 1}));
  EXPECT_EQ(vals(where(gt(a, b), a, b)), (std::vector<double>{2, 5, 3}));
  EXPECT_EQ(vals(maximum(a, b)), (std::vector<double>{2, 5, 3}));
  EXPECT_EQ(vals(minimum(a, 2.0)), (std::vector<double>{1, 2, 2}));
  Tensor mask = from_vector<uint8_t>({0, 1, 0}, {3}).to(DType::boolean);
  EXPECT_EQ(vals(masked_fill(a, mask, -1.0)), (std::vector<double>{1, -1, 3}));
  EXPECT_NE(error_of([&] { where(a, a, b); }).find("bool"), std::string::npos);
  EXPECT_NE(error_of([&] { masked_fill(a, ones({2}, {.dtype = DType::boolean}), 0.0); }).find("masked_fill"),
            std::string::npos);
}

TEST(Elementwise, NaNPropagatesThroughMaximum) {
  Tensor a = from_vector<double>({std::nan(""), 1}, {2});
  Tensor b = from_vector<double>({0, std::nan("")}, {2});
  std::vector<double> m = vals(maximum(a, b));
  EXPECT_TRUE(std::isnan(m[0]));
  EXPECT_TRUE(std::isnan(m[1]));
}

TEST(Elementwise, UnaryValues) {
  Tensor x = from_vector<double>({-1.0, 0.0, 2.0}, {3});
  EXPECT_EQ(vals(relu(x)), (std::vector<double>{0, 0, 2}));
  EXPECT_EQ(vals(abs(x)), (std::vector<double>{1, 0, 2}));
  EXPECT_EQ(vals(neg(x)), (std::vector<double>{1, 0, -2}));
  EXPECT_NEAR(vals(gelu(x))[2], 2.0 * 0.5 * (1 + std::erf(2.0 / std::sqrt(2.0))), 1e-15);
  EXPECT_NEAR(vals(gelu(x, true))[0], -0.15880800939172324, 1e-12);  // GPT-2's tanh form
  EXPECT_NEAR(vals(silu(x))[2], 2.0 / (1 + std::exp(-2.0)), 1e-15);
  EXPECT_NEAR(vals(sigmoid(x))[0], 1 / (1 + std::exp(1.0)), 1e-15);
  EXPECT_NEAR(vals(rsqrt(from_vector<double>({4}, {1})))[0], 0.5, 1e-15);
  // integer inputs: neg/abs/relu keep the dtype, transcendental functions promote to f32
  Tensor i = from_vector<int64_t>({-3, 4}, {2});
  EXPECT_EQ(abs(i).dtype(), DType::i64);
  EXPECT_EQ(exp(i).dtype(), DType::f32);
  EXPECT_THROW(neg(ones({1}, {.dtype = DType::boolean})), Error);
}

TEST(Elementwise, SixteenBitComputeInFloat) {
  Tensor x = from_vector<float>({1.0f, 2.0f, 3.0f}, {3}, {.dtype = DType::bf16});
  Tensor y = exp(x);
  EXPECT_EQ(y.dtype(), DType::bf16);
  std::vector<double> v = vals(y);
  for (int k = 0; k < 3; ++k) EXPECT_NEAR(v[k], std::exp(k + 1.0), std::exp(k + 1.0) * 4e-3);
}

TEST(Elementwise, LargeParallelMatchesSerialSemantics) {
  // Exercises the OpenMP paths (contiguous chunks and strided outer ranges).
  Tensor a = randn({300, 513}, {.dtype = DType::f64});
  Tensor b = randn({513}, {.dtype = DType::f64});
  Tensor c = add(a.t().contiguous().t(), b);  // non-contiguous lhs
  std::vector<double> av = vals(a), bv = vals(b), cv = vals(c);
  for (int64_t i = 0; i < 300; i += 37)
    for (int64_t j = 0; j < 513; j += 41) EXPECT_EQ(cv[i * 513 + j], av[i * 513 + j] + bv[j]);
}

TEST(Elementwise, DeviceMismatchIsAnError) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "needs a GPU";
  const std::string m = error_of([] { add(zeros({2}), zeros({2}, {.device = Device::cuda(0)})); });
  EXPECT_NE(m.find("cuda:0"), std::string::npos) << m;
}

}  // namespace
}  // namespace forge

namespace forge {
namespace {

TEST(Promotion, ZeroDimTensorsRaiseOnlyAcrossCategories) {
  Tensor i32 = ones({2}, {.dtype = DType::i32}), f16 = ones({2}, {.dtype = DType::f16});
  EXPECT_EQ(ops::add(i32, scalar_tensor(2, {.dtype = DType::i64})).dtype(), DType::i32);
  EXPECT_EQ(ops::add(f16, scalar_tensor(2, {.dtype = DType::f32})).dtype(), DType::f16);
  EXPECT_EQ(ops::add(i32, scalar_tensor(2, {.dtype = DType::f64})).dtype(), DType::f64);
  EXPECT_EQ(ops::add(scalar_tensor(2, {.dtype = DType::i32}), scalar_tensor(2, {.dtype = DType::i64})).dtype(),
            DType::i64);
  EXPECT_EQ(ops::add(ones({2}, {.dtype = DType::boolean}), 3.0).dtype(), DType::i64);
  EXPECT_EQ(ops::where(ones({2}, {.dtype = DType::boolean}), f16, scalar_tensor(1.0)).dtype(), DType::f16);
}

TEST(Item, LargeIntegersAreExact) {
  const int64_t big = (int64_t{1} << 62) + 1;
  EXPECT_EQ(from_vector<int64_t>({big}, {1}).item<int64_t>(), big);
}

}  // namespace
}  // namespace forge
