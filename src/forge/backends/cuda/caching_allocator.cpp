// The CUDA device allocator: one forge::Allocator per device, a caching allocator over
// cudaMalloc/cudaFree (Note [caching allocator] in core/block_pool.h, docs/cuda.md).
//
// Memory contract: allocate(n) returns at least n bytes of device memory on the
// allocator's device, 256-byte aligned (so every 16-byte vector load of a contiguous
// tensor's start is aligned), uninitialised; zero bytes give nullptr. Never managed
// (unified) memory. The block belongs to the current stream of the device at the time of
// the call (current_stream, runtime.h) and is reused, once freed, only by allocations on
// that stream: stream order makes it safe to release a temporary right after launching
// the kernel that reads it (cuda::copy does this). Memory used on another stream needs
// record_stream (Note [stream safety] in stream.h). deallocate() never throws: it runs
// from Storage destructors, also at process exit after the CUDA runtime may have shut down.
//
// FORGE_CUDA_ALLOC=plain (core/env.h; read at the first allocation) replaces the cache with a
// cudaMalloc/cudaFree per storage, for debugging memory errors with compute-sanitizer; it
// keeps the same counters (reserved == allocated). cudaFree waits for the device's pending
// work, so the stream rule holds there without record_stream.
#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "forge/backends/cuda/memory.h"
#include "forge/backends/cuda/runtime.h"
#include "forge/backends/cuda/stream.h"
#include "forge/backends/cuda/tensor_kernels.h"
#include "forge/core/block_pool.h"
#include "forge/core/env.h"

namespace forge::cuda {
namespace {

class DeviceAllocator : public Allocator {
 public:
  explicit DeviceAllocator(int device) : device_(device) {}
  Device device() const override { return Device::cuda(device_); }
  virtual MemoryStats stats() = 0;
  virtual void reset_peak() = 0;
  virtual void empty_cache() = 0;
  virtual void record_stream(void* ptr, cudaStream_t stream) = 0;

 protected:
  int device_;
};

// (free, total) bytes of `device`; (0, 0) when the runtime cannot say.
std::pair<size_t, size_t> device_memory_info(int device) {
  int previous = -1;
  size_t free_b = 0, total_b = 0;
  if (cudaGetDevice(&previous) == cudaSuccess && cudaSetDevice(device) == cudaSuccess &&
      cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
    (void)cudaSetDevice(previous);
    return {free_b, total_b};
  }
  (void)cudaGetLastError();
  if (previous >= 0) (void)cudaSetDevice(previous);
  return {0, 0};
}

// cudaMalloc of `bytes` on `device`; nullptr when the device is out of memory.
void* device_malloc(int device, size_t bytes) {
  DeviceGuard guard(device);
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    return nullptr;
  }
  FORGE_CUDA_CHECK(err);
  return p;
}

void device_free(void* p) {
  // cudaFree needs no particular current device. At exit the runtime may already be
  // unloading (cudaErrorCudartUnloading): the memory goes with the process then.
  if (cudaFree(p) != cudaSuccess) (void)cudaGetLastError();
}

class CachingAllocator final : public DeviceAllocator {
 public:
  explicit CachingAllocator(int device)
      : DeviceAllocator(device), pool_("CUDA caching allocator on cuda:" + std::to_string(device), backend()) {}

  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    const auto stream = reinterpret_cast<BlockPool::StreamId>(current_stream(device_));
    std::lock_guard<std::mutex> lock(mu_);
    return pool_.allocate(nbytes, stream);
  }

  void deallocate(void* ptr, size_t /*nbytes*/) override {
    if (ptr == nullptr) return;
    try {
      std::lock_guard<std::mutex> lock(mu_);
      pool_.free(ptr);
    } catch (...) {  // std::system_error from the mutex: never thrown in practice
    }
  }

  MemoryStats stats() override {
    std::lock_guard<std::mutex> lock(mu_);
    return pool_.stats();
  }
  void reset_peak() override {
    std::lock_guard<std::mutex> lock(mu_);
    pool_.reset_peak();
  }
  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mu_);
    pool_.empty_cache();
  }
  void record_stream(void* ptr, cudaStream_t stream) override {
    std::lock_guard<std::mutex> lock(mu_);
    pool_.record_stream(ptr, reinterpret_cast<BlockPool::StreamId>(stream));
  }

 private:
  // Callbacks run under mu_. Events are recorded on streams of this device (the pool's
  // StreamId 0 is this device's legacy stream), so they are created here too, and kept in
  // a free list for the next record_stream (as cheap as it gets in the steady state).
  BlockPool::Backend backend() {
    const int device = device_;
    BlockPool::Backend b;
    b.allocate_segment = [device](size_t bytes) { return device_malloc(device, bytes); };
    b.free_segment = [](void* p, size_t) { device_free(p); };
    b.record_event = [this, device](BlockPool::StreamId stream) -> BlockPool::EventId {
      DeviceGuard guard(device);
      cudaEvent_t e = nullptr;
      if (!free_events_.empty()) {
        e = free_events_.back();
        free_events_.pop_back();
      } else {
        FORGE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      }
      const cudaError_t err = cudaEventRecord(e, reinterpret_cast<cudaStream_t>(stream));
      if (err != cudaSuccess) (void)cudaEventDestroy(e);
      FORGE_CUDA_CHECK(err);
      return e;
    };
    b.event_done = [](BlockPool::EventId e) { return event_completed(static_cast<cudaEvent_t>(e)); };
    b.wait_event = [](BlockPool::EventId e) { FORGE_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(e))); };
    b.release_event = [this](BlockPool::EventId e) {
      try {
        free_events_.push_back(static_cast<cudaEvent_t>(e));
      } catch (...) {  // std::bad_alloc: destroy it instead
        if (cudaEventDestroy(static_cast<cudaEvent_t>(e)) != cudaSuccess) (void)cudaGetLastError();
      }
    };
    b.memory_info = [device] { return device_memory_info(device); };
    return b;
  }

  std::mutex mu_;
  std::vector<cudaEvent_t> free_events_;  // declared before pool_: the callbacks use it
  BlockPool pool_;
};

