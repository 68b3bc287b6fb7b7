// Training checkpoints; the directory layout and state.json schema are in checkpoint.h.
#include "forge/io/checkpoint.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <future>
#include <set>
#include <system_error>
#include <thread>

#include "forge/core/error.h"
#include "forge/core/half.h"
#include "forge/io/atomic_file.h"
#include "forge/io/checksum.h"
#include "forge/io/json_input.h"

#ifndef FORGE_VERSION
#define FORGE_VERSION "unknown"
#endif

namespace forge::io {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
constexpr const char* kStateFile = "state.json";
constexpr const char* kManifestFile = "manifest.json";
constexpr const char* kFormatName = "forge-checkpoint";
constexpr const char* kManifestFormat = "forge-checkpoint-manifest";

json state_to_json(const GeneratorState& s) { return json{{"seed", s.seed}, {"offset", s.offset}}; }

// Field access for state.json with errors that name the file and the field.
class StateReader {
 public:
  explicit StateReader(fs::path file) : file_(std::move(file)) {}

  const json& field(const json& obj, const std::string& key, const std::string& where) const {
    FORGE_CHECK(obj.is_object() && obj.contains(key), "checkpoint state '", file_.string(), "': missing field '",
                where.empty() ? key : where + "." + key, "'");
    return obj[key];
  }
  uint64_t u64(const json& obj, const std::string& key, const std::string& where) const {
    const json& v = field(obj, key, where);
    FORGE_CHECK(v.is_number_unsigned(), "checkpoint state '", file_.string(), "': field '",
                where.empty() ? key : where + "." + key, "' must be a non-negative integer, got ", v.dump());
    return v.get<uint64_t>();
  }
  int64_t i64(const json& obj, const std::string& key, const std::string& where) const {
    const json& v = field(obj, key, where);
    FORGE_CHECK(v.is_number_integer(), "checkpoint state '", file_.string(), "': field '",
                where.empty() ? key : where + "." + key, "' must be an integer, got ", v.dump());
    return v.get<int64_t>();
  }
  std::string str(const json& obj, const std::string& key, const std::string& where) const {
    const json& v = field(obj, key, where);
    FORGE_CHECK(v.is_string(), "checkpoint state '", file_.string(), "': field '",
                where.empty() ? key : where + "." + key, "' must be a string, got ", v.dump());
    return v.get<std::string>();
  }
  GeneratorState generator(const json& obj, const std::string& where) const {
    FORGE_CHECK(obj.is_object(), "checkpoint state '", file_.string(), "': field '", where,
                "' must be an object {seed, offset}, got ", obj.dump());
    return {u64(obj, "seed", where), u64(obj, "offset", where)};
  }

 private:
  fs::path file_;
};

// "step_<digits>" -> the step; anything else (including temporaries) -> nullopt.
std::optional<int64_t> parse_step_name(const std::string& name) {
  constexpr std::string_view prefix = "step_";
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  const char* first = name.data() + prefix.size();
  const char* last = name.data() + name.size();
  if (!std::all_of(first, last, [](char c) { return c >= '0' && c <= '9'; })) return std::nullopt;
  int64_t step = 0;
  const auto [ptr, ec] = std::from_chars(first, last, step);
  if (ec != std::errc() || ptr != last) return std::nullopt;
  return step;
}

bool is_complete_checkpoint(const fs::path& dir) {
  std::error_code ec;
  for (const char* f : {kModelFile, kOptimizerFile, kStateFile})
    if (!fs::is_regular_file(dir / f, ec)) return false;
  return true;
}


// Note [checkpoint integrity]: the manifest of the files in `dir` (all but itself), written last.
void write_manifest(const fs::path& dir, int64_t step) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_regular_file(ec) && it->path().filename() != kManifestFile) files.push_back(it->path());
  FORGE_CHECK(!ec, "checkpoint: cannot list '", dir.string(), "': ", ec.message());
  std::sort(files.begin(), files.end());
  const std::vector<FileDigest> digests = digest_files(files);
  json listed = json::object();
  for (size_t i = 0; i < files.size(); ++i)
    listed[files[i].filename().string()] = {{"bytes", digests[i].bytes}, {"hash", digests[i].hash}};
  const json manifest = {{"format", kManifestFormat}, {"format_version", 1}, {"step", step}, {"files", listed}};
  write_file_atomic(dir / kManifestFile, manifest.dump(2) + "\n");
}

