// The weight files of a Hugging Face model directory (contract in hf_checkpoint.h).
#include "forge/io/hf_checkpoint.h"

#include <cctype>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "forge/core/error.h"
#include "forge/io/atomic_file.h"
#include "forge/io/json_input.h"

namespace forge::io {

namespace fs = std::filesystem;
using nlohmann::json;

int64_t parse_byte_size(const std::string& text, const std::string& what) {
  size_t digits = 0;
  while (digits < text.size() && (std::isdigit(static_cast<unsigned char>(text[digits])) || text[digits] == '.'))
    ++digits;
  std::string unit = text.substr(digits);
  for (char& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  static const std::map<std::string, double> units = {
      {"", 1.0},      {"B", 1.0},          {"KB", 1e3},          {"MB", 1e6},          {"GB", 1e9},
      {"TB", 1e12},   {"KIB", 1024.0},     {"MIB", 1048576.0},   {"GIB", 1073741824.0}};
  double number = 0.0;
  bool ok = digits > 0 && units.count(unit) != 0;
  if (ok) {
    try {
      size_t used = 0;
      number = std::stod(text.substr(0, digits), &used);
      ok = used == digits;
    } catch (const std::exception&) {
      ok = false;
    }
  }
  FORGE_CHECK(ok, what, " = '", text, "' is not a size; write bytes or a number with a unit: 5GB, 500MB, 10KB "
              "(powers of 1000), 2GiB, 64MiB (powers of 1024)");
  const double bytes = number * units.at(unit);
  FORGE_CHECK(bytes >= 1.0 && bytes < 9.0e18, what, " = '", text, "' must be at least 1 byte");
  return static_cast<int64_t>(bytes);
}

namespace {

int64_t data_bytes(const Tensor& t) { return t.numel() * static_cast<int64_t>(element_size(t.dtype())); }

std::string shard_name(size_t index, size_t count) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "model-%05zu-of-%05zu.safetensors", index + 1, count);
  return buf;
}

}  // namespace

std::vector<std::string> save_hf_weights(const fs::path& dir, const TensorItems& tensors, int64_t max_shard_bytes,
                                         const SafetensorsMetadata& metadata) {
  FORGE_CHECK(max_shard_bytes > 0, "save_hf_weights: the shard limit must be > 0 bytes, got ", max_shard_bytes);
  // transformers' rule: a new shard when the next tensor would take this one past the limit.
  std::vector<TensorItems> shards(1);
  int64_t in_shard = 0, total = 0;
  for (const auto& item : tensors) {
    const int64_t bytes = data_bytes(item.second);
    if (!shards.back().empty() && in_shard + bytes > max_shard_bytes) shards.emplace_back(), in_shard = 0;
    shards.back().push_back(item);
    in_shard += bytes;
    total += bytes;
  }
  if (shards.size() == 1) {
    save_safetensors(dir / kHfWeightsFile, tensors, metadata);
    return {kHfWeightsFile};
  }
  std::vector<std::string> files;
  json weight_map = json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    files.push_back(shard_name(i, shards.size()));
    save_safetensors(dir / files.back(), shards[i], metadata);
    for (const auto& [name, t] : shards[i]) weight_map[name] = files.back();
  }
  const json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  write_file_atomic(dir / kHfWeightsIndexFile, index.dump(2) + "\n");
  files.push_back(kHfWeightsIndexFile);
  return files;
}

bool has_hf_weights(const fs::path& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir / kHfWeightsFile, ec) || fs::is_regular_file(dir / kHfWeightsIndexFile, ec);
}

NamedTensors load_hf_weights(const fs::path& dir) {
  std::error_code ec;
  if (fs::is_regular_file(dir / kHfWeightsFile, ec)) return load_safetensors(dir / kHfWeightsFile).tensors;
  const fs::path index_path = dir / kHfWeightsIndexFile;
  FORGE_CHECK(fs::is_regular_file(index_path, ec), "'", dir.string(), "' has neither ", kHfWeightsFile, " nor ",
              kHfWeightsIndexFile, "; give a Hugging Face model directory with safetensors weights (a PyTorch .bin "
              "checkpoint can be converted with transformers: model.save_pretrained(dir, safe_serialization=True))");
  json index;
  {
    std::ifstream in(index_path);
    std::stringstream ss;
    ss << in.rdbuf();
    index = parse_json(ss.str(), forge::detail::concat("'", index_path.string(), "'"));  // Note [untrusted JSON]
  }
  FORGE_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(), "'",
              index_path.string(), "' has no \"weight_map\" object (tensor name -> shard file)");
  // The shards in order of first appearance, each with the tensors the index puts there.
  std::vector<std::string> order;
  std::map<std::string, std::vector<std::string>> names_in;
  for (const auto& [name, file] : index["weight_map"].items()) {
    FORGE_CHECK(file.is_string(), "'", index_path.string(), "': weight_map[\"", name, "\"] is not a file name");
    const std::string f = file.get<std::string>();
    FORGE_CHECK(fs::path(f).filename().string() == f, "'", index_path.string(), "': weight_map[\"", name,
                "\"] = \"", f, "\" is not a file name in the directory");
    if (!names_in.count(f)) order.push_back(f);
    names_in[f].push_back(name);
  }
  NamedTensors out;
  for (const std::string& f : order) {
    const fs::path shard = dir / f;
    FORGE_CHECK(fs::is_regular_file(shard, ec), "'", index_path.string(), "' names the shard '", f,
                "', which is missing from '", dir.string(), "'; copy the whole model directory");
    SafetensorsFile file = load_safetensors(shard);
    for (const std::string& name : names_in[f]) {
      const Tensor* t = file.tensors.find(name);
      FORGE_CHECK(t != nullptr, "'", index_path.string(), "' maps '", name, "' to '", f, "', which has no such tensor");
      FORGE_CHECK(!out.contains(name), "'", index_path.string(), "': tensor '", name, "' appears in two shards");
      out.insert(name, *t);
    }
  }
  return out;
}

}  // namespace forge::io
