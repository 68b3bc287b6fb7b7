// Note [TensorBoard event files] (telemetry/tensorboard.h): CRC-32C against its published check
// values, one record's bytes assembled by hand from the protocol-buffer wire format (not by the
// writer's code), the reader's checks, and a CPU training run whose event file holds every
// number of metrics.jsonl at its step. (tests/python/tensorboard_check.py reads a run's files
// with TensorBoard's own EventAccumulator on a machine that has it.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "forge/core/error.h"
#include "forge/telemetry/metrics.h"
#include "forge/telemetry/tensorboard.h"
#include "forge/run/config.h"
#include "forge/train/trainer.h"
#include "train_testing.h"

namespace forge::telemetry {
namespace {

namespace fs = std::filesystem;

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

fs::path only_event_file(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) files.push_back(e.path());
  EXPECT_EQ(files.size(), 1u);
  EXPECT_EQ(files.at(0).filename().string().rfind("events.out.tfevents.", 0), 0u);
  return files.at(0);
}

TEST(TensorBoard, Crc32cMatchesItsCheckValues) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);               // the CRC catalogue's check value
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);     // RFC 3720 B.4: 32 bytes of zeros
  EXPECT_EQ(crc32c(std::string(32, '\xff')), 0x62A8AB43u);   // ... and of ones
  const uint32_t c = crc32c("123456789");
  EXPECT_EQ(masked_crc32c("123456789"), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

TEST(TensorBoard, ARecordIsTheEventsWireBytesFramed) {
  train_testing::Scratch scratch;
  const fs::path dir = scratch.path() / "tb";
  {
    TensorBoardWriter w(dir);
    w.scalars(3, 1.5, {{"a", 2.0}});
  }
  const std::string all = read_bytes(only_event_file(dir));
  // Event{wall_time = 1.5 (field 1, fixed64), step = 3 (field 2, varint), summary (field 5) =
  // Summary{value (field 1) = Value{tag (1) = "a", simple_value (2, fixed32) = 2.0f}}}.
  const std::string value = std::string("\x0a\x01" "a" "\x15", 4) + std::string("\x00\x00\x00\x40", 4);
  const std::string summary = std::string("\x0a\x08", 2) + value;
  const std::string event = std::string("\x09", 1) + std::string("\x00\x00\x00\x00\x00\x00\xf8\x3f", 8) +
                            std::string("\x10\x03\x2a\x0a", 4) + summary;
  std::string len(8, '\0');
  const uint64_t n = event.size();
  std::memcpy(len.data(), &n, 8);
  auto le32 = [](uint32_t x) { return std::string(reinterpret_cast<const char*>(&x), 4); };
  const std::string want = len + le32(masked_crc32c(len)) + event + le32(masked_crc32c(event));
  ASSERT_GE(all.size(), want.size());
  EXPECT_EQ(all.substr(all.size() - want.size()), want);
  // The first record: file_version "brain.Event:2" (field 3).
  const auto events = read_tensorboard(only_event_file(dir));
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  EXPECT_EQ(events[1].step, 3);
  EXPECT_DOUBLE_EQ(events[1].wall_time, 1.5);
  ASSERT_EQ(events[1].scalars.size(), 1u);
  EXPECT_EQ(events[1].scalars[0].first, "a");
  EXPECT_EQ(events[1].scalars[0].second, 2.0f);
  // A flipped byte or a cut file is named.
  std::string bad = all;
  bad[bad.size() - 6] ^= 1;
  std::ofstream(dir / "bad", std::ios::binary) << bad;
  try {
    read_tensorboard(dir / "bad");
    ADD_FAILURE() << "a corrupt record was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("record 1: the data's checksum does not match"), std::string::npos) << e.what();
  }
  std::ofstream(dir / "cut", std::ios::binary) << all.substr(0, all.size() - 3);
  EXPECT_THROW(read_tensorboard(dir / "cut"), Error);
}

TEST(TensorBoard, ATrainingRunWritesEveryScalarOfItsMetrics) {
  train_testing::Scratch scratch;
  train_testing::write_corpus(scratch.path() / "corpus");
  const train::RunConfig c = train::parse_config(train_testing::tiny_toml(scratch.path(), "tb", 12), "tb.toml",
                                                 {"--eval.every=5"});
  EXPECT_TRUE(c.telemetry.tensorboard);
  std::ostringstream log;
  const train::TrainResult r = train::run_training(c, {}, log);
  const auto events = read_tensorboard(only_event_file(fs::path(r.run_dir) / "tb"));
  // (step, tag) -> its values: two records of one step (the progress and the evaluation record)
  // may both carry a key such as elapsed_s, as two events.
  std::map<std::pair<int64_t, std::string>, std::vector<float>> tb;
  for (const auto& e : events)
    for (const auto& [tag, v] : e.scalars) tb[{e.step, tag}].push_back(v);
  int64_t checked = 0;
  for (const auto& rec : read_jsonl(fs::path(r.run_dir) / "metrics.jsonl")) {
    const bool final = rec.value("final", false);
    for (const auto& [key, v] : rec.items()) {
      if (key == "step" || !v.is_number()) continue;
      const auto it = tb.find({rec["step"].get<int64_t>(), final ? "final/" + key : key});
      ASSERT_NE(it, tb.end()) << "step " << rec["step"] << " " << key;
      EXPECT_NE(std::find(it->second.begin(), it->second.end(), static_cast<float>(v.get<double>())), it->second.end())
          << "step " << rec["step"] << " " << key;
      ++checked;
    }
  }
  EXPECT_GT(checked, 12 * 5);  // loss, lr, grad_norm, tokens_per_s, ... every step; val_loss; the final record
  EXPECT_EQ(tb.count({5, "val_loss"}), 1u);
  // Off: no tb directory; a fresh run (run.overwrite) replaces the old files.
  const train::RunConfig off = train::parse_config(train_testing::tiny_toml(scratch.path(), "tb_off", 2), "t.toml",
                                                   {"--telemetry.tensorboard=false"});
  train::run_training(off, {}, log);
  EXPECT_FALSE(fs::exists(fs::path(off.run_dir()) / "tb"));
  const train::RunConfig again = train::parse_config(train_testing::tiny_toml(scratch.path(), "tb", 3), "tb.toml",
                                                     {"--run.overwrite=true"});
  train::run_training(again, {}, log);
  EXPECT_EQ(read_tensorboard(only_event_file(fs::path(r.run_dir) / "tb")).back().step, 3);
}

}  // namespace
}  // namespace forge::telemetry
