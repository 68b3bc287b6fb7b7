// gtest main of forge_parallel_tests, run under `mpirun -np N` (tests/CMakeLists.txt): every rank
// joins the MPI world, runs every test, and the job fails when any rank had a failure.
// Rank 0 prints gtest's usual report; the other ranks print only their failures.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "forge/ops/creation.h"
#include "forge/parallel/env.h"
#include "forge/parallel/world.h"

namespace {

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  // (UnitTest::current_test_info() would deadlock here: gtest holds its lock while reporting.)
  void OnTestStart(const ::testing::TestInfo& info) override {
    test_ = std::string(info.test_suite_name()) + "." + info.name();
  }
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] FAILED %s at %s:%d\n%s\n", rank_, test_.c_str(),
                 r.file_name() ? r.file_name() : "?", r.line_number(), r.message());
  }

 private:
  int rank_;
  std::string test_;
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  using namespace forge;
  const parallel::LaunchEnv env = parallel::launch_env();
  if (!env.uses_mpi()) {
    std::fprintf(stderr, "forge_parallel_tests: run it under MPI, e.g. `mpirun --oversubscribe -np 4 %s` "
                         "(ctest -L dist does)\n", argv[0]);
    return 2;
  }
  auto world = parallel::init_world(env, Device::cpu());
  if (world->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(world->rank()));
  }
  const int rc = RUN_ALL_TESTS();
  // The job fails when any rank failed.
  Tensor failed = full({1}, rc != 0 ? 1.0 : 0.0, {.dtype = DType::i64});
  world->all_reduce(failed, parallel::ReduceOp::max)->wait();
  const bool any_failed = failed.item<int64_t>() != 0;
  if (world->rank() == 0 && any_failed) std::fprintf(stderr, "forge_parallel_tests: a rank had failures\n");
  world.reset();
  parallel::shutdown();
  return any_failed ? 1 : 0;
}
