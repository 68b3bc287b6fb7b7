// ops::add_rms_norm (the residual add fused with the RMS norm after it): the same bits as
// ops::add followed by ops::rms_norm, forward and backward, in every float dtype; gradients from
// other uses of h are added to the norm's; errors name the op and the shapes; LLaMA (which fuses
// every residual add with the next RMSNorm, Note [fused residual + RMS norm in LLaMA]) gives the
// bits of the unfused composition. Finite differences: the op table (op_cases_nn.cpp).
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "forge/forge.h"
#include "ops/add_norm_testing.h"
#include "forge/nn/llama.h"

namespace forge {
namespace {

using namespace add_norm_testing;

class AddRmsNormDtypes : public ::testing::TestWithParam<DType> {};

TEST_P(AddRmsNormDtypes, SameBitsAsAddThenRmsNorm) {
  const DType dt = GetParam();
  const Shape shape{3, 5, 24};
  const int64_t C = shape.back();
  Generator g(7);
  const Tensor gy = randn(shape, {}, &g).to(dt), gh = randn(shape, {}, &g).to(dt);
  struct Run {
    Tensor h, y, dx, dr, dw;
  };
  auto run = [&](bool fused) {
    Tensor x = input(shape, dt, 1), r = input(shape, dt, 2), w = input({C}, dt, 3);
    Tensor h, y;
    if (fused) {
      ops::AddRmsNorm o = ops::add_rms_norm(x, r, w, 1e-5);
      h = o.h;
      y = o.y;
    } else {
      h = ops::add(x, r);
      y = ops::rms_norm(h, w, 1e-5);
    }
    autograd::backward({y, h}, {gy, gh});
    return Run{h.detach(), y.detach(), x.grad(), r.grad(), w.grad()};
  };
  const Run a = run(true), e = run(false);
  EXPECT_TRUE(bitwise_equal(a.h, e.h)) << "h";
  EXPECT_TRUE(bitwise_equal(a.y, e.y)) << "y";
  EXPECT_TRUE(bitwise_equal(a.dx, e.dx)) << "dx";
  EXPECT_TRUE(bitwise_equal(a.dr, e.dr)) << "dresidual";
  EXPECT_TRUE(bitwise_equal(a.dw, e.dw)) << "dweight";
  EXPECT_TRUE(bitwise_equal(a.dx, a.dr)) << "x and residual receive the same gradient";
}

INSTANTIATE_TEST_SUITE_P(AllFloat, AddRmsNormDtypes, ::testing::Values(DType::f32, DType::f64, DType::bf16, DType::f16),
                         [](const ::testing::TestParamInfo<DType>& i) { return std::string(dtype_name(i.param)); });

TEST(AddRmsNorm, NonContiguousInputsAndNoWeight) {
  Tensor xt = input({6, 4}, DType::f32, 11);
  Tensor r = input({4, 12}, DType::f32, 12);
  ops::AddRmsNorm o = ops::add_rms_norm(xt.t(), r.slice(1, 0, 12, 2));
  const Tensor h = ops::add(xt.t(), r.slice(1, 0, 12, 2));
  EXPECT_TRUE(bitwise_equal(o.h, h));
  EXPECT_TRUE(bitwise_equal(o.y, ops::rms_norm(h)));
  ops::sum(o.y * o.y + o.h).backward();
  ASSERT_TRUE(xt.grad().defined() && r.grad().defined());
  EXPECT_EQ(xt.grad().shape(), (Shape{6, 4}));
  EXPECT_EQ(r.grad().shape(), (Shape{4, 12}));
}

// LLaMA fuses every residual add with the RMSNorm after it: its logits and every parameter
// gradient must be the bits of the plain composition (LlamaBlock::forward, block by block).
TEST(AddRmsNorm, LlamaEqualsTheUnfusedComposition) {
  nn::LlamaConfig c;
  c.vocab_size = 37;
  c.block_size = 16;
  c.n_layer = 3;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.dim = 32;
  c.ffn_hidden = 48;
  const nn::Llama model(c, 3);
  Generator g(5);
  const Tensor idx = randint(0, c.vocab_size, {2, 16}, {.dtype = DType::i64}, &g);
  const Tensor w = randn({2, 16, c.vocab_size}, {}, &g);
  auto unfused = [&] {
    Tensor x = model.embed_tokens->forward(idx);
    for (const auto& b : model.layers) x = b->forward(x);
    return model.lm_head->forward(model.norm->forward(x));
  };
  auto run = [&](const std::function<Tensor()>& forward) { return logits_and_grads(model, forward, w); };
  const std::vector<Tensor> fused = run([&] { return model.forward(idx); }), plain = run(unfused);
  ASSERT_EQ(fused.size(), plain.size());
  EXPECT_TRUE(bitwise_equal(fused[0], plain[0])) << "logits";
  for (size_t i = 1; i < fused.size(); ++i) EXPECT_TRUE(bitwise_equal(fused[i], plain[i])) << "gradient " << i;
}

TEST(AddRmsNorm, Errors) {
  const Tensor x = zeros({2, 4}), w = ones({4});
  std::string m = message([&] { ops::add_rms_norm(x, zeros({2, 3}), w); });
  EXPECT_NE(m.find("add_rms_norm"), std::string::npos) << m;
  EXPECT_NE(m.find("[2, 3]"), std::string::npos) << m;
  m = message([&] { ops::add_rms_norm(x, zeros({2, 4}, {.dtype = DType::f64}), w); });
  EXPECT_NE(m.find("f64"), std::string::npos) << m;
  m = message([&] { ops::add_rms_norm(x, Tensor(), w); });
  EXPECT_NE(m.find("residual"), std::string::npos) << m;
  m = message([&] { ops::add_rms_norm(x, zeros({2, 4}), ones({3})); });
  EXPECT_NE(m.find("weight"), std::string::npos) << m;
}

}  // namespace
}  // namespace forge
