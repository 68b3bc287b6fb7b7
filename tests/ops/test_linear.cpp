// linear / linear_gelu on the CPU: the same values and gradients as the composite
// matmul(x, w^T) + b (and gelu_tanh of it), shapes, dtypes, error messages, and nn::Linear
// and nn::MLP running through them. Finite-difference gradients are in the gradcheck table
// (grad_cases_matmul.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "forge/autograd/deferred.h"
#include "forge/autograd/node.h"
#include "forge/forge.h"
#include "forge/nn/layers.h"
#include "forge/nn/linear.h"
#include "testing/tensor_testing.h"

namespace forge {
namespace {

using forge::testing::error_of;
using forge::testing::vals;

Tensor rnd(const Shape& s, uint64_t seed, DType dt = DType::f64) {
  Generator g(seed);
  return randn(s, {.dtype = dt}, &g);
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = vals(a), y = vals(b);
  EXPECT_EQ(x.size(), y.size());
  double m = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}

// linear(x, w, b) and the composite matmul(x, w^T) + b: values and all three gradients.
void expect_matches_composite(const Shape& x_shape, bool with_bias, bool gelu) {
  const Tensor x0 = rnd(x_shape, 1), w0 = rnd({5, x_shape.back()}, 2), b0 = rnd({5}, 3);
  Tensor x1 = x0.detach().requires_grad_(), w1 = w0.detach().requires_grad_(), b1 = b0.detach().requires_grad_();
  Tensor x2 = x0.detach().requires_grad_(), w2 = w0.detach().requires_grad_(), b2 = b0.detach().requires_grad_();
  const Tensor bias1 = with_bias ? b1 : Tensor();
  Tensor y1 = gelu ? ops::linear_gelu(x1, w1, bias1) : ops::linear(x1, w1, bias1);
  Tensor y2 = ops::matmul(x2, ops::transpose(w2, 0, 1));
  if (with_bias) y2 = ops::add(y2, b2);
  if (gelu) y2 = ops::gelu(y2, true);
  ASSERT_EQ(y1.shape(), y2.shape());
  EXPECT_LE(max_abs_diff(y1, y2), 1e-12);
  const Tensor g = rnd(y1.shape(), 4);
  y1.backward(g);
  y2.backward(g);
  EXPECT_LE(max_abs_diff(x1.grad(), x2.grad()), 1e-12);
  EXPECT_LE(max_abs_diff(w1.grad(), w2.grad()), 1e-12);
  if (with_bias) EXPECT_LE(max_abs_diff(b1.grad(), b2.grad()), 1e-12);
  else EXPECT_FALSE(b1.grad().defined());
}

TEST(Linear, MatchesMatmulPlusBias) {
  expect_matches_composite({3, 4}, true, false);
  expect_matches_composite({2, 3, 4}, true, false);
  expect_matches_composite({2, 3, 4}, false, false);
  expect_matches_composite({4}, true, false);
}

TEST(Linear, GeluMatchesComposite) {
  expect_matches_composite({3, 4}, true, true);
  expect_matches_composite({2, 3, 4}, false, true);
  expect_matches_composite({4}, true, true);
}

TEST(Linear, ShapesAndExactValues) {
  const Tensor x = from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor w = from_vector<double>({1, 0, 0, 0, 1, 1}, {2, 3});
  const Tensor b = from_vector<double>({10, 20}, {2});
  const Tensor y = ops::linear(x, w, b);
  EXPECT_EQ(y.shape(), (Shape{2, 2}));
  EXPECT_EQ(vals(y), (std::vector<double>{11, 25, 14, 31}));
  EXPECT_EQ(ops::linear(from_vector<double>({1, 2, 3}, {3}), w).shape(), (Shape{2}));
  EXPECT_EQ(ops::linear(zeros({0, 3}, {.dtype = DType::f64}), w, b).shape(), (Shape{0, 2}));
  // in_features = 0: the bias alone.
  EXPECT_EQ(vals(ops::linear(zeros({2, 0}, {.dtype = DType::f64}), zeros({2, 0}, {.dtype = DType::f64}), b)),
            (std::vector<double>{10, 20, 10, 20}));
}

TEST(Linear, NonContiguousInputs) {
  const Tensor x = rnd({4, 3}, 5).t();  // (3, 4) view
  const Tensor w = rnd({6, 8}, 6).slice(1, 0, 8, 2);  // (6, 4), every other column
  const Tensor b = rnd({12}, 7).slice(0, 0, 12, 2);   // (6), stride 2
  const Tensor ref = ops::add(ops::matmul(x, ops::transpose(w, 0, 1)), b);
  EXPECT_LE(max_abs_diff(ops::linear(x, w, b), ref), 1e-12);
}

TEST(Linear, SixteenBitDtypesRoundOnce) {
  for (DType dt : {DType::bf16, DType::f16}) {
    const Tensor x = rnd({7, 33}, 8).to(dt), w = rnd({9, 33}, 9).to(dt), b = rnd({9}, 10).to(dt);
    const Tensor y = ops::linear(x, w, b);
    EXPECT_EQ(y.dtype(), dt);
    const Tensor ref = ops::linear(x.to(DType::f32), w.to(DType::f32), b.to(DType::f32));
    const std::vector<double> got = vals(y), want = vals(ref);
    double num = 0, den = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      num += (got[i] - want[i]) * (got[i] - want[i]);
      den += want[i] * want[i];
    }
    EXPECT_LE(std::sqrt(num / den), 1e-2) << dtype_name(dt);
  }
}

TEST(Linear, Errors) {
  const Tensor x = zeros({2, 3}), w = zeros({4, 3}), b = zeros({4});
  EXPECT_NE(error_of([&] { ops::linear(zeros({2, 5}), w, b); }).find("does not end in in_features = 3"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ops::linear(x, w, zeros({3})); }).find("bias must have shape [4]"), std::string::npos);
  EXPECT_NE(error_of([&] { ops::linear(x, zeros({3})); }).find("weight must be 2-D"), std::string::npos);
  EXPECT_NE(error_of([&] { ops::linear(x, w.to(DType::f64), b); }).find("one floating dtype"), std::string::npos);
  EXPECT_NE(error_of([&] { ops::linear(zeros({2, 3}, {.dtype = DType::i64}), w, b); }).find("floating"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ops::linear_gelu(zeros({2, 5}), w, b); }).find("linear_gelu"), std::string::npos);
}

