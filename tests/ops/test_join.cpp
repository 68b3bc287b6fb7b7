// cat / stack / split / chunk: values, shapes, dtype promotion, views, gradients, errors.
#include <gtest/gtest.h>

#include <functional>

#include "forge/forge.h"
#include "testing/tensor_testing.h"

namespace forge {
namespace {

using forge::testing::error_of;
using forge::testing::seq;
using forge::testing::vals;

using namespace forge::ops;

std::vector<Shape> shapes_of(const TensorList& ts) {
  std::vector<Shape> s;
  for (const Tensor& t : ts) s.push_back(t.shape());
  return s;
}

TEST(JoinCat, AlongEachDim) {
  Tensor a = seq(0, {2, 2}), b = seq(10, {1, 2}), c = seq(20, {2, 1});
  Tensor r0 = cat({a, b}, 0);
  EXPECT_EQ(r0.shape(), (Shape{3, 2}));
  EXPECT_EQ(vals(r0), (std::vector<double>{0, 1, 2, 3, 10, 11}));
  Tensor r1 = cat({a, c, a}, -1);
  EXPECT_EQ(r1.shape(), (Shape{2, 5}));
  EXPECT_EQ(vals(r1), (std::vector<double>{0, 1, 20, 0, 1, 2, 3, 21, 2, 3}));
  // Non-contiguous inputs are read through their strides.
  Tensor t = seq(0, {2, 3}).t();  // (3, 2)
  EXPECT_EQ(vals(cat({t, t}, 1)), (std::vector<double>{0, 3, 0, 3, 1, 4, 1, 4, 2, 5, 2, 5}));
  EXPECT_EQ(vals(cat({a}, 0)), vals(a));
}

TEST(JoinCat, PromotesDtypesAndSkipsLegacyEmpty) {
  Tensor i = from_vector<int32_t>({1, 2}, {2});
  Tensor f = from_vector<float>({0.5f}, {1});
  Tensor r = cat({i, f});
  EXPECT_EQ(r.dtype(), DType::f32);
  EXPECT_EQ(vals(r), (std::vector<double>{1, 2, 0.5}));
  EXPECT_EQ(cat({i, from_vector<int64_t>({7}, {1})}).dtype(), DType::i64);
  // A 1-D tensor of size 0 joins anything (torch's legacy rule).
  Tensor m = seq(0, {2, 2});
  Tensor e = cat({zeros({0}, {.dtype = DType::f64}), m, zeros({0}, {.dtype = DType::f64})}, 1);
  EXPECT_EQ(e.shape(), (Shape{2, 2}));
  EXPECT_EQ(vals(e), vals(m));
  EXPECT_EQ(cat({zeros({0}), zeros({0})}).shape(), (Shape{0}));
  EXPECT_EQ(cat({zeros({2, 0}), ones({2, 3})}, 1).shape(), (Shape{2, 3}));
}

TEST(JoinCat, GradientIsSlicedPerInput) {
  Tensor a = seq(0, {2, 2}).requires_grad_(), b = seq(0, {2, 1}).requires_grad_();
  Tensor w = from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3});
  mul(cat({a, b}, 1), w).sum().backward();
  EXPECT_EQ(vals(a.grad()), (std::vector<double>{1, 2, 4, 5}));
  EXPECT_EQ(vals(b.grad()), (std::vector<double>{3, 6}));
  // A f32 input of an f64 result gets an f32 gradient.
  Tensor s = from_vector<float>({1, 2}, {2}).requires_grad_();
  Tensor d = from_vector<double>({3}, {1}).requires_grad_();
  mul(cat({s, d}), from_vector<double>({10, 20, 30}, {3})).sum().backward();
  EXPECT_EQ(s.grad().dtype(), DType::f32);
  EXPECT_EQ(vals(s.grad()), (std::vector<double>{10, 20}));
  EXPECT_EQ(vals(d.grad()), (std::vector<double>{30}));
}

TEST(JoinCat, MismatchErrorsNameOpDimAndShapes) {
  std::string m = error_of([] { cat({zeros({2, 3}), zeros({3, 4})}, 1); });
  EXPECT_NE(m.find("cat"), std::string::npos) << m;
  EXPECT_NE(m.find("dim 1"), std::string::npos) << m;
  EXPECT_NE(m.find("[2, 3]"), std::string::npos) << m;
  EXPECT_NE(m.find("[3, 4]"), std::string::npos) << m;
  m = error_of([] { cat({zeros({2, 3}), zeros({2, 3, 1})}, 0); });
  EXPECT_NE(m.find("cat"), std::string::npos) << m;
  EXPECT_NE(m.find("[2, 3, 1]"), std::string::npos) << m;
  m = error_of([] { cat({}, 0); });
  EXPECT_NE(m.find("cat"), std::string::npos) << m;
  m = error_of([] { cat({zeros({2}), zeros({2})}, 1); });
  EXPECT_NE(m.find("cat"), std::string::npos) << m;
  EXPECT_THROW(cat({scalar_tensor(1.0), scalar_tensor(2.0)}), Error);
}

