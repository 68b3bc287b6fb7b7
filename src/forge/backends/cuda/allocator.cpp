// The CUDA device allocator: one forge::Allocator per device, backed by cudaMalloc/cudaFree.
//
// Memory contract: allocate(n) returns n bytes of device memory on the allocator's device
// (cudaMalloc alignment, 256 bytes, so every 16-byte vector load of a contiguous
// tensor's start is aligned), uninitialised; zero bytes give nullptr. Never managed
// (unified) memory. deallocate() never throws: it runs from Storage destructors, also at
// process exit after the CUDA runtime may have shut down.
//
// TODO(caching allocator): this is the plain allocator the first CUDA backend needs.
// cudaMalloc/cudaFree synchronise the device and cost tens of microseconds, so training
// must not call them in its steady state: the caching allocator (size-binned free lists
// per stream, block splitting, memory_reserved, empty_cache; see DESIGN.md "CUDA backend")
// replaces the body of this class and keeps its interface and counters. One property the
// callers rely on today: cudaFree waits for the device's pending work, so a temporary may
// be released right after launching the kernel that reads it (cuda::copy does this); the
// caching allocator keeps that safe by reusing a block only in its stream's order.
#include <atomic>
#include <memory>
#include <vector>

#include "forge/backends/cuda/memory.h"
#include "forge/backends/cuda/runtime.h"
#include "forge/backends/cuda/tensor_kernels.h"

namespace forge::cuda {
namespace {

class CudaAllocator final : public Allocator {
 public:
  explicit CudaAllocator(int device) : device_(device) {}

  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    DeviceGuard guard(device_);
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, nbytes);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) (void)cudaGetLastError();
      FORGE_THROW("CUDA out of memory: cannot allocate ", nbytes, " bytes on cuda:", device_, " (forge holds ",
                  allocated_.load(), " bytes in live tensors; the device has ", free_b, " of ", total_b,
                  " bytes free)");
    }
    FORGE_CUDA_CHECK(err);
    const auto n = static_cast<int64_t>(nbytes);
    const int64_t now = allocated_.fetch_add(n) + n;
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    count_.fetch_add(1);
    return p;
  }

  void deallocate(void* ptr, size_t nbytes) override {
    if (ptr == nullptr) return;
    // cudaFree needs no particular current device. At exit the runtime may already be
    // unloading (cudaErrorCudartUnloading): the memory goes with the process then.
    if (cudaFree(ptr) != cudaSuccess) (void)cudaGetLastError();
    allocated_.fetch_sub(static_cast<int64_t>(nbytes));
  }

  Device device() const override { return Device::cuda(device_); }

  MemoryStats stats() const { return {allocated_.load(), peak_.load(), count_.load()}; }
  void reset_peak() { peak_.store(allocated_.load()); }

 private:
  int device_;
  std::atomic<int64_t> allocated_{0};
  std::atomic<int64_t> peak_{0};
  std::atomic<int64_t> count_{0};
};

// One allocator per visible device, created on first use and never destroyed: storages
// freed during static destruction must still find theirs.
CudaAllocator& allocator_of(int device, const char* op) {
  static auto* allocators = [] {
    auto* v = new std::vector<std::unique_ptr<CudaAllocator>>();
    for (int d = 0; d < device_count(); ++d) v->push_back(std::make_unique<CudaAllocator>(d));
    return v;
  }();
  check_device(device, op);
  return *(*allocators)[static_cast<size_t>(device)];
}

}  // namespace

Allocator* allocator(int device) { return &allocator_of(device, "cuda::allocator"); }

MemoryStats memory_stats(int device) { return allocator_of(device, "cuda::memory_stats").stats(); }

void reset_peak_memory_stats(int device) { allocator_of(device, "cuda::reset_peak_memory_stats").reset_peak(); }

}  // namespace forge::cuda
