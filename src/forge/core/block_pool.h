#pragma once
// BlockPool: the bookkeeping of a caching allocator, in plain C++ (no CUDA), so that all
// of it is unit-tested on the CPU (tests/core/test_block_pool.cpp). The CUDA device
// allocator (backends/cuda/caching_allocator.cpp) and the pinned host allocator
// (backends/cuda/pinned.cpp) each wrap one, passing the functions that obtain and release
// segments and record events (Backend).
//
//   BlockPool pool("CUDA caching allocator on cuda:0", backend);
//   void* p = pool.allocate(4000, stream);   // a 4096-byte block carved from a 2 MiB segment
//   pool.free(p);                            // back to `stream`'s free list, not to the device
//
// Not thread-safe: the owner holds a mutex around every call (the callbacks run under it).
//
// Note [caching allocator]
// ------------------------
// cudaMalloc and cudaFree cost tens of microseconds and synchronise the device, so a
// training step must not call them. Like PyTorch's CUDACachingAllocator, forge keeps
// the memory it obtained ("segments") and hands out pieces of it ("blocks"):
//
// - Sizes are rounded up to kRoundBytes (512). Blocks start at multiples of 512 from
//   their segment's start and segments come from cudaMalloc (>= 256-byte aligned), so
//   every block is 256-byte aligned: 16-byte vector loads of a tensor's start are aligned.
// - Two pools. Small requests (rounded size <= kSmallSize, 1 MiB) are carved from 2 MiB
//   segments; large ones from 20 MiB segments when below 10 MiB (so that many mid-size
//   tensors share a segment), else from a segment of the size rounded up to 2 MiB.
// - Free blocks sit in an ordered set per pool keyed by (stream, size, address): the
//   first entry at or after (s, n, 0) is the best fit on stream s (ties: lowest address).
// - A block bigger than the request is split and the remainder stays free: in the small
//   pool when the remainder is >= 512 bytes, in the large pool when it is > 1 MiB (a
//   smaller remainder could only serve small requests, which never look in the large
//   pool; it stays with the block as slack and is counted in `allocated`).
// - A freed block merges with its free neighbours in the segment, so a segment whose
//   blocks are all free is one free block again, and empty_cache() can release it.
// - Stream rule: a block belongs to the stream that was current when it was allocated
//   and is only reused by allocations on that stream. Work on one stream runs in order,
//   so a block freed right after launching the kernel that reads it (a temporary) is
//   safe: the next user's kernels queue behind that kernel. A block used by work on
//   ANOTHER stream must be announced with record_stream(ptr, other): when it is freed,
//   an event is recorded on `other` and the block returns to the free list only once the
//   event has completed (polled, without blocking, at each allocation). Events recorded
//   by the owner while the block is live (add_event: the pinned allocator records one
//   after each asynchronous copy) are waited for the same way.
// - When the device refuses a segment, pending events are waited for, every wholly free
//   segment is released, and the segment is asked for once more; if that fails too,
//   allocate() throws a forge::Error naming the request, what the pool holds (allocated,
//   reserved) and the device's free/total memory.
// - Stats: `allocated` (bytes of live blocks, rounded sizes), `reserved` (bytes of all
//   segments), their peaks since reset_peak(), `num_allocs` (allocate() calls),
//   `num_device_allocs` / `num_device_frees` (segments obtained / released). A block
//   freed while its events are pending no longer counts as allocated, but its segment
//   still counts as reserved.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "forge/core/allocator.h"
#include "forge/core/memory_owner.h"

namespace forge {

class BlockPool {
 public:
  using StreamId = uintptr_t;  // a cudaStream_t as an integer (0: the legacy default stream)
  using EventId = void*;       // a cudaEvent_t, opaque here

  static constexpr size_t kRoundBytes = 512;
  static constexpr size_t kSmallSize = size_t{1} << 20;           // small pool: rounded size <= 1 MiB
  static constexpr size_t kSmallSegment = size_t{2} << 20;        // its segments: 2 MiB
  static constexpr size_t kMidSegment = size_t{20} << 20;         // segments for 1 MiB < size < 10 MiB
  static constexpr size_t kLargeThreshold = size_t{10} << 20;     // from here, a segment per request
  static constexpr size_t kLargeRound = size_t{2} << 20;          // ... rounded up to 2 MiB

  struct Backend {
    // A segment of exactly `bytes`; nullptr when the device is out of memory (any other
    // failure throws).
    std::function<void*(size_t bytes)> allocate_segment;
    // Releases a segment from allocate_segment. Must not throw.
    std::function<void(void* ptr, size_t bytes)> free_segment;
    // Events, needed only if record_stream() or add_event() is used. record_event returns
    // an event recorded now on `stream`; event_done never blocks; wait_event blocks until
    // the event completed; release_event must not throw.
    std::function<EventId(StreamId stream)> record_event;
    std::function<bool(EventId)> event_done;
    std::function<void(EventId)> wait_event;
    std::function<void(EventId)> release_event;
    // (free, total) bytes of the device, for out-of-memory messages; optional.
    std::function<std::pair<size_t, size_t>()> memory_info;
    // A cap on the segments' bytes that allocate_segment enforces (FORGE_CUDA_MEMORY_LIMIT),
    // named in out-of-memory messages and snapshots; -1: none.
    int64_t limit = -1;
    const char* limit_name = nullptr;
  };

