// The gradient-check table: every differentiable op, over several shapes including
// broadcast and non-contiguous inputs, against central finite differences in f64.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <set>

#include "forge/autograd/node.h"
#include "testing/gradcheck.h"

namespace forge::testing {
namespace {

class GradCheckTable : public ::testing::TestWithParam<GradCase> {};

TEST_P(GradCheckTable, MatchesFiniteDifferences) {
  const GradCase& c = GetParam();
  TensorList inputs = c.make_inputs();
  GradCheckResult r = gradcheck(c.fn, inputs, c.eps, c.atol, c.rtol);
  EXPECT_TRUE(r.ok) << c.op << " [" << c.label << "]: " << r.message;
}

std::string case_name(const ::testing::TestParamInfo<GradCase>& info) {
  std::string s = info.param.op + "_" + std::to_string(info.index);
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

INSTANTIATE_TEST_SUITE_P(AllOps, GradCheckTable, ::testing::ValuesIn(all_grad_cases()), case_name);

TEST(GradCheckCoverage, EveryDifferentiableOpHasACase) {
  std::set<std::string> covered;
  for (const auto& c : all_grad_cases()) covered.insert(c.op);
  for (const auto& op : differentiable_ops()) EXPECT_TRUE(covered.count(op)) << "no gradcheck case for op '" << op << "'";
  for (const auto& op : covered)
    EXPECT_NE(std::find(differentiable_ops().begin(), differentiable_ops().end(), op), differentiable_ops().end())
        << "case for unknown op '" << op << "' (add it to differentiable_ops())";
}

// The checker itself must fail on a wrong gradient.
TEST(GradCheckSelfTest, DetectsAWrongGradient) {
  Tensor x = arg({3, 4});
  OpFn wrong = [](const TensorList& in) {
    // forward: x^2; backward recorded as if it were x^3 (3x^2 instead of 2x)
    Tensor y = ops::mul(in[0].detach(), in[0].detach());
    Tensor xs = in[0].detach();
    autograd::record("wrong_square", y, {in[0]}, [xs](const Tensor& g, const autograd::GradMask&) {
      return TensorList{ops::mul(g, ops::mul(ops::mul(xs, xs), 3.0))};
    });
    return y;
  };
  EXPECT_FALSE(gradcheck(wrong, {x}).ok);
  OpFn right = [](const TensorList& in) { return ops::mul(in[0], in[0]); };
  EXPECT_TRUE(gradcheck(right, {x}).ok);
}

}  // namespace
}  // namespace forge::testing
