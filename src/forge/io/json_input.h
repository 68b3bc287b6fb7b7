#pragma once
// JSON read from files: untrusted input (tokenizer.json, config.json, safetensors headers, a
// checkpoint's state.json and manifest, JSON Lines corpora, forge's own caches).
//
// Note [untrusted JSON]: every JSON document forge reads from a file goes through parse_json:
//   - nesting deeper than kMaxJsonDepth (64 arrays or objects inside each other; real files
//     reach 5) is refused while parsing, before anything recursive (a dump(), a destructor, a
//     conversion) sees the document: 200k levels would overflow the stack;
//   - a NUL byte anywhere is refused (nlohmann's lexer takes it for the end of the input and would
//     silently drop what follows), and anything after the value but whitespace is refused;
//   - every error is a forge::Error naming the file (`what`) and the position.
// json_error(what, e) turns a nlohmann type or range error met while reading a parsed document
// into the same kind of message ("... : [json.exception.type_error.302] ...") instead of an
// "internal error".
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace forge::io {

inline constexpr int kMaxJsonDepth = 64;

nlohmann::json parse_json(std::string_view text, const std::string& what, int max_depth = kMaxJsonDepth);
// The same, keeping the keys' order (safetensors headers).
nlohmann::ordered_json parse_ordered_json(std::string_view text, const std::string& what,
                                          int max_depth = kMaxJsonDepth);

// Reads and parses a whole file (read_file, then parse_json; `what` defaults to the path).
nlohmann::json read_json_file(const std::string& path, const std::string& what = "");

// The integer `v` when it is one in [lo, hi] (not a float, not 1e39, not a string); else a
// forge::Error "<what> must be an integer in [lo, hi], got <v>" (v shortened).
int64_t json_integer(const nlohmann::json& v, int64_t lo, int64_t hi, const std::string& what);

// "<what>: a field has the wrong type or is missing (<e.what()>)": for a nlohmann exception thrown
// while reading a parsed document.
[[noreturn]] void throw_json_error(const std::string& what, const std::exception& e);

}  // namespace forge::io
