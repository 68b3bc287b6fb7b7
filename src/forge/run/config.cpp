// RunConfig: the schema table, TOML/JSON loading, overrides and validation (contract in config.h).
#include "forge/run/config.h"
#include "forge/run/config_schema.h"

#include <fnmatch.h>
#include <glob.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <toml.hpp>  // third_party/tomlplusplus
#include <variant>

#include "forge/core/error.h"
#include "forge/nn/model_registry.h"
#include "forge/ops/creation.h"
#include "forge/run/hf_model.h"

namespace forge::train {

namespace fs = std::filesystem;
using nlohmann::json;

std::string RunConfig::run_dir() const { return (fs::path(run.dir) / run.name).string(); }

bool RunConfig::is_language_model() const {
  const nn::ModelFamily* f = nn::find_model_family(model.type);
  return f != nullptr && f->is_transformer();
}

const char* key_type_name(KeyType t) {
  switch (t) {
    case KeyType::integer: return "an integer";
    case KeyType::floating: return "a number";
    case KeyType::boolean: return "a boolean (true or false)";
    case KeyType::string: return "a string";
    case KeyType::string_list: return "a list of strings";
    case KeyType::integer_list: return "a list of integers";
  }
  return "?";
}

namespace {

// ---- the schema: the key table (config_schema.h, config_fields.cpp) -------------------------

using detail::AnyAccessor;
using detail::Field;
using detail::IntList;
using detail::StringList;
using detail::fields;

const std::vector<std::string>& section_names() {
  static const std::vector<std::string> names = {"run", "model", "data", "optim", "schedule", "train", "eval",
                                                 "checkpoint", "lora", "dist", "telemetry", "debug"};
  return names;
}

const Field* find_field(const std::string& key) {
  for (const auto& f : fields())
    if (f.key == key) return &f;
  return nullptr;
}

KeyType type_of(const Field& f) {
  return std::visit(
      [](auto acc) -> KeyType {
        using T = std::remove_reference_t<decltype(acc(std::declval<RunConfig&>()))>;
        if constexpr (std::is_same_v<T, int64_t>) return KeyType::integer;
        else if constexpr (std::is_same_v<T, double>) return KeyType::floating;
        else if constexpr (std::is_same_v<T, bool>) return KeyType::boolean;
        else if constexpr (std::is_same_v<T, std::string>) return KeyType::string;
        else if constexpr (std::is_same_v<T, IntList>) return KeyType::integer_list;
        else return KeyType::string_list;
      },
      f.get);
}

// ---- value text ----------------------------------------------------------------------------

std::string toml_string(const std::string& s) {
  std::ostringstream os;
  os << toml::value<std::string>(s);
  return os.str();
}

std::string format_double(double v) {
  char buf[64];
  for (int prec = 6; prec <= 17; ++prec) {  // the shortest text that reads back exactly
    std::snprintf(buf, sizeof(buf), "%.*g", prec, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  std::string s = buf;
  if (std::isfinite(v) && s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s;
}

std::string value_text(const Field& f, const RunConfig& cfg) {
  auto& c = const_cast<RunConfig&>(cfg);  // accessors take a mutable config; nothing is written
  return std::visit(
      [&](auto acc) -> std::string {
        const auto& v = acc(c);
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, int64_t>) return std::to_string(v);
        else if constexpr (std::is_same_v<T, double>) return format_double(v);
        else if constexpr (std::is_same_v<T, bool>) return v ? "true" : "false";
        else if constexpr (std::is_same_v<T, std::string>) return toml_string(v);
        else if constexpr (std::is_same_v<T, IntList>) {
          std::string s = "[";
          for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
          return s + "]";
        } else {
          std::string s = "[";
          for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + toml_string(v[i]);
          return s + "]";
        }
      },
      f.get);
}

// ---- suggestions ---------------------------------------------------------------------------

std::string join(const std::vector<std::string>& items, const char* sep) {
  std::string s;
  for (size_t i = 0; i < items.size(); ++i) s += (i ? sep : "") + items[i];
  return s;
}

std::vector<std::string> names_in(const std::string& section) {
  std::vector<std::string> out;
  for (const auto& f : fields())
    if (f.section == section) out.push_back(f.name);
  return out;
}

// "; did you mean 'train.steps'?" or the list of valid keys.
std::string suggest_key(const std::string& section, const std::string& name) {
  const std::string key = section + "." + name;
  // The right name in the wrong section ("train.lr" -> "optim.lr").
  for (const auto& f : fields())
    if (f.name == name) return "; did you mean '" + f.key + "'?";
  const Field* best = nullptr;
  size_t best_d = SIZE_MAX;
  for (const auto& f : fields()) {
    const size_t d = edit_distance(key, f.key);
    if (d < best_d) best_d = d, best = &f;
  }
  if (best && best_d <= std::max<size_t>(2, name.size() / 3)) return "; did you mean '" + best->key + "'?";
  for (const auto& f : fields())  // a prefix either way: "train.log" -> "train.log_every"
    if (f.section == section && (f.name.rfind(name, 0) == 0 || name.rfind(f.name, 0) == 0))
      return "; did you mean '" + f.key + "'?";
  const auto& secs = section_names();
  if (std::find(secs.begin(), secs.end(), section) != secs.end())
    return "; the keys of [" + section + "] are: " + join(names_in(section), ", ");
  return "; the sections are: " + join(secs, ", ");
}

std::string suggest_section(const std::string& section) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const auto& s : section_names()) {
    const size_t d = edit_distance(section, s);
    if (d < best_d) best_d = d, best = s;
  }
  if (best_d <= std::max<size_t>(2, section.size() / 3)) return "; did you mean [" + best + "]?";
  for (const auto& s : section_names())  // a prefix either way: [optimizer] -> [optim]
    if (s.rfind(section, 0) == 0 || section.rfind(s, 0) == 0) return "; did you mean [" + s + "]?";
  return "; the sections are: [" + join(section_names(), "], [") + "]";
}

// ---- setting values ------------------------------------------------------------------------

// What one TOML node holds, for messages: "string \"abc\"".
std::string describe_node(const toml::node& n) {
  std::ostringstream os;
  os << n.type() << " ";
  if (n.is_table()) os << "{...}";
  else if (const auto* a = n.as_array()) os << *a;
  else n.visit([&](const auto& v) { os << v; });
  return os.str();
}

std::string where(const std::string& origin, const toml::node& n) {
  const auto& src = n.source();
  if (src.begin.line == 0) return origin;
  return origin + ":" + std::to_string(src.begin.line);
}

[[noreturn]] void wrong_type(const std::string& at, const Field& f, const std::string& got, const RunConfig& defaults) {
  FORGE_THROW(at, ": ", f.key, " must be ", key_type_name(type_of(f)), ", got ", got, "; write e.g. ", f.key, " = ",
              value_text(f, defaults));
}

void set_from_toml(RunConfig& cfg, const Field& f, const toml::node& n, const std::string& at) {
  static const RunConfig defaults;
  std::visit(
      [&](auto acc) {
        auto& dst = acc(cfg);
        using T = std::decay_t<decltype(dst)>;
        if constexpr (std::is_same_v<T, int64_t>) {
          if (!n.is_integer()) wrong_type(at, f, describe_node(n), defaults);
          dst = *n.value<int64_t>();
        } else if constexpr (std::is_same_v<T, double>) {
          if (!n.is_number()) wrong_type(at, f, describe_node(n), defaults);
          dst = *n.value<double>();
        } else if constexpr (std::is_same_v<T, bool>) {
          if (!n.is_boolean()) wrong_type(at, f, describe_node(n), defaults);
          dst = *n.value<bool>();
        } else if constexpr (std::is_same_v<T, std::string>) {
          if (!n.is_string()) wrong_type(at, f, describe_node(n), defaults);
          dst = *n.value<std::string>();
        } else if constexpr (std::is_same_v<T, IntList>) {
          const toml::array* a = n.as_array();
          if (a == nullptr) wrong_type(at, f, describe_node(n), defaults);
          IntList out;
          for (const auto& item : *a) {
            if (!item.is_integer()) wrong_type(at, f, describe_node(n) + " (an element is " + describe_node(item) + ")", defaults);
            out.push_back(*item.value<int64_t>());
          }
          dst = std::move(out);
        } else {
          if (n.is_string()) {
            dst = {*n.value<std::string>()};
            return;
          }
          const toml::array* a = n.as_array();
          if (a == nullptr) wrong_type(at, f, describe_node(n), defaults);
          StringList out;
          for (const auto& item : *a) {
            if (!item.is_string()) wrong_type(at, f, describe_node(n) + " (an element is " + describe_node(item) + ")", defaults);
            out.push_back(*item.value<std::string>());
          }
          dst = std::move(out);
        }
      },
      f.get);
}

void set_from_json(RunConfig& cfg, const Field& f, const json& v, const std::string& at) {
  static const RunConfig defaults;
  std::visit(
      [&](auto acc) {
        auto& dst = acc(cfg);
        using T = std::decay_t<decltype(dst)>;
        if constexpr (std::is_same_v<T, int64_t>) {
          if (!v.is_number_integer()) wrong_type(at, f, v.dump(), defaults);
          dst = v.get<int64_t>();
        } else if constexpr (std::is_same_v<T, double>) {
          if (!v.is_number()) wrong_type(at, f, v.dump(), defaults);
          dst = v.get<double>();
        } else if constexpr (std::is_same_v<T, bool>) {
          if (!v.is_boolean()) wrong_type(at, f, v.dump(), defaults);
          dst = v.get<bool>();
        } else if constexpr (std::is_same_v<T, std::string>) {
          if (!v.is_string()) wrong_type(at, f, v.dump(), defaults);
          dst = v.get<std::string>();
        } else if constexpr (std::is_same_v<T, IntList>) {
          if (!v.is_array()) wrong_type(at, f, v.dump(), defaults);
          IntList out;
          for (const auto& item : v) {
            if (!item.is_number_integer()) wrong_type(at, f, v.dump(), defaults);
            out.push_back(item.get<int64_t>());
          }
          dst = std::move(out);
        } else {
          if (!v.is_array()) wrong_type(at, f, v.dump(), defaults);
          StringList out;
          for (const auto& item : v) {
            if (!item.is_string()) wrong_type(at, f, v.dump(), defaults);
            out.push_back(item.get<std::string>());
          }
          dst = std::move(out);
        }
      },
      f.get);
}

bool parse_bool(const std::string& s, bool& out) {
  std::string l = s;
  std::transform(l.begin(), l.end(), l.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (l == "true" || l == "1" || l == "yes" || l == "on") return out = true, true;
  if (l == "false" || l == "0" || l == "no" || l == "off") return out = false, true;
  return false;
}

void set_from_text(RunConfig& cfg, const Field& f, const std::string& text, const std::string& at) {
  static const RunConfig defaults;
  const std::string got = "'" + text + "'";
  std::visit(
      [&](auto acc) {
        auto& dst = acc(cfg);
        using T = std::decay_t<decltype(dst)>;
        if constexpr (std::is_same_v<T, int64_t>) {
          int64_t v = 0;
          const auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
          if (text.empty() || ec != std::errc() || p != text.data() + text.size()) wrong_type(at, f, got, defaults);
          dst = v;
        } else if constexpr (std::is_same_v<T, double>) {
          char* end = nullptr;
          const double v = std::strtod(text.c_str(), &end);
          if (text.empty() || end != text.c_str() + text.size()) wrong_type(at, f, got, defaults);
          dst = v;
        } else if constexpr (std::is_same_v<T, bool>) {
          bool v = false;
          if (!parse_bool(text, v)) wrong_type(at, f, got, defaults);
          dst = v;
        } else if constexpr (std::is_same_v<T, std::string>) {
          dst = text;
        } else if constexpr (std::is_same_v<T, IntList>) {
          // A TOML array ("[3, 5]") or comma-separated integers ("3,5").
          const std::string array = !text.empty() && text.front() == '[' ? text : "[" + text + "]";
          toml::table t;
          try {
            t = toml::parse("v = " + array);
          } catch (const toml::parse_error& e) {
            wrong_type(at, f, got + " (" + std::string(e.description()) + ")", defaults);
          }
          set_from_toml(cfg, f, *t.get("v"), at);
        } else {
          StringList out;
          if (!text.empty() && text.front() == '[') {  // a TOML array: ["a", "b"]
            toml::table t;
            try {
              t = toml::parse("v = " + text);
            } catch (const toml::parse_error& e) {
              wrong_type(at, f, got + " (" + std::string(e.description()) + ")", defaults);
            }
            set_from_toml(cfg, f, *t.get("v"), at);
            return;
          }
          size_t start = 0;  // comma-separated
          while (start <= text.size() && !text.empty()) {
            const size_t comma = text.find(',', start);
            const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
            if (!item.empty()) out.push_back(item);
            if (comma == std::string::npos) break;
            start = comma + 1;
          }
          dst = std::move(out);
        }
      },
      f.get);
}

// ---- validation helpers ----------------------------------------------------------------------

bool has_glob_chars(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

bool excluded(const fs::path& p, const StringList& exclude) {
  const std::string full = p.string(), base = p.filename().string();
  for (const auto& pat : exclude) {
    const std::string& subject = pat.find('/') != std::string::npos ? full : base;
    if (fnmatch(pat.c_str(), subject.c_str(), 0) == 0) return true;
  }
  return false;
}

}  // namespace

// ---- public ----------------------------------------------------------------------------------

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::vector<std::string> ignored_model_keys(const RunConfig& cfg) {
  static const RunConfig defaults;
  const nn::ModelFamily* family = nn::find_model_family(cfg.model.type);
  std::vector<std::string> out;
  if (family == nullptr) return out;  // validate() names the type
  for (const auto& f : fields()) {
    if (f.section != "model" || family->reads(f.name)) continue;
    const std::string value = value_text(f, cfg);
    if (value != value_text(f, defaults)) out.push_back(f.key + " = " + value);
  }
  return out;
}

const std::vector<KeyInfo>& config_keys() {
  static const std::vector<KeyInfo> keys = [] {
    const RunConfig defaults;
    std::vector<KeyInfo> out;
    for (const auto& f : fields()) out.push_back({f.key, type_of(f), value_text(f, defaults), f.doc});
    return out;
  }();
  return keys;
}

void apply_override(RunConfig& cfg, const std::string& arg) {
  std::string s = arg;
  if (s.rfind("--", 0) == 0) s = s.substr(2);
  const size_t eq = s.find('=');
  const std::string key = s.substr(0, eq);
  const size_t dot = key.find('.');
  FORGE_CHECK(dot != std::string::npos && dot > 0 && dot + 1 < key.size(), "override '", arg,
              "' is not of the form --section.key=value (e.g. --train.steps=100)");
  const std::string section = key.substr(0, dot), name = key.substr(dot + 1);
  const Field* f = find_field(key);
  if (f == nullptr) {
    const auto& secs = section_names();
    if (std::find(secs.begin(), secs.end(), section) == secs.end())
      FORGE_THROW("override '", arg, "': unknown section [", section, "]", suggest_section(section));
    FORGE_THROW("override '", arg, "': unknown key '", key, "'", suggest_key(section, name));
  }
  if (eq == std::string::npos && type_of(*f) == KeyType::boolean) {  // a bare boolean key: --run.overwrite
    set_from_text(cfg, *f, "true", "override '" + arg + "'");
    return;
  }
  FORGE_CHECK(eq != std::string::npos, "override '", arg, "' has no value; write --", key, "=VALUE");
  set_from_text(cfg, *f, s.substr(eq + 1), "override '" + arg + "'");
}

RunConfig parse_config(const std::string& text, const std::string& origin, const std::vector<std::string>& overrides) {
  toml::table root;
  try {
    root = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    FORGE_THROW(origin, ":", e.source().begin.line, ":", e.source().begin.column, ": invalid TOML: ", e.description());
  }
  RunConfig cfg;
  cfg.source = origin;
  const auto& secs = section_names();
  // toml++ tables are ordered by key; report problems in the order of the file.
  auto in_file_order = [](const toml::table& t) {
    std::vector<std::pair<std::string, const toml::node*>> items;
    for (const auto& [k, node] : t) items.emplace_back(std::string(k.str()), &node);
    std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) {
      const auto &sa = a.second->source().begin, &sb = b.second->source().begin;
      return sa.line != sb.line ? sa.line < sb.line : sa.column < sb.column;
    });
    return items;
  };
  for (const auto& [section, node_ptr] : in_file_order(root)) {
    const toml::node& node = *node_ptr;
    if (!node.is_table()) {
      std::string hint;
      for (const auto& f : fields())
        if (f.name == section) {
          hint = "; did you mean '" + f.key + "' (write it under [" + f.section + "])?";
          break;
        }
      if (hint.empty()) hint = "; the sections are: [" + join(secs, "], [") + "]";
      FORGE_THROW(where(origin, node), ": key '", section, "' is outside any section", hint);
    }
    if (std::find(secs.begin(), secs.end(), section) == secs.end())
      FORGE_THROW(where(origin, node), ": unknown section [", section, "]", suggest_section(section));
    for (const auto& [name, value_ptr] : in_file_order(*node.as_table())) {
      const toml::node& value = *value_ptr;
      const std::string key = section + "." + name;
      const Field* f = find_field(key);
      if (f == nullptr) FORGE_THROW(where(origin, value), ": unknown key '", key, "'", suggest_key(section, name));
      set_from_toml(cfg, *f, value, where(origin, value));
    }
  }
  for (const auto& o : overrides) apply_override(cfg, o);
  apply_init_from(cfg);  // Note [init_from precedence] (hf_model.h)
  validate(cfg);
  return cfg;
}

std::string installed_config(const std::string& path) {
  std::error_code ec;
  if (path.empty() || fs::path(path).is_absolute() || fs::is_regular_file(path, ec)) return "";
  // Note [installed configs]: `make install` puts the shipped configs in <prefix>/share/forge/configs
  // beside <prefix>/bin/forge, so `forge train configs/tiny.toml` works from any directory.
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec || exe.empty()) return "";
  const fs::path candidate = exe.parent_path().parent_path() / "share" / "forge" / path;
  return fs::is_regular_file(candidate, ec) ? candidate.string() : "";
}

