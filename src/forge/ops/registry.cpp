#include "forge/ops/registry.h"

#include <set>

namespace forge::ops {
namespace {

// Built on first use: family files register during static initialisation, in any order.
std::set<std::string, std::less<>>& registry() {
  static std::set<std::string, std::less<>> names;
  return names;
}

}  // namespace

bool register_ops(std::initializer_list<const char*> names) {
  for (const char* n : names) registry().insert(n);
  return true;
}

std::vector<std::string> registered_ops() { return {registry().begin(), registry().end()}; }

bool is_registered_op(std::string_view name) { return registry().count(name) > 0; }

}  // namespace forge::ops
