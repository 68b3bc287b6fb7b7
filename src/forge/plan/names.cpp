#include "forge/plan/names.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "forge/core/error.h"

namespace forge::plan {

namespace {

// Levenshtein distance (insertions, deletions, substitutions).
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string normalize_name(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == ' ' || c == '-' || c == '_') continue;
    out.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  return out;
}

std::vector<std::string> nearest_names(const std::string& query, const std::vector<std::string>& candidates) {
  const std::string q = normalize_name(query);
  std::vector<std::string> out;
  if (q.empty()) return out;
  for (const auto& c : candidates)
    if (normalize_name(c).rfind(q, 0) == 0) out.push_back(c);
  if (!out.empty()) return out;
  std::vector<std::pair<size_t, std::string>> scored;
  for (const auto& c : candidates) scored.emplace_back(edit_distance(q, normalize_name(c)), c);
  std::stable_sort(scored.begin(), scored.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  const size_t limit = std::max<size_t>(2, q.size() / 3);
  for (const auto& [d, c] : scored) {
    if (d > limit || out.size() == 3) break;
    out.push_back(c);
  }
  return out;
}

std::string did_you_mean(const std::vector<std::string>& names) {
  if (names.empty()) return "";
  std::string s = "; did you mean ";
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) s += i + 1 == names.size() ? " or " : ", ";
    s += "'" + names[i] + "'";
  }
  return s + "?";
}

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

std::string with_commas(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return n < 0 ? "-" + out : out;
}

std::string si(double v, int sig) {
  static const char* units[] = {"", "k", "M", "B", "T", "P", "E"};
  const double a = std::fabs(v);
  int u = 0;
  while (a >= std::pow(1000.0, u + 1) && u < 6) ++u;
  const double x = v / std::pow(1000.0, u);
  const double ax = std::fabs(x);
  const int decimals = ax >= 100 ? std::max(0, sig - 3) : ax >= 10 ? std::max(0, sig - 2) : std::max(0, sig - 1);
  if (u == 0 && std::floor(v) == v) return std::to_string(static_cast<int64_t>(v));
  return fixed(x, decimals) + units[u];
}

std::string sci(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*e", decimals, v);
  return buf;
}

std::string gib(double bytes, int decimals) { return fixed(bytes / 1e9, decimals); }

std::string duration(double s) {
  if (!std::isfinite(s)) return "inf";
  if (s < 1e-3) return fixed(s * 1e6, 0) + " us";
  if (s < 1) return fixed(s * 1e3, 1) + " ms";
  if (s < 120) return fixed(s, 2) + " s";
  if (s < 7200) return fixed(s / 60, 1) + " min";
  if (s < 3 * 86400) return fixed(s / 3600, 1) + " h";
  if (s < 2 * 365.25 * 86400) return fixed(s / 86400, 1) + " days";
  return fixed(s / (365.25 * 86400), 2) + " years";
}

double parse_count(const std::string& text, const std::string& what) {
  std::string t;
  for (char c : text)
    if (c != '_' && c != ',') t.push_back(c);
  FORGE_CHECK(!t.empty(), what, ": expected a number such as 2T, 300B, 4M or 1e12, got ''");
  double mult = 1;
  switch (t.back()) {
    case 'k': case 'K': mult = 1e3; break;
    case 'M': case 'm': mult = 1e6; break;
    case 'B': case 'b': case 'G': case 'g': mult = 1e9; break;
    case 'T': case 't': mult = 1e12; break;
    default: break;
  }
  if (mult != 1) t.pop_back();
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  FORGE_CHECK(end != t.c_str() && *end == '\0' && std::isfinite(v), what,
              ": expected a number such as 2T, 300B, 4M or 1e12 (k, M, B/G, T = powers of 1000), got '", text, "'");
  FORGE_CHECK(v > 0, what, " must be > 0, got '", text, "'");
  return v * mult;
}

}  // namespace forge::plan
