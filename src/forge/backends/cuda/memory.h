#pragma once
// The CUDA memory allocators, seen from plain C++ (no CUDA headers): statistics and
// cache control of the per-device caching allocator, and the pinned host allocator.
//
//   auto s = forge::cuda::memory_stats(0);   // s.allocated, s.reserved, s.peak_allocated, ...
//   forge::cuda::empty_cache(0);             // give cached, unused segments back to the driver
//
// User code can use the same functions without a backend header as forge::cuda_memory_*
// (ops/creation.h). Design, stats and the FORGE_CUDA_ALLOC switch: docs/cuda.md and
// Note [caching allocator] in core/block_pool.h.
//
// `allocated` counts the bytes of live storages on the device, rounded up to the
// allocator's 512-byte blocks (PyTorch's memory_allocated); `reserved` the bytes of the
// segments obtained with cudaMalloc, in use or cached (memory_reserved). Their peaks run
// since the start or the last reset_peak_memory_stats (max_memory_allocated /
// max_memory_reserved). `num_device_allocs` / `num_device_frees` count cudaMalloc /
// cudaFree calls: in the steady state of a training step they stay put. With
// FORGE_CUDA_ALLOC=plain every storage is its own cudaMalloc of the exact size, and
// reserved == allocated.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "forge/core/allocator.h"

namespace forge::cuda {

MemoryStats memory_stats(int device);
int64_t memory_allocated(int device);
int64_t memory_reserved(int device);
int64_t max_memory_allocated(int device);
int64_t max_memory_reserved(int device);
void reset_peak_memory_stats(int device);
// Releases every cached segment none of whose memory is in use (after the pending
// cross-stream uses of freed blocks have completed). Live tensors are not touched.
void empty_cache(int device);
// False when FORGE_CUDA_ALLOC=plain.
bool caching_allocator_enabled();

// Private memory pools of CUDA graphs (Note [graph memory pools], caching_allocator.cpp; used by
// cuda::CudaGraph, graph.h). graph_pool_begin: until graph_pool_end, every allocation of the
// calling thread on `device` comes from a new pool, whose id it returns (throws with
// FORGE_CUDA_ALLOC=plain, or while another capture runs on the device). graph_pool_release: the
// graph is gone (and no longer running); the pool's memory is given back once its last block
// is freed.
int graph_pool_begin(int device);
void graph_pool_end(int device);
void graph_pool_release(int device, int id);

// Page-locked host memory (pinned.h): an allocator of CPU storages that the GPU reads and
// writes by DMA, so host<->device copies of it can be asynchronous. Cached like device
// memory; a block is reused only after the asynchronous copies that used it completed.
// Needs a visible CUDA device.
Allocator* pinned_allocator();
MemoryStats pinned_memory_stats();
void empty_pinned_cache();
// Pins, ahead of time and without holding up other threads' pinned allocations, the segments
// that `requests` (bytes, in the order they will be made, all live at once) would need
// (Note [reserving segments ahead] in core/block_pool.cpp), for copies from `device`. Stops
// early when *stop becomes true or the host has no more page-locked memory; returns the bytes
// reserved.
uint64_t reserve_pinned(const std::vector<size_t>& requests, int device, const std::atomic<bool>* stop = nullptr);

}  // namespace forge::cuda
