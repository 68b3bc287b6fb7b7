#pragma once
// Who owns device memory, and what an allocator looked like when it ran out (issue 19).
//
//   { MemoryOwner owner("forward: block 3");   // allocations on this thread are labelled so
//     ... }                                    // until the scope ends (innermost label wins)
//   try { ... } catch (const OutOfMemoryError& e) { e.snapshot(); }
//
// Note [memory owners]
// --------------------
// An out-of-memory error that says only "tried to allocate 2 GB" leaves the user guessing which
// part of the step holds the rest. So allocations carry a label: the innermost MemoryOwner scope
// of the allocating thread when the block was handed out (a pointer to an interned string: one
// word per block, no allocation per label). The models label each block's forward ("forward:
// block i", the embedding, the head and loss), the autograd engine each node's backward
// ("backward: <op>"), the optimizer its update ("optimizer"), the trainer the parameters and the
// data. A block keeps the label it was allocated under: activations saved in forward stay
// "forward: block i" through backward. When an allocator cannot serve a request it throws
// OutOfMemoryError with a MemorySnapshot taken at that moment, before unwinding frees anything:
// its live bytes by owner, its pools (reserved, cached free bytes, the largest free block: how
// fragmented), the request and the owner it was for. forge train writes it to the run directory
// beside forge plan's prediction for the run's config (train/oom_report.h).
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "forge/core/allocator.h"
#include "forge/core/error.h"

namespace forge {

// A stable pointer for `label` (the same pointer for equal labels, for the life of the process).
const char* intern_memory_owner(std::string_view label);
// The innermost MemoryOwner label of this thread, or nullptr.
const char* current_memory_owner();

class MemoryOwner {
 public:
  explicit MemoryOwner(const char* interned);          // a label from intern_memory_owner
  explicit MemoryOwner(std::string_view label) : MemoryOwner(intern_memory_owner(label)) {}
  ~MemoryOwner();
  MemoryOwner(const MemoryOwner&) = delete;
  MemoryOwner& operator=(const MemoryOwner&) = delete;
};

// "forward: block <i>", interned once per index.
const char* forward_block_owner(int64_t i);

struct OwnerBytes {
  std::string owner;  // "(untagged)" for allocations outside every scope
  int64_t blocks = 0;
  int64_t bytes = 0;
};

struct MemorySnapshot {
  std::string allocator;      // the pool's name ("CUDA caching allocator on cuda:0", "cpu allocator")
  int64_t requested = 0;      // bytes asked for
  std::string failed_owner;   // the label of the failed request
  MemoryStats stats;          // at the failure
  int64_t segments = 0;       // device segments held (caching allocators)
  int64_t cached_free_bytes = 0;   // free bytes inside those segments
  int64_t largest_free_block = 0;  // the largest of them: a request above it needs a new segment
  int64_t pending_blocks = 0;      // freed, waiting for work on other streams
  int64_t device_free = -1, device_total = -1;  // the device's own figures (-1: unknown)
  int64_t limit = -1;              // the allocator's own limit (the CPU's FORGE_CPU_MEMORY_LIMIT), -1: none
  std::vector<OwnerBytes> live;    // live bytes by owner, largest first
};

// Sums `blocks` (owner label or nullptr, bytes) by owner, largest first.
std::vector<OwnerBytes> bytes_by_owner(const std::vector<std::pair<const char*, int64_t>>& blocks);

class OutOfMemoryError : public Error {
 public:
  OutOfMemoryError(const std::string& what, MemorySnapshot snapshot) : Error(what), snapshot_(std::move(snapshot)) {}
  const MemorySnapshot& snapshot() const { return snapshot_; }

 private:
  MemorySnapshot snapshot_;
};

// The CPU allocator's limit in bytes from FORGE_CPU_MEMORY_LIMIT ("512MB", "2GiB", a count of
// bytes), read once; nullopt when unset. With a limit the CPU allocator keeps each live block's
// size and owner and throws OutOfMemoryError beyond it (tests, and a run on a shared host).
std::optional<int64_t> cpu_memory_limit();
// FORGE_CUDA_MEMORY_LIMIT, read once: a cap on the device memory each CUDA caching allocator
// (one per device, its CUDA graph pools included) obtains from cudaMalloc. Beyond it a request
// fails as on a full device, with the same out-of-memory snapshot: a smaller GPU simulated on a
// larger one (what does a run need on a 40 GB card? what held the memory at that point?).
std::optional<int64_t> cuda_memory_limit();
// The size a variable gives ("512MB", "2GiB", a count of bytes); nullopt when unset; an error
// naming the variable for anything else.
std::optional<int64_t> parse_memory_limit(const char* variable);

}  // namespace forge
