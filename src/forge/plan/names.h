#pragma once
// Name matching for `forge plan`'s catalogues (model presets, GPUs): case-, space-, '-'- and
// '_'-insensitive, with "did you mean" suggestions for a name that matches nothing.
#include <string>
#include <vector>

namespace forge::plan {

// "H100 SXM" -> "h100sxm".
std::string normalize_name(const std::string& s);

// The candidates a mistyped `query` most likely meant: those its normalized form is a prefix
// of, else the nearest by edit distance (at most three). Empty when nothing is close.
std::vector<std::string> nearest_names(const std::string& query, const std::vector<std::string>& candidates);

// "; did you mean 'a' or 'b'?" (empty when `names` is empty).
std::string did_you_mean(const std::vector<std::string>& names);

// Number formatting for tables and messages (no fmt/std::format in this toolchain).
std::string fixed(double v, int decimals);            // "12.35"
std::string with_commas(int64_t n);                   // "124,439,808"
std::string si(double v, int sig = 3);                // "6.74B", "124M", "950", "2.05T"
std::string sci(double v, int decimals = 2);         // "8.54e+18"
std::string gib(double bytes, int decimals = 2);      // bytes as GB (1e9): "13.48"
std::string duration(double seconds);                 // "3.2 s", "4.1 min", "2.3 h", "12.5 days"

// Parses "2T", "300B", "1.5e12", "4M", "512k" (k, M, B/G, T: powers of 1000). Throws forge::Error
// naming `what` for anything else or a value <= 0.
double parse_count(const std::string& text, const std::string& what);

}  // namespace forge::plan
