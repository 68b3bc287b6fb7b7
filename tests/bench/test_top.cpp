// forge top (bench/top.h): the clock-event reasons in words, the table and the JSON of a sample,
// and, on a machine without a GPU, the message and the distinct exit status. (On a GPU machine
// scripts/gpu-dist-runs.sh's tb_check step sets forge top --once --json beside nvidia-smi.)
#include <gtest/gtest.h>

#include <cstdlib>

#include "forge/bench/top.h"
#include "testing/cli_testing.h"

namespace forge::bench {
namespace {

TEST(Top, ClockEventReasonsInWords) {
  EXPECT_TRUE(clock_event_reason_names(0).empty());
  EXPECT_EQ(clock_event_reason_names(0x4 | 0x40), (std::vector<std::string>{"power cap", "HW thermal slowdown"}));
  EXPECT_EQ(clock_event_reason_names(0x1), (std::vector<std::string>{"idle"}));
}

TEST(Top, TableAndJsonOfASample) {
  TopSnapshot s;
  s.driver = "580.1";
  GpuState g;
  g.index = 1;
  g.name = "NVIDIA H100 80GB HBM3";
  g.utilization_pct = 97;
  g.memory_utilization_pct = 40;
  g.memory_used_bytes = 21'000'000'000;
  g.memory_total_bytes = 85'520'000'000;
  g.power_w = 512.4;
  g.power_limit_w = 700;
  g.sm_clock_mhz = 1980;
  g.temperature_c = 61;
  g.clock_event_reasons = 0x4;
  g.reasons = clock_event_reason_names(0x4);
  g.processes = {{4242, "forge", 20'500'000'000}};
  s.gpus = {g};
  const std::string t = top_table(s);
  for (const char* want : {"driver 580.1", "NVIDIA H100", "97%", "40%", "21.00 GB / 85.52 GB", "512 / 700 W", "1980", "61C",
                           "power cap", "pid 4242", "forge", "not SM saturation"})
    EXPECT_NE(t.find(want), std::string::npos) << want << "\n" << t;
  const auto j = top_json(s);
  EXPECT_EQ(j["gpus"][0]["utilization_pct"], 97);
  EXPECT_EQ(j["gpus"][0]["memory_used_bytes"], 21'000'000'000);
  EXPECT_EQ(j["gpus"][0]["clock_event_reason_names"][0], "power cap");
  EXPECT_EQ(j["gpus"][0]["processes"][0]["pid"], 4242);
}

TEST(Top, WithoutAGpuItSaysSoAndExitsThree) {
  const TopSnapshot s = top_snapshot();
  if (!s.gpus.empty()) GTEST_SKIP() << "this machine has a GPU: the no-GPU path is for machines without one";
  EXPECT_FALSE(s.note.empty());
  const auto r = forge::testing::run_forge({"top", "--once"});
  EXPECT_EQ(r.status, kNoGpuStatus) << r.out;
  EXPECT_NE(r.out.find("forge top: no GPU to show"), std::string::npos) << r.out;
  EXPECT_EQ(forge::testing::run_forge({"top", "--once", "--json"}).status, kNoGpuStatus);
  EXPECT_EQ(forge::testing::run_forge({"top", "--interval", "0"}).status, 1);  // a bad argument: an error, not "no GPU"
}

}  // namespace
}  // namespace forge::bench
