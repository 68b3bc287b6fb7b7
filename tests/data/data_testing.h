#pragma once
// Helpers for the forge::data tests: a scratch directory per test, file I/O, and the
// English fortunes (Debian's fortunes-min/fortunes packages) as real text.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace forge::testing {

// A fresh directory under the system temp dir, removed with its contents on destruction.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = "forge_data_" + std::to_string(::getpid()) + "_";
    if (info) name += std::string(info->test_suite_name()) + "_" + info->name();
    path_ = std::filesystem::temp_directory_path() / name;
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Debian's `fortunes` corpus; FORGE_FORTUNES_DIR points elsewhere (scripts/gpu-check.sh
// unpacks the package there on the GPU machine, which has no package registry).
inline const char* const kFortuneDir = [] {
  const char* env = std::getenv("FORGE_FORTUNES_DIR");
  return env && *env ? env : "/usr/share/games/fortunes";
}();

// The fortune text files (not the .dat indexes or .u8 links), sorted by name.
inline std::vector<std::string> fortune_files() {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(kFortuneDir, ec)) {
    if (!e.is_regular_file() || e.is_symlink()) continue;
    if (e.path().has_extension()) continue;
    out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// All fortunes concatenated (about 2.7 MB).
inline std::string fortune_text() {
  std::string all;
  for (const auto& f : fortune_files()) all += read_bytes(f);
  return all;
}

}  // namespace forge::testing