json parse_json_file(const fs::path& file, const char* what) {
  return parse_json(read_file(file), std::string(what) + " '" + file.string() + "'");  // Note [untrusted JSON]
}

// Whether an element of a floating-point dtype is NaN or infinite, from its bits: the exponent
// all ones.
template <class Bits>
int64_t first_non_finite_bits(const Bits* p, int64_t n, Bits exponent_mask) {
  for (int64_t i = 0; i < n; ++i)
    if ((p[i] & exponent_mask) == exponent_mask) return i;
  return -1;
}

}  // namespace

// ---- RNG -----------------------------------------------------------------------------------

GeneratorState generator_state(const Generator& gen) { return {gen.seed(), gen.offset()}; }

void set_generator_state(Generator& gen, const GeneratorState& state) { gen.set_state(state.seed, state.offset); }

void capture_rng(CheckpointData& data, const std::map<std::string, Generator*>& named) {
  data.rng = generator_state(default_generator());
  for (const auto& [name, gen] : named) {
    FORGE_CHECK(gen != nullptr, "capture_rng: generator '", name, "' is null");
    data.generators[name] = generator_state(*gen);
  }
}

void restore_rng(const CheckpointData& data, const std::map<std::string, Generator*>& named) {
  for (const auto& [name, gen] : named) {
    FORGE_CHECK(gen != nullptr, "restore_rng: generator '", name, "' is null");
    FORGE_CHECK(data.generators.count(name), "restore_rng: the checkpoint (step ", data.step,
                ") has no state for generator '", name, "'");
  }
  set_generator_state(default_generator(), data.rng);
  for (const auto& [name, gen] : named) set_generator_state(*gen, data.generators.at(name));
}

// ---- save / load ---------------------------------------------------------------------------

void save_checkpoint(const fs::path& dir, const CheckpointData& data) {
  FORGE_CHECK(data.step >= 0, "save_checkpoint '", dir.string(), "': negative step ", data.step);
  json state = json::object();
  state["format"] = kFormatName;
  state["format_version"] = kCheckpointFormatVersion;
  state["forge_version"] = FORGE_VERSION;
  state["step"] = data.step;
  json generators = json::object();
  for (const auto& [name, s] : data.generators) generators[name] = state_to_json(s);
  state["rng"] = json{{"default", state_to_json(data.rng)}, {"generators", std::move(generators)}};
  state["data_loader"] = data.data_loader;
  state["config"] = data.config;
  state["extra"] = data.extra;
  std::string text;
  try {
    text = state.dump(2) + "\n";
  } catch (const json::exception& e) {
    FORGE_THROW("save_checkpoint '", dir.string(), "': cannot encode state.json: ", e.what());
  }

  const std::string what = "checkpoint of step " + std::to_string(data.step) + " not written";
  check_finite(data.model.items(), what);
  check_finite(data.optimizer.items(), what);
  const SafetensorsMetadata model_meta{{"format", "pt"}, {"forge_step", std::to_string(data.step)}};
  replace_directory_atomic(dir, [&](const fs::path& tmp) {
    save_safetensors(tmp / kModelFile, data.model.items(), model_meta);
    save_safetensors(tmp / kOptimizerFile, data.optimizer.items(), {{"forge_step", std::to_string(data.step)}});
    for (const auto& f : data.move_in) {
      std::error_code ec;
      fs::rename(f, tmp / f.filename(), ec);
      FORGE_CHECK(!ec, "save_checkpoint '", dir.string(), "': cannot move '", f.string(), "' into it: ", ec.message());
    }
    write_file_atomic(tmp / kStateFile, text);
    write_manifest(tmp, data.step);
  });
}

