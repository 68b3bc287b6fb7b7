// The self group on a GPU (parallel/self_group.h): the process group a one-process CUDA run
// trains over (Note [one process is a data-parallel group of one]). Its collectives must be the
// identity (all_reduce, broadcast) or a device copy (all_gather, reduce_scatter, all_to_all) of
// fresh random values, bit for bit, with nothing left to wait for; tensors on the host refused.
#include <gtest/gtest.h>

#include "backends/cuda/cuda_testing.h"
#include "forge/ops/creation.h"
#include "forge/core/generator.h"
#include "forge/parallel/self_group.h"

namespace forge {
namespace {
using cuda_testing::kGpu;

TEST(CudaSelfGroup, CollectivesAreIdentitiesOrCopiesOnTheDevice) {
  FORGE_SKIP_WITHOUT_GPU();
  auto g = parallel::self_group(kGpu);
  EXPECT_EQ(g->backend(), "self");
  EXPECT_EQ(g->device(), kGpu);
  manual_seed(7);
  for (DType dt : {DType::f32, DType::bf16}) {
    const Tensor src = randn({1000}, {.dtype = dt, .device = kGpu});
    const auto ref = src.to(Device::cpu()).to_vector<double>();
    Tensor t = src.clone();
    auto w = g->all_reduce(t, parallel::ReduceOp::avg);
    EXPECT_TRUE(w->is_completed());
    w->wait();
    EXPECT_EQ(t.to(Device::cpu()).to_vector<double>(), ref);
    g->broadcast(t, 0)->wait();
    EXPECT_EQ(t.to(Device::cpu()).to_vector<double>(), ref);
    for (int op = 0; op < 3; ++op) {
      Tensor out = zeros({1000}, {.dtype = dt, .device = kGpu});
      if (op == 0) g->all_gather(out, src)->wait();
      if (op == 1) g->reduce_scatter(out, src, parallel::ReduceOp::sum)->wait();
      if (op == 2) g->all_to_all(out, src)->wait();
      EXPECT_EQ(out.to(Device::cpu()).to_vector<double>(), ref) << "operation " << op;
    }
  }
  EXPECT_THROW(g->all_reduce(zeros({4})), Error);  // a host tensor for a CUDA group
  EXPECT_THROW(g->send(zeros({4}, {.device = kGpu}), 0), Error);
  EXPECT_EQ(g->new_group({0})->device(), kGpu);
}

}  // namespace
}  // namespace forge