TEST(JoinStack, NewDimAtEachPosition) {
  Tensor a = seq(0, {2, 3}), b = seq(10, {2, 3});
  EXPECT_EQ(stack({a, b}).shape(), (Shape{2, 2, 3}));
  EXPECT_EQ(vals(stack({a, b})), (std::vector<double>{0, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15}));
  Tensor s1 = stack({a, b}, 1);
  EXPECT_EQ(s1.shape(), (Shape{2, 2, 3}));
  EXPECT_EQ(vals(s1), (std::vector<double>{0, 1, 2, 10, 11, 12, 3, 4, 5, 13, 14, 15}));
  Tensor s2 = stack({a, b}, -1);
  EXPECT_EQ(s2.shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(vals(s2), (std::vector<double>{0, 10, 1, 11, 2, 12, 3, 13, 4, 14, 5, 15}));
  Tensor v = stack({scalar_tensor(1.0), scalar_tensor(2.0)});
  EXPECT_EQ(v.shape(), (Shape{2}));
  const std::string m = error_of([&] { stack({a, seq(0, {3, 2})}); });
  EXPECT_NE(m.find("stack"), std::string::npos) << m;
  EXPECT_NE(m.find("[2, 3]"), std::string::npos) << m;
  EXPECT_NE(m.find("[3, 2]"), std::string::npos) << m;
  EXPECT_THROW(stack({a, b}, 3), Error);
}

TEST(JoinSplit, BySizeAndBySizes) {
  Tensor x = seq(0, {5, 2});
  TensorList p = split(x, 2);
  EXPECT_EQ(shapes_of(p), (std::vector<Shape>{{2, 2}, {2, 2}, {1, 2}}));
  EXPECT_EQ(vals(p[2]), (std::vector<double>{8, 9}));
  // Views: same storage, no copy.
  EXPECT_EQ(p[1].storage().get(), x.storage().get());
  EXPECT_EQ(p[1].offset(), 4);
  EXPECT_EQ(split(x, 7).size(), 1u);
  TensorList q = split(x, std::vector<int64_t>{1, 0, 1}, 1);
  EXPECT_EQ(shapes_of(q), (std::vector<Shape>{{5, 1}, {5, 0}, {5, 1}}));
  EXPECT_EQ(vals(q[2]), (std::vector<double>{1, 3, 5, 7, 9}));
  EXPECT_EQ(split(zeros({0, 3}), 0).size(), 1u);
  std::string m = error_of([&] { split(x, std::vector<int64_t>{2, 2}); });
  EXPECT_NE(m.find("split"), std::string::npos) << m;
  EXPECT_NE(m.find("[5, 2]"), std::string::npos) << m;
  m = error_of([&] { split(x, 0); });
  EXPECT_NE(m.find("split"), std::string::npos) << m;
}

TEST(JoinChunk, PiecesLikeTorch) {
  EXPECT_EQ(shapes_of(chunk(zeros({7}), 3)), (std::vector<Shape>{{3}, {3}, {1}}));
  EXPECT_EQ(shapes_of(chunk(zeros({6}), 4)), (std::vector<Shape>{{2}, {2}, {2}}));  // fewer than asked
  EXPECT_EQ(shapes_of(chunk(zeros({2, 5}), 5, 1)), (std::vector<Shape>{{2, 1}, {2, 1}, {2, 1}, {2, 1}, {2, 1}}));
  EXPECT_EQ(shapes_of(chunk(zeros({0}), 3)), (std::vector<Shape>{{0}, {0}, {0}}));
  Tensor x = seq(0, {2, 4});
  EXPECT_EQ(vals(chunk(x, 2, -1)[1]), (std::vector<double>{2, 3, 6, 7}));
  EXPECT_THROW(chunk(x, 0), Error);
}

TEST(JoinSplit, GradientFlowsToThePiecesUsed) {
  Tensor x = seq(0, {4, 2}).requires_grad_();
  TensorList p = chunk(x, 2);
  add(mul(p[0], 2.0), mul(p[1], 3.0)).sum().backward();
  EXPECT_EQ(vals(x.grad()), (std::vector<double>{2, 2, 2, 2, 3, 3, 3, 3}));
  Tensor y = seq(0, {3}).requires_grad_();
  split(y, std::vector<int64_t>{1, 2})[1].sum().backward();
  EXPECT_EQ(vals(y.grad()), (std::vector<double>{0, 1, 1}));
}

}  // namespace
}  // namespace forge
