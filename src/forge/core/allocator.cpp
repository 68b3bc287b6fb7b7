#include "forge/core/allocator.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <new>

#include "forge/core/error.h"
#include "forge/core/memory_owner.h"

#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace forge {
namespace {

std::atomic<int64_t> g_allocated{0};
std::atomic<int64_t> g_peak{0};
std::atomic<int64_t> g_count{0};

// With FORGE_CPU_MEMORY_LIMIT (Note [memory owners]): the live blocks' sizes and owners, and the
// refusal of a request beyond the limit with a snapshot of them.
struct Limited {
  std::mutex mu;
  std::unordered_map<void*, std::pair<const char*, int64_t>> live;
};
Limited& limited() {
  static Limited* l = new Limited();  // (never freed: storages may outlive static destruction)
  return *l;
}

[[noreturn]] void refuse(size_t nbytes, int64_t limit) {
  MemorySnapshot s;
  s.allocator = "cpu allocator";
  s.requested = static_cast<int64_t>(nbytes);
  const char* owner = current_memory_owner();
  s.failed_owner = owner ? owner : "(untagged)";
  s.stats = cpu_memory_stats();
  s.limit = limit;
  {
    std::vector<std::pair<const char*, int64_t>> blocks;
    std::lock_guard<std::mutex> lock(limited().mu);
    blocks.reserve(limited().live.size());
    for (const auto& [p, ob] : limited().live) blocks.push_back(ob);
    s.live = bytes_by_owner(blocks);
  }
  const std::string what = "cpu allocator: out of memory: tried to allocate " + std::to_string(nbytes) +
                           " bytes for " + s.failed_owner + " with " + std::to_string(s.stats.allocated) +
                           " bytes in live tensors, over FORGE_CPU_MEMORY_LIMIT = " + std::to_string(limit) +
                           " bytes; lower the batch size or raise the limit";
  throw OutOfMemoryError(what, std::move(s));
}

class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    const size_t rounded = (std::max<size_t>(nbytes, 1) + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    const std::optional<int64_t> limit = cpu_memory_limit();
    if (limit && g_allocated.load() + static_cast<int64_t>(nbytes) > *limit) refuse(nbytes, *limit);
    void* p = std::aligned_alloc(kCpuAlignment, rounded);
    FORGE_CHECK(p != nullptr, "cpu allocator: out of memory allocating ", nbytes, " bytes");
    if (limit) {
      std::lock_guard<std::mutex> lock(limited().mu);
      limited().live[p] = {current_memory_owner(), static_cast<int64_t>(nbytes)};
    }
    const int64_t now = g_allocated.fetch_add(static_cast<int64_t>(nbytes)) + static_cast<int64_t>(nbytes);
    int64_t peak = g_peak.load();
    while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
    }
    g_count.fetch_add(1);
    return p;
  }
  void deallocate(void* ptr, size_t nbytes) override {
    if (cpu_memory_limit() && ptr != nullptr) {
      std::lock_guard<std::mutex> lock(limited().mu);
      limited().live.erase(ptr);
    }
    std::free(ptr);
    g_allocated.fetch_sub(static_cast<int64_t>(nbytes));
  }
  Device device() const override { return Device::cpu(); }
};

}  // namespace

Allocator* cpu_allocator() {
  static CpuAllocator a;
  return &a;
}

MemoryStats cpu_memory_stats() { return {g_allocated.load(), g_peak.load(), g_count.load()}; }

void reset_cpu_peak_memory() { g_peak.store(g_allocated.load()); }

}  // namespace forge
