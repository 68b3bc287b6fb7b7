// The backend-consistency table: every differentiable op of the library on CUDA against the
// CPU backend.
//
// Two parts:
//  1. `CudaOpTable`: a table of rows (op, inputs, function) for the ops whose CUDA path is the
//     composition of kernels tested elsewhere (binary ops with broadcasting and their backward
//     through sum_to, where / masked_fill, joins, views and copies, max/min along a dim, dtype
//     casts). Each row runs forward and backward on both devices, in f32, bf16 and f16, from the
//     same random inputs (never zeros; rounded to the dtype once, so both devices see the same
//     values), with the same upstream gradient; outputs and every input gradient are compared
//     by ||cuda - cpu|| / ||cpu||: f32 1e-5; bf16/f16 1e-2, against the CPU computing in f32
//     from the rounded inputs (the reference for mixed precision).
//  2. `CudaOpCoverage`: every op of testing::differentiable_ops() (the gradcheck table's list:
//     a new op must be added there) names the CUDA tests that compare it with the CPU, and
//     each of those tests must be registered in this binary. An op without a CUDA comparison
//     fails here: no op is left out.
//
// Without a GPU the table reports SKIPPED; the coverage check only reads the test registry and
// runs everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "backends/cuda/cuda_testing.h"
#include "forge/forge.h"
#include "testing/gradcheck.h"