namespace {

// A JSON file of the checkpoint with a field of an unexpected type (a number where a string
// belongs: nlohmann's type_error) is a damaged checkpoint like any other: a forge::Error naming it,
// so that find_latest_valid_checkpoint skips it and --resume reports it (a fuzzing finding).
template <class F>
auto naming_json_errors(const fs::path& dir, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const json::exception& e) {
    FORGE_THROW("checkpoint '", dir.string(), "' is damaged: a JSON field of the wrong type in its state or manifest (",
                e.what(), ")");
  }
}

CheckpointData load_checkpoint_unchecked(const fs::path& dir, Device device, bool verify);
bool verify_checkpoint_unchecked(const fs::path& dir);

}  // namespace

CheckpointData load_checkpoint(const fs::path& dir, Device device, bool verify) {
  return naming_json_errors(dir, [&] { return load_checkpoint_unchecked(dir, device, verify); });
}

bool verify_checkpoint(const fs::path& dir) {
  return naming_json_errors(dir, [&] { return verify_checkpoint_unchecked(dir); });
}

namespace {

CheckpointData load_checkpoint_unchecked(const fs::path& dir, Device device, bool verify) {
  std::error_code ec;
  FORGE_CHECK(fs::is_directory(dir, ec), "load_checkpoint: '", dir.string(), "' is not a directory");
  const bool verified = verify ? verify_checkpoint(dir) : fs::exists(dir / kManifestFile, ec);  // Note [checkpoint integrity]
  const fs::path state_file = dir / kStateFile;
  std::string text;
  try {
    text = read_file(state_file);
  } catch (const Error& e) {
    FORGE_THROW("load_checkpoint: '", dir.string(), "' is not a complete checkpoint: ", e.what());
  }
  const json state = parse_json(text, "checkpoint state '" + state_file.string() + "'");
  const StateReader r(state_file);
  FORGE_CHECK(state.is_object(), "checkpoint state '", state_file.string(), "' is not a JSON object");
  const std::string format = r.str(state, "format", "");
  FORGE_CHECK(format == kFormatName, "checkpoint state '", state_file.string(), "': format is '", format,
              "', expected '", kFormatName, "'");

  CheckpointData data;
  const int64_t version = r.i64(state, "format_version", "");
  FORGE_CHECK(version >= 1 && version <= kCheckpointFormatVersion, "checkpoint '", dir.string(),
              "' has format_version ", version, "; this forge (", FORGE_VERSION, ") reads versions 1 to ",
              kCheckpointFormatVersion, (version > kCheckpointFormatVersion ? ": it was written by a newer forge" : ""));
  data.format_version = static_cast<int>(version);
  data.forge_version = r.str(state, "forge_version", "");
  data.step = r.i64(state, "step", "");
  FORGE_CHECK(data.step >= 0, "checkpoint state '", state_file.string(), "': negative step ", data.step);

  const json& rng = r.field(state, "rng", "");
  data.rng = r.generator(r.field(rng, "default", "rng"), "rng.default");
  const json& gens = r.field(rng, "generators", "rng");
  FORGE_CHECK(gens.is_object(), "checkpoint state '", state_file.string(),
              "': field 'rng.generators' must be an object, got ", gens.dump());
  for (const auto& [name, s] : gens.items()) data.generators[name] = r.generator(s, "rng.generators." + name);

  data.data_loader = state.value("data_loader", json());
  data.config = state.value("config", json());
  data.extra = state.value("extra", json());

  for (const char* f : {kModelFile, kOptimizerFile}) {
    FORGE_CHECK(fs::is_regular_file(dir / f, ec), "load_checkpoint: '", dir.string(),
                "' is not a complete checkpoint: ", f, " is missing");
  }
  data.model = load_safetensors(dir / kModelFile, device).tensors;
  data.optimizer = load_safetensors(dir / kOptimizerFile, device).tensors;
  data.verified = verified;
  return data;
}

bool verify_checkpoint_unchecked(const fs::path& dir) {
  std::error_code ec;
  FORGE_CHECK(fs::is_directory(dir, ec), "checkpoint '", dir.string(), "' is not a directory");
  const std::string where = "checkpoint '" + dir.string() + "'";
  const fs::path manifest_file = dir / kManifestFile;
  const fs::path state_file = dir / kStateFile;
  FORGE_CHECK(fs::is_regular_file(state_file, ec), where, " is not a complete checkpoint: ", kStateFile, " is missing");
  const json state = parse_json_file(state_file, "checkpoint state");
  FORGE_CHECK(state.is_object(), "checkpoint state '", state_file.string(), "' is not a JSON object");
  const StateReader r(state_file);
  const int64_t state_step = r.i64(state, "step", "");
  (void)r.i64(state, "format_version", "");
  if (!fs::exists(manifest_file, ec)) {
    if (state["format_version"].get<int64_t>() == 1) return false;  // written before manifests
    FORGE_THROW(where, " is incomplete or damaged: ", kManifestFile,
                " is missing (every checkpoint of format_version 2 or later has one)");
  }
  const json m = parse_json_file(manifest_file, "checkpoint manifest");
  FORGE_CHECK(m.is_object() && m.contains("format") && m["format"].is_string() &&
                  m["format"].get<std::string>() == kManifestFormat && m.contains("files") &&
                  m["files"].is_object() && m.contains("step") && m["step"].is_number_integer(),
              "checkpoint manifest '", manifest_file.string(), "' is not a forge checkpoint manifest (format '",
              kManifestFormat, "' with 'step' and 'files')");
  const int64_t step = m["step"].get<int64_t>();
  // Every listed file: a plain name in the directory, its size, then (all sizes right) its checksum.
  std::vector<fs::path> files;
  std::vector<FileDigest> expected;
  for (const auto& [name, e] : m["files"].items()) {
    FORGE_CHECK(!name.empty() && name.find('/') == std::string::npos && name != "." && name != ".." &&
                    name != kManifestFile,
                "checkpoint manifest '", manifest_file.string(), "': '", name, "' is not a file name of the checkpoint");
    FORGE_CHECK(e.is_object() && e.contains("bytes") && e["bytes"].is_number_unsigned() && e.contains("hash") &&
                    e["hash"].is_string(),
                "checkpoint manifest '", manifest_file.string(), "': the entry of '", name, "' lacks 'bytes' or 'hash'");
    const fs::path f = dir / name;
    FORGE_CHECK(fs::is_regular_file(f, ec), where, " is not a complete checkpoint: ", name,
                " is missing (the manifest lists it)");
    const uint64_t bytes = e["bytes"].get<uint64_t>(), size = fs::file_size(f, ec);
    FORGE_CHECK(!ec && size == bytes, where, ": ", name, " is ", size, " bytes but the manifest says ", bytes,
                " (a truncated or changed file)");
    files.push_back(f);
    expected.push_back({bytes, e["hash"].get<std::string>()});
  }
  for (const char* required : {kStateFile, kModelFile, kOptimizerFile})
    FORGE_CHECK(m["files"].contains(required), where, ": the manifest does not list ", required);
  // The shard files state.json names (data-parallel runs) are listed too.
  if (state.contains("extra") && state["extra"].is_object() && state["extra"].contains("dist") &&
      state["extra"]["dist"].is_object() && state["extra"]["dist"].contains("files"))
    for (const auto& f : state["extra"]["dist"]["files"])
      FORGE_CHECK(f.is_string() && m["files"].contains(f.get<std::string>()), where, ": ", kStateFile,
                  " names the optimizer shard ", f.dump(), " but the manifest does not list it");
  const std::vector<FileDigest> actual = digest_files(files);
  for (size_t i = 0; i < files.size(); ++i)
    FORGE_CHECK(actual[i].hash == expected[i].hash, where, ": ", files[i].filename().string(),
                " does not match its checksum (", actual[i].hash, ", the manifest says ", expected[i].hash,
                "): the file is damaged");
  // The step wherever it is recorded: the manifest, state.json, the directory's name, and every
  // safetensors file's metadata (forge_step).
  FORGE_CHECK(state_step == step, where, ": ", kStateFile, " says step ", state_step, " but ", kManifestFile,
              " says step ", step, " (an edited or mixed-up file)");
  if (const auto named = parse_step_name(dir.filename().string()))
    FORGE_CHECK(*named == step, where, ": the directory is named for step ", *named, " but holds step ", step);
  for (const auto& f : files) {
    if (f.extension() != ".safetensors") continue;
    const SafetensorsHeader h = read_safetensors_header(f);
    if (auto it = h.metadata.find("forge_step"); it != h.metadata.end())
      FORGE_CHECK(it->second == std::to_string(step), where, ": ", f.filename().string(), " is of step ", it->second,
                  " but the checkpoint is of step ", step, " (a file from another checkpoint)");
  }
  return true;
}

}  // namespace

