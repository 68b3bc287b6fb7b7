#include "forge/core/allocator.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <new>

#include "forge/core/error.h"

namespace forge {
namespace {

std::atomic<int64_t> g_allocated{0};
std::atomic<int64_t> g_peak{0};
std::atomic<int64_t> g_count{0};

class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    const size_t rounded = (std::max<size_t>(nbytes, 1) + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    void* p = std::aligned_alloc(kCpuAlignment, rounded);
    FORGE_CHECK(p != nullptr, "cpu allocator: out of memory allocating ", nbytes, " bytes");
    const int64_t now = g_allocated.fetch_add(static_cast<int64_t>(nbytes)) + static_cast<int64_t>(nbytes);
    int64_t peak = g_peak.load();
    while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
    }
    g_count.fetch_add(1);
    return p;
  }
  void deallocate(void* ptr, size_t nbytes) override {
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