TEST(Linear, ModulesRunThroughTheOp) {
  nn::Linear lin(3, 4);
  const Tensor y = lin.forward(rnd({2, 3}, 11, DType::f32));
  ASSERT_TRUE(y.grad_fn());
  EXPECT_EQ(y.grad_fn()->name(), "linearBackward");
  const Tensor ref = ops::add(ops::matmul(rnd({2, 3}, 11, DType::f32), ops::transpose(lin.weight, 0, 1)), lin.bias);
  EXPECT_LE(max_abs_diff(y, ref), 1e-6);
  // The CPU MLP is linear -> gelu_tanh -> linear.
  nn::MLP mlp(3, 8);
  const Tensor x = rnd({2, 3}, 12, DType::f32);
  const Tensor want = ops::linear(ops::gelu(ops::linear(x, mlp.c_fc->weight, mlp.c_fc->bias), true),
                                  mlp.c_proj->weight, mlp.c_proj->bias);
  EXPECT_LE(max_abs_diff(mlp.forward(x), want), 1e-6);
}

}  // namespace
}  // namespace forge

namespace forge {
namespace {

// Note [weight gradients behind the collective]: a linear given a DeferredGrads returns dX in its
// backward and queues dW and db; running the queue hands them to the leaves (their hooks run then),
// with the values of the plain linear, bit for bit.
TEST(LinearDeferred, WeightGradientsWaitForTheQueueAndMatchThePlainLinear) {
  const Tensor x0 = rnd({3, 4, 6}, 11), w0 = rnd({5, 6}, 12), b0 = rnd({5}, 13), dy = rnd({3, 4, 5}, 14);
  Tensor x1 = x0.detach().requires_grad_(), w1 = w0.detach().requires_grad_(), b1 = b0.detach().requires_grad_();
  ops::linear(x1, w1, b1).backward(dy);
  Tensor x2 = x0.detach().requires_grad_(), w2 = w0.detach().requires_grad_(), b2 = b0.detach().requires_grad_();
  int hooks = 0;
  w2.register_grad_hook([&](const Tensor&) { ++hooks; });
  auto queue = std::make_shared<autograd::DeferredGrads>();
  ops::linear(x2, w2, b2, queue).backward(dy);
  EXPECT_EQ(vals(x2.grad()), vals(x1.grad())) << "dX comes at once";
  EXPECT_FALSE(w2.grad().defined()) << "dW waits for the queue";
  EXPECT_FALSE(b2.grad().defined());
  EXPECT_EQ(hooks, 0);
  ASSERT_FALSE(queue->empty());
  queue->run();
  EXPECT_TRUE(queue->empty());
  EXPECT_EQ(vals(w2.grad()), vals(w1.grad()));
  EXPECT_EQ(vals(b2.grad()), vals(b1.grad()));
  EXPECT_EQ(hooks, 1) << "the leaf's hooks run when its gradient lands (DDP's buckets)";
  // A second backward accumulates, as it would without the queue.
  ops::linear(x2, w2, b2, queue).backward(dy);
  queue->run();
  EXPECT_EQ(vals(w2.grad()), vals(ops::mul(w1.grad(), 2.0)));
  // on_first_push: called once, when the first weight gradient is queued (the sequence-parallel
  // entry starts its all-gather there), before it is queued; not again.
  int first = 0;
  size_t queued_then = 99;
  auto q2 = std::make_shared<autograd::DeferredGrads>();
  q2->on_first_push([&] { ++first, queued_then = q2->empty() ? 0 : 1; });
  Tensor x3 = x0.detach().requires_grad_(), w3 = w0.detach().requires_grad_();
  ops::add(ops::sum(ops::linear(x3, w3, Tensor(), q2)), ops::sum(ops::linear(x3, w3, Tensor(), q2))).backward();
  EXPECT_EQ(first, 1);
  EXPECT_EQ(queued_then, 0u);
  q2->run();
}

}  // namespace
}  // namespace forge

