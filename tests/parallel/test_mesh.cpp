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

// Context parallelism sits between tp and pp: rank = ((dp * pp + pp_rank) * cp + cp_rank) * tp + tp_rank.
TEST(Mesh, ContextParallelSitsBetweenTensorAndPipeline) {
  // world 16: tp 2, cp 2, pp 2, dp 2; rank 13 = ((1 * 2 + 1) * 2 + 0) * 2 + 1
  const Mesh m = Mesh::carve(16, 13, 2, 2, 2);
  EXPECT_EQ(m.dp(), 2);
  EXPECT_EQ(m.cp(), 2);
  EXPECT_EQ(m.world_size(), 16);
  EXPECT_EQ(m.dp_rank(), 1);
  EXPECT_EQ(m.pp_rank(), 1);
  EXPECT_EQ(m.cp_rank(), 0);
  EXPECT_EQ(m.tp_rank(), 1);
  EXPECT_EQ(m.tp_group_ranks(), (std::vector<int>{12, 13}));
  EXPECT_EQ(m.cp_group_ranks(), (std::vector<int>{13, 15}));
  EXPECT_EQ(m.pp_group_ranks(), (std::vector<int>{9, 13}));
  EXPECT_EQ(m.dp_group_ranks(), (std::vector<int>{5, 13}));
  // The data-parallel reduction of a context-parallel run: dp x cp, dp varying slowest.
  EXPECT_EQ(m.group_ranks({"dp", "cp"}), (std::vector<int>{5, 7, 13, 15}));
  EXPECT_EQ(m.rank_at(0, 1, 0), 4);  // ((0 * 2 + 1) * 2 + 0) * 2 + 0: at this rank's cp coordinate 0
  EXPECT_EQ(m.describe(), "dp 2 x tp 2 x pp 2 x cp 2 (rank 13: dp 1, pp 1, tp 1, cp 0)");
  // Every group of one kind partitions the world, whatever the dimensions.
  for (const std::vector<std::string>& dims : {std::vector<std::string>{"cp"}, {"dp", "cp"}, {"tp", "cp"}, {"pp"}}) {
    std::set<int> seen;
    for (const auto& g : m.all_groups(dims)) {
      EXPECT_EQ(g.size(), 2u * dims.size());
      for (int r : g) EXPECT_TRUE(seen.insert(r).second) << "rank " << r << " in two groups";
    }
    EXPECT_EQ(seen.size(), 16u);
  }
  // cp = 1 numbers the ranks exactly as a mesh without it.
  for (int r = 0; r < 8; ++r) {
    const Mesh a = Mesh::carve(8, r, 2, 2), b = Mesh::carve(8, r, 2, 2, 1);
    EXPECT_EQ(a.all_dp_groups(), b.all_dp_groups());
    EXPECT_EQ(a.group_ranks({"dp", "cp"}), a.dp_group_ranks());
  }
  try {
    Mesh::carve(6, 0, 1, 1, 4);
    FAIL() << "cp 4 carved a world of 6";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("x dist.cp = 4 = 4 ranks per model replica"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("lower dist.tp / dist.pp / dist.cp"), std::string::npos) << e.what();
  }
}

TEST(Mesh, NamedDimensionsOfAnyNumber) {
  const Mesh m = Mesh::of({{"a", 3}, {"b", 1}, {"c", 2}}, 5);  // 5 = a 2, c 1
  EXPECT_EQ(m.world_size(), 6);
  EXPECT_EQ(m.coord("a"), 2);
  EXPECT_EQ(m.coord("c"), 1);
  EXPECT_EQ(m.size("tp"), 1);  // a dimension the mesh does not have: size 1, coordinate 0
  EXPECT_EQ(m.group_ranks({"a"}), (std::vector<int>{1, 3, 5}));
  EXPECT_EQ(m.all_groups({"c"}), (std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}}));
  EXPECT_THROW(Mesh::of({{"a", 2}, {"a", 2}}, 0), Error);
  EXPECT_THROW(Mesh::of({{"a", 0}}, 0), Error);
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
