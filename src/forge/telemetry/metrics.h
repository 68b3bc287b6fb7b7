#pragma once
// Run metrics: the JSONL log (<run dir>/metrics.jsonl) and the one-line progress report.
//
// metrics.jsonl holds one JSON object per line, written whole and flushed at once, so a
// crash loses at most the line being written and every complete line parses on its own.
// Training records carry "step" (optimizer steps completed); a resumed run first drops the
// records past its checkpoint's step (truncate_jsonl_after_step), so the file reads like
// one uninterrupted run.
//
// The progress line (progress_line):
//   step   120/500 | loss 4.1234 | lr 5.87e-04 | 18.2k tok/s | 1.21 GB | 0:42 elapsed | ETA 2:13
//   epoch 1/2 | step 1875/3750 | loss 0.3690 | lr 1.25e-02 | 3.83k img/s | 223 MB | 0:18 elapsed | ETA 0:16
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace forge::telemetry {

class JsonlWriter {
 public:
  // Opens `path` for appending (or afresh with truncate); its directory must exist.
  explicit JsonlWriter(const std::filesystem::path& path, bool truncate = false);
  // Writes `record` (a JSON object) as one line and flushes.
  void write(const nlohmann::json& record);
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  std::ofstream out_;
};

// Every record of a JSONL file, in order. Throws forge::Error naming the file and the line
// for a line that is not a JSON object, except a last line without its newline that does not
// parse (a write cut short by a crash or a full disk, or one still being written): that one is
// left out, and *torn (when given) says so. A missing file gives no records.
std::vector<nlohmann::json> read_jsonl(const std::filesystem::path& path, bool* torn = nullptr);

// Rewrites `path` atomically without the records whose "step" exceeds max_step (records
// without a step are kept) and without a torn last line (read_jsonl). Does nothing when the
// file does not exist. Returns a warning for the log when a torn line was cut ("" otherwise).
std::string truncate_jsonl_after_step(const std::filesystem::path& path, int64_t max_step);

// "0:42", "12:03", "1:02:03" (h:mm:ss), "--:--" for a negative or non-finite time.
std::string format_duration(double seconds);
// "950", "18.2k", "1.25M" (3 significant digits).
std::string format_count(double n);
// "812 MB", "1.21 GB".
std::string format_bytes(double bytes);
// `s` with &, <, > and " as XML entities (text and attributes of the SVG figures: forge plot,
// forge bench roofline).
std::string xml_escape(const std::string& s);

struct Progress {
  int64_t step = 0;
  int64_t total_steps = 0;
  double loss = 0.0;
  double lr = 0.0;
  double rate = 0.0;          // units per second
  std::string unit = "tok";   // "tok", "img"
  double elapsed_s = 0.0;
  double eta_s = 0.0;
  int64_t memory_bytes = -1;  // < 0: not shown
  double mfu = -1.0;          // model FLOPs utilisation in [0, 1] (Note [MFU]); < 0: not shown
  int64_t epoch = 0, epochs = 0;  // epochs > 0: "epoch E/N | " leads the line
  std::string gpu;                 // device activity ("GPU busy 97%, SM 81%, tensor 38%"); empty: not shown
};
std::string progress_line(const Progress& p);

}  // namespace forge::telemetry
