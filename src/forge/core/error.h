#pragma once
// forge::Error and the checking macros.
//
// Library code never exits or aborts: every bad input becomes a forge::Error whose
// message names the op, the shapes and the dtypes involved, and (where there is one)
// the fix. FORGE_CHECK(cond, parts...) streams its parts into the message; a Shape
// (std::vector<int64_t>) prints as [2, 3].
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace forge {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

std::string shape_str(const std::vector<int64_t>& shape);

namespace detail {
template <class T> void append_part(std::ostringstream& os, const T& v) {
  if constexpr (std::is_same_v<std::decay_t<T>, std::vector<int64_t>>) {
    os << shape_str(v);
  } else {
    os << v;
  }
}
template <class... Parts> std::string concat(const Parts&... parts) {
  std::ostringstream os;
  (append_part(os, parts), ...);
  return os.str();
}
}  // namespace detail

}  // namespace forge

#define FORGE_THROW(...) throw ::forge::Error(::forge::detail::concat(__VA_ARGS__))
#define FORGE_CHECK(cond, ...)        \
  do {                                \
    if (!(cond)) FORGE_THROW(__VA_ARGS__); \
  } while (0)