void check_finite(const std::vector<std::pair<std::string, Tensor>>& tensors, const std::string& what,
                  const std::string& why) {
  for (const auto& [name, t0] : tensors) {
    if (!t0.defined() || !is_floating(t0.dtype()) || t0.numel() == 0) continue;  // (the writer names an undefined one)
    const Tensor t = (t0.is_cpu() ? t0 : t0.to(Device::cpu())).contiguous();
    const int64_t n = t.numel();
    int64_t bad = -1;
    switch (t.dtype()) {
      case DType::f32: bad = first_non_finite_bits(static_cast<const uint32_t*>(t.data_ptr()), n, uint32_t{0x7F800000}); break;
      case DType::f64: bad = first_non_finite_bits(static_cast<const uint64_t*>(t.data_ptr()), n, uint64_t{0x7FF0000000000000}); break;
      case DType::bf16: bad = first_non_finite_bits(static_cast<const uint16_t*>(t.data_ptr()), n, uint16_t{0x7F80}); break;
      case DType::f16: bad = first_non_finite_bits(static_cast<const uint16_t*>(t.data_ptr()), n, uint16_t{0x7C00}); break;
      default: continue;
    }
    if (bad < 0) continue;
    const double v = t.reshape({-1}).narrow(0, bad, 1).item();
    FORGE_THROW(what, ": tensor '", name, "' ", t0.shape(), " holds ", std::isnan(v) ? "NaN" : v > 0 ? "+inf" : "-inf",
                " (first at element ", bad, ")", why);
  }
}

