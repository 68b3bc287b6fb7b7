// parallel::group_ranks_per_node: how many of a data-parallel group's ranks each node holds,
// given the members' world ranks and the node size, for the meshes forge carves (tp innermost,
// dp outermost: parallel/mesh.h), and the layouts it refuses.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "forge/core/error.h"
#include "forge/parallel/hierarchical_group.h"
#include "forge/parallel/mesh.h"

namespace forge::parallel {
namespace {

TEST(HierarchicalRanks, ConsecutiveRanksOnNodesOfTwo) {
  EXPECT_EQ(group_ranks_per_node({0, 1, 2, 3}, 2), 2);
  EXPECT_EQ(group_ranks_per_node({0, 1, 2, 3, 4, 5, 6, 7}, 4), 4);
  EXPECT_EQ(group_ranks_per_node({0, 1, 2, 3}, 4), 4);  // one node: the flat group
  EXPECT_EQ(group_ranks_per_node({0, 1, 2, 3}, 1), 1);  // a rank per node: the flat group
}

// 16 ranks, tp 2, pp 2 (dp 4) on nodes of 8: the dp group of rank 0 is {0, 4, 8, 12}, two per node.
TEST(HierarchicalRanks, TheDataParallelGroupOfAMeshWithTensorAndPipelineParallelism) {
  const Mesh m = Mesh::carve(16, 0, /*tp=*/2, /*pp=*/2);
  const std::vector<int> dp = m.group_ranks({"dp", "cp"});
  ASSERT_EQ(dp, (std::vector<int>{0, 4, 8, 12}));
  EXPECT_EQ(group_ranks_per_node(dp, 8), 2);
  EXPECT_EQ(group_ranks_per_node(dp, 4), 1);
  EXPECT_EQ(group_ranks_per_node(dp, 16), 4);
}

TEST(HierarchicalRanks, UnevenNodesAreRefusedNamingTheSetting) {
  for (const auto& [ranks, node] : std::vector<std::pair<std::vector<int>, int>>{{{0, 1, 2, 3}, 3}, {{0, 1, 2, 3, 4, 5}, 4}}) {
    try {
      group_ranks_per_node(ranks, node);
      FAIL() << "expected an error for node size " << node;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("dist.node_size"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("different numbers"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace forge::parallel
