// parallel::Mesh: the dp x tp x pp carving of a world (tp innermost, then pp, dp outermost), its
// checks, and attaching it to a world of one. The groups over real ranks are tested under
// mpirun in tests/parallel/mpi/test_mesh_mpi.cpp.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "forge/core/error.h"
#include "forge/parallel/mesh.h"
#include "forge/parallel/world.h"

namespace forge::parallel {
namespace {

std::string error_of(int world, int rank, int tp, int pp) {
  try {
    Mesh::carve(world, rank, tp, pp);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Mesh, TensorParallelIsInnermostThenPipelineThenData) {
  const Mesh m = Mesh::carve(8, 5, 2, 2);
  EXPECT_EQ(m.dp(), 2);
  EXPECT_EQ(m.tp(), 2);
  EXPECT_EQ(m.pp(), 2);
  EXPECT_EQ(m.world_size(), 8);
  // rank 5 = (dp 1 * pp 2 + pp 0) * tp 2 + tp 1
  EXPECT_EQ(m.dp_rank(), 1);
  EXPECT_EQ(m.pp_rank(), 0);
  EXPECT_EQ(m.tp_rank(), 1);
  EXPECT_EQ(m.tp_group_ranks(), (std::vector<int>{4, 5}));
  EXPECT_EQ(m.pp_group_ranks(), (std::vector<int>{5, 7}));
  EXPECT_EQ(m.dp_group_ranks(), (std::vector<int>{1, 5}));
  EXPECT_EQ(m.all_tp_groups(), (std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(m.all_pp_groups(), (std::vector<std::vector<int>>{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(m.all_dp_groups(), (std::vector<std::vector<int>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(m.describe(), "dp 2 x tp 2 x pp 2 (rank 5: dp 1, pp 0, tp 1)");
}

TEST(Mesh, EveryRankHasOnePlaceAndEachDimensionPartitionsTheWorld) {
  for (const auto& [world, tp, pp] : std::vector<std::tuple<int, int, int>>{{12, 2, 3}, {8, 4, 1}, {8, 1, 4}, {6, 1, 1}}) {
    std::set<std::tuple<int, int, int>> coords;
    for (int r = 0; r < world; ++r) {
      const Mesh m = Mesh::carve(world, r, tp, pp);
      EXPECT_EQ(m.rank_at(m.dp_rank(), m.pp_rank(), m.tp_rank()), r);
      coords.insert({m.dp_rank(), m.pp_rank(), m.tp_rank()});
      // This rank is in its own groups, at its coordinate's position.
      EXPECT_EQ(m.tp_group_ranks()[static_cast<size_t>(m.tp_rank())], r);
      EXPECT_EQ(m.pp_group_ranks()[static_cast<size_t>(m.pp_rank())], r);
      EXPECT_EQ(m.dp_group_ranks()[static_cast<size_t>(m.dp_rank())], r);
    }
    EXPECT_EQ(static_cast<int>(coords.size()), world);
    const Mesh m = Mesh::carve(world, 0, tp, pp);
    for (const auto& groups : {m.all_tp_groups(), m.all_pp_groups(), m.all_dp_groups()}) {
      std::set<int> seen;
      for (const auto& g : groups)
        for (int r : g) EXPECT_TRUE(seen.insert(r).second) << "rank " << r << " in two groups of one dimension";
      EXPECT_EQ(static_cast<int>(seen.size()), world);
    }
  }
}

TEST(Mesh, DegreesThatDoNotSplitTheWorldAreRefusedWithTheFix) {
  const std::string e = error_of(1, 0, 2, 1);
  EXPECT_NE(e.find("dist.tp = 2 x dist.pp = 1 = 2 ranks per model replica, but the world has 1 process"),
            std::string::npos) << e;
  EXPECT_NE(e.find("forge launch --nproc-per-node 2"), std::string::npos) << e;
  EXPECT_NE(e.find("lower dist.tp / dist.pp"), std::string::npos) << e;
  EXPECT_NE(error_of(6, 0, 2, 2).find("the world has 6 processes, which is not a multiple of 4"), std::string::npos);
  EXPECT_NE(error_of(4, 0, 0, 1).find("dist.tp must be >= 1"), std::string::npos);
  EXPECT_NE(error_of(4, 0, 1, -1).find("dist.pp must be >= 1"), std::string::npos);
}

TEST(Mesh, AWorldOfOneNeedsNoGroups) {
  Mesh m = Mesh::carve(1, 0, 1, 1);
  m.attach(world() ? world() : init_world(LaunchEnv{}, Device::cpu()));
  EXPECT_NE(m.world(), nullptr);
  EXPECT_EQ(m.dp_group(), nullptr);
  EXPECT_EQ(m.tp_group(), nullptr);
  EXPECT_EQ(m.pp_group(), nullptr);
}

}  // namespace
}  // namespace forge::parallel
