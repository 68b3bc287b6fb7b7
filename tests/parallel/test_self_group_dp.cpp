// Note [gradient memory between steps] (parallel/grad_buckets.cpp): DataParallel over a self group
// with release_grads (one process's executor, Note [one process is a data-parallel group of
// one]) drops the buckets' gradient memory at zero_grad and takes it again at the next step's
// backward: the same parameters step for step as with the buckets kept, and the gradients' bytes
// gone from the allocator between steps.
#include <gtest/gtest.h>

#include <memory>

#include "forge/core/allocator.h"
#include "forge/ops/binary.h"
#include "forge/ops/creation.h"
#include "forge/ops/matmul.h"
#include "forge/ops/reduce.h"
#include "forge/optim/sgd.h"
#include "forge/parallel/data_parallel.h"
#include "forge/parallel/self_group.h"

namespace forge::parallel {
namespace {

struct Replica {
  Tensor w1, w2;
  std::unique_ptr<DataParallel> dp;
};

Replica make(bool release) {
  manual_seed(11);
  Replica r;
  r.w1 = randn({64, 48}).requires_grad_(true);
  r.w2 = randn({48, 8}).requires_grad_(true);
  auto factory = [](std::vector<optim::ParamGroup> g) {
    return std::make_unique<optim::SGD>(std::move(g), optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
  };
  DataParallelOptions o;
  o.bucket_mb = 0.005;
  o.release_grads = release;
  r.dp = std::make_unique<DataParallel>(std::vector<std::pair<std::string, Tensor>>{{"w1", r.w1}, {"w2", r.w2}},
                                        std::vector<optim::ParamGroup>{{.params = {r.w1, r.w2}}}, factory,
                                        self_group(Device::cpu()), o);
  return r;
}

void step(Replica& r, const Tensor& x) {
  r.dp->begin_backward(true);
  Tensor loss = ops::sum(ops::mul(ops::matmul(ops::matmul(x, r.w1), r.w2), ops::matmul(ops::matmul(x, r.w1), r.w2)));
  loss.backward();
  r.dp->end_backward();
  r.dp->step(Tensor());
}

TEST(SelfGroupDataParallel, ReleasedGradientsGiveTheSameStepsAndFreeTheirBytes) {
  Replica kept = make(false), released = make(true);
  ASSERT_GT(released.dp->num_buckets(), 1);  // (several buckets: 12 KB of gradients in 5 KB ones)
  manual_seed(12);
  for (int i = 0; i < 3; ++i) {
    const Tensor x = randn({16, 64});
    step(kept, x);
    step(released, x);
    kept.dp->zero_grad();
    const int64_t before = cpu_memory_stats().allocated;
    released.dp->zero_grad();
    const int64_t freed = before - cpu_memory_stats().allocated;
    EXPECT_GE(freed, (64 * 48 + 48 * 8) * 4) << "step " << i;  // the gradients' bytes (and the padding)
    EXPECT_EQ(kept.w1.to_vector<float>(), released.w1.to_vector<float>()) << "step " << i;
    EXPECT_EQ(kept.w2.to_vector<float>(), released.w2.to_vector<float>()) << "step " << i;
  }
}

}  // namespace
}  // namespace forge::parallel
