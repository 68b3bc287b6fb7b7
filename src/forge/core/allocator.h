#pragma once
// The allocator interface, one per device, and the CPU allocator.
//
// Every Storage is allocated through an Allocator and returned to the same one. The
// CPU allocator aligns to 64 bytes (a cache line, and the widest AVX-512 load) and keeps
// byte counters like the CUDA caching allocator does, so memory tests and `forge plan`
// validation can read peak usage on either device. The CUDA device allocators and the
// pinned host allocator live in backends/cuda/ (docs/cuda.md).
#include <cstddef>
#include <cstdint>

#include "forge/core/device.h"

namespace forge {

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t nbytes) = 0;
  virtual void deallocate(void* ptr, size_t nbytes) = 0;
  virtual Device device() const = 0;
  // True for page-locked host memory (backends/cuda/pinned.h): copies from and to it can be
  // asynchronous. Tensor::is_pinned() asks the allocator of the tensor's storage.
  virtual bool is_pinned() const { return false; }
};

struct MemoryStats {
  int64_t allocated = 0;      // bytes held by live storages
  int64_t peak_allocated = 0; // maximum of `allocated` since the last reset
  int64_t num_allocs = 0;     // allocate() calls since start
  // Caching allocators only (the CPU allocator leaves them 0): bytes obtained from the
  // device (cudaMalloc'ed segments), live or cached for reuse, and its maximum since the
  // last reset; segment allocations and releases (cudaMalloc / cudaFree calls) since start.
  int64_t reserved = 0;
  int64_t peak_reserved = 0;
  int64_t num_device_allocs = 0;
  int64_t num_device_frees = 0;
};

inline constexpr size_t kCpuAlignment = 64;

Allocator* cpu_allocator();
MemoryStats cpu_memory_stats();
void reset_cpu_peak_memory();

}  // namespace forge
