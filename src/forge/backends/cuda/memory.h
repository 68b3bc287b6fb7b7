#pragma once
// Device memory statistics of the CUDA allocator, per device (plain C++: no CUDA headers).
//
//   auto s = forge::cuda::memory_stats(0);   // s.allocated, s.peak_allocated, s.num_allocs
//
// `allocated` counts the bytes of live storages on the device (what PyTorch calls
// memory_allocated); `peak_allocated` its maximum since the start or the last
// reset_peak_memory_stats (max_memory_allocated). Bytes the allocator holds in reserve
// (memory_reserved) will come with the caching allocator; today every byte counted here
// is a live cudaMalloc.
#include "forge/core/allocator.h"

namespace forge::cuda {

MemoryStats memory_stats(int device);
void reset_peak_memory_stats(int device);

}  // namespace forge::cuda
