// Untrusted JSON (Note [untrusted JSON] in json_input.h).
#include "forge/io/json_input.h"

#include "forge/core/error.h"
#include "forge/io/atomic_file.h"

namespace forge::io {

namespace {

template <class Json>
Json parse_bounded(std::string_view text, const std::string& what, int max_depth) {
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos)
    FORGE_THROW(what, ": not valid JSON: a NUL byte at offset ", nul, " (a JSON text holds none)");
  bool too_deep = false;
  // Called as the parser goes: a throw here ends the parse before the document grows deeper.
  const typename Json::parser_callback_t limit = [&](int depth, typename Json::parse_event_t event, Json&) {
    if ((event == Json::parse_event_t::object_start || event == Json::parse_event_t::array_start) &&
        depth >= max_depth) {
      too_deep = true;
      throw std::runtime_error("too deep");
    }
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), limit);
  } catch (const typename Json::exception& e) {
    FORGE_THROW(what, ": not valid JSON: ", e.what());
  } catch (const std::runtime_error&) {
    if (!too_deep) throw;
    FORGE_THROW(what, ": JSON nested deeper than ", max_depth,
                " levels of arrays and objects; forge refuses it (no file it reads nests more than a few)");
  }
}

}  // namespace

nlohmann::json parse_json(std::string_view text, const std::string& what, int max_depth) {
  return parse_bounded<nlohmann::json>(text, what, max_depth);
}

nlohmann::ordered_json parse_ordered_json(std::string_view text, const std::string& what, int max_depth) {
  return parse_bounded<nlohmann::ordered_json>(text, what, max_depth);
}

nlohmann::json read_json_file(const std::string& path, const std::string& what) {
  return parse_json(read_file(path), what.empty() ? "'" + path + "'" : what);
}

int64_t json_integer(const nlohmann::json& v, int64_t lo, int64_t hi, const std::string& what) {
  bool ok = false;
  int64_t x = 0;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    ok = u <= static_cast<uint64_t>(INT64_MAX);
    x = ok ? static_cast<int64_t>(u) : 0;
  } else if (v.is_number_integer()) {
    x = v.get<int64_t>();
    ok = true;
  }
  if (ok && x >= lo && x <= hi) return x;
  std::string shown = v.dump();
  if (shown.size() > 60) shown = shown.substr(0, 57) + "...";
  FORGE_THROW(what, " must be an integer in [", lo, ", ", hi, "], got ", shown);
}

void throw_json_error(const std::string& what, const std::exception& e) {
  FORGE_THROW(what, ": a field is missing or has the wrong type (", e.what(), ")");
}

}  // namespace forge::io
