// forge plot (telemetry/plot.h): the panels hold every training record's figures and the
// evaluations, one series per run; the SVG has a polyline per series per panel and escapes names;
// bad runs are named; the CLI writes the file.
#include <gtest/gtest.h>

#include <regex>
#include <sstream>

#include "forge/core/error.h"
#include "forge/telemetry/metrics.h"
#include "forge/telemetry/plot.h"
#include "testing/cli_testing.h"
#include "train_testing.h"

namespace forge::telemetry {
namespace {

namespace fs = std::filesystem;

void write_run(const fs::path& dir, int steps, double scale) {
  fs::create_directories(dir);
  JsonlWriter w(dir / "metrics.jsonl", true);
  for (int s = 1; s <= steps; ++s) {
    w.write({{"step", s}, {"loss", scale * (10.0 - s * 0.1)}, {"lr", 1e-3 * s / steps}, {"grad_norm", 1.0},
             {"tokens_per_s", 1000.0 + s}, {"mfu", 0.3}, {"elapsed_s", s}});
    if (s % 10 == 0) w.write({{"step", s}, {"val_loss", scale * (9.0 - s * 0.05)}, {"elapsed_s", s}});
  }
  w.write({{"step", steps + 1}, {"skipped", true}, {"loss", 1e9}});
  w.write({{"step", steps}, {"final", true}, {"tokens_per_s", 5.0}, {"val_loss", 1.0}});
}

TEST(Plot, PanelsHoldEveryRecordOfEveryRun) {
  train_testing::Scratch scratch;
  write_run(scratch.path() / "a", 30, 1.0);
  write_run(scratch.path() / "b<&>", 20, 2.0);
  const auto panels = plot_panels({scratch.path() / "a", scratch.path() / "b<&>" / "metrics.jsonl"});
  ASSERT_EQ(panels.size(), 5u);
  EXPECT_EQ(panels[0].key, "loss");
  EXPECT_EQ(panels[3].key, "tokens_per_s");
  EXPECT_EQ(panels[3].title, "tokens per second");
  ASSERT_EQ(panels[0].series.size(), 2u);
  EXPECT_EQ(panels[0].series[0].run, "a");
  EXPECT_EQ(panels[0].series[1].run, "b<&>");
  EXPECT_EQ(panels[0].series[0].points.size(), 30u);  // the skipped step and the final record left out
  EXPECT_EQ(panels[0].series[1].points.size(), 20u);
  EXPECT_DOUBLE_EQ(panels[0].series[1].points[4].second, 2.0 * (10.0 - 0.5));
  EXPECT_EQ(panels[1].series[0].points.size(), 4u);  // val_loss at 10, 20, 30 and the final one
  EXPECT_EQ(panels[3].series[0].points.back().second, 1030.0);  // not the final record's mean

  const std::string svg = plot_svg(panels);
  EXPECT_EQ(svg.rfind("<svg ", 0), 0u);
  const std::regex line("<polyline class=\"series\" data-run=\"([^\"]*)\"");
  const auto n = std::distance(std::sregex_iterator(svg.begin(), svg.end(), line), std::sregex_iterator());
  EXPECT_EQ(n, 10);  // 5 panels x 2 runs
  EXPECT_NE(svg.find("data-run=\"b&lt;&amp;&gt;\""), std::string::npos);
  EXPECT_EQ(svg.find("b<&>"), std::string::npos);

  try {
    plot_panels({scratch.path() / "nowhere"});
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not exist; give a run directory"), std::string::npos) << e.what();
  }
}

TEST(Plot, CliWritesTheSvg) {
  train_testing::Scratch scratch;
  write_run(scratch.path() / "run1", 12, 1.0);
  const fs::path out = scratch.path() / "c.svg";
  const auto r = forge::testing::run_forge({"plot", (scratch.path() / "run1").string(), "--out", out.string()});
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("5 panel(s)"), std::string::npos) << r.out;
  EXPECT_NE(train_testing::read_text(out).find("</svg>"), std::string::npos);
  EXPECT_NE(forge::testing::run_forge({"plot"}).status, 0);
}

}  // namespace
}  // namespace forge::telemetry
