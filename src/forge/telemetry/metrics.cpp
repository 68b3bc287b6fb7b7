// metrics.jsonl writing/reading and the progress line (contract in metrics.h).
#include "forge/telemetry/metrics.h"

#include <cmath>
#include <cstdio>
#include <sstream>

#include "forge/core/error.h"
#include "forge/io/atomic_file.h"
#include "forge/io/json_input.h"

namespace forge::telemetry {

namespace fs = std::filesystem;
using nlohmann::json;

JsonlWriter::JsonlWriter(const fs::path& path, bool truncate)
    : path_(path), out_(path, truncate ? std::ios::out | std::ios::trunc : std::ios::out | std::ios::app) {
  FORGE_CHECK(out_.good(), "metrics: cannot open '", path_.string(), "' for writing");
}

void JsonlWriter::write(const json& record) {
  FORGE_CHECK(record.is_object(), "metrics: a record must be a JSON object, got ", record.dump());
  // NaN/inf are not JSON: nlohmann writes them as null, which readers accept.
  out_ << record.dump() << '\n';
  out_.flush();
  FORGE_CHECK(out_.good(), "metrics: cannot write '", path_.string(), "'");
}

std::vector<json> read_jsonl(const fs::path& path, bool* torn) {
  std::vector<json> out;
  if (torn != nullptr) *torn = false;
  std::error_code ec;
  if (!fs::exists(path, ec)) return out;
  std::ifstream in(path, std::ios::binary);
  FORGE_CHECK(in.good(), "metrics: cannot read '", path.string(), "'");
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) continue;
    const bool last_unterminated = in.eof();  // getline hit the end of the file before a newline
    json j;
    try {
      j = io::parse_json(line, "metrics: '" + path.string() + "' line " + std::to_string(n));  // Note [untrusted JSON]
    } catch (const Error&) {
      if (last_unterminated) {
        if (torn != nullptr) *torn = true;
        break;
      }
      throw;
    }
    FORGE_CHECK(j.is_object(), "metrics: '", path.string(), "' line ", n, " is not a JSON object");
    out.push_back(std::move(j));
  }
  return out;
}

std::string truncate_jsonl_after_step(const fs::path& path, int64_t max_step) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return "";
  std::string kept;
  bool torn = false;
  for (const auto& r : read_jsonl(path, &torn)) {
    if (r.contains("step") && r["step"].is_number_integer() && r["step"].get<int64_t>() > max_step) continue;
    kept += r.dump() + "\n";
  }
  io::write_file_atomic(path, kept);
  if (!torn) return "";
  return "warning: the last line of '" + path.string() +
         "' was cut short (a crash or a full disk while it was written); it is removed";
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--:--";
  const auto s = static_cast<int64_t>(std::llround(seconds));
  char buf[48];
  if (s >= 3600)
    std::snprintf(buf, sizeof(buf), "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  else
    std::snprintf(buf, sizeof(buf), "%lld:%02lld", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  return buf;
}

std::string format_count(double n) {
  char buf[32];
  const double a = std::fabs(n);
  if (a < 1e3) std::snprintf(buf, sizeof(buf), "%.0f", n);
  else if (a < 1e6) std::snprintf(buf, sizeof(buf), a < 1e4 ? "%.2fk" : a < 1e5 ? "%.1fk" : "%.0fk", n / 1e3);
  else if (a < 1e9) std::snprintf(buf, sizeof(buf), a < 1e7 ? "%.2fM" : a < 1e8 ? "%.1fM" : "%.0fM", n / 1e6);
  else std::snprintf(buf, sizeof(buf), "%.2fG", n / 1e9);
  return buf;
}

std::string xml_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

std::string format_bytes(double bytes) {
  char buf[32];
  if (bytes < 1e9) std::snprintf(buf, sizeof(buf), "%.0f MB", bytes / 1e6);
  else std::snprintf(buf, sizeof(buf), "%.2f GB", bytes / 1e9);
  return buf;
}

std::string progress_line(const Progress& p) {
  const int width = static_cast<int>(std::to_string(p.total_steps).size());
  char head[96];
  std::snprintf(head, sizeof(head), "step %*lld/%lld | loss %.4f | lr %.2e", width, static_cast<long long>(p.step),
                static_cast<long long>(p.total_steps), p.loss, p.lr);
  std::ostringstream os;
  if (p.epochs > 0) os << "epoch " << p.epoch << "/" << p.epochs << " | ";
  os << head << " | " << format_count(p.rate) << " " << p.unit << "/s";
  if (p.mfu >= 0) {
    char mfu[32];
    std::snprintf(mfu, sizeof(mfu), "MFU %.1f%%", 100.0 * p.mfu);
    os << " | " << mfu;
  }
  if (p.memory_bytes >= 0) os << " | " << format_bytes(static_cast<double>(p.memory_bytes));
  if (!p.gpu.empty()) os << " | " << p.gpu;
  os << " | " << format_duration(p.elapsed_s) << " elapsed | ETA " << format_duration(p.eta_s);
  return os.str();
}

}  // namespace forge::telemetry