// ---- runs ----------------------------------------------------------------------------------

fs::path checkpoint_path(const fs::path& run_dir, int64_t step) {
  FORGE_CHECK(step >= 0, "checkpoint_path: negative step ", step);
  char name[40];
  std::snprintf(name, sizeof(name), "step_%08lld", static_cast<long long>(step));
  return run_dir / "checkpoints" / name;
}

std::vector<std::pair<int64_t, fs::path>> list_checkpoints(const fs::path& run_dir) {
  std::vector<std::pair<int64_t, fs::path>> out;
  const fs::path root = run_dir / "checkpoints";
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const auto step = parse_step_name(it->path().filename().string());
    if (step && it->is_directory(ec) && is_complete_checkpoint(it->path())) out.emplace_back(*step, it->path());
  }
  FORGE_CHECK(!ec, "list_checkpoints: cannot list '", root.string(), "': ", ec.message());
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<fs::path> find_latest_checkpoint(const fs::path& run_dir) {
  auto all = list_checkpoints(run_dir);
  if (all.empty()) return std::nullopt;
  return all.back().second;
}

ValidCheckpoint find_latest_valid_checkpoint(const fs::path& run_dir) {
  ValidCheckpoint out;
  // Every step_N directory, complete or not: a save publishes a checkpoint whole (replace_directory_atomic),
  // so one that lacks a file was damaged after it was written, and is reported.
  std::vector<std::pair<int64_t, fs::path>> all;
  std::error_code ec;
  const fs::path root = run_dir / "checkpoints";
  if (fs::is_directory(root, ec))
    for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec))
      if (const auto step = parse_step_name(it->path().filename().string()); step && it->is_directory(ec))
        all.emplace_back(*step, it->path());
  std::sort(all.begin(), all.end());
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    try {
      verify_checkpoint(it->second);
      out.dir = it->second;
      return out;
    } catch (const Error& e) {
      out.skipped.push_back(e.what());
    }
  }
  return out;
}