RunConfig load_config(const std::string& path_in, const std::vector<std::string>& overrides) {
  std::error_code ec;
  const std::string installed = installed_config(path_in);
  const std::string path = installed.empty() ? path_in : installed;
  FORGE_CHECK(fs::is_regular_file(path, ec), "config file '", path, "' does not exist (give the path to a TOML file, e.g. configs/tiny.toml)");
  std::ifstream in(path);
  FORGE_CHECK(in.good(), "cannot read config file '", path, "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_config(ss.str(), path, overrides);
}

SplitArgs split_overrides(const std::vector<std::string>& args) {
  SplitArgs out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    const bool is_override = a.size() > 2 && a.rfind("--", 0) == 0 && a.substr(2, a.find('=') - 2).find('.') != std::string::npos;
    if (!is_override) {
      out.rest.push_back(a);
      continue;
    }
    if (a.find('=') == std::string::npos && i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) {
      out.overrides.push_back(a + "=" + args[++i]);
    } else {
      out.overrides.push_back(a);
    }
  }
  return out;
}

json config_to_json(const RunConfig& cfg) {
  json j = json::object();
  auto& c = const_cast<RunConfig&>(cfg);
  for (const auto& f : fields()) {
    std::visit([&](auto acc) { j[f.section][f.name] = acc(c); }, f.get);
  }
  return j;
}

