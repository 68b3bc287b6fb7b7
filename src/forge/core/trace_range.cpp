// Trace ranges (contract in trace_range.h).
#include "forge/core/trace_range.h"

#include <mutex>
#include <string>
#include <vector>

#include "forge/core/memory_owner.h"

namespace forge::trace {
namespace {
thread_local RangeSink* t_sink = nullptr;
thread_local int64_t t_block = -1;
}  // namespace

void set_sink(RangeSink* s) { t_sink = s; }
void instant(const char* name) {
  if (t_sink) t_sink->instant(name);
}
RangeSink* sink() { return t_sink; }
int64_t current_block() { return t_block; }

const char* backward_block_name(int64_t i) {
  static std::mutex mu;
  static std::vector<const char*> names;
  std::lock_guard<std::mutex> lock(mu);
  const auto n = static_cast<size_t>(i < 0 ? 0 : i);
  while (names.size() <= n) names.push_back(intern_memory_owner("backward: block " + std::to_string(names.size())));
  return names[n];
}

// The forward label is the memory owner's (one interned string for both).
BlockScope::BlockScope(int64_t block) : previous_(t_block), range_(forward_block_owner(block)) { t_block = block; }
BlockScope::~BlockScope() { t_block = previous_; }

}  // namespace forge::trace