void prune_checkpoints(const fs::path& run_dir, size_t keep_last) {
  FORGE_CHECK(keep_last >= 1, "prune_checkpoints: keep_last must be at least 1");
  const auto all = list_checkpoints(run_dir);
  std::error_code ec;
  for (size_t i = 0; i + keep_last < all.size(); ++i) {
    fs::remove_all(all[i].second, ec);
    // (Gone already is fine: someone removed an old checkpoint by hand while the run went on.)
    FORGE_CHECK(!ec || ec == std::errc::no_such_file_or_directory, "prune_checkpoints: cannot remove '",
                all[i].second.string(), "': ", ec.message());
  }
  const fs::path root = run_dir / "checkpoints";
  if (!fs::is_directory(root, ec)) return;
  std::vector<fs::path> litter;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec))
    if (is_temporary_name(it->path().filename().string())) litter.push_back(it->path());
  for (const auto& p : litter) fs::remove_all(p, ec);
}

// ---- compatibility -------------------------------------------------------------------------

NamedShapes named_shapes(const NamedTensors& tensors) {
  NamedShapes out;
  out.reserve(tensors.size());
  for (const auto& [name, t] : tensors) out.emplace_back(name, t.shape());
  return out;
}

void check_compatible(const NamedShapes& expected, const NamedTensors& loaded, const std::string& source) {
  size_t mismatched = 0, missing = 0;
  std::string first;
  bool dtype_first = false;
  for (const auto& [name, shape] : expected) {
    const Tensor* t = loaded.find(name);
    if (t == nullptr) {
      if (first.empty())
        first = forge::detail::concat("tensor '", name, "' (", shape, " in the model) is missing from ", source);
      ++missing;
    } else if (t->shape() != shape) {
      if (first.empty())
        first = forge::detail::concat("tensor '", name, "' is ", t->shape(), " in ", source, " but ", shape, " in the model");
      ++mismatched;
    } else if (!is_floating(t->dtype())) {
      // Issue 43: weights stored as integers would be converted to nonsense (a loss of NaN, exit 0).
      if (first.empty()) {
        first = forge::detail::concat("tensor '", name, "' is stored as ", dtype_name(t->dtype()), " in ", source,
                                      "; a model's weights are floating point (f32, bf16, f16)");
        dtype_first = true;
      }
      ++mismatched;
    }
  }
  size_t unexpected = 0;
  std::set<std::string> names;
  for (const auto& [name, shape] : expected) names.insert(name);
  for (const auto& [name, t] : loaded) {
    if (names.count(name)) continue;
    if (first.empty())
      first = forge::detail::concat("tensor '", name, "' ", t.shape(), " is in ", source, " but not in the model");
    ++unexpected;
  }
  if (first.empty()) return;
  FORGE_THROW(dtype_first ? "checkpoint with weights that are not floating point: " : "checkpoint from another model shape: ",
              first, " (shape or dtype mismatches: ", mismatched,
              ", missing: ", missing, ", unexpected: ", unexpected, "; the model has ", expected.size(), " tensors)");
}

}  // namespace forge::io
