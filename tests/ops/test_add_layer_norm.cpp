// ops::add_layer_norm (the residual add fused with the layer norm after it): the same bits as
// ops::add followed by ops::layer_norm, forward and backward, in every float dtype; gradients
// from other uses of h are added to the norm's; only the needed gradients are computed; errors
// name the op and the shapes; GPT (which fuses every residual add with the next LayerNorm) gives
// the bits of the unfused composition. Finite differences live in grad_cases_nn.cpp.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "forge/forge.h"
#include "ops/add_norm_testing.h"
#include "forge/nn/gpt.h"

namespace forge {
namespace {

using namespace add_norm_testing;

class AddLayerNormDtypes : public ::testing::TestWithParam<DType> {};

// Runs loss = <y, gy> + <h, gh> both ways; compares outputs and every gradient bit for bit.
TEST_P(AddLayerNormDtypes, SameBitsAsAddThenLayerNorm) {
  const DType dt = GetParam();
  const Shape shape{3, 5, 24};
  const int64_t C = shape.back();
  Generator g(7);
  const Tensor gy = randn(shape, {}, &g).to(dt), gh = randn(shape, {}, &g).to(dt);
  struct Run {
    Tensor h, y, dx, dr, dw, db;
  };
  auto run = [&](bool fused) {
    Tensor x = input(shape, dt, 1), r = input(shape, dt, 2);
    Tensor w = input({C}, dt, 3), b = input({C}, dt, 4);
    Tensor h, y;
    if (fused) {
      ops::AddLayerNorm o = ops::add_layer_norm(x, r, w, b, 1e-5);
      h = o.h;
      y = o.y;
    } else {
      h = ops::add(x, r);
      y = ops::layer_norm(h, w, b, 1e-5);
    }
    autograd::backward({y, h}, {gy, gh});
    return Run{h.detach(), y.detach(), x.grad(), r.grad(), w.grad(), b.grad()};
  };
  const Run a = run(true), e = run(false);
  EXPECT_TRUE(bitwise_equal(a.h, e.h)) << "h";
  EXPECT_TRUE(bitwise_equal(a.y, e.y)) << "y";
  EXPECT_TRUE(bitwise_equal(a.dx, e.dx)) << "dx";
  EXPECT_TRUE(bitwise_equal(a.dr, e.dr)) << "dresidual";
  EXPECT_TRUE(bitwise_equal(a.dw, e.dw)) << "dweight";
  EXPECT_TRUE(bitwise_equal(a.db, e.db)) << "dbias";
  EXPECT_TRUE(bitwise_equal(a.dx, a.dr)) << "x and residual receive the same gradient";
}

INSTANTIATE_TEST_SUITE_P(AllFloat, AddLayerNormDtypes,
                         ::testing::Values(DType::f32, DType::f64, DType::bf16, DType::f16),
                         [](const ::testing::TestParamInfo<DType>& i) { return std::string(dtype_name(i.param)); });

TEST(AddLayerNorm, NonContiguousInputsAndNoParameters) {
  Tensor xt = input({6, 4}, DType::f32, 11);  // used as its transpose (4, 6)
  Tensor r = input({4, 12}, DType::f32, 12);  // every other column: (4, 6)
  ops::AddLayerNorm o = ops::add_layer_norm(xt.t(), r.slice(1, 0, 12, 2));
  const Tensor h = ops::add(xt.t(), r.slice(1, 0, 12, 2));
  EXPECT_TRUE(bitwise_equal(o.h, h));
  EXPECT_TRUE(bitwise_equal(o.y, ops::layer_norm(h)));
  ops::sum(o.y * o.y + o.h).backward();
  ASSERT_TRUE(xt.grad().defined() && r.grad().defined());
  EXPECT_EQ(xt.grad().shape(), (Shape{6, 4}));
  EXPECT_EQ(r.grad().shape(), (Shape{4, 12}));
}

TEST(AddLayerNorm, OnlyTheNeededGradients) {
  Tensor x = input({2, 8}, DType::f32, 21, false), r = input({2, 8}, DType::f32, 22, false);
  Tensor w = input({8}, DType::f32, 23), b = input({8}, DType::f32, 24, false);
  ops::AddLayerNorm o = ops::add_layer_norm(x, r, w, b);
  EXPECT_FALSE(o.h.requires_grad());  // neither x nor residual needs a gradient
  ops::sum(o.y).backward();
  EXPECT_TRUE(w.grad().defined());
  EXPECT_FALSE(b.grad().defined());
  {
    NoGradGuard no_grad;
    Tensor xg = input({2, 8}, DType::f32, 25);
    ops::AddLayerNorm n = ops::add_layer_norm(xg, r, w, b);
    EXPECT_FALSE(n.h.requires_grad() || n.y.requires_grad());
  }
}

// GPT fuses every residual add with the LayerNorm after it (Note [fused residual + layer norm
// in GPT]): its logits and every parameter gradient must be the bits of the plain composition.
TEST(AddLayerNorm, GptEqualsTheUnfusedComposition) {
  nn::GPTConfig c;
  c.vocab_size = 37;
  c.block_size = 16;
  c.n_layer = 3;
  c.n_head = 2;
  c.n_embd = 24;
  const nn::GPT model(c, 3);
  Generator g(5);
  const Tensor idx = randint(0, c.vocab_size, {2, 16}, {.dtype = DType::i64}, &g);
  const Tensor w = randn({2, 16, c.vocab_size}, {}, &g);
  auto unfused = [&] {
    Tensor x = ops::add(model.wte->forward(idx), model.wpe->forward(arange(16, {.dtype = DType::i64})));
    for (const auto& b : model.h) {
      x = ops::add(x, b->attn->forward(b->ln_1->forward(x)));
      x = ops::add(x, b->mlp->forward(b->ln_2->forward(x)));
    }
    return ops::matmul(model.ln_f->forward(x), ops::transpose(model.wte->weight, 0, 1));
  };
  auto run = [&](const std::function<Tensor()>& forward) { return logits_and_grads(model, forward, w); };
  const std::vector<Tensor> fused = run([&] { return model.forward(idx); }), plain = run(unfused);
  ASSERT_EQ(fused.size(), plain.size());
  EXPECT_TRUE(bitwise_equal(fused[0], plain[0])) << "logits";
  for (size_t i = 1; i < fused.size(); ++i) EXPECT_TRUE(bitwise_equal(fused[i], plain[i])) << "gradient " << i;
}

TEST(AddLayerNorm, Errors) {
  const Tensor x = zeros({2, 4}), w = ones({4});
  std::string m = message([&] { ops::add_layer_norm(x, zeros({2, 3}), w); });
  EXPECT_NE(m.find("add_layer_norm"), std::string::npos) << m;
  EXPECT_NE(m.find("[2, 3]"), std::string::npos) << m;
  m = message([&] { ops::add_layer_norm(x, zeros({2, 4}, {.dtype = DType::f64}), w); });
  EXPECT_NE(m.find("f64"), std::string::npos) << m;
  m = message([&] { ops::add_layer_norm(x, Tensor(), w); });
  EXPECT_NE(m.find("residual"), std::string::npos) << m;
  m = message([&] { ops::add_layer_norm(x, zeros({2, 4}), ones({3})); });
  EXPECT_NE(m.find("weight"), std::string::npos) << m;
}

}  // namespace
}  // namespace forge
