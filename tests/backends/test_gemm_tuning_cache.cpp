// The GEMM tuning cache file (backends/gemm_tuning_cache.h), without a GPU: round trips, one
// section per GPU/cuBLASLt identity, files of another version or corrupt ones ignored with a
// warning, merging with entries another process wrote, atomic replacement, and where the file
// lives. The CUDA side (timing, cublasLtMatmulAlgoCheck on reload) is
// tests/backends/cuda/test_cuda_gemm_tuning.cpp.
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "forge/backends/gemm_tuning_cache.h"
#include "forge/core/env.h"
#include "forge/forge.h"
#include "io/io_testing.h"

namespace forge {
namespace {

namespace gt = gemm_tuning;
using testing::ScratchDir;
using testing::listing;
using testing::slurp;
using testing::spit;

const gt::Identity kH100{"NVIDIA H100 80GB HBM3", 9, 0, 132, 120803};

gt::Entry entry(uint64_t seed, double tuned_ms = 0.5, double heuristic_ms = 0.6) {
  gt::Entry e;
  for (size_t i = 0; i < e.algo.size(); ++i) e.algo[i] = seed * 0x9e3779b97f4a7c15ull + i * 0xff00ff00ff00ull + i;
  e.algo[7] = ~uint64_t{0};  // the full 64-bit range survives the text form
  e.tuned_ms = tuned_ms;
  e.heuristic_ms = heuristic_ms;
  e.candidates = 16;
  return e;
}

void expect_has(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "'" << part << "' not in: " << text;
}

TEST(GemmTuningCache, AlgoTextRoundTripsAndRejectsAnythingElse) {
  const gt::AlgoData a = entry(3).algo;
  const std::string t = gt::algo_text(a);
  EXPECT_EQ(t.size(), 128u);
  ASSERT_TRUE(gt::parse_algo(t).has_value());
  EXPECT_EQ(*gt::parse_algo(t), a);
  EXPECT_FALSE(gt::parse_algo(t.substr(1)));                         // too short
  EXPECT_FALSE(gt::parse_algo(t + "0"));                             // too long
  EXPECT_FALSE(gt::parse_algo(std::string(127, '0') + "g"));         // not hex
  EXPECT_FALSE(gt::parse_algo(std::string(127, '0') + "F"));         // upper case is not written
  EXPECT_EQ(*gt::parse_algo(std::string(128, '0')), gt::AlgoData{});
}

TEST(GemmTuningCache, RoundTrip) {
  ScratchDir dir;
  const auto path = dir / "gemm_tuning.json";
  EXPECT_TRUE(gt::load(path, kH100).entries.empty());  // no file yet: empty, no warning
  EXPECT_TRUE(gt::load(path, kH100).warning.empty());
  gt::Entries e = {{"bf16 m16384 n50304 k768", entry(1)}, {"f32 m37 n129 k61", entry(2, 0, 0)}};
  e["f32 m37 n129 k61"].candidates = 1;
  gt::save(path, kH100, e);
  const gt::Loaded l = gt::load(path, kH100);
  EXPECT_TRUE(l.warning.empty()) << l.warning;
  EXPECT_EQ(l.dropped, 0);
  EXPECT_EQ(l.entries, e);
  const nlohmann::json j = nlohmann::json::parse(slurp(path));
  EXPECT_EQ(j["format"], "forge-gemm-tuning");
  EXPECT_EQ(j["version"], gt::kFormatVersion);
  const nlohmann::json section = j["devices"][kH100.key()];
  EXPECT_EQ(section["gpu"], kH100.gpu);
  EXPECT_EQ(section["compute_capability"], "9.0");
  EXPECT_EQ(section["sm_count"], 132);
  EXPECT_EQ(section["cublaslt_version"], 120803);
  EXPECT_EQ(section["entries"].size(), 2u);
  EXPECT_EQ(kH100.key(), "NVIDIA H100 80GB HBM3, sm_90, 132 SMs, cuBLASLt 120803");
}

TEST(GemmTuningCache, OtherGpusAndCublasLtVersionsAreIgnoredAndKept) {
  ScratchDir dir;
  const auto path = dir / "c.json";
  gt::Identity newer = kH100;
  newer.cublaslt_version = 120900;
  gt::Identity a100{"NVIDIA A100-SXM4-80GB", 8, 0, 108, 120803};
  gt::Identity mig = kH100;
  mig.gpu += " MIG 1g.10gb";
  mig.sm_count = 16;
  gt::save(path, kH100, {{"k", entry(1)}});
  gt::save(path, newer, {{"k", entry(2)}});
  for (const gt::Identity& other : {a100, mig}) {  // never tuned here: empty, and no warning
    const gt::Loaded l = gt::load(path, other);
    EXPECT_TRUE(l.entries.empty()) << other.key();
    EXPECT_TRUE(l.warning.empty()) << l.warning;
  }
  EXPECT_EQ(gt::load(path, kH100).entries.at("k"), entry(1));  // each section its own algorithm
  EXPECT_EQ(gt::load(path, newer).entries.at("k"), entry(2));
}

// Note [GEMM timing in CUDA graphs]: choices timed as graphs keep a section of their own beside
// the stream-timed ones of the same GPU and cuBLASLt, so switching FORGE_GEMM_TUNE_IN_GRAPH never
// reads the other mode's algorithms.
TEST(GemmTuningCache, GraphTimedChoicesKeepASectionOfTheirOwn) {
  ScratchDir dir;
  const auto path = dir / "c.json";
  gt::Identity graphs = kH100;
  graphs.graph_timed = true;
  EXPECT_EQ(graphs.key(), "NVIDIA H100 80GB HBM3, sm_90, 132 SMs, cuBLASLt 120803, timed as CUDA graphs");
  gt::save(path, kH100, {{"k", entry(1)}});
  EXPECT_TRUE(gt::load(path, graphs).entries.empty());
  gt::save(path, graphs, {{"k", entry(2)}});
  EXPECT_EQ(gt::load(path, kH100).entries.at("k"), entry(1));
  EXPECT_EQ(gt::load(path, graphs).entries.at("k"), entry(2));
  const nlohmann::json j = nlohmann::json::parse(slurp(path));
  EXPECT_EQ(j["devices"][graphs.key()]["timed_as"], "CUDA graphs");
  EXPECT_FALSE(j["devices"][kH100.key()].contains("timed_as"));
}

TEST(GemmTuningCache, AnotherFormatVersionIsIgnoredWithAWarningAndReplaced) {
  ScratchDir dir;
  const auto path = dir / "c.json";
  spit(path, R"({"format": "forge-gemm-tuning", "version": 999, "devices": {}})");
  const gt::Loaded l = gt::load(path, kH100);
  EXPECT_TRUE(l.entries.empty());
  expect_has(l.warning, path.string());
  expect_has(l.warning, "format version 999, this forge reads version 1");
  gt::save(path, kH100, {{"k", entry(1)}});
  const gt::Loaded again = gt::load(path, kH100);
  EXPECT_TRUE(again.warning.empty()) << again.warning;
  EXPECT_EQ(again.entries.size(), 1u);
}

TEST(GemmTuningCache, CorruptFilesAreRejectedWithAClearWarning) {
  ScratchDir dir;
  const auto path = dir / "c.json";
  const std::pair<std::string, std::string> cases[] = {
      {"{\"format\": \"forge-gemm-tuning\", \"version\": 1, \"devi", "is not valid JSON"},  // torn
      {"", "is not valid JSON"},
      {"\x01\x02garbage", "is not valid JSON"},
      {"[1, 2, 3]", "is not a forge GEMM tuning cache"},
      {R"({"format": "something-else", "version": 1, "devices": {}})", "is not a forge GEMM tuning cache"},
      {R"({"format": "forge-gemm-tuning", "version": "1", "devices": {}})", "format version \"1\""},
      {R"({"format": "forge-gemm-tuning", "version": 1, "devices": []})", "\"devices\" is not an object"},
  };
  for (const auto& [text, why] : cases) {
    SCOPED_TRACE(text);
    spit(path, text);
    const gt::Loaded l = gt::load(path, kH100);
    EXPECT_TRUE(l.entries.empty());
    expect_has(l.warning, "the GEMM tuning cache '" + path.string() + "' is ignored: ");
    expect_has(l.warning, why);
    expect_has(l.warning, "rewritten when new shapes are tuned");
  }
  // A directory where the file should be is refused the same way.
  const auto sub = dir / "sub";
  std::filesystem::create_directory(sub);
  expect_has(gt::load(sub, kH100).warning, "is not a regular file");
  // A saved cache replaces a corrupt file.
  spit(path, "not json");
  gt::save(path, kH100, {{"k", entry(1)}});
  EXPECT_EQ(gt::load(path, kH100).entries.size(), 1u);
}

TEST(GemmTuningCache, MalformedEntriesAreDroppedAndCounted) {
  ScratchDir dir;
  const auto path = dir / "c.json";
  gt::save(path, kH100, {{"good", entry(1)}});
  nlohmann::json j = nlohmann::json::parse(slurp(path));
  nlohmann::json entries = j["devices"][kH100.key()]["entries"];
  entries["short algo"] = {{"algo", "00ff"}};
  entries["no algo"] = {{"tuned_ms", 1.0}};
  entries["negative time"] = {{"algo", std::string(128, 'a')}, {"tuned_ms", -1.0}};
  entries["not an object"] = 7;
  j["devices"][kH100.key()]["entries"] = entries;
  spit(path, j.dump());
  const gt::Loaded l = gt::load(path, kH100);
  EXPECT_EQ(l.dropped, 4);
  ASSERT_EQ(l.entries.size(), 1u);
  EXPECT_EQ(l.entries.at("good"), entry(1));
  expect_has(l.warning, "4 malformed entries");
  // The next save leaves them out.
  gt::save(path, kH100, l.entries);
  const gt::Loaded clean = gt::load(path, kH100);
  EXPECT_EQ(clean.dropped, 0);
  EXPECT_TRUE(clean.warning.empty());
  // A section without entries is ignored with a warning.
  spit(path, nlohmann::json{{"format", "forge-gemm-tuning"},
                            {"version", 1},
                            {"devices", {{kH100.key(), {{"gpu", kH100.gpu}}}}}}
                 .dump());
  expect_has(gt::load(path, kH100).warning, "has no \"entries\" object");
}

TEST(GemmTuningCache, SaveMergesWithWhatOtherProcessesWrote) {
  ScratchDir dir;
  const auto path = dir / "c.json";
  // Two processes load the same (empty) cache, tune different shapes, and save in turn.
  gt::save(path, kH100, {{"first", entry(1)}, {"both", entry(2)}});
  gt::save(path, kH100, {{"second", entry(3)}, {"both", entry(4)}});
  const gt::Loaded l = gt::load(path, kH100);
  EXPECT_EQ(l.entries.size(), 3u);
  EXPECT_EQ(l.entries.at("first"), entry(1));
  EXPECT_EQ(l.entries.at("second"), entry(3));
  EXPECT_EQ(l.entries.at("both"), entry(4));  // the later save wins a key both tuned
}

TEST(GemmTuningCache, WritesAreAtomicAndFailuresLeaveTheFileAlone) {
  ScratchDir dir;
  // A missing directory is created; no temporary is left behind.
  const auto path = dir / "nested" / "forge" / "gemm_tuning.json";
  gt::save(path, kH100, {{"k", entry(1)}});
  EXPECT_EQ(listing(path.parent_path()), std::vector<std::string>{"gemm_tuning.json"});
  const std::string before = slurp(path);
  gt::save(path, kH100, {{"k", entry(1)}});  // replaced in place by rename: same content
  EXPECT_EQ(slurp(path), before);
  EXPECT_EQ(listing(path.parent_path()), std::vector<std::string>{"gemm_tuning.json"});

  // A path whose parent is a file cannot be written: a forge::Error naming it.
  const auto file = dir / "plain_file";
  spit(file, "x");
  try {
    gt::save(file / "c.json", kH100, {{"k", entry(1)}});
    FAIL() << "expected a forge::Error";
  } catch (const Error& e) {
    expect_has(e.what(), (file / "c.json").string());
  }
  // A directory in the file's place: the rename fails, the temporary is removed, and the
  // directory is untouched.
  const auto taken = dir / "taken";
  std::filesystem::create_directory(taken);
  spit(taken / "inside", "keep");
  EXPECT_THROW(gt::save(taken, kH100, {{"k", entry(1)}}), Error);
  EXPECT_EQ(listing(dir.path()), (std::vector<std::string>{"nested", "plain_file", "taken"}));
  EXPECT_EQ(slurp(taken / "inside"), "keep");
}

// Sets (or unsets, nullopt) an environment variable for its scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* v = std::getenv(name)) old_ = v;
    if (value) ::setenv(name, value->c_str(), 1);
    else ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(GemmTuningCache, WhereTheFileLives) {
  {
    env::Override o("FORGE_GEMM_TUNE_CACHE", "/data/tuning.json");
    EXPECT_EQ(gt::cache_path(), std::filesystem::path("/data/tuning.json"));
  }
  {
    env::Override o("FORGE_GEMM_TUNE_CACHE", "none");
    EXPECT_FALSE(gt::cache_path().has_value());
  }
  env::Override unset("FORGE_GEMM_TUNE_CACHE", std::nullopt);
  {
    ScopedEnv xdg("XDG_CACHE_HOME", "/xdg");
    ScopedEnv home("HOME", "/home/me");
    EXPECT_EQ(gt::cache_path(), std::filesystem::path("/xdg/forge/gemm_tuning.json"));
  }
  {
    ScopedEnv xdg("XDG_CACHE_HOME", "relative/is/ignored");
    ScopedEnv home("HOME", "/home/me");
    EXPECT_EQ(gt::cache_path(), std::filesystem::path("/home/me/.cache/forge/gemm_tuning.json"));
  }
  {
    ScopedEnv xdg("XDG_CACHE_HOME", std::nullopt);
    ScopedEnv home("HOME", std::nullopt);
    EXPECT_FALSE(gt::cache_path().has_value());
  }
}

}  // namespace
}  // namespace forge
