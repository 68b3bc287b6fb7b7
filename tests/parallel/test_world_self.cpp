// parallel::init_world in one process without a launcher: the "self" group of one CPU rank
// (Note [world of one] in parallel/world.cpp), and init_world's errors. The multi-process MPI
// tests are tests/parallel/mpi/ (run under mpirun).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "forge/ops/creation.h"
#include "forge/parallel/world.h"

namespace forge::parallel {
namespace {

class SelfWorld : public ::testing::Test {
 protected:
  void TearDown() override { shutdown(); }
};

Tensor values(int64_t n, DType dt, double start = 1.0) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = start + 0.5 * static_cast<double>(i % 13);
  return from_vector(v, {n}, {.dtype = dt});
}

TEST_F(SelfWorld, EveryOperationOnOneRank) {
  auto w = init_world(LaunchEnv{}, Device::cpu());
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(world(), w);
  EXPECT_EQ(w->backend(), "self");
  EXPECT_EQ(w->rank(), 0);
  EXPECT_EQ(w->size(), 1);
  EXPECT_EQ(w->device(), Device::cpu());

  for (DType dt : {DType::f32, DType::bf16, DType::f64, DType::i64}) {
    const auto ref = values(37, dt).to_vector<double>();
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min}) {
      if (op == ReduceOp::avg && !is_floating(dt)) continue;
      Tensor t = values(37, dt);
      auto work = w->all_reduce(t, op);
      EXPECT_TRUE(work->is_completed());
      work->wait();
      EXPECT_EQ(t.to_vector<double>(), ref);
      w->reduce(t, 0, op)->synchronize();
      EXPECT_EQ(t.to_vector<double>(), ref);
      Tensor out = zeros({37}, {.dtype = dt});
      w->reduce_scatter(out, values(37, dt), op)->wait();
      EXPECT_EQ(out.to_vector<double>(), ref);
    }
    Tensor t = values(37, dt);
    w->broadcast(t, 0)->wait();
    EXPECT_EQ(t.to_vector<double>(), ref);
    Tensor out = zeros({37}, {.dtype = dt});
    w->all_gather(out, values(37, dt))->wait();
    EXPECT_EQ(out.to_vector<double>(), ref);
    Tensor g = zeros({37}, {.dtype = dt});
    w->gather(g, values(37, dt), 0)->wait();
    EXPECT_EQ(g.to_vector<double>(), ref);
    Tensor s = zeros({37}, {.dtype = dt});
    w->scatter(s, values(37, dt), 0)->wait();
    EXPECT_EQ(s.to_vector<double>(), ref);
    Tensor x = zeros({37}, {.dtype = dt});
    w->all_to_all(x, values(37, dt))->wait();
    EXPECT_EQ(x.to_vector<double>(), ref);
  }
  w->barrier()->wait();
  auto sub = w->new_group({0});
  ASSERT_NE(sub, nullptr);
  EXPECT_EQ(sub->size(), 1);

  Tensor a = values(8, DType::f32);
  EXPECT_THROW(w->send(a, 0), Error);  // a rank cannot send to itself
  EXPECT_THROW(w->recv(a, 1), Error);
  EXPECT_THROW(w->broadcast(a, 1), Error);
  EXPECT_THROW(w->all_gather(zeros({9}), a), Error);
  EXPECT_THROW(w->all_to_all(zeros({9}), a), Error);  // sizes differ
  EXPECT_THROW(w->all_to_all(a, a), Error);           // not in place
  EXPECT_THROW(w->all_reduce(values(8, DType::i64), ReduceOp::avg), Error);
  EXPECT_THROW(w->all_reduce(a.reshape({2, 4}).transpose(0, 1)), Error);
  EXPECT_THROW(w->new_group({1}), Error);
}

TEST_F(SelfWorld, InitTwiceAndShutdown) {
  init_world(LaunchEnv{}, Device::cpu());
  try {
    init_world(LaunchEnv{}, Device::cpu());
    ADD_FAILURE() << "a second init_world did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("already exists"), std::string::npos) << e.what();
  }
  shutdown();
  EXPECT_EQ(world(), nullptr);
  shutdown();  // idempotent
  EXPECT_NE(init_world(LaunchEnv{}, Device::cpu()), nullptr);
}

TEST_F(SelfWorld, CpuRanksWithoutMpiAreRefused) {
  LaunchEnv env;
  env.launcher = Launcher::torchrun;
  env.rank = 0;
  env.world_size = 2;
  env.local_world_size = 2;
  try {
    init_world(env, Device::cpu());
    ADD_FAILURE() << "a CPU world of 2 without MPI did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mpirun"), std::string::npos) << e.what();
  }
  EXPECT_EQ(world(), nullptr);
}

TEST(DistEngines, Compiled) {
  EXPECT_TRUE(have_mpi());
#ifdef FORGE_WITH_CUDA
  EXPECT_TRUE(have_nccl());
#else
  EXPECT_FALSE(have_nccl());
#endif
  EXPECT_STREQ(reduce_op_name(ReduceOp::avg), "avg");
}

}  // namespace
}  // namespace forge::parallel
