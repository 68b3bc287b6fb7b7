#pragma once
// TensorBoard event files, written by hand (no TensorFlow, no protobuf library): the scalars of
// a run's metrics.jsonl by step, for `tensorboard --logdir <run dir>/tb`.
//
// Note [TensorBoard event files]: an event file (events.out.tfevents.<seconds>.<host>.<pid>) is a
// sequence of TFRecords, each
//   uint64 length (little-endian) | uint32 masked_crc32c(length's 8 bytes) | data | uint32 masked_crc32c(data)
// with masked_crc32c(x) = ((c >> 15) | (c << 17)) + 0xa282ead8 for c = CRC-32C (Castagnoli) of x.
// Each record's data is a serialized tensorflow.Event protocol buffer:
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }
//   Value   { string tag = 1; float simple_value = 2; }
// The first record holds file_version "brain.Event:2"; every later one a step's scalars. Each
// record is written whole and flushed, so a crash loses at most the record being written (which
// TensorBoard skips as a truncated tail).
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace forge::telemetry {

// CRC-32C (Castagnoli polynomial 0x82F63B78, reflected), and TFRecord's mask of it.
uint32_t crc32c(std::string_view data);
uint32_t masked_crc32c(std::string_view data);

class TensorBoardWriter {
 public:
  // Creates `dir` if needed and a new event file in it, starting with the file-version record.
  explicit TensorBoardWriter(const std::filesystem::path& dir);
  // One Event at `step` holding every (tag, value) as a scalar (simple_value, a float).
  void scalars(int64_t step, double wall_time, const std::vector<std::pair<std::string, double>>& values);
  const std::filesystem::path& path() const { return path_; }

 private:
  void record(const std::string& data);
  std::filesystem::path path_;
  std::ofstream out_;
};

// The scalars of a metrics.jsonl record (json object): every number but "step", under its own key;
// a final record's ("final": true) under "final/<key>", so the run's summary figures (its mean
// tokens/s, ...) do not join the per-interval series of the same name. Booleans and strings are
// left out.
std::vector<std::pair<std::string, double>> record_scalars(const nlohmann::json& record);

// What a reader gets back from an event file (tests; forge plot could read runs this way).
struct TensorBoardEvent {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  std::vector<std::pair<std::string, float>> scalars;
};
// Reads every record of an event file, checking both CRCs of each; throws forge::Error naming
// the file and the record on a bad length or checksum (a truncated last record is an error too).
std::vector<TensorBoardEvent> read_tensorboard(const std::filesystem::path& path);

}  // namespace forge::telemetry