  BlockPool(std::string name, Backend backend);
  // Releases every segment (the owner destroys a pool only when none of its blocks is in
  // use; forge's allocators are never destroyed) and every pending event.
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // A block of at least `nbytes` (rounded up to 512) on `stream`; nullptr for 0 bytes.
  // Throws forge::Error when the device has no memory left (Note [caching allocator]).
  void* allocate(size_t nbytes, StreamId stream);
  // Returns the block starting at `ptr` (from allocate) to its stream's free list, at once
  // or once its pending events completed. Never throws; unknown pointers are ignored.
  void free(void* ptr) noexcept;
  // The live block at `ptr` is used by work queued on `stream` too: when it is freed, it is
  // not reused before that work is done. A no-op for the block's own stream.
  void record_stream(void* ptr, StreamId stream);
  // `stream` is being destroyed after all its work completed (it was synchronised): the live
  // blocks forget their record_stream uses of it (an event could no longer be recorded on it,
  // and the work it announced is done), so freeing them later needs no event there.
  void forget_stream(StreamId stream) noexcept;
  // Attaches an already recorded event to the live block at `ptr`: once freed, the block
  // is not reused before the event completed. Events of the block that have completed
  // are released first, so a long-lived block that is copied every step keeps few.
  void add_event(void* ptr, EventId event);
  // Waits for pending events, then releases every segment whose blocks are all free.
  void empty_cache();

  // Note [reserving segments ahead]: the segments (bytes, small pool?) that allocate() would
  // obtain, in order, for `requests` made one after the other into an empty pool and all kept
  // live (a checkpoint's host copies). Computed by replaying the requests on a pool with a
  // pretend backend; nothing is allocated.
  struct SegmentPlan {
    size_t bytes = 0;
    bool small = false;
  };
  static std::vector<SegmentPlan> plan_segments(const std::vector<size_t>& requests);
  // Adds a segment the owner obtained itself from the backend's allocate_segment (outside its
  // lock) as one free block of `stream` in the small or the large pool, as plan_segments said;
  // from here on it is the pool's, counted as reserved and released like the others.
  void add_segment(void* ptr, size_t bytes, bool small, StreamId stream);

  MemoryStats stats() const;
  void reset_peak();  // peak_allocated = allocated, peak_reserved = reserved
  // Live bytes by owner, segments, cached free bytes and the largest free block (Note [memory
  // owners]); the request fields are left empty.
  MemorySnapshot snapshot() const;

  // For tests and diagnostics: the rounded size of the live block at `ptr` (0 if none), the
  // number of freed blocks waiting for events, the number of segments held.
  size_t block_size(const void* ptr) const;
  size_t pending_blocks() const;
  size_t segment_count() const { return segments_.size(); }
  size_t live_blocks() const { return live_.size(); }

  static size_t round_size(size_t nbytes);
  // Bytes of the segment obtained for a request of `rounded` bytes.
  static size_t segment_size(size_t rounded);

 private:
  struct Block {
    StreamId stream = 0;
    size_t size = 0;
    char* ptr = nullptr;
    bool small = false;     // which pool
    bool in_pool = false;   // in its pool's free set (free and reusable)
    bool allocated = false;
    Block* prev = nullptr;  // neighbours within the segment, by address
    Block* next = nullptr;
    const char* owner = nullptr;         // Note [memory owners] (core/memory_owner.h)
    int pending_events = 0;              // freed, waiting for this many events
    std::vector<StreamId> stream_uses;   // record_stream()
    std::vector<EventId> events;         // add_event()
  };
  struct BlockLess {
    bool operator()(const Block* a, const Block* b) const;
  };
  using FreeSet = std::set<Block*, BlockLess>;
  struct Pending {
    EventId event;
    Block* block;
  };

  FreeSet& pool_of(const Block* b) { return b->small ? small_ : large_; }
  Block* take_free(FreeSet& pool, StreamId stream, size_t size);
  Block* new_segment(StreamId stream, size_t size, bool small, size_t requested);
  Block* adopt_segment(void* ptr, size_t bytes, bool small, StreamId stream);  // counted, not yet free
  void insert_free(Block* b);  // merges with free neighbours, then into its pool
  void process_events();       // frees the blocks whose events all completed (never blocks)
  void release_cached();       // waits for pending events, releases wholly free segments
  Block* live_block(const void* ptr, const char* op) const;
  [[noreturn]] void throw_out_of_memory(size_t requested, size_t rounded, size_t segment) const;

  std::string name_;
  Backend backend_;
  FreeSet small_, large_;
  std::unordered_map<const void*, Block*> live_;  // allocated blocks by address
  std::unordered_set<Block*> segments_;           // the first block of each segment
  std::list<Pending> pending_;                    // events of freed blocks
  MemoryStats stats_;
};

}  // namespace forge