namespace forge {
namespace {

// A thread's DeferWeightGrads queue (ZB-H1's W pass) takes the weight gradients of the linears
// recorded while it is alive, nested guards restoring the outer queue; outside, linears are plain.
TEST(LinearDeferred, AThreadsQueueTakesTheLinearsRecordedUnderIt) {
  const Tensor x0 = rnd({4, 6}, 21), w0 = rnd({5, 6}, 22), dy = rnd({4, 5}, 23);
  auto outer = std::make_shared<autograd::DeferredGrads>(), inner = std::make_shared<autograd::DeferredGrads>();
  Tensor w = w0.detach().requires_grad_();
  Tensor y1, y2, y3;
  {
    autograd::DeferWeightGrads a(outer);
    y1 = ops::linear(x0, w);
    {
      autograd::DeferWeightGrads b(inner);
      y2 = ops::linear(x0, w);
    }
    y3 = ops::linear_gelu(x0, w, Tensor());
  }
  EXPECT_EQ(autograd::current_weight_grad_queue(), nullptr);
  y1.backward(dy);
  y2.backward(dy);
  EXPECT_FALSE(w.grad().defined()) << "queued, not computed";
  inner->run();
  const std::vector<double> one = vals(w.grad());
  y3.backward(dy);  // (the outer queue holds y1's and y3's)
  outer->run();
  Tensor plain = w0.detach().requires_grad_();
  ops::linear(x0, plain).backward(dy);
  EXPECT_EQ(one, vals(plain.grad())) << "the inner queue held the second linear's gradient";
  Tensor plain3 = w0.detach().requires_grad_();
  ops::linear(x0, plain3).backward(dy);
  ops::linear(x0, plain3).backward(dy);
  ops::linear_gelu(x0, plain3, Tensor()).backward(dy);
  EXPECT_EQ(vals(w.grad()), vals(plain3.grad()));
}

}  // namespace
}  // namespace forge
