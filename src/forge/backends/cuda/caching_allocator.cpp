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
//
// Note [graph memory pools]
// -------------------------
// A CUDA graph replays its kernels on the addresses they had when it was captured, so the
// memory of a captured step must be its own, kept as long as the graph lives (PyTorch's
// "private pools"). graph_pool_begin(device) makes a new BlockPool the source of every
// allocation of the calling thread on the device until graph_pool_end; the capture's own
// allocations and frees then happen in it, in capture order, which is the replay order, so a
// block a temporary freed during the capture is safely reused by a later kernel of the same
// graph. Around the rest:
// - cudaMalloc is a "potentially unsafe" call during a capture: a segment is obtained with
//   the thread's capture mode relaxed for that one call (the memory is not part of the graph,
//   only its address is).
// - A block used on another stream inside the capture (record_stream: NCCL's stream) is not
//   reused before the capture ends (no event can be queried during a capture); after it, the
//   graph's own dependencies order the streams, and nothing else allocates from the pool.
// - A block of the device's main pool freed during a capture may be read by the graph (a
//   tensor the captured step replaced): it is held, not freed, until the graph is released.
// - graph_pool_release(id) (the graph is destroyed) gives the pool's segments back once its
//   last block is freed (tensors the capture returned may outlive the graph).
// stats() add the pools up, and its peaks are those of the sum; empty_cache() leaves graph
// pools alone (their blocks are addresses of a graph) and does nothing during a capture.
#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
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
#include "forge/core/memory_owner.h"

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
  virtual void forget_stream(cudaStream_t stream) = 0;
  // Note [graph memory pools]; the plain allocator has none (a capture cannot cudaFree).
  virtual int graph_pool_begin() {
    FORGE_THROW("CUDA graphs need the caching allocator: FORGE_CUDA_ALLOC=plain frees memory with cudaFree, "
                "which a graph capture does not allow; unset FORGE_CUDA_ALLOC");
  }
  virtual void graph_pool_end() {}
  virtual void graph_pool_release(int) {}

 protected:
  int device_;
};

// The bytes each device's allocators obtained from cudaMalloc, against FORGE_CUDA_MEMORY_LIMIT
// (cuda_memory_limit in memory_owner.h).
constexpr int kMaxDevices = 64;
std::atomic<int64_t> g_device_bytes[kMaxDevices];

std::atomic<int64_t>& device_bytes(int device) { return g_device_bytes[std::clamp(device, 0, kMaxDevices - 1)]; }

// (free, total) bytes of `device`, (0, 0) when the runtime cannot say; under
// FORGE_CUDA_MEMORY_LIMIT, of the limit.
std::pair<size_t, size_t> device_memory_info(int device) {
  if (const std::optional<int64_t> limit = cuda_memory_limit()) {
    const int64_t used = device_bytes(device).load();
    return {static_cast<size_t>(std::max<int64_t>(*limit - used, 0)), static_cast<size_t>(*limit)};
  }
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

// cudaMalloc of `bytes` on `device`; nullptr when the device is out of memory (or the request
// would pass FORGE_CUDA_MEMORY_LIMIT). During a stream capture of this thread cudaMalloc counts
// as unsafe: relaxed for this call (Note [caching allocator] in block_pool.h).
void* device_malloc(int device, size_t bytes) {
  const std::optional<int64_t> limit = cuda_memory_limit();
  if (limit && device_bytes(device).load() + static_cast<int64_t>(bytes) > *limit) return nullptr;
  DeviceGuard guard(device);
  void* p = nullptr;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  FORGE_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
  const cudaError_t err = cudaMalloc(&p, bytes);
  (void)cudaThreadExchangeStreamCaptureMode(&mode);
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    return nullptr;
  }
  FORGE_CUDA_CHECK(err);
  device_bytes(device) += static_cast<int64_t>(bytes);
  return p;
}

