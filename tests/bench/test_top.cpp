// forge top (bench/top.h): the clock-event reasons in words, the table and the JSON of a sample,
// and, on a machine without a GPU, the message and the distinct exit status. (On a GPU machine
// scripts/gpu-dist-runs.sh's tb_check step sets forge top --once --json beside nvidia-smi.)
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "forge/bench/gpu_sampler.h"
#include "forge/bench/top.h"
#include "forge/telemetry/metrics.h"
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
  g.gpm.sm_active_pct = 81.4;
  g.gpm.sm_occupancy_pct = 30.0;
  g.gpm.tensor_active_pct = 38.6;
  g.gpm.dram_active_pct = 55.0;
  g.gpm.pcie_tx_gbps = 0.25;
  g.gpm.pcie_rx_gbps = 1.5;
  g.gpm.nvlink_tx_gbps = 120.0;
  g.gpm.nvlink_rx_gbps = 118.5;
  s.gpus = {g};
  const std::string t = top_table(s);
  for (const char* want : {"driver 580.1", "NVIDIA H100", "97%", "40%", "21.00 GB / 85.52 GB", "512 / 700 W", "1980", "61C",
                           "power cap", "pid 4242", "forge", "not SM saturation", "81%", "39%", "occupancy 30%",
                           "DRAM 55%", "PCIe tx/rx 0.2 / 1.5 GB/s", "NVLink tx/rx 120.0 / 118.5 GB/s"})
    EXPECT_NE(t.find(want), std::string::npos) << want << "\n" << t;
  const auto j = top_json(s);
  EXPECT_EQ(j["gpus"][0]["utilization_pct"], 97);
  EXPECT_EQ(j["gpus"][0]["memory_used_bytes"], 21'000'000'000);
  EXPECT_EQ(j["gpus"][0]["clock_event_reason_names"][0], "power cap");
  EXPECT_EQ(j["gpus"][0]["processes"][0]["pid"], 4242);
  EXPECT_DOUBLE_EQ(j["gpus"][0]["sm_active_pct"].get<double>(), 81.4);
  EXPECT_DOUBLE_EQ(j["gpus"][0]["tensor_active_pct"].get<double>(), 38.6);
  EXPECT_DOUBLE_EQ(j["gpus"][0]["nvlink_rx_gbps"].get<double>(), 118.5);
  // Without GPM (before Hopper): -1 in the JSON, "-" in the table.
  s.gpus[0].gpm = {};
  EXPECT_EQ(top_json(s)["gpus"][0]["sm_active_pct"], -1);
  EXPECT_EQ(top_table(s).find("NVLink"), std::string::npos);
}

// What a training run's progress line and metrics.jsonl get from the GPU sampler (Note [idle
// share] in gpu_sampler.h): utilisation beside GPM's SM and tensor activity where measured.
TEST(GpuActivity, TheProgressTextAndTheMetricsRecord) {
  GpuActivity a;
  EXPECT_EQ(activity_text(a), "");
  EXPECT_TRUE(activity_record(a).empty());
  a.samples = 12;
  a.utilization_pct = 97.2;
  a.memory_utilization_pct = 41;
  a.power_w = 500;
  a.sm_clock_min_mhz = 1755;
  a.temperature_max_c = 60;
  a.memory_used_max_bytes = 7'000'000'000;
  a.clock_event_reasons = 0x1 | 0x4;
  EXPECT_EQ(activity_text(a), "GPU busy 97%");
  auto r = activity_record(a);
  EXPECT_DOUBLE_EQ(r["gpu_util_pct"].get<double>(), 97.2);
  EXPECT_EQ(r["gpu_clock_events"], "power cap");  // "idle" left out
  EXPECT_FALSE(r.contains("gpu_sm_active_pct"));
  a.gpm_intervals = 3;
  a.gpm.sm_active_pct = 80.6;
  a.gpm.tensor_active_pct = 38.2;
  a.gpm.nvlink_tx_gbps = 0;
  EXPECT_EQ(activity_text(a), "GPU busy 97%, SM 81%, tensor 38%");
  r = activity_record(a);
  EXPECT_DOUBLE_EQ(r["gpu_sm_active_pct"].get<double>(), 80.6);
  EXPECT_DOUBLE_EQ(r["gpu_tensor_active_pct"].get<double>(), 38.2);
  EXPECT_DOUBLE_EQ(r["gpu_nvlink_tx_gbps"].get<double>(), 0.0);
  EXPECT_FALSE(r.contains("gpu_pcie_tx_gbps"));  // not measured
  EXPECT_NE(telemetry::progress_line({.step = 5, .total_steps = 10, .gpu = activity_text(a)}).find(
                "| GPU busy 97%, SM 81%, tensor 38% |"),
            std::string::npos);
}

TEST(Top, WithoutAGpuItSaysSoAndExitsThree) {
  const TopSnapshot s = top_snapshot();
  if (!s.gpus.empty()) GTEST_SKIP() << "this machine has a GPU: the no-GPU path is for machines without one";
  EXPECT_FALSE(s.note.empty());
  const auto r = forge::testing::run_forge({"top", "--once"});
  EXPECT_EQ(r.status, kNoGpuStatus) << r.out;
  EXPECT_NE(r.out.find("forge top: no GPU to show"), std::string::npos) << r.out;
  const auto j = forge::testing::run_forge({"top", "--once", "--json"}, forge::testing::Stderr::dropped);
  EXPECT_EQ(j.status, kNoGpuStatus);
  const nlohmann::json parsed = nlohmann::json::parse(j.out);  // stdout alone: one JSON object
  EXPECT_EQ(parsed.at("error"), "no GPU to show");
  EXPECT_FALSE(parsed.at("reason").get<std::string>().empty());
  EXPECT_TRUE(parsed.at("gpus").empty());
  EXPECT_EQ(forge::testing::run_forge({"top", "--interval", "0"}).status, 1);  // a bad argument: an error, not "no GPU"
}

}  // namespace
}  // namespace forge::bench