RunConfig config_from_json(const json& j, const std::string& origin) {
  FORGE_CHECK(j.is_object(), origin, ": the config must be a JSON object, got ", j.dump());
  RunConfig cfg;
  cfg.source = origin;
  const auto& secs = section_names();
  for (const auto& [section, body] : j.items()) {
    FORGE_CHECK(std::find(secs.begin(), secs.end(), section) != secs.end(), origin, ": unknown section [", section, "]",
                suggest_section(section));
    FORGE_CHECK(body.is_object(), origin, ": section [", section, "] must be an object");
    for (const auto& [name, value] : body.items()) {
      const Field* f = find_field(section + "." + name);
      FORGE_CHECK(f != nullptr, origin, ": unknown key '", section, ".", name, "'", suggest_key(section, name));
      set_from_json(cfg, *f, value, origin);
    }
  }
  // A checkpoint's config is untrusted input too (Note [checked sizes]): its model's shape rules and
  // bounds before anything is built from it.
  if (cfg.is_language_model()) {
    try {
      nn::validate_model(cfg.model);
    } catch (const Error& e) {
      FORGE_THROW(origin, ": ", e.what());
    }
  }
  return cfg;
}

std::string config_to_toml(const RunConfig& cfg) {
  std::ostringstream os;
  std::string section;
  for (const auto& f : fields()) {
    if (f.section != section) {
      os << (section.empty() ? "" : "\n") << "[" << f.section << "]\n";
      section = f.section;
    }
    os << f.name << " = " << value_text(f, cfg) << "\n";
  }
  return os.str();
}

