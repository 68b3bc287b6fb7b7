// The GEMM tuning cache file (contract in gemm_tuning_cache.h).
#include "forge/backends/gemm_tuning_cache.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <system_error>

#include "forge/core/env.h"
#include "forge/core/error.h"

namespace forge::gemm_tuning {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string quoted(const fs::path& p) {
  std::string s(1, '\'');
  s += p.string();
  s += '\'';
  return s;
}

// A well-formed entry, or nullopt.
std::optional<Entry> parse_entry(const json& j) {
  if (!j.is_object()) return std::nullopt;
  const auto algo = j.find("algo");
  if (algo == j.end() || !algo->is_string()) return std::nullopt;
  const auto data = parse_algo(algo->get<std::string>());
  if (!data) return std::nullopt;
  Entry e;
  e.algo = *data;
  const auto number = [&](const char* name, double& out) {
    const auto it = j.find(name);
    if (it == j.end()) return true;  // optional: the times are informative
    if (!it->is_number() || !std::isfinite(it->get<double>()) || it->get<double>() < 0) return false;
    out = it->get<double>();
    return true;
  };
  if (!number("tuned_ms", e.tuned_ms) || !number("heuristic_ms", e.heuristic_ms)) return std::nullopt;
  if (const auto c = j.find("candidates"); c != j.end()) {
    if (!c->is_number_integer() || c->get<int64_t>() < 0 || c->get<int64_t>() > 1 << 20) return std::nullopt;
    e.candidates = static_cast<int>(c->get<int64_t>());
  }
  return e;
}

json entry_json(const Entry& e) {
  return {{"algo", algo_text(e.algo)},
          {"tuned_ms", e.tuned_ms},
          {"heuristic_ms", e.heuristic_ms},
          {"candidates", e.candidates}};
}

// The file's JSON when it is this format and version; otherwise nullopt and `why` says why
// (empty when the file does not exist).
std::optional<json> read_document(const fs::path& path, std::string& why) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) return std::nullopt;  // no file yet
  if (!fs::is_regular_file(st)) {
    why = "it is not a regular file";
    return std::nullopt;
  }
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  if (in.is_open()) text << in.rdbuf();
  if (!in.is_open() || in.bad()) {
    why = std::string("it cannot be read (") + std::strerror(errno) + ")";
    return std::nullopt;
  }
  // Note [untrusted JSON] (io/json_input.h, above this layer): nesting bounded while parsing, no NUL.
  const std::string body = text.str();
  bool too_deep = false;
  const json::parser_callback_t limit = [&](int depth, json::parse_event_t event, json&) {
    if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) && depth >= 64)
      too_deep = true;
    return !too_deep;
  };
  json doc = body.find('\0') == std::string::npos ? json::parse(body, limit, /*allow_exceptions=*/false)
                                                   : json(json::value_t::discarded);
  if (doc.is_discarded() || too_deep) {
    why = "it is not valid JSON";
    return std::nullopt;
  }
  const auto format = doc.is_object() ? doc.find("format") : doc.end();
  if (!doc.is_object() || format == doc.end() || *format != kFormatName) {
    why = std::string("it is not a forge GEMM tuning cache (no \"format\": \"") + kFormatName + "\")";
    return std::nullopt;
  }
  const auto version = doc.find("version");
  if (version == doc.end() || !version->is_number_integer() || version->get<int64_t>() != kFormatVersion) {
    why = "it has format version " + (version == doc.end() ? std::string("(none)") : version->dump()) +
          ", this forge reads version " + std::to_string(kFormatVersion);
    return std::nullopt;
  }
  const auto devices = doc.find("devices");
  if (devices == doc.end() || !devices->is_object()) {
    why = "its \"devices\" is not an object";
    return std::nullopt;
  }
  return doc;
}

uint64_t random_suffix() {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t seed = [] {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }();
  return seed ^ (counter.fetch_add(1) * 0x9e3779b97f4a7c15ull);
}

// Writes `text` to `path` through a temporary next to it and rename(); throws forge::Error.
void write_atomically(const fs::path& path, const std::string& text) {
  char suffix[64];
  std::snprintf(suffix, sizeof(suffix), ".tmp.%ld.%016" PRIx64, static_cast<long>(::getpid()), random_suffix());
  const fs::path tmp = path.string() + suffix;
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) FORGE_THROW("cannot create ", quoted(tmp), ": ", std::strerror(errno));
  const char* p = text.data();
  size_t left = text.size();
  int err = 0;
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      err = errno;
      break;
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && ::rename(tmp.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(tmp.c_str());
    FORGE_THROW("cannot write ", quoted(path), ": ", std::strerror(err));
  }
}

}  // namespace

