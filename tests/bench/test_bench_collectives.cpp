// forge bench collectives: the size and bandwidth arithmetic, and runs on CPU ranks (the self
// world of one process, and two MPI ranks).
#include <gtest/gtest.h>

#include <filesystem>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <string>

#include "forge/bench/collectives.h"
#include "forge/core/error.h"
#include "testing/cli_testing.h"

namespace {

using forge::bench::busbw_factor;
using forge::bench::collective_elements;
using forge::bench::collective_sizes;

TEST(BenchCollectives, BusBandwidthFactorsFollowNcclTests) {
  EXPECT_DOUBLE_EQ(busbw_factor("all_reduce", 2), 1.0);
  EXPECT_DOUBLE_EQ(busbw_factor("all_reduce", 8), 2.0 * 7 / 8);
  EXPECT_DOUBLE_EQ(busbw_factor("all_gather", 4), 0.75);
  EXPECT_DOUBLE_EQ(busbw_factor("reduce_scatter", 4), 0.75);
  EXPECT_DOUBLE_EQ(busbw_factor("all_to_all", 8), 7.0 / 8);
  EXPECT_DOUBLE_EQ(busbw_factor("broadcast", 8), 1.0);
  EXPECT_DOUBLE_EQ(busbw_factor("send_recv", 2), 1.0);
  EXPECT_DOUBLE_EQ(busbw_factor("all_reduce", 1), 1.0);
  EXPECT_THROW(busbw_factor("allreduce", 2), forge::Error);
}

TEST(BenchCollectives, ElementsAreAMultipleOfTheWorld) {
  EXPECT_EQ(collective_elements(1024, 4, 1), 256);
  EXPECT_EQ(collective_elements(1024, 4, 3), 255);
  EXPECT_EQ(collective_elements(8, 4, 4), 4);  // at least one element per rank
  EXPECT_EQ(collective_elements(int64_t{1} << 30, 2, 8), (int64_t{1} << 29));
}

TEST(BenchCollectives, SizesArePowersOfTwo) {
  EXPECT_EQ(collective_sizes(8, 64), (std::vector<int64_t>{8, 16, 32, 64}));
  EXPECT_EQ(collective_sizes(1024, 1024), (std::vector<int64_t>{1024}));
  EXPECT_THROW(collective_sizes(64, 8), forge::Error);
}

class BenchCollectivesCli : public forge::testing::ForgeCliTest {};

TEST_F(BenchCollectivesCli, OneProcessRunsEveryCollectiveButSendRecv) {
  const auto r = forge::testing::run_forge(
      {"bench", "collectives", "--device", "cpu", "--sizes", "8..1K", "--iters", "2", "--warmup", "1", "--json"},
      forge::testing::Stderr::dropped);
  ASSERT_EQ(r.status, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["world"], 1);
  EXPECT_EQ(j["results"].size(), 5u * 8u);  // 5 collectives x 8 sizes; send_recv needs 2 ranks
  EXPECT_NE(j["notes"].dump().find("send_recv needs at least 2 ranks"), std::string::npos);
  for (const auto& x : j["results"]) {
    EXPECT_GT(x["time_us"].get<double>(), 0.0);
    EXPECT_NEAR(x["algbw_gbs"].get<double>(), x["bytes"].get<double>() / (x["time_us"].get<double>() * 1e-6) / 1e9, 1e-9);
  }
  const auto bad = forge::testing::run_forge({"bench", "collectives", "--device", "cpu", "--ops", "allreduce"});
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.out.find("unknown operation 'allreduce'"), std::string::npos) << bad.out;
}

TEST_F(BenchCollectivesCli, TwoMpiRanksReportFromRankZero) {
  // Its own Open MPI session directory: concurrent mpiruns (ctest -j) can race on the shared one.
  const std::filesystem::path tmp =
      std::filesystem::temp_directory_path() / ("forge_bench_ompi_" + std::to_string(::getpid()));
  std::filesystem::create_directories(tmp);
  const std::string cmd =
      "OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_orte_tmpdir_base=" +
      forge::testing::shell_quote(tmp.string()) +
      " OMPI_MCA_btl_vader_single_copy_mechanism=none mpirun --oversubscribe --bind-to none -np 2 " +
      forge::testing::shell_quote(forge::testing::forge_binary().string()) +
      " bench collectives --device cpu --sizes 64..4K --iters 3 --warmup 1 --json 2>/dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  ASSERT_EQ(::pclose(p), 0) << out;
  const auto j = nlohmann::json::parse(out);  // one JSON object: rank 1 prints nothing
  EXPECT_EQ(j["world"], 2);
  EXPECT_EQ(j["backend"], "mpi");
  EXPECT_EQ(j["results"].size(), 6u * 7u);  // every operation, send_recv included, x 7 sizes
  for (const auto& x : j["results"])
    EXPECT_NEAR(x["busbw_gbs"].get<double>(), x["algbw_gbs"].get<double>() * busbw_factor(x["op"], 2), 1e-9);
}

}  // namespace