namespace {

// Files, glob patterns and directories (their files, not recursive) of `specs` (the key `key`),
// without data.exclude's, empty files found by a pattern, and repeats.
std::vector<std::string> resolve_files(const std::vector<std::string>& specs, const std::vector<std::string>& exclude,
                                       const std::string& key) {
  std::vector<std::string> out;
  auto add_expanded = [&](std::vector<std::string> found, const std::string& spec) {
    std::sort(found.begin(), found.end());
    size_t kept = 0;
    std::error_code ec;
    for (const auto& p : found) {
      if (!fs::is_regular_file(p, ec) || excluded(p, exclude)) continue;
      if (fs::file_size(p, ec) == 0 || ec) continue;  // empty files found by a pattern are skipped
      out.push_back(p);
      ++kept;
    }
    FORGE_CHECK(kept > 0, key + ": '", spec, "' gives no non-empty file",
                exclude.empty() ? "" : " (after data.exclude)", "; fix the path or pattern");
  };
  for (const auto& spec : specs) {
    std::error_code ec;
    if (has_glob_chars(spec)) {
      glob_t g{};
      const int rc = ::glob(spec.c_str(), 0, nullptr, &g);
      std::vector<std::string> found;
      if (rc == 0)
        for (size_t i = 0; i < g.gl_pathc; ++i) found.emplace_back(g.gl_pathv[i]);
      globfree(&g);
      FORGE_CHECK(!found.empty(), key + ": pattern '", spec, "' matches no file; fix the pattern");
      add_expanded(std::move(found), spec);
    } else if (fs::is_directory(spec, ec)) {
      std::vector<std::string> found;
      for (const auto& e : fs::directory_iterator(spec, ec)) found.push_back(e.path().string());
      FORGE_CHECK(!ec, key + ": cannot list directory '", spec, "': ", ec.message());
      add_expanded(std::move(found), spec);
    } else {
      FORGE_CHECK(fs::exists(spec, ec), key + ": '", spec, "' does not exist; fix the path in " + key,
                  spec.rfind("/usr/share/games/fortunes", 0) == 0 ? " (install Debian's 'fortunes' package: scripts/install-deps.sh)" : "");
      FORGE_CHECK(fs::is_regular_file(spec, ec), key + ": '", spec, "' is not a regular file");
      FORGE_CHECK(fs::file_size(spec, ec) > 0, key + ": '", spec,
                  "' is empty (0 bytes); remove it from " + key + " or give a file with text");
      out.push_back(spec);
    }
  }
  // The same file named twice (a path and a glob) is read once.
  std::vector<std::string> unique;
  for (const auto& p : out)
    if (std::find(unique.begin(), unique.end(), p) == unique.end()) unique.push_back(p);
  return unique;
}

}  // namespace