std::string Identity::key() const {
  return gpu + ", sm_" + std::to_string(cc_major) + std::to_string(cc_minor) + ", " + std::to_string(sm_count) +
         " SMs, cuBLASLt " + std::to_string(cublaslt_version) + (graph_timed ? ", timed as CUDA graphs" : "");
}

std::string algo_text(const AlgoData& a) {
  std::string s;
  s.reserve(128);
  char word[17];
  for (uint64_t w : a) {
    std::snprintf(word, sizeof(word), "%016" PRIx64, w);
    s += word;
  }
  return s;
}

std::optional<AlgoData> parse_algo(const std::string& text) {
  if (text.size() != 128) return std::nullopt;
  AlgoData a{};
  for (size_t i = 0; i < 8; ++i) {
    uint64_t w = 0;
    for (size_t j = 0; j < 16; ++j) {
      const char c = text[i * 16 + j];
      uint64_t d = 0;
      if (c >= '0' && c <= '9') d = static_cast<uint64_t>(c - '0');
      else if (c >= 'a' && c <= 'f') d = static_cast<uint64_t>(c - 'a' + 10);
      else return std::nullopt;
      w = (w << 4) | d;
    }
    a[i] = w;
  }
  return a;
}

Loaded load(const fs::path& path, const Identity& id) {
  Loaded out;
  std::string why;
  const std::optional<json> doc = read_document(path, why);
  if (!doc) {
    if (!why.empty())
      out.warning = "the GEMM tuning cache " + quoted(path) + " is ignored: " + why +
                    "; it is rewritten when new shapes are tuned (or delete it)";
    return out;
  }
  const auto devices = doc->find("devices");  // an object (read_document)
  const auto section = devices->find(id.key());
  if (section == devices->end()) return out;  // nothing tuned on this GPU and cuBLASLt yet
  const auto entries = section->is_object() ? section->find("entries") : section->end();
  if (entries == section->end() || !entries->is_object()) {
    out.warning = "the GEMM tuning cache " + quoted(path) + ": the section of '" + id.key() +
                  "' has no \"entries\" object; it is ignored and rewritten when new shapes are tuned";
    return out;
  }
  for (const auto& [key, value] : entries->items()) {
    if (const auto e = parse_entry(value)) out.entries.emplace(key, *e);
    else ++out.dropped;
  }
  if (out.dropped > 0)
    out.warning = "the GEMM tuning cache " + quoted(path) + ": " + std::to_string(out.dropped) +
                  " malformed entr" + (out.dropped == 1 ? "y" : "ies") + " of '" + id.key() +
                  "' skipped (timed again, then rewritten)";
  return out;
}

void save(const fs::path& path, const Identity& id, const Entries& entries) {
  std::string why;
  json doc = read_document(path, why).value_or(json::object());
  doc["format"] = kFormatName;
  doc["version"] = kFormatVersion;
  if (!doc.contains("devices")) doc["devices"] = json::object();
  const std::string key = id.key();
  json& section = doc["devices"][key];
  if (!section.is_object()) section = json::object();
  section["gpu"] = id.gpu;
  section["compute_capability"] = std::to_string(id.cc_major) + "." + std::to_string(id.cc_minor);
  section["sm_count"] = id.sm_count;
  section["cublaslt_version"] = id.cublaslt_version;
  if (id.graph_timed) section["timed_as"] = "CUDA graphs";
  json merged = json::object();
  if (const auto old = section.find("entries"); old != section.end() && old->is_object())
    for (const auto& [key, value] : old->items())
      if (parse_entry(value)) merged[key] = value;  // another process's, or an older one of ours
  for (const auto& [key, e] : entries) merged[key] = entry_json(e);
  section["entries"] = std::move(merged);

  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) FORGE_THROW("cannot create the directory ", quoted(dir), " of ", quoted(path), ": ", ec.message());
  write_atomically(path, doc.dump(1) + "\n");
}

std::optional<fs::path> cache_path() {
  const std::string set = env::string("FORGE_GEMM_TUNE_CACHE");
  if (set == "none") return std::nullopt;
  if (!set.empty()) return fs::path(set);
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && xdg[0] == '/')
    return fs::path(xdg) / "forge" / "gemm_tuning.json";
  if (const char* home = std::getenv("HOME"); home != nullptr && home[0] != '\0')
    return fs::path(home) / ".cache" / "forge" / "gemm_tuning.json";
  return std::nullopt;
}

}  // namespace forge::gemm_tuning
