// The op table (testing/op_table.h, Note [op table]) on the CPU, in every build:
//  - GradCheckTable: each case's gradients against central finite differences in f64, and
//    every node the case records is a registered op with a case;
//  - OpTableOnCpu: each case's device comparison with the CPU's bf16/f16 paths in place of
//    CUDA's (so the comparison, its dtypes and tolerances are exercised without a GPU);
//  - OpTableCoverage: every registered op has a case, every case names a registered op and is
//    compared on the device or names its dedicated CUDA tests (which must exist), and the
//    tiny GPT, LLaMA and LeNet record only ops with cases;
//  - self-tests: each of those checks fails on what it must catch.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "forge/autograd/node.h"
#include "forge/nn/cnn.h"
#include "forge/nn/gpt.h"
#include "forge/nn/llama.h"
#include "forge/ops/registry.h"
#include "testing/gradcheck.h"
#include "testing/op_table.h"

#ifndef FORGE_CUDA_TEST_DIR
#error "FORGE_CUDA_TEST_DIR (tests/backends/cuda) must be defined by tests/CMakeLists.txt"
#endif

namespace forge::testing {
namespace {

std::string param_name(const ::testing::TestParamInfo<size_t>& info) { return case_name(info.param); }

std::vector<size_t> all_cases() {
  std::vector<size_t> r(op_table().size());
  for (size_t i = 0; i < r.size(); ++i) r[i] = i;
  return r;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string s;
  for (const std::string& l : lines) s += "\n  " + l;
  return s;
}

// ---- the f64 gradient check --------------------------------------------------------------------

class GradCheckTable : public ::testing::TestWithParam<size_t> {};

TEST_P(GradCheckTable, MatchesFiniteDifferences) {
  const OpCase& c = op_table()[GetParam()];
  const TensorList inputs = make_inputs(c.inputs);
  const GradCheckResult r = gradcheck(c.fn, inputs, c.eps, c.atol, c.rtol);
  EXPECT_TRUE(r.ok) << c.op << " [" << c.label << "]: " << r.message;
  const Tensor out = c.fn(inputs);
  const std::vector<std::string> unknown = ops_without_cases(recorded_ops(out), ops::registered_ops(), op_table());
  EXPECT_TRUE(unknown.empty()) << c.op << " [" << c.label << "] records:" << joined(unknown);
}

INSTANTIATE_TEST_SUITE_P(AllOps, GradCheckTable, ::testing::ValuesIn(all_cases()), param_name);

// ---- the device comparison, on the CPU's 16-bit paths ------------------------------------------

class OpTableOnCpu : public ::testing::TestWithParam<size_t> {};

TEST_P(OpTableOnCpu, Bf16AndF16MatchF32) {
  const OpCase& c = op_table()[GetParam()];
  for (DType t : c.device.dtypes) {
    if (t == DType::f32) continue;  // the CPU against itself
    const std::vector<std::string> bad = compare_with_cpu(c, Device::cpu(), t);
    EXPECT_TRUE(bad.empty()) << c.op << " [" << c.label << "] in " << dtype_name(t) << ":" << joined(bad);
  }
}

std::vector<size_t> compared_cases() {
  std::vector<size_t> r;
  for (size_t i = 0; i < op_table().size(); ++i)
    if (!op_table()[i].device.exempt()) r.push_back(i);
  return r;
}

INSTANTIATE_TEST_SUITE_P(AllOps, OpTableOnCpu, ::testing::ValuesIn(compared_cases()), param_name);

// ---- coverage ----------------------------------------------------------------------------------

TEST(OpTableCoverage, TheRegistryHoldsTheLibrarysOps) {
  const std::vector<std::string> ops = ops::registered_ops();
  EXPECT_GE(ops.size(), 60u);
  for (const char* op : {"add", "matmul", "sum", "reshape", "to", "cat", "embedding", "layer_norm", "cross_entropy",
                         "scaled_dot_product_attention", "conv2d"})
    EXPECT_TRUE(ops::is_registered_op(op)) << op;
  EXPECT_FALSE(ops::is_registered_op("AccumulateGrad"));
}

TEST(OpTableCoverage, EveryRegisteredOpHasACaseAndEveryCaseIsComparedOnTheDevice) {
  const std::vector<std::string> bad = coverage_problems(ops::registered_ops(), op_table());
  EXPECT_TRUE(bad.empty()) << joined(bad);
}

TEST(OpTableCoverage, ExemptionsNameDedicatedCudaTestsThatExist) {
  std::string sources;
  size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(FORGE_CUDA_TEST_DIR)) {
    if (entry.path().extension() != ".cpp") continue;
    std::ifstream in(entry.path());
    std::ostringstream text;
    text << in.rdbuf();
    sources += text.str();
    ++files;
  }
  ASSERT_GT(files, 0u) << "no CUDA test sources under " << FORGE_CUDA_TEST_DIR;
  const std::vector<std::string> bad = missing_dedicated_tests(op_table(), sources);
  EXPECT_TRUE(bad.empty()) << joined(bad);
}

// Every node a model's forward + loss records: no op a model uses can lack a case.
void expect_only_ops_with_cases(const Tensor& loss, const char* model) {
  const std::set<std::string> recorded = recorded_ops(loss);
  EXPECT_GE(recorded.size(), 5u) << model;
  const std::vector<std::string> bad = ops_without_cases(recorded, ops::registered_ops(), op_table());
  EXPECT_TRUE(bad.empty()) << model << ":" << joined(bad);
  loss.backward();  // and the graph runs
}

TEST(OpTableCoverage, ModelsRecordOnlyOpsWithCases) {
  Generator gen(5);
  const Tensor tokens = randint(0, 61, {2, 9}, {.dtype = DType::i64}, &gen);
  const Tensor idx = tokens.slice(1, 0, 8).contiguous(), targets = tokens.slice(1, 1, 9).contiguous();
  {
    nn::GPTConfig c;
    c.vocab_size = 61;
    c.block_size = 16;
    c.n_layer = 2;
    c.n_head = 4;
    c.n_embd = 32;
    c.dropout = 0.1;  // so dropout is recorded too
    nn::GPT gpt(c, 1);
    expect_only_ops_with_cases(gpt.loss(idx, targets), "GPT");
  }
  {
    nn::LlamaConfig c;
    c.vocab_size = 61;
    c.block_size = 16;
    c.n_layer = 2;
    c.n_head = 4;
    c.n_kv_head = 2;
    c.dim = 32;
    c.ffn_hidden = 80;
    nn::Llama llama(c, 1);
    expect_only_ops_with_cases(llama.loss(idx, targets), "LLaMA");
  }
  {
    nn::LeNet lenet(10, 1);
    const Tensor images = randn({3, 1, 28, 28}, {}, &gen);
    const Tensor labels = randint(0, 10, {3}, {.dtype = DType::i64}, &gen);
    expect_only_ops_with_cases(ops::cross_entropy(lenet.forward(images), labels), "LeNet");
  }
}

// ---- the checks fail on what they must catch ---------------------------------------------------

bool mentions(const std::vector<std::string>& lines, const std::string& word) {
  return std::any_of(lines.begin(), lines.end(),
                     [&](const std::string& l) { return l.find(word) != std::string::npos; });
}

OpFn identity() {
  return [](const TensorList& in) { return ops::mul(in[0], 1.0); };
}

TEST(OpTableCoverageSelfTest, ReportsMissingCasesUnknownOpsAndUncomparedCases) {
  std::vector<OpCase> cases{
      {"add", "fine", {real({2})}, identity()},
      {"not_an_op", "a case of an op nobody registered", {real({2})}, identity()},
      OpCase{"mul", "compared in no dtype", {real({2})}, identity()}.dtypes({}, "no reason is enough"),
      OpCase{"mul", "exempt without a reason", {real({2})}, identity()}.exempt("", {"CudaMul.Test"}),
  };
  cases.push_back({"sub", "narrowed without a reason", {real({2})}, identity()});
  cases.back().device.dtypes = {DType::f32};
  const std::vector<std::string> bad = coverage_problems({"add", "mul", "sub", "fake_op"}, cases);
  EXPECT_TRUE(mentions(bad, "'fake_op' is registered but has no case")) << joined(bad);
  EXPECT_TRUE(mentions(bad, "not_an_op [a case of an op nobody registered]' names an op that is not registered"))
      << joined(bad);
  EXPECT_TRUE(mentions(bad, "[compared in no dtype]' runs the device comparison in no dtype")) << joined(bad);
  EXPECT_TRUE(mentions(bad, "[exempt without a reason]' is exempt from the device comparison without a reason"))
      << joined(bad);
  EXPECT_TRUE(mentions(bad, "[narrowed without a reason]' changes the device comparison")) << joined(bad);
  EXPECT_EQ(bad.size(), 5u) << joined(bad);
}

TEST(OpTableCoverageSelfTest, ReportsAnUnregisteredNodeAndAnOpWithoutACase) {
  Tensor x = make_input(real({3}));
  Tensor y = ops::mul(x.detach(), 2.0);
  autograd::record("fake_unregistered", y, {x},
                   [](const Tensor& g, const autograd::GradMask&) { return TensorList{ops::mul(g, 2.0)}; });
  const Tensor z = ops::exp(ops::add(y, 1.0));
  const std::set<std::string> recorded = recorded_ops(z);
  EXPECT_EQ(recorded, (std::set<std::string>{"add", "exp", "fake_unregistered"}));
  const std::vector<OpCase> cases{{"add", "a case", {real({2})}, identity()}};
  const std::vector<std::string> bad = ops_without_cases(recorded, {"add", "exp"}, cases);
  EXPECT_TRUE(mentions(bad, "node 'fake_unregisteredBackward' is not a registered op")) << joined(bad);
  EXPECT_TRUE(mentions(bad, "op 'exp' has no case")) << joined(bad);
  EXPECT_EQ(bad.size(), 2u) << joined(bad);
}

TEST(OpTableCoverageSelfTest, ReportsADedicatedTestThatDoesNotExist) {
  const std::vector<OpCase> cases{
      OpCase{"add", "a", {real({2})}, identity()}.exempt("why", {"CudaYes.Present", "CudaNope.Missing", "NoDot"})};
  const std::string sources = "TEST(CudaYes, Present) {\n}\nTEST_P(CudaNope, Other) {}\n";
  const std::vector<std::string> bad = missing_dedicated_tests(cases, sources);
  EXPECT_TRUE(mentions(bad, "'CudaNope.Missing'")) << joined(bad);
  EXPECT_TRUE(mentions(bad, "'NoDot'")) << joined(bad);
  EXPECT_EQ(bad.size(), 2u) << joined(bad);
}

// A result or a gradient that differs only in 16 bits is reported by the device comparison.
TEST(OpTableCoverageSelfTest, DeviceComparisonReportsAWrongOutputAndAWrongGradient) {
  const OpCase wrong_output{"mul", "off by 5% in bf16", {real({4, 5}, 3)}, [](const TensorList& in) {
                              return ops::mul(in[0], in[0].dtype() == DType::bf16 ? 1.05 : 1.0);
                            }};
  const std::vector<std::string> out_bad = compare_with_cpu(wrong_output, Device::cpu(), DType::bf16);
  EXPECT_TRUE(mentions(out_bad, "output")) << joined(out_bad);
  EXPECT_TRUE(compare_with_cpu(wrong_output, Device::cpu(), DType::f16).empty());

  const OpCase wrong_gradient{
      "mul", "backward off by 5% in f16", {real({4, 5}, 3)}, [](const TensorList& in) {
        Tensor y = ops::mul(in[0].detach(), 2.0);
        const double k = in[0].dtype() == DType::f16 ? 2.1 : 2.0;
        return autograd::record("mul", y, {in[0]},
                                [k](const Tensor& g, const autograd::GradMask&) { return TensorList{ops::mul(g, k)}; });
      }};
  const std::vector<std::string> grad_bad = compare_with_cpu(wrong_gradient, Device::cpu(), DType::f16);
  EXPECT_TRUE(mentions(grad_bad, "gradient of input 0")) << joined(grad_bad);
  EXPECT_FALSE(mentions(grad_bad, "output")) << joined(grad_bad);
}

// The checker itself must fail on a wrong gradient.
TEST(GradCheckSelfTest, DetectsAWrongGradient) {
  Tensor x = make_input(real({3, 4}));
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
