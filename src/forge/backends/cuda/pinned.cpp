// The pinned host allocator (pinned.h): cudaHostAlloc'ed segments cached by a BlockPool,
// blocks reused only after the asynchronous copies that used them completed.
#include "forge/backends/cuda/pinned.h"

#include <unistd.h>

#include <atomic>
#include <mutex>
#include <vector>
#include <utility>

#include "forge/backends/cuda/runtime.h"
#include "forge/backends/cuda/tensor_kernels.h"
#include "forge/core/block_pool.h"

namespace forge::cuda {
namespace {

class PinnedAllocator final : public Allocator {
 public:
  PinnedAllocator() : pool_("pinned host allocator", backend()) {}

  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    std::lock_guard<std::mutex> lock(mu_);
    return pool_.allocate(nbytes, 0);
  }

  void deallocate(void* ptr, size_t /*nbytes*/) override {
    if (ptr == nullptr) return;
    try {
      std::lock_guard<std::mutex> lock(mu_);
      pool_.free(ptr);
    } catch (...) {
    }
  }

  Device device() const override { return Device::cpu(); }
  bool is_pinned() const override { return true; }

  void record_use(void* block, cudaStream_t stream, int device) {
    cudaEvent_t e = nullptr;
    {
      DeviceGuard guard(device);  // an event must be created on its stream's device
      FORGE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      const cudaError_t err = cudaEventRecord(e, stream);
      if (err != cudaSuccess) (void)cudaEventDestroy(e);
      FORGE_CUDA_CHECK(err);
    }
    std::lock_guard<std::mutex> lock(mu_);
    pool_.add_event(block, e);  // releases the event if it throws
  }

  // Note [reserving segments ahead] (core/block_pool.cpp): each segment is pinned without the
  // lock, then handed to the pool. Stops early (keeping what it has) when `stop` is set or the
  // host refuses more page-locked memory; returns the bytes added.
  uint64_t reserve(const std::vector<size_t>& requests, int device, const std::atomic<bool>* stop) {
    const BlockPool::Backend b = backend();
    uint64_t added = 0;
    DeviceGuard guard(device);  // the context of the training's device, not device 0's
    for (const BlockPool::SegmentPlan& seg : BlockPool::plan_segments(requests)) {
      if (stop != nullptr && stop->load()) break;
      void* p = b.allocate_segment(seg.bytes);
      if (p == nullptr) break;
      std::lock_guard<std::mutex> lock(mu_);
      try {
        pool_.add_segment(p, seg.bytes, seg.small, 0);
      } catch (...) {
        b.free_segment(p, seg.bytes);
        throw;
      }
      added += seg.bytes;
    }
    return added;
  }

  MemoryStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return pool_.stats();
  }
  void empty_cache() {
    std::lock_guard<std::mutex> lock(mu_);
    pool_.empty_cache();
  }

 private:
  static BlockPool::Backend backend() {
    BlockPool::Backend b;
    b.allocate_segment = [](size_t bytes) -> void* {
      void* p = nullptr;
      const cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
      if (err == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        return nullptr;
      }
      FORGE_CUDA_CHECK(err);
      return p;
    };
    b.free_segment = [](void* p, size_t) {
      if (cudaFreeHost(p) != cudaSuccess) (void)cudaGetLastError();
    };
    // Pinned blocks only get events through add_event (record_use); record_stream is not
    // used, so record_event stays empty.
    b.event_done = [](BlockPool::EventId e) { return event_completed(static_cast<cudaEvent_t>(e)); };
    b.wait_event = [](BlockPool::EventId e) { FORGE_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(e))); };
    b.release_event = [](BlockPool::EventId e) {
      if (cudaEventDestroy(static_cast<cudaEvent_t>(e)) != cudaSuccess) (void)cudaGetLastError();
    };
    b.memory_info = []() -> std::pair<size_t, size_t> {
      const long page = sysconf(_SC_PAGESIZE), avail = sysconf(_SC_AVPHYS_PAGES), total = sysconf(_SC_PHYS_PAGES);
      if (page <= 0 || avail < 0 || total <= 0) return {0, 0};
      const auto bytes = [page](long pages) { return static_cast<size_t>(pages) * static_cast<size_t>(page); };
      return {bytes(avail), bytes(total)};
    };
    return b;
  }

  std::mutex mu_;
  BlockPool pool_;
};

// Created on first use and never destroyed (pinned storages may be freed at exit).
PinnedAllocator& pinned(const char* op) {
  FORGE_CHECK(device_count() > 0, op, ": pinned host memory is page-locked through the CUDA driver, and no CUDA ",
              "device is visible; keep the tensor in ordinary memory (drop pin_memory / non_blocking)");
  static auto* a = new PinnedAllocator();
  return *a;
}

}  // namespace

Allocator* pinned_allocator() { return &pinned("pin_memory"); }

MemoryStats pinned_memory_stats() { return pinned("pinned_memory_stats").stats(); }

void empty_pinned_cache() { pinned("empty_pinned_cache").empty_cache(); }

uint64_t reserve_pinned(const std::vector<size_t>& requests, int device, const std::atomic<bool>* stop) {
  return pinned("reserve_pinned").reserve(requests, device, stop);
}

void record_pinned_use(void* block, cudaStream_t stream, int device) {
  if (block == nullptr) return;
  pinned("record_pinned_use").record_use(block, stream, device);
}

}  // namespace forge::cuda
