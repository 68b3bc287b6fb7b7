#pragma once
// The weight files of a Hugging Face model directory, as save_pretrained writes them and
// from_pretrained reads them:
//
//   <dir>/model.safetensors                    every tensor in one file; or, over the shard limit,
//   <dir>/model-00001-of-00003.safetensors     the tensors split into shards (in the order given,
//   ...                                        a new shard when the next tensor would pass the limit;
//   <dir>/model.safetensors.index.json         a tensor larger than the limit gets a shard alone) and
//                                              {"metadata": {"total_size": <bytes of tensor data>},
//                                               "weight_map": {"<tensor>": "<shard file>", ...}}
//
// Names and layouts are the file's (HF's); io/hf_names.h and run/hf_model.h map them to
// forge's. Every error is a forge::Error naming the directory or file and the fix.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "forge/io/hf_names.h"
#include "forge/io/safetensors.h"

namespace forge::io {

inline constexpr const char* kHfWeightsFile = "model.safetensors";
inline constexpr const char* kHfWeightsIndexFile = "model.safetensors.index.json";
// save_pretrained's default shard limit: 5 GB (10^9 bytes a GB, as transformers counts).
inline constexpr int64_t kHfDefaultMaxShardBytes = 5'000'000'000;

// "5GB", "500MB", "10KB", "2GiB", "64MiB", "123" (bytes): the sizes `forge export
// --max-shard-size` and transformers' max_shard_size accept (KB/MB/GB powers of 1000, KiB/MiB/GiB
// of 1024). Throws naming `what` for anything else or a size <= 0.
int64_t parse_byte_size(const std::string& text, const std::string& what);

// Writes `tensors` into `dir` (an existing directory) as model.safetensors when their data fits
// in `max_shard_bytes`, else as shards plus the index. Returns the files written (names in dir).
std::vector<std::string> save_hf_weights(const std::filesystem::path& dir, const TensorItems& tensors,
                                         int64_t max_shard_bytes, const SafetensorsMetadata& metadata = {});

// The tensors of `dir`: model.safetensors, or the index and every shard it names (a shard that
// is missing, a tensor the index maps to a file that lacks it, or a tensor in two shards is an
// error). Tensors come back on the CPU in the files' dtypes, in file order.
NamedTensors load_hf_weights(const std::filesystem::path& dir);

// Whether `dir` holds weights load_hf_weights reads (either file).
bool has_hf_weights(const std::filesystem::path& dir);

}  // namespace forge::io
