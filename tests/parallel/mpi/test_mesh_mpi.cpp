// parallel::Mesh over real ranks (mpirun -np 1/2/4): every group attach() makes holds the ranks the
// mesh names, and a collective on it combines exactly those ranks.
#include <gtest/gtest.h>

#include <vector>

#include "forge/ops/creation.h"
#include "forge/parallel/mesh.h"
#include "forge/parallel/world.h"

namespace forge::parallel {
namespace {

// The sum over a group of (world rank + 1), from an all-reduce on that group.
double group_sum(const ProcessGroupPtr& g) {
  Tensor t = from_vector(std::vector<double>{static_cast<double>(world()->rank() + 1)}, {1}, {.dtype = DType::f64});
  g->all_reduce(t, ReduceOp::sum)->wait();
  return t.to_vector<double>()[0];
}

double expected_sum(const std::vector<int>& ranks) {
  double s = 0;
  for (int r : ranks) s += r + 1;
  return s;
}

TEST(MeshMpi, EveryLayoutOfTheWorldReducesOverItsOwnGroups) {
  const int W = world()->size(), rank = world()->rank();
  for (int tp = 1; tp <= W; tp *= 2)
    for (int pp = 1; tp * pp <= W; pp *= 2) {
      if (W % (tp * pp) != 0) continue;
      Mesh m = Mesh::carve(W, rank, tp, pp);
      m.attach(world());  // collective: every rank, same shape, same order
      SCOPED_TRACE(m.describe());
      ASSERT_EQ(m.tp_group() == nullptr, tp == 1);
      ASSERT_EQ(m.pp_group() == nullptr, pp == 1);
      ASSERT_EQ(m.dp_group() == nullptr, m.dp() == 1);
      if (m.tp_group()) {
        EXPECT_EQ(m.tp_group()->size(), tp);
        EXPECT_EQ(m.tp_group()->rank(), m.tp_rank());
        EXPECT_EQ(group_sum(m.tp_group()), expected_sum(m.tp_group_ranks()));
      }
      if (m.pp_group()) {
        EXPECT_EQ(m.pp_group()->rank(), m.pp_rank());
        EXPECT_EQ(group_sum(m.pp_group()), expected_sum(m.pp_group_ranks()));
      }
      if (m.dp_group()) {
        EXPECT_EQ(m.dp_group()->rank(), m.dp_rank());
        EXPECT_EQ(group_sum(m.dp_group()), expected_sum(m.dp_group_ranks()));
      }
    }
}

}  // namespace
}  // namespace forge::parallel
