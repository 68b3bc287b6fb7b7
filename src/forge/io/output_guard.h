#pragma once
// Note [nothing deletes what it did not write] (DESIGN.md, "User-facing behaviour"): before a
// command writes an output it looks at what is there. An output path holds nothing, or what an
// earlier run of the same command wrote (each command recognises its own files), or the user
// said --force; and a forge run directory or checkpoint is never another command's output. Each
// refusal is a forge::Error, raised before any work, naming the path, what is in the way and the
// fix. `forge train` keeps the same rule inside its run directory: it removes only the files it
// writes there (checkpoints/, metrics.jsonl, tb/), and only when asked (run.overwrite).
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

namespace forge::io {

// Whether `dir` is a forge run directory (forge.lock, checkpoints/ or metrics.jsonl in it) or a
// checkpoint (state.json with manifest.json or model.safetensors); its description when it is.
std::string forge_directory_kind(const std::filesystem::path& dir);

// `path` is about to be written (replaced) by `who` (e.g. "forge plot --out"): fine when nothing
// is there, or when `ours` recognises the file's first 4 KiB as one this command wrote; with
// `force`, any regular file. Never a directory.
void check_output_file(const std::filesystem::path& path, const std::string& who,
                       const std::function<bool(std::string_view head)>& ours, bool force);

// `dir` is about to receive files from `who`: fine when it does not exist or is empty, or when
// `ours` accepts every entry in it (an earlier output of the same command, which it may replace);
// with `force`, any directory but a forge run directory or checkpoint, whose other files are kept.
// Returns whether `dir` held an earlier output of the command (`ours` accepted a non-empty dir).
bool check_output_dir(const std::filesystem::path& dir, const std::string& who,
                      const std::function<bool(const std::filesystem::path& entry)>& ours, bool force);

}  // namespace forge::io
