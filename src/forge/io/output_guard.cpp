// What a command may write over (Note [nothing deletes what it did not write] in output_guard.h).
#include "forge/io/output_guard.h"

#include <fstream>
#include <vector>

#include "forge/core/error.h"

namespace forge::io {

namespace fs = std::filesystem;

std::string forge_directory_kind(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return "";
  if (fs::exists(dir / "forge.lock", ec) || fs::is_directory(dir / "checkpoints", ec) ||
      fs::exists(dir / "metrics.jsonl", ec))
    return "a forge run directory";
  if (fs::is_regular_file(dir / "state.json", ec) &&
      (fs::exists(dir / "manifest.json", ec) || fs::exists(dir / "model.safetensors", ec)))
    return "a forge checkpoint";
  return "";
}

void check_output_file(const fs::path& path, const std::string& who,
                       const std::function<bool(std::string_view head)>& ours, bool force) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) return;
  FORGE_CHECK(!fs::is_directory(st), who, ": '", path.string(), "' is a directory; name a file to write");
  FORGE_CHECK(fs::is_regular_file(st), who, ": '", path.string(), "' exists and is not a regular file");
  if (force) return;
  std::string head(4096, '\0');
  std::ifstream in(path, std::ios::binary);
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(in.gcount()));
  FORGE_CHECK(ours(head), who, ": '", path.string(),
              "' exists and is not a file this command wrote; forge does not overwrite it. Name another file, "
              "remove it yourself, or pass --force to replace it");
}

bool check_output_dir(const fs::path& dir, const std::string& who,
                      const std::function<bool(const fs::path& entry)>& ours, bool force) {
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (!fs::exists(st)) return false;
  FORGE_CHECK(fs::is_directory(st), who, ": '", dir.string(), "' exists and is not a directory");
  const std::string kind = forge_directory_kind(dir);
  FORGE_CHECK(kind.empty(), who, ": '", dir.string(), "' is ", kind,
              "; forge never writes another command's output into one (--force does not change that). Name a new "
              "or empty directory");
  std::vector<std::string> foreign;
  size_t entries = 0;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    ++entries;
    if (!ours(it->path())) foreign.push_back(it->path().filename().string());
  }
  FORGE_CHECK(!ec, who, ": cannot list '", dir.string(), "': ", ec.message());
  if (entries == 0) return false;
  if (foreign.empty()) return true;
  if (force) return false;
  std::string names;
  for (size_t i = 0; i < foreign.size() && i < 5; ++i) names += (i ? ", " : "") + foreign[i];
  if (foreign.size() > 5) names += ", ... (" + std::to_string(foreign.size()) + " in all)";
  FORGE_THROW(who, ": '", dir.string(), "' is not empty and holds files this command did not write (", names,
              "); forge does not delete or overwrite them. Name a new or empty directory, or pass --force to write "
              "into it (its other files are kept)");
}

}  // namespace forge::io