void device_free(int device, void* p, size_t bytes) {
  device_bytes(device) -= static_cast<int64_t>(bytes);
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
    void* p = nullptr;
    if (capturing_ != nullptr && std::this_thread::get_id() == capture_thread_) {
      p = capturing_->pool->allocate(nbytes, stream);
      graph_block_owner_.emplace(p, capturing_);
    } else {
      p = pool_.allocate(nbytes, stream);
    }
    if (combined_) raise_peaks();
    return p;
  }

  void deallocate(void* ptr, size_t /*nbytes*/) override {
    if (ptr == nullptr) return;
    try {
      std::lock_guard<std::mutex> lock(mu_);
      if (!graph_block_owner_.empty()) {
        if (auto it = graph_block_owner_.find(ptr); it != graph_block_owner_.end()) {
          GraphPool* g = it->second;
          graph_block_owner_.erase(it);
          g->pool->free(ptr);
          if (g->released && g->pool->live_blocks() == 0) graph_pools_.erase(g->id);
          return;
        }
      }
      if (capturing_ != nullptr && pool_.block_size(ptr) != 0) {  // the graph may read it
        capturing_->held.push_back(ptr);
        return;
      }
      pool_.free(ptr);
    } catch (...) {  // std::system_error from the mutex, std::bad_alloc: never thrown in practice
    }
  }

  MemoryStats stats() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!combined_) return pool_.stats();
    MemoryStats s = totals();
    s.peak_allocated = std::max(peak_allocated_, s.allocated);
    s.peak_reserved = std::max(peak_reserved_, s.reserved);
    return s;
  }
  void reset_peak() override {
    std::lock_guard<std::mutex> lock(mu_);
    pool_.reset_peak();
    for (auto& [id, g] : graph_pools_) g->pool->reset_peak();
    if (combined_) {
      const MemoryStats s = totals();
      peak_allocated_ = s.allocated;
      peak_reserved_ = s.reserved;
    }
  }
  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (capturing_ == nullptr) pool_.empty_cache();
  }
  void record_stream(void* ptr, cudaStream_t stream) override {
    std::lock_guard<std::mutex> lock(mu_);
    const auto id = reinterpret_cast<BlockPool::StreamId>(stream);
    if (auto it = graph_block_owner_.find(ptr); it != graph_block_owner_.end()) return it->second->pool->record_stream(ptr, id);
    pool_.record_stream(ptr, id);
  }

  void forget_stream(cudaStream_t stream) override {
    std::lock_guard<std::mutex> lock(mu_);
    const auto id = reinterpret_cast<BlockPool::StreamId>(stream);
    pool_.forget_stream(id);
    for (auto& [gid, g] : graph_pools_) g->pool->forget_stream(id);
  }

  int graph_pool_begin() override {
    std::lock_guard<std::mutex> lock(mu_);
    FORGE_CHECK(capturing_ == nullptr, "CUDA graph: cuda:", device_, " is already capturing a graph; one capture at a time");
    if (!combined_) {  // from now on the peaks are those of the pools' sum
      const MemoryStats s = pool_.stats();
      peak_allocated_ = s.peak_allocated;
      peak_reserved_ = s.peak_reserved;
      combined_ = true;
    }
    auto g = std::make_unique<GraphPool>();
    g->id = next_graph_pool_++;
    g->pool = std::make_unique<BlockPool>("CUDA graph pool " + std::to_string(g->id) + " on cuda:" + std::to_string(device_),
                                          graph_backend(g.get()));
    capturing_ = g.get();
    capture_thread_ = std::this_thread::get_id();
    const int id = g->id;
    graph_pools_.emplace(id, std::move(g));
    return id;
  }
  void graph_pool_end() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (capturing_ != nullptr) capturing_->capturing = false;
    capturing_ = nullptr;
  }
  void graph_pool_release(int id) override {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = graph_pools_.find(id);
    if (it == graph_pools_.end()) return;
    GraphPool* g = it->second.get();
    if (g == capturing_) capturing_ = nullptr;
    // The graph no longer runs (its owner synchronised before releasing): the main pool's blocks
    // it kept go back, and so does the pool once no tensor holds one of its blocks.
    for (void* p : g->held) pool_.free(p);
    g->held.clear();
    g->released = true;
    if (g->pool->live_blocks() == 0) graph_pools_.erase(it);
  }

 private:
  struct GraphPool {
    int id = 0;
    bool capturing = true;   // its capture is still running
    bool released = false;   // its graph is gone: destroyed with its last block
    std::vector<void*> held; // main-pool blocks freed during the capture
    std::unique_ptr<BlockPool> pool;
  };

  MemoryStats totals() const {
    MemoryStats s = pool_.stats();
    for (const auto& [id, g] : graph_pools_) {
      const MemoryStats t = g->pool->stats();
      s.allocated += t.allocated;
      s.reserved += t.reserved;
      s.num_allocs += t.num_allocs;
      s.num_device_allocs += t.num_device_allocs;
      s.num_device_frees += t.num_device_frees;
    }
    return s;
  }
  void raise_peaks() {
    const MemoryStats s = totals();
    peak_allocated_ = std::max(peak_allocated_, s.allocated);
    peak_reserved_ = std::max(peak_reserved_, s.reserved);
  }

  // A graph pool's callbacks (under mu_). No event is recorded or queried while its capture
  // runs: a block used on another stream is simply not reused before the capture ends.
  // Segments are freed only when the pool is destroyed (its blocks are addresses of a graph).
  BlockPool::Backend graph_backend(GraphPool* g) {
    const int device = device_;
    BlockPool::Backend b;
    b.allocate_segment = [device](size_t bytes) { return device_malloc(device, bytes); };
    b.free_segment = [device](void* p, size_t bytes) { device_free(device, p, bytes); };
    b.record_event = [](BlockPool::StreamId) -> BlockPool::EventId { return reinterpret_cast<BlockPool::EventId>(1); };
    b.event_done = [g](BlockPool::EventId) { return !g->capturing; };
    b.wait_event = [g](BlockPool::EventId) {
      FORGE_CHECK(!g->capturing, "CUDA graph pool: out of device memory during a capture");
    };
    b.release_event = [](BlockPool::EventId) {};
    b.memory_info = [device] { return device_memory_info(device); };
    b.limit = cuda_memory_limit().value_or(-1);
    b.limit_name = "FORGE_CUDA_MEMORY_LIMIT";
    return b;
  }

  // Callbacks run under mu_. Events are recorded on streams of this device (the pool's
  // StreamId 0 is this device's legacy stream), so they are created here too, and kept in
  // a free list for the next record_stream (as cheap as it gets in the steady state).
  BlockPool::Backend backend() {
    const int device = device_;
    BlockPool::Backend b;
    b.allocate_segment = [device](size_t bytes) { return device_malloc(device, bytes); };
    b.free_segment = [device](void* p, size_t bytes) { device_free(device, p, bytes); };
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
    b.limit = cuda_memory_limit().value_or(-1);
    b.limit_name = "FORGE_CUDA_MEMORY_LIMIT";
    return b;
  }

  std::mutex mu_;
  std::vector<cudaEvent_t> free_events_;  // declared before pool_: the callbacks use it
  BlockPool pool_;
  std::map<int, std::unique_ptr<GraphPool>> graph_pools_;           // by id
  std::unordered_map<const void*, GraphPool*> graph_block_owner_;  // live blocks of graph pools
  GraphPool* capturing_ = nullptr;  // the pool of the capture running now
  std::thread::id capture_thread_;
  int next_graph_pool_ = 1;
  bool combined_ = false;  // a graph pool was made: stats are the sum over the pools, peaks tracked here
  int64_t peak_allocated_ = 0, peak_reserved_ = 0;
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
    int64_t n = static_cast<int64_t>(nbytes);
    try {
      std::lock_guard<std::mutex> lock(mu_);
      const auto it = sizes_.find(ptr);
      if (it != sizes_.end()) {
        n = it->second;
        sizes_.erase(it);
      }
      stats_.allocated -= n;
      stats_.reserved -= n;
      ++stats_.num_device_frees;
    } catch (...) {
    }
    device_free(device_, ptr, static_cast<size_t>(n));
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
  void forget_stream(cudaStream_t) override {}

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

int graph_pool_begin(int device) { return allocator_of(device, "cuda::graph_pool_begin").graph_pool_begin(); }
void graph_pool_end(int device) { allocator_of(device, "cuda::graph_pool_end").graph_pool_end(); }
void graph_pool_release(int device, int id) { allocator_of(device, "cuda::graph_pool_release").graph_pool_release(id); }

void forget_stream(int device, cudaStream_t stream) noexcept {
  try {
    allocator_of(device, "forget_stream").forget_stream(stream);
  } catch (...) {
    // (a device that was never used has no allocator state to clean)
  }
}

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
