// Module: registration, names, state dicts, conversion, train/eval; Linear.
#include <gtest/gtest.h>

#include "forge/forge.h"
#include "forge/nn/linear.h"
#include "testing/tensor_testing.h"

namespace forge::nn {
namespace {

using forge::testing::error_of;
using forge::testing::vals;

class TwoLayer : public Module {
 public:
  TwoLayer() {
    fc = register_module("fc", std::make_shared<Linear>(3, 4));
    proj = register_module("proj", std::make_shared<Linear>(4, 2, false));
    scale = register_buffer("scale", full({1}, 2.0));
  }
  Tensor forward(const Tensor& x) { return ops::mul(proj->forward(ops::tanh(fc->forward(x))), scale); }
  std::shared_ptr<Linear> fc, proj;
  Tensor scale;
};

TEST(Module, NamesCountsAndStateDict) {
  TwoLayer m;
  NamedTensors p = m.named_parameters();
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[0].first, "fc.weight");
  EXPECT_EQ(p[1].first, "fc.bias");
  EXPECT_EQ(p[2].first, "proj.weight");
  EXPECT_EQ(m.num_parameters(), 3 * 4 + 4 + 4 * 2);
  EXPECT_TRUE(p[0].second.requires_grad());
  NamedTensors sd = m.state_dict();
  ASSERT_EQ(sd.size(), 4u);
  EXPECT_EQ(sd[3].first, "scale");
}

TEST(Module, LinearMatchesItsFormulaAndTrains) {
  Linear l(3, 2);
  Tensor x = randn({5, 3});
  Tensor y = l.forward(x);
  Tensor ref = ops::add(ops::matmul(x, l.weight.t()), l.bias);
  EXPECT_EQ(vals(y), vals(ref));
  ops::sum(y).backward();
  EXPECT_EQ(l.weight.grad().shape(), (Shape{2, 3}));
  EXPECT_EQ(vals(l.bias.grad()), (std::vector<double>{5, 5}));
  EXPECT_NE(error_of([&] { l.forward(randn({5, 4})); }).find("in_features"), std::string::npos);
}

TEST(Module, LoadStateDictCopiesValuesAndKeepsHandles) {
  TwoLayer a, b;
  Tensor handle = b.fc->weight;
  b.load_state_dict(a.state_dict());
  EXPECT_EQ(vals(b.fc->weight), vals(a.fc->weight));
  EXPECT_TRUE(handle.is_same(b.fc->weight));
  Tensor x = randn({2, 3});
  EXPECT_EQ(vals(a.forward(x)), vals(b.forward(x)));
}

TEST(Module, LoadStateDictErrorsNameTheKey) {
  TwoLayer m;
  NamedTensors sd = m.state_dict();
  sd[0].second = zeros({5, 3});
  const std::string shape_err = error_of([&] { m.load_state_dict(sd); });
  EXPECT_NE(shape_err.find("fc.weight"), std::string::npos) << shape_err;
  EXPECT_NE(shape_err.find("[5, 3]"), std::string::npos) << shape_err;
  NamedTensors missing = m.state_dict();
  missing.pop_back();
  EXPECT_NE(error_of([&] { m.load_state_dict(missing); }).find("missing key 'scale'"), std::string::npos);
  NamedTensors extra = m.state_dict();
  extra.emplace_back("bogus", zeros({1}));
  EXPECT_NE(error_of([&] { m.load_state_dict(extra); }).find("unexpected key 'bogus'"), std::string::npos);
  m.load_state_dict(missing, /*strict=*/false);
}

TEST(Module, ToConvertsInPlaceAndTrainEvalPropagate) {
  TwoLayer m;
  Tensor w = m.fc->weight;
  m.to(DType::f64);
  EXPECT_EQ(w.dtype(), DType::f64);  // the member handle follows
  EXPECT_TRUE(w.requires_grad());
  EXPECT_EQ(m.scale.dtype(), DType::f64);
  Tensor y = m.forward(randn({2, 3}, {.dtype = DType::f64}));
  EXPECT_EQ(y.dtype(), DType::f64);
  m.eval();
  EXPECT_FALSE(m.fc->is_training());
  m.train();
  EXPECT_TRUE(m.proj->is_training());
}

}  // namespace
}  // namespace forge::nn