// FORGE_CUDA_ALLOC=plain: a cudaMalloc per storage, exact sizes.
class PlainAllocator final : public DeviceAllocator {
 public:
  using DeviceAllocator::DeviceAllocator;

  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    void* p = device_malloc(device_, nbytes);
    if (p == nullptr) {
      const auto [free_b, total_b] = device_memory_info(device_);
      std::lock_guard<std::mutex> lock(mu_);
      FORGE_THROW("CUDA out of memory (FORGE_CUDA_ALLOC=plain): cannot allocate ", nbytes, " bytes on cuda:", device_,
                  " (forge holds ", stats_.allocated, " bytes in live tensors; the device has ", free_b, " of ",
                  total_b, " bytes free)");
    }
    std::lock_guard<std::mutex> lock(mu_);
    const auto n = static_cast<int64_t>(nbytes);
    sizes_.emplace(p, n);
    stats_.allocated += n;
    stats_.reserved += n;
    stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
    stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
    ++stats_.num_allocs;
    ++stats_.num_device_allocs;
    return p;
  }

  void deallocate(void* ptr, size_t nbytes) override {
    if (ptr == nullptr) return;
    device_free(ptr);
    try {
      std::lock_guard<std::mutex> lock(mu_);
      const auto it = sizes_.find(ptr);
      const int64_t n = it != sizes_.end() ? it->second : static_cast<int64_t>(nbytes);
      if (it != sizes_.end()) sizes_.erase(it);
      stats_.allocated -= n;
      stats_.reserved -= n;
      ++stats_.num_device_frees;
    } catch (...) {
    }
  }

  MemoryStats stats() override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  void reset_peak() override {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.peak_allocated = stats_.allocated;
    stats_.peak_reserved = stats_.reserved;
  }
  void empty_cache() override {}
  void record_stream(void*, cudaStream_t) override {}

 private:
  std::mutex mu_;
  std::unordered_map<void*, int64_t> sizes_;
  MemoryStats stats_;
};

// FORGE_CUDA_ALLOC: caching (the default) or plain; anything else is an error naming it.
bool read_plain_mode() { return env::string("FORGE_CUDA_ALLOC") == "plain"; }

// One allocator per visible device, created on first use and never destroyed: storages
// freed during static destruction must still find theirs.
DeviceAllocator& allocator_of(int device, const char* op) {
  static auto* allocators = [] {
    const bool plain = read_plain_mode();
    auto* v = new std::vector<std::unique_ptr<DeviceAllocator>>();
    for (int d = 0; d < device_count(); ++d) {
      if (plain) v->push_back(std::make_unique<PlainAllocator>(d));
      else v->push_back(std::make_unique<CachingAllocator>(d));
    }
    return v;
  }();
  check_device(device, op);
  return *(*allocators)[static_cast<size_t>(device)];
}

}  // namespace

Allocator* allocator(int device) { return &allocator_of(device, "cuda::allocator"); }

bool caching_allocator_enabled() {
  static const bool plain = read_plain_mode();
  return !plain;
}

MemoryStats memory_stats(int device) { return allocator_of(device, "cuda::memory_stats").stats(); }
int64_t memory_allocated(int device) { return memory_stats(device).allocated; }
int64_t memory_reserved(int device) { return memory_stats(device).reserved; }
int64_t max_memory_allocated(int device) { return memory_stats(device).peak_allocated; }
int64_t max_memory_reserved(int device) { return memory_stats(device).peak_reserved; }

void reset_peak_memory_stats(int device) { allocator_of(device, "cuda::reset_peak_memory_stats").reset_peak(); }

void empty_cache(int device) { allocator_of(device, "cuda::empty_cache").empty_cache(); }

void record_stream(const Tensor& t, const Stream& stream) {
  FORGE_CHECK(t.is_cuda(), "record_stream: the tensor (shape ", t.shape(), ") is on ", t.device().str(),
              ", not on a GPU");
  FORGE_CHECK(stream.device() == t.device().index, "record_stream: the tensor is on ", t.device().str(),
              " but the stream on cuda:", stream.device());
  void* block = t.storage()->data();
  if (block == nullptr) return;  // an empty tensor
  allocator_of(t.device().index, "record_stream").record_stream(block, stream.handle());
}

}  // namespace forge::cuda
