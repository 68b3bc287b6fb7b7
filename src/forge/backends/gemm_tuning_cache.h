#pragma once
// The GEMM tuning cache file: the cuBLASLt algorithm the CUDA backend chose for each GEMM plan
// by timing (Note [GEMM algorithm tuning] in backends/cuda/blaslt.h), kept on disk so that
// later runs on the same GPU and cuBLASLt skip the timing. Plain C++ (no CUDA headers), built
// in every configuration, so the CPU tests check the file's format and its failure modes.
//
//   gemm_tuning::Identity id{"NVIDIA H100 80GB HBM3", 9, 0, 132, 120803};
//   gemm_tuning::Loaded l = gemm_tuning::load(path, id);      // l.entries, l.warning
//   l.entries["bf16 ..."] = gemm_tuning::Entry{...};
//   gemm_tuning::save(path, id, l.entries);                   // atomic; merges with the file
//
// The file (JSON, format version kFormatVersion):
//   {"format": "forge-gemm-tuning", "version": 1,
//    "devices": {"<Identity::key()>": {"gpu": ..., "compute_capability": "9.0", "sm_count": 132,
//                                      "cublaslt_version": 120803, ("timed_as": "CUDA graphs",)
//                                      "entries": {"<plan key>": {"algo": "<128 hex digits>",
//                                                  "tuned_ms": 0.41, "heuristic_ms": 0.44,
//                                                  "candidates": 16}}}}}
// One section per identity (GPU name, compute capability, SM count, cuBLASLt version), so a
// host with two kinds of GPU, or a home directory shared by several machines, keeps one file.
// "algo" is cublasLtMatmulAlgo_t's opaque data (8 uint64, little-endian words in order, as
// hex), meaningful only to the cuBLASLt version of its section; the backend still checks
// every entry with cublasLtMatmulAlgoCheck before using it and drops the ones it refuses.
//
// Contract:
//   - load() never throws for a bad file: a missing file is empty (no warning); a file that
//     cannot be read, is not JSON, is not this format or is another version is ignored with a
//     `warning` (one line naming the path and why); a malformed entry is skipped and counted.
//     Sections of other identities are ignored.
//   - save() writes the file atomically (a temporary next to it, then rename: readers see the
//     old file or the new one, never a torn one), keeping the sections of other identities
//     and the entries of this one that `entries` lacks (written by another process since it
//     was loaded); `entries` wins for a key in both. A file that load() would reject is
//     replaced. The parent directory is created. Throws forge::Error naming the path and the
//     reason when it cannot write; the old file is then untouched. No fsync: a cache lost to
//     a crash is timed again. (io/atomic_file is not used: backends sit below io/.)
#include <array>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>

namespace forge::gemm_tuning {

inline constexpr int kFormatVersion = 1;
inline constexpr const char* kFormatName = "forge-gemm-tuning";

// What a chosen algorithm is valid for.
struct Identity {
  std::string gpu;               // the device name, as the driver reports it
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;              // a MIG slice has fewer SMs than the whole GPU
  int64_t cublaslt_version = 0;  // cublasLtGetVersion()
  // The candidates were timed as CUDA graphs (FORGE_GEMM_TUNE_IN_GRAPH; Note [GEMM timing in CUDA
  // graphs] in backends/cuda/gemm_graph_timing.cpp): their choices differ, so they keep a section
  // of their own.
  bool graph_timed = false;
  // "NVIDIA H100 80GB HBM3, sm_90, 132 SMs, cuBLASLt 120803" (", timed as CUDA graphs" appended
  // when graph_timed): the section's key.
  std::string key() const;
};

using AlgoData = std::array<uint64_t, 8>;  // cublasLtMatmulAlgo_t::data

struct Entry {
  AlgoData algo{};
  double tuned_ms = 0;      // the chosen algorithm's time (0: not timed, a single candidate)
  double heuristic_ms = 0;  // the heuristic's first choice's time, measured the same way
  int candidates = 0;       // algorithms timed (1: the heuristic offered only one)
  friend bool operator==(const Entry&, const Entry&) = default;
};

// By plan key: the text of everything a plan depends on (backends/cuda/blaslt.cpp).
using Entries = std::map<std::string, Entry>;

struct Loaded {
  Entries entries;      // this identity's well-formed entries
  int dropped = 0;      // malformed entries of this identity skipped
  std::string warning;  // non-empty: the file was ignored, or entries were dropped: why
};

Loaded load(const std::filesystem::path& path, const Identity& id);
void save(const std::filesystem::path& path, const Identity& id, const Entries& entries);

// Where the cache lives: FORGE_GEMM_TUNE_CACHE when set (a path; "none": no file, nullopt);
// otherwise $XDG_CACHE_HOME/forge/gemm_tuning.json, else $HOME/.cache/forge/gemm_tuning.json
// (nullopt when neither variable is set).
std::optional<std::filesystem::path> cache_path();

// The "algo" field's text: 128 lower-case hex digits; parse_algo returns nullopt for anything else.
std::string algo_text(const AlgoData& a);
std::optional<AlgoData> parse_algo(const std::string& text);

}  // namespace forge::gemm_tuning
