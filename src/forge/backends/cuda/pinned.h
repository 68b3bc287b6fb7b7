#pragma once
// Pinned (page-locked) host memory: the caching allocator behind Tensor::pin_memory() and
// the asynchronous host<->device copies (`t.to(Device::cuda(0), /*non_blocking=*/true)`).
//
// Internal to backends/cuda/ (CUDA headers); the plain C++ entry points (pinned_allocator,
// pinned_memory_stats, empty_pinned_cache) are declared in memory.h.
//
// Segments come from cudaHostAlloc (portable: every device can DMA from them) and are
// carved into blocks by a BlockPool (Note [caching allocator] in core/block_pool.h), all on
// one free list (pinned memory has no stream of its own). The rule that makes asynchronous
// copies safe: every copy that reads or writes a pinned block records an event on its
// stream (record_pinned_use); a freed block is reused only after all its events have
// completed. So a batch can be pinned, copied with non_blocking=true and dropped at once:
// its memory is not handed to the next batch while the DMA may still read it.
#include <cuda_runtime_api.h>

#include "forge/backends/cuda/memory.h"

namespace forge::cuda {

// Work just queued on `stream` (of `device`) reads or writes the pinned block that starts
// at `block` (a pinned storage's data()): records an event there and attaches it to the block.
void record_pinned_use(void* block, cudaStream_t stream, int device);

}  // namespace forge::cuda