std::vector<std::string> resolve_data_files(const DataSection& data) {
  FORGE_CHECK(!data.files.empty(),
              "data.files is empty: list the text files to train on (files, glob patterns or directories), e.g. "
              "data.files = [\"/usr/share/games/fortunes\"]");
  return resolve_files(data.files, data.exclude, "data.files");
}

std::vector<std::string> resolve_val_files(const DataSection& data) {
  if (data.val_files.empty()) return {};
  return resolve_files(data.val_files, data.exclude, "data.val_files");
}

std::string check_run_device_syntax(const std::string& device) {
  if (device == "auto") return device;
  try {
    return Device::parse(device).str();
  } catch (const Error&) {
    FORGE_THROW("run.device = '", device, "' is not a device; use \"auto\", \"cpu\", \"cuda\" or \"cuda:N\"");
  }
}

Device resolve_run_device(const std::string& device) {
  check_run_device_syntax(device);
  const int gpus = cuda_device_count();
  if (device == "auto") return gpus > 0 ? Device::cuda(0) : Device::cpu();
  const Device d = Device::parse(device);
  FORGE_CHECK(d.is_cpu() || d.index < gpus, "run.device = '", device, "' but ",
              gpus == 0 ? std::string("no CUDA device is visible") : std::to_string(gpus) + " CUDA device(s) are visible",
              "; use run.device = \"auto\" or \"cpu\"", gpus > 0 ? std::string(", or cuda:0..cuda:") + std::to_string(gpus - 1) : "");
  return d;
}

DType resolve_run_dtype(const std::string& dtype, Device device) {
  if (dtype == "auto") return device.is_cuda() ? DType::bf16 : DType::f32;
  if (dtype == "f32") return DType::f32;
  if (dtype == "bf16") return DType::bf16;
  if (dtype == "f16") return DType::f16;
  FORGE_THROW("run.dtype = '", dtype, "' is unknown; use \"auto\", \"f32\", \"bf16\" or \"f16\"");
}

std::optional<RankStep> parse_rank_step(const std::string& spec, const std::string& key) {
  if (spec.empty()) return std::nullopt;
  int r = -1;
  long long st = -1;
  char tail = 0;
  FORGE_CHECK(std::sscanf(spec.c_str(), "%d:%lld%c", &r, &st, &tail) == 2 && r >= 0 && st >= 1, key, " = '", spec,
              "' is not <rank>:<step> (rank >= 0, step >= 1), e.g. \"1:5\"; or \"\" for none");
  return RankStep{r, static_cast<int64_t>(st)};
}

}  // namespace forge::train
