// Memory owners and out-of-memory snapshots (Note [memory owners] in memory_owner.h).
#include "forge/core/memory_owner.h"

#include "forge/core/env.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <unordered_set>

namespace forge {
namespace {

thread_local std::vector<const char*> t_owners;

}  // namespace

const char* intern_memory_owner(std::string_view label) {
  static std::mutex mu;
  static std::unordered_set<std::string>* labels = new std::unordered_set<std::string>();  // never freed
  std::lock_guard<std::mutex> lock(mu);
  return labels->emplace(label).first->c_str();
}

const char* current_memory_owner() { return t_owners.empty() ? nullptr : t_owners.back(); }

MemoryOwner::MemoryOwner(const char* interned) { t_owners.push_back(interned); }
MemoryOwner::~MemoryOwner() { t_owners.pop_back(); }

const char* forward_block_owner(int64_t i) {
  static std::mutex mu;
  static std::vector<const char*> labels;
  std::lock_guard<std::mutex> lock(mu);
  const auto n = static_cast<size_t>(std::max<int64_t>(i, 0));
  while (labels.size() <= n) labels.push_back(intern_memory_owner("forward: block " + std::to_string(labels.size())));
  return labels[n];
}

std::vector<OwnerBytes> bytes_by_owner(const std::vector<std::pair<const char*, int64_t>>& blocks) {
  std::map<const char*, OwnerBytes> by;
  for (const auto& [owner, bytes] : blocks) {
    OwnerBytes& o = by[owner];
    ++o.blocks;
    o.bytes += bytes;
  }
  std::vector<OwnerBytes> out;
  out.reserve(by.size());
  for (auto& [owner, o] : by) {
    o.owner = owner ? owner : "(untagged)";
    out.push_back(std::move(o));
  }
  std::sort(out.begin(), out.end(), [](const OwnerBytes& a, const OwnerBytes& b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.owner < b.owner;
  });
  return out;
}

std::optional<int64_t> parse_memory_limit(const char* variable) {
  const std::string s = env::string(variable);
  if (s.empty()) return std::nullopt;
  size_t end = 0;
  double n = 0;
  try {
    n = std::stod(s, &end);
  } catch (...) {
    end = 0;
  }
  std::string unit = s.substr(end);
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  static const std::map<std::string, double> units = {{"", 1},         {"b", 1},          {"kb", 1e3},
                                                      {"mb", 1e6},     {"gb", 1e9},       {"kib", 1024.0},
                                                      {"mib", 1048576.0}, {"gib", 1073741824.0}};
  const auto u = units.find(unit);
  FORGE_CHECK(end > 0 && n > 0 && u != units.end(), variable, " = '", s,
              "' is not a size; give bytes or a number with kB, MB, GB, KiB, MiB or GiB (e.g. 512MB)");
  return static_cast<int64_t>(n * u->second);
}

std::optional<int64_t> cpu_memory_limit() {
  static const std::optional<int64_t> limit = parse_memory_limit("FORGE_CPU_MEMORY_LIMIT");
  return limit;
}

std::optional<int64_t> cuda_memory_limit() {
  static const std::optional<int64_t> limit = parse_memory_limit("FORGE_CUDA_MEMORY_LIMIT");
  return limit;
}

}  // namespace forge