namespace forge {
namespace {

using namespace cuda_testing;

struct Input {
  Shape shape;
  Domain domain = Domain::real;
  bool grad = true;        // a leaf that needs a gradient
  bool boolean = false;    // a random bool mask instead (no gradient)
};

struct Row {
  std::string op, label;
  std::vector<Input> inputs;
  std::function<Tensor(const TensorList&)> fn;
};

std::vector<Row> rows() {
  using TL = TensorList;
  std::vector<Row> r;
  const Shape m{7, 33};
  // Binary ops: broadcast both ways, so backward reduces through sum_to on the device.
  auto bin = [&](const char* op, Domain da, Domain db, std::function<Tensor(const Tensor&, const Tensor&)> f) {
    r.push_back({op, "[7,33] (+) [33]", {{m, da}, {{33}, db}}, [f](const TL& in) { return f(in[0], in[1]); }});
    r.push_back({op, "[7,1] (+) [1,33]", {{{7, 1}, da}, {{1, 33}, db}}, [f](const TL& in) { return f(in[0], in[1]); }});
  };
  bin("add", Domain::real, Domain::real, [](const Tensor& a, const Tensor& b) { return ops::add(a, b); });
  bin("sub", Domain::real, Domain::real, [](const Tensor& a, const Tensor& b) { return ops::sub(a, b); });
  bin("mul", Domain::real, Domain::real, [](const Tensor& a, const Tensor& b) { return ops::mul(a, b); });
  bin("div", Domain::real, Domain::away_from_zero, [](const Tensor& a, const Tensor& b) { return ops::div(a, b); });
  // pow: no broadcast (its exponent gradient g * a^b * ln a changes sign, and a sum of such
  // terms in bf16 would measure cancellation rather than the kernel).
  r.push_back({"pow", "[7,33] ^ [7,33]", {{m, Domain::positive}, {m}},
               [](const TL& in) { return ops::pow(in[0], in[1]); }});
  bin("maximum", Domain::real, Domain::real, [](const Tensor& a, const Tensor& b) { return ops::maximum(a, b); });
  bin("minimum", Domain::real, Domain::real, [](const Tensor& a, const Tensor& b) { return ops::minimum(a, b); });
  r.push_back({"pow", "x ^ 3 (scalar exponent)", {{m, Domain::real}}, [](const TL& in) { return ops::pow(in[0], 3.0); }});
  r.push_back({"where", "where(mask, a, b) with a broadcast b", {{m, Domain::real, false, true}, {m}, {{33}}},
               [](const TL& in) { return ops::where(in[0], in[1], in[2]); }});
  r.push_back({"masked_fill", "masked_fill(x, mask, -2)", {{m}, {m, Domain::real, false, true}},
               [](const TL& in) { return ops::masked_fill(in[0], in[1], -2.0); }});
  // SwiGLU's gate (one fused kernel forward, two backward).
  r.push_back({"swiglu", "silu([7,33]) * [7,33]", {{m}, {m}}, [](const TL& in) { return ops::swiglu(in[0], in[1]); }});
  r.push_back({"swiglu", "transposed gate", {{{33, 7}}, {m}},
               [](const TL& in) { return ops::swiglu(in[0].t(), in[1]); }});
  // Reductions along a dim with indices.
  r.push_back({"max", "max over dim 1", {{m}}, [](const TL& in) { return ops::max(in[0], 1).values; }});
  r.push_back({"min", "min over dim 0, keepdim", {{m}}, [](const TL& in) { return ops::min(in[0], 0, true).values; }});
  r.push_back({"amin", "amin over dim 1", {{m}}, [](const TL& in) { return ops::amin(in[0], {1}); }});
  r.push_back({"log_softmax", "log_softmax over dim 0", {{m}}, [](const TL& in) { return ops::log_softmax(in[0], 0); }});
  // Joins.
  r.push_back({"cat", "cat of [7,33] and [7,5] along dim 1", {{m}, {{7, 5}}},
               [](const TL& in) { return ops::cat({in[0], in[1]}, 1); }});
  r.push_back({"stack", "stack of two [7,33] along dim 1", {{m}, {m}},
               [](const TL& in) { return ops::stack({in[0], ops::mul(in[1], 2.0)}, 1); }});
  r.push_back({"split", "split [7,33] into 10s along dim 1, reordered", {{m}},
               [](const TL& in) {
                 const TensorList p = ops::split(in[0], 10, 1);
                 return ops::cat({ops::mul(p[3], 3.0), p[0], ops::mul(p[2], -1.0)}, 1);
               }});
  r.push_back({"chunk", "chunk [7,33] in 3 along dim 0", {{m}},
               [](const TL& in) {
                 const TensorList p = ops::chunk(in[0], 3, 0);
                 return ops::cat({p[2], ops::mul(p[0], 2.0)}, 0);
               }});
  // Views and copies: a multiply after the view so the gradient differs per element.
  const Shape s3{4, 6, 5};
  auto view_row = [&](const char* op, const char* label, Shape shape, std::function<Tensor(const Tensor&)> f) {
    r.push_back({op, label, {{shape}, {{}, Domain::positive, false}},
                 [f](const TL& in) { return ops::mul(f(in[0]), in[1]); }});
  };
  view_row("reshape", "[4,6,5] -> [24,5] of a transposed view", s3,
           [](const Tensor& x) { return x.transpose(0, 1).reshape({24, 5}); });
  view_row("view", "[4,6,5] -> [4,30]", s3, [](const Tensor& x) { return x.view({4, 30}); });
  view_row("flatten", "flatten dims 1..2", s3, [](const Tensor& x) { return x.flatten(1, 2); });
  view_row("transpose", "transpose(0, 2)", s3, [](const Tensor& x) { return x.transpose(0, 2); });
  view_row("permute", "permute(2, 0, 1)", s3, [](const Tensor& x) { return x.permute({2, 0, 1}); });
  view_row("narrow", "narrow(1, 2, 3)", s3, [](const Tensor& x) { return x.narrow(1, 2, 3); });
  view_row("slice", "slice(2, 1, 5, step 2)", s3, [](const Tensor& x) { return x.slice(2, 1, 5, 2); });
  view_row("select", "select(1, 4)", s3, [](const Tensor& x) { return x.select(1, 4); });
  view_row("expand", "[4,1,5] -> [4,6,5]", {4, 1, 5}, [](const Tensor& x) { return x.expand({4, 6, 5}); });
  view_row("squeeze", "squeeze dim 1 of [4,1,5]", {4, 1, 5}, [](const Tensor& x) { return x.squeeze(1); });
  view_row("unsqueeze", "unsqueeze(1)", s3, [](const Tensor& x) { return x.unsqueeze(1); });
  view_row("contiguous", "contiguous of a permuted view", s3,
           [](const Tensor& x) { return x.permute({1, 2, 0}).contiguous(); });
  view_row("clone", "clone of a sliced view", s3, [](const Tensor& x) { return x.slice(0, 1, 4).clone(); });
  view_row("to", "to f64 and back", s3, [](const Tensor& x) { return ops::to(ops::to(x, DType::f64), x.dtype()); });
  return r;
}

struct RowRun {
  Tensor out;
  std::vector<Tensor> grads;  // per input that needs one
};

// Runs a row on `device` in `dtype` from host inputs (already rounded to the compute dtype).
RowRun run_row(const Row& row, const TensorList& host, Device device, DType dtype, const Tensor& upstream_host) {
  TensorList in;
  for (size_t i = 0; i < host.size(); ++i) {
    Tensor t = row.inputs[i].boolean ? host[i].to(device) : host[i].to(device, dtype);
    if (row.inputs[i].grad) t.requires_grad_();
    in.push_back(t);
  }
  RowRun r;
  r.out = row.fn(in);
  r.out.backward(upstream_host.to(device, r.out.dtype()));
  for (size_t i = 0; i < in.size(); ++i)
    if (row.inputs[i].grad) r.grads.push_back(in[i].grad());
  return r;
}

using TableParam = std::tuple<size_t, DType>;
class CudaOpTable : public ::testing::TestWithParam<TableParam> {};

TEST_P(CudaOpTable, ForwardAndBackwardMatchTheCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  const auto [index, dtype] = GetParam();
  const Row row = rows()[index];
  const std::string what = row.op + ": " + row.label + " (" + dtype_name(dtype) + ")";
  // Inputs drawn in f32 and rounded to the dtype once: both devices see the same values.
  TensorList host;
  for (size_t i = 0; i < row.inputs.size(); ++i) {
    const Input& s = row.inputs[i];
    if (s.boolean) {
      Generator gen(900 + i);
      host.push_back(ops::gt(rand(s.shape, {}, &gen), 0.5));
    } else {
      host.push_back(host_input(s.shape, s.domain, DType::f32, 100 * index + i).to(dtype));
    }
  }
  // The output's shape, from a CPU run in f32, gives the upstream gradient's.
  const DType ref_dtype = DType::f32;  // the CPU reference computes in f32 from the rounded inputs
  TensorList probe;
  for (size_t i = 0; i < host.size(); ++i) probe.push_back(row.inputs[i].boolean ? host[i] : host[i].to(DType::f32));
  const Shape out_shape = row.fn(probe).shape();
  // A positive upstream gradient: the reductions in backward (broadcast sums, the joins' and
  // views' scatter) add terms of one sign, so 16-bit rounding is measured, not cancellation.
  const Tensor upstream = host_input(out_shape, Domain::positive, DType::f32, 7000 + index).to(dtype);
  const RowRun gpu = run_row(row, host, kGpu, dtype, upstream);
  const RowRun cpu = run_row(row, host, Device::cpu(), ref_dtype, upstream);
  const double tol = dtype == DType::f32 ? 1e-5 : 1e-2;
  ASSERT_TRUE(gpu.out.is_cuda()) << what;
  ASSERT_EQ(gpu.out.shape(), cpu.out.shape()) << what;
  EXPECT_LE(rel_err(gpu.out, cpu.out), tol) << what << ": output";
  ASSERT_EQ(gpu.grads.size(), cpu.grads.size()) << what;
  for (size_t i = 0; i < gpu.grads.size(); ++i) {
    ASSERT_TRUE(gpu.grads[i].defined() && cpu.grads[i].defined()) << what << ": gradient " << i;
    EXPECT_TRUE(gpu.grads[i].is_cuda()) << what << ": gradient " << i;
    EXPECT_LE(rel_err(gpu.grads[i], cpu.grads[i]), tol) << what << ": gradient of input " << i;
  }
}

std::vector<TableParam> table_params() {
  std::vector<TableParam> p;
  const size_t n = rows().size();
  for (size_t i = 0; i < n; ++i)
    for (DType t : {DType::f32, DType::bf16, DType::f16}) p.emplace_back(i, t);
  return p;
}

std::string table_name(const ::testing::TestParamInfo<TableParam>& info) {
  const auto [index, dtype] = info.param;
  return rows()[index].op + "_" + std::to_string(index) + "_" + dtype_name(dtype);
}

INSTANTIATE_TEST_SUITE_P(EveryComposedOp, CudaOpTable, ::testing::ValuesIn(table_params()), table_name);

// ---- coverage ----------------------------------------------------------------------------------

// op -> the registered CUDA-vs-CPU tests (full names, or prefixes ending in '*') that compare it.
const std::map<std::string, std::vector<std::string>>& coverage() {
  static const std::map<std::string, std::vector<std::string>> m = [] {
    std::map<std::string, std::vector<std::string>> c;
    for (const char* u : {"neg", "abs", "exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "relu", "gelu",
                          "gelu_tanh", "silu"})
      c[u] = {std::string("AllOps/CudaUnary.ForwardMatchesCpu/") + u + "_f32",
              std::string("AllOps/CudaUnary.BackwardMatchesCpu/") + u + "_bf16"};
    for (const char* b : {"add", "sub", "mul", "div", "pow", "maximum", "minimum"})
      c[b] = {std::string("AllOps/CudaBinary.MatchesCpu/") + b + "_f32", std::string("EveryComposedOp/CudaOpTable.*") + b};
    for (const char* t : {"where", "masked_fill", "max", "min", "amin", "cat", "stack", "split", "chunk", "reshape",
                          "view", "flatten", "transpose", "permute", "narrow", "slice", "select", "expand", "squeeze",
                          "unsqueeze", "contiguous", "clone", "to"})
      c[t] = {std::string("EveryComposedOp/CudaOpTable.*") + t};
    c["where"].push_back("CudaWhere.MatchesCpu");
    for (const char* r : {"sum", "mean", "amax", "var"})
      c[r] = {"FloatDTypes/CudaReduce.SumMeanAmaxAminOverEveryDim*", "FloatDTypes/CudaReduce.BackwardThroughSumMeanVarAmax*"};
    c["var"][0] = "FloatDTypes/CudaReduce.VarOverEveryDim*";
    c["softmax"] = {"FloatDTypes/CudaSoftmax.AlongEveryDim*"};
    c["log_softmax"] = {"EveryComposedOp/CudaOpTable.*log_softmax", "FloatDTypes/CudaSoftmax.AlongEveryDim*"};
    c["matmul"] = {"Dtypes/CudaMatmul.AllTransposeCombinationsOddSizes*", "Dtypes/CudaMatmul.Backward*"};
    c["mm"] = {"Dtypes/CudaMatmul.AllTransposeCombinationsOddSizes*"};
    c["bmm"] = {"Dtypes/CudaMatmul.BatchedAndBroadcastBatches*"};
    c["linear"] = {"Dtypes/CudaLinear.ForwardAndBackward*"};
    c["linear_gelu"] = {"Dtypes/CudaLinear.GeluForwardAndBackward*"};
    c["gelu_mlp"] = {"Dtypes/CudaLinear.GeluMlpForwardAndBackward*"};
    c["index_select"] = {"FloatDTypes/CudaIndex.IndexSelectAlongEveryDim*"};
    c["gather"] = {"FloatDTypes/CudaIndex.GatherAndScatterAdd*"};
    c["scatter_add"] = {"FloatDTypes/CudaIndex.GatherAndScatterAdd*"};
    c["embedding"] = {"FloatDTypes/CudaEmbedding.RepeatedIds*"};
    c["layer_norm"] = {"Dtypes/CudaNorm.LayerNormWidthsAndRows*"};
    c["add_layer_norm"] = {"Dtypes/CudaNorm.AddLayerNormMatchesTheCpu*"};
    c["rms_norm"] = {"Dtypes/CudaNorm.RmsNormWidthsAndRows*"};
    c["dropout"] = {"CudaDropout.SameMaskAndGradientAsTheCpu"};
    c["cross_entropy"] = {"FloatDTypes/CudaCrossEntropy.VocabularyRowsWithIgnoredTargets*"};
    c["scaled_dot_product_attention"] = {"Dtypes/CudaAttention.MatchesCpuForwardAndBackward*",
                                         "Dtypes/CudaFlashAttention.MatchesCpuForwardAndBackward*",
                                         "Dtypes/CudaCudnnAttention.MatchesCpuForwardAndBackward*"};
    c["swiglu"] = {"EveryComposedOp/CudaOpTable.*swiglu"};
    c["qkv_attention"] = {"Dtypes/CudaQkvAttention.MatchesCpu*"};
    c["rope"] = {"Dtypes/CudaRope.MatchesTheCpu*"};
    c["conv2d"] = {"Dtypes/CudaConv.MatchesTheCpu*"};
    c["max_pool2d"] = {"CudaMaxPool.ValuesIndicesAndGradientsEqualTheCpu"};
    return c;
  }();
  return m;
}

// Whether a registered test's full name matches `pattern` (exact, or a prefix before '*', or
// "Suite.*needle": a test of that suite whose name contains the needle).
bool registered(const std::string& pattern) {
  const ::testing::UnitTest& ut = *::testing::UnitTest::GetInstance();
  for (int s = 0; s < ut.total_test_suite_count(); ++s) {
    const ::testing::TestSuite& suite = *ut.GetTestSuite(s);
    for (int t = 0; t < suite.total_test_count(); ++t) {
      const std::string name = std::string(suite.name()) + "." + suite.GetTestInfo(t)->name();
      const size_t star = pattern.find('*');
      if (star == std::string::npos) {
        if (name == pattern) return true;
      } else if (name.compare(0, star, pattern, 0, star) == 0) {
        // "Suite.*op": a parameterised test whose parameter name starts with "op_"; "Prefix*": any.
        const std::string needle = pattern.substr(star + 1);
        if (needle.empty() || name.find("/" + needle + "_", star) != std::string::npos) return true;
      }
    }
  }
  return false;
}

TEST(CudaOpCoverage, EveryDifferentiableOpIsComparedWithTheCpu) {
  for (const std::string& op : testing::differentiable_ops()) {
    const auto it = coverage().find(op);
    ASSERT_NE(it, coverage().end()) << "op '" << op
                                    << "' has no CUDA-vs-CPU test: add a row to CudaOpTable or a test, and list it here";
    for (const std::string& pattern : it->second)
      EXPECT_TRUE(registered(pattern)) << "op '" << op << "': no registered test matches '" << pattern << "'";
  }
  for (const auto& [op, tests] : coverage()) {
    (void)tests;
    const auto& all = testing::differentiable_ops();
    EXPECT_NE(std::find(all.begin(), all.end(), op), all.end()) << "coverage lists '" << op << "', not an op";
  }
}

}  // namespace
}  // namespace forge
