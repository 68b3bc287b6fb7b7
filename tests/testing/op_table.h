#pragma once
// The op table: one list of cases drives every op test (ggml's test-backend-ops, PyTorch's
// OpInfo).
//
// Note [op table]: a case is an op of the registry (forge/ops/registry.h), a label, its inputs
// as specs (shape, domain of the values, layout, whether a gradient is wanted; or fixed integer
// ids and bool masks) and the function of those inputs. From the same case:
//  - tests/autograd/test_op_table.cpp checks every input's gradient against central finite
//    differences in f64 on the CPU (gradcheck(); forge_tests, every build), and that every node
//    the function records is a registered op;
//  - tests/backends/cuda/test_cuda_op_table.cpp runs it forward and backward on CUDA and on the
//    CPU from the same random values (never zeros) in f32, bf16 and f16, and compares the output
//    and every input gradient by ||cuda - cpu|| / ||cpu||: f32 1e-5; bf16/f16 1e-2 against the
//    CPU computing in f32 from the inputs rounded to the dtype (compare_with_cpu());
//    forge_tests runs the same comparison with the CPU's own bf16/f16 paths in place of CUDA,
//    so a case's dtypes and tolerances are checked in a build without a GPU;
//  - the coverage checks (test_op_table.cpp, every build) fail when a registered op has no case,
//    a case names an op that is not registered, a case neither runs the device comparison nor
//    names the dedicated CUDA tests that cover it, or a model records an op without a case.
// A case narrows its dtypes or widens a tolerance only with the reason (DeviceCheck::note).
#include <cstdint>
#include <functional>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "forge/forge.h"

namespace forge::testing {

using OpFn = std::function<Tensor(const TensorList&)>;

enum class Domain {
  real,            // normal
  positive,        // in [0.5, 2)
  away_from_zero,  // |x| in [0.2, 1.2), random sign (ops with a kink or a pole at 0)
};

enum class Layout {
  contiguous,
  transposed,  // the transpose of a (shape[1], shape[0]) tensor (2-D shapes)
  strided,     // every other element along the last dim of a wider tensor
};

// One argument of a case.
struct Input {
  enum class Kind { floating, integer, boolean };
  Kind kind = Kind::floating;
  Shape shape{};
  uint64_t seed = 1;
  Domain domain = Domain::real;
  Layout layout = Layout::contiguous;
  bool grad = true;               // floating: a leaf that needs a gradient
  std::vector<int64_t> values{};  // integer: the values; boolean: 0/1 (none: random); row-major
  DType dtype = DType::i64;       // integer: i64 or i32

  Input transposed() const;
  Input strided() const;
  Input constant() const;  // needs no gradient
};

Input real(const Shape& shape, uint64_t seed = 1);
Input positive(const Shape& shape, uint64_t seed = 1);
Input away_from_zero(const Shape& shape, uint64_t seed = 1);
Input ids(std::vector<int64_t> values, const Shape& shape, DType dtype = DType::i64);
Input mask(std::vector<int64_t> values, const Shape& shape);
Input random_mask(const Shape& shape, uint64_t seed);

// The tensor for `in` on `device` with floating values stored as `dtype` after rounding to
// `round_to` (values drawn in f64 from in.seed, so every dtype and device sees the same ones).
Tensor make_input(const Input& in, Device device = Device::cpu(), DType dtype = DType::f64,
                  DType round_to = DType::f64);
TensorList make_inputs(const std::vector<Input>& specs, Device device = Device::cpu(), DType dtype = DType::f64,
                       DType round_to = DType::f64);

// What the CUDA-vs-CPU comparison runs for a case.
struct DeviceCheck {
  std::vector<DType> dtypes{DType::f32, DType::bf16, DType::f16};
  double tol32 = 1e-5, tol16 = 1e-2;  // ||out - ref|| / ||ref|| for f32; for bf16 and f16
  std::string note{};                 // why the dtypes or tolerances differ from the defaults
  // Not run by the generic comparison: why, and the dedicated CUDA tests ("Suite.Name", as in
  // TEST(Suite, Name) or TEST_P(Suite, Name)) that compare this op with the CPU instead.
  std::vector<std::string> dedicated{};
  bool exempt() const { return !dedicated.empty(); }
};

struct OpCase {
  std::string op;     // a registered op (forge::ops::registered_ops())
  std::string label;  // what this case covers (shapes, broadcast, non-contiguous, ...)
  std::vector<Input> inputs{};
  OpFn fn{};
  // gradcheck(): the finite-difference step and tolerances.
  double eps = 1e-6, atol = 1e-7, rtol = 1e-5;
  DeviceCheck device{};

  OpCase& gradcheck_tolerance(double step, double abs_tol, double rel_tol);
  OpCase& dtypes(std::vector<DType> only, std::string why);
  OpCase& tolerance16(double tol, std::string why);
  OpCase& tolerance32(double tol, std::string why);
  OpCase& exempt(std::string why, std::vector<std::string> dedicated_tests);
};
void PrintTo(const OpCase& c, std::ostream* os);

// Each op family contributes its cases (tests/ops/op_cases_*.cpp).
std::vector<OpCase> unary_cases();
std::vector<OpCase> binary_cases();
std::vector<OpCase> view_cases();
std::vector<OpCase> reduce_cases();
std::vector<OpCase> matmul_cases();
std::vector<OpCase> index_cases();
std::vector<OpCase> join_cases();
std::vector<OpCase> nn_cases();         // embedding, norms, dropout, cross_entropy
std::vector<OpCase> attention_cases();  // attention, rope, conv2d, max_pool2d

// The whole table, built once.
const std::vector<OpCase>& op_table();

// A test name for op_table()[index]: "<op>_<k>" for the op's k-th case (so a case added to
// one op renames no other op's tests).
std::string case_name(size_t index);

// Runs `c` forward and backward on `device` in `dtype` and on the CPU as the reference (f32
// from the same inputs rounded to `dtype`; f64 for f64), with one positive upstream gradient
// (so the reductions in backward add terms of one sign: rounding is measured, not
// cancellation). Returns what differs: the output or an input's gradient past the case's
// tolerance, a missing gradient, a result left on another device. Empty when they agree.
std::vector<std::string> compare_with_cpu(const OpCase& c, Device device, DType dtype);

// The ops recorded in the autograd graph behind `root`: every node's name without its
// "Backward" suffix (leaf accumulators left out).
std::set<std::string> recorded_ops(const Tensor& root);

// Coverage of `ops` (the registry) by `cases`: a registered op without a case, a case of an op
// that is not registered, a case neither compared on the device nor exempted with dedicated
// tests, an exemption or a narrowed comparison without its reason. Empty when complete.
std::vector<std::string> coverage_problems(const std::vector<std::string>& ops, const std::vector<OpCase>& cases);

// The names in `recorded` that are not registered ops with a case.
std::vector<std::string> ops_without_cases(const std::set<std::string>& recorded, const std::vector<std::string>& ops,
                                           const std::vector<OpCase>& cases);

// The dedicated tests named by the exemptions in `cases` that `sources` (the text of the CUDA
// test files) does not define with TEST(Suite, Name) or TEST_P(Suite, Name).
std::vector<std::string> missing_dedicated_tests(const std::vector<OpCase>& cases, const std::string& sources);

}  // namespace forge::testing
