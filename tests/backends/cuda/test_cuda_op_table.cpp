// The backend-consistency table: every case of the op table (testing/op_table.h, Note [op
// table]) on CUDA against the CPU backend.
//
//  1. `CudaOpTable`: each case that is not exempt runs forward and backward on both devices, in
//     each of its dtypes (f32, bf16, f16 unless the case says otherwise, with its reason), from
//     the same random inputs (never zeros; rounded to the dtype once, so both devices see the
//     same values), with the same positive upstream gradient; the output and every input
//     gradient are compared by ||cuda - cpu|| / ||cpu||: f32 1e-5; bf16/f16 1e-2, against the
//     CPU computing in f32 from the rounded inputs (the reference for mixed precision).
//  2. `CudaOpTableExemptions`: the dedicated tests that an exempt case names are registered in
//     this binary. (Which ops have cases, and that every case is compared or exempted, is
//     checked by forge_tests in every build: tests/autograd/test_op_table.cpp.)
//
// Without a GPU the table reports SKIPPED; the exemption check only reads the test registry and
// runs everywhere.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backends/cuda/cuda_testing.h"
#include "forge/forge.h"
#include "testing/op_table.h"

namespace forge {
namespace {

using namespace cuda_testing;
using testing::op_table;
using testing::OpCase;

class CudaOpTable : public ::testing::TestWithParam<size_t> {};

TEST_P(CudaOpTable, ForwardAndBackwardMatchTheCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  const OpCase& c = op_table()[GetParam()];
  for (DType dtype : c.device.dtypes) {
    const std::vector<std::string> bad = testing::compare_with_cpu(c, kGpu, dtype);
    std::string lines;
    for (const std::string& b : bad) lines += "\n  " + b;
    EXPECT_TRUE(bad.empty()) << c.op << " [" << c.label << "] (" << dtype_name(dtype) << "):" << lines;
  }
}

// One test per case (its dtypes in turn): the process start of a CUDA test costs more than a case.
std::vector<size_t> compared_cases() {
  std::vector<size_t> r;
  for (size_t i = 0; i < op_table().size(); ++i)
    if (!op_table()[i].device.exempt()) r.push_back(i);
  return r;
}

std::string param_name(const ::testing::TestParamInfo<size_t>& info) { return testing::case_name(info.param); }

INSTANTIATE_TEST_SUITE_P(AllOps, CudaOpTable, ::testing::ValuesIn(compared_cases()), param_name);

// ---- exemptions --------------------------------------------------------------------------------

// Whether a test "Suite.Name" is registered: suite `Suite` or `<instantiation>/Suite`, test
// `Name` or `Name/<parameter>`.
bool registered(const std::string& dedicated) {
  const size_t dot = dedicated.find('.');
  if (dot == std::string::npos) return false;
  const std::string suite = dedicated.substr(0, dot), name = dedicated.substr(dot + 1);
  auto matches = [](const std::string& full, const std::string& want, bool prefix_part) {
    if (full == want) return true;
    if (prefix_part)  // "<instantiation>/Suite"
      return full.size() > want.size() && full.compare(full.size() - want.size(), want.size(), want) == 0 &&
             full[full.size() - want.size() - 1] == '/';
    return full.compare(0, want.size() + 1, want + "/") == 0;  // "Name/<parameter>"
  };
  const ::testing::UnitTest& ut = *::testing::UnitTest::GetInstance();
  for (int s = 0; s < ut.total_test_suite_count(); ++s) {
    const ::testing::TestSuite& ts = *ut.GetTestSuite(s);
    if (!matches(ts.name(), suite, true)) continue;
    for (int t = 0; t < ts.total_test_count(); ++t)
      if (matches(ts.GetTestInfo(t)->name(), name, false)) return true;
  }
  return false;
}

TEST(CudaOpTableExemptions, DedicatedTestsAreRegistered) {
  size_t exempt = 0;
  for (const OpCase& c : op_table()) {
    if (!c.device.exempt()) continue;
    ++exempt;
    for (const std::string& t : c.device.dedicated)
      EXPECT_TRUE(registered(t)) << c.op << " [" << c.label << "]: no registered test matches '" << t << "'";
  }
  EXPECT_TRUE(registered("CudaOpTable.ForwardAndBackwardMatchTheCpu"));  // the matcher itself
  EXPECT_FALSE(registered("CudaOpTable.NoSuchTest"));
  ::testing::Test::RecordProperty("exempt_cases", static_cast<int>(exempt));
}

}  // namespace
}  // namespace forge
