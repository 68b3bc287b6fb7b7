// BlockPool: the free lists, splitting, merging and stream bookkeeping of forge's caching
// allocators (Note [caching allocator] in block_pool.h).
#include "forge/core/block_pool.h"

#include <algorithm>
#include <cstdio>
#include <tuple>

#include "forge/core/error.h"

namespace forge {
namespace {

std::string format_bytes(size_t n) {
  char buf[64];
  if (n >= (size_t{1} << 30)) std::snprintf(buf, sizeof(buf), "%.2f GiB", static_cast<double>(n) / (1 << 30));
  else if (n >= (size_t{1} << 20)) std::snprintf(buf, sizeof(buf), "%.2f MiB", static_cast<double>(n) / (1 << 20));
  else if (n >= (size_t{1} << 10)) std::snprintf(buf, sizeof(buf), "%.2f KiB", static_cast<double>(n) / (1 << 10));
  else std::snprintf(buf, sizeof(buf), "%zu bytes", n);
  return std::to_string(n) + " bytes (" + buf + ")";
}

void raise_peak(int64_t now, int64_t& peak) { peak = std::max(peak, now); }

}  // namespace

bool BlockPool::BlockLess::operator()(const Block* a, const Block* b) const {
  return std::make_tuple(a->stream, a->size, reinterpret_cast<uintptr_t>(a->ptr)) <
         std::make_tuple(b->stream, b->size, reinterpret_cast<uintptr_t>(b->ptr));
}

size_t BlockPool::round_size(size_t nbytes) {
  return (std::max<size_t>(nbytes, 1) + kRoundBytes - 1) / kRoundBytes * kRoundBytes;
}

size_t BlockPool::segment_size(size_t rounded) {
  if (rounded <= kSmallSize) return kSmallSegment;
  if (rounded < kLargeThreshold) return kMidSegment;
  return (rounded + kLargeRound - 1) / kLargeRound * kLargeRound;
}

BlockPool::BlockPool(std::string name, Backend backend) : name_(std::move(name)), backend_(std::move(backend)) {
  FORGE_CHECK(backend_.allocate_segment && backend_.free_segment, "BlockPool ", name_,
              ": allocate_segment and free_segment are required");
}

BlockPool::~BlockPool() {
  for (const Pending& p : pending_) backend_.release_event(p.event);
  for (Block* head : segments_) {
    char* base = head->ptr;
    size_t bytes = 0;
    for (Block* b = head; b != nullptr;) {
      bytes += b->size;
      for (EventId e : b->events) backend_.release_event(e);
      Block* next = b->next;
      delete b;
      b = next;
    }
    backend_.free_segment(base, bytes);
  }
}

void* BlockPool::allocate(size_t nbytes, StreamId stream) {
  if (nbytes == 0) return nullptr;
  process_events();
  const size_t size = round_size(nbytes);
  const bool small = size <= kSmallSize;
  FreeSet& pool = small ? small_ : large_;
  Block* b = take_free(pool, stream, size);
  if (b == nullptr) b = new_segment(stream, size, small, nbytes);

  const size_t remaining = b->size - size;
  if (small ? remaining >= kRoundBytes : remaining > kSmallSize) {
    auto* rest = new Block;
    rest->stream = stream;
    rest->small = small;
    rest->ptr = b->ptr + size;
    rest->size = remaining;
    rest->prev = b;
    rest->next = b->next;
    if (b->next) b->next->prev = rest;
    b->next = rest;
    b->size = size;
    insert_free(rest);
  }
  b->allocated = true;
  b->owner = current_memory_owner();
  live_.emplace(b->ptr, b);
  stats_.allocated += static_cast<int64_t>(b->size);
  raise_peak(stats_.allocated, stats_.peak_allocated);
  ++stats_.num_allocs;
  return b->ptr;
}

BlockPool::Block* BlockPool::take_free(FreeSet& pool, StreamId stream, size_t size) {
  Block key;
  key.stream = stream;
  key.size = size;
  auto it = pool.lower_bound(&key);
  if (it == pool.end() || (*it)->stream != stream) return nullptr;
  Block* b = *it;
  pool.erase(it);
  b->in_pool = false;
  return b;
}

BlockPool::Block* BlockPool::new_segment(StreamId stream, size_t size, bool small, size_t requested) {
  const size_t bytes = segment_size(size);
  void* p = backend_.allocate_segment(bytes);
  if (p == nullptr) {
    release_cached();
    p = backend_.allocate_segment(bytes);
  }
  if (p == nullptr) throw_out_of_memory(requested, size, bytes);
  return adopt_segment(p, bytes, small, stream);
}

BlockPool::Block* BlockPool::adopt_segment(void* ptr, size_t bytes, bool small, StreamId stream) {
  auto* b = new Block;
  b->stream = stream;
  b->small = small;
  b->ptr = static_cast<char*>(ptr);
  b->size = bytes;
  segments_.insert(b);
  stats_.reserved += static_cast<int64_t>(bytes);
  raise_peak(stats_.reserved, stats_.peak_reserved);
  ++stats_.num_device_allocs;
  return b;
}

void BlockPool::insert_free(Block* b) {
  // Merges keep the lower block and delete the upper one, so a segment's first block
  // (the key of segments_) lives as long as the segment.
  if (Block* n = b->next; n != nullptr && n->in_pool) {
    pool_of(n).erase(n);
    b->size += n->size;
    b->next = n->next;
    if (b->next) b->next->prev = b;
    delete n;
  }
  if (Block* p = b->prev; p != nullptr && p->in_pool) {
    pool_of(p).erase(p);  // before its size (a key) changes
    p->size += b->size;
    p->next = b->next;
    if (p->next) p->next->prev = p;
    delete b;
    b = p;
  }
  b->in_pool = true;
  pool_of(b).insert(b);
}

void BlockPool::free(void* ptr) noexcept {
  if (ptr == nullptr) return;
  const auto it = live_.find(ptr);
  if (it == live_.end()) return;
  Block* b = it->second;
  live_.erase(it);
  b->allocated = false;
  stats_.allocated -= static_cast<int64_t>(b->size);
  try {
    std::vector<EventId> events = std::move(b->events);
    b->events.clear();
    try {
      for (StreamId s : b->stream_uses) events.push_back(backend_.record_event(s));
    } catch (...) {
      // Cannot tell when the other streams are done with the block: never reuse it (it
      // stays in its segment, counted as reserved, until the pool is destroyed).
      for (EventId e : events) backend_.release_event(e);
      b->stream_uses.clear();
      return;
    }
    b->stream_uses.clear();
    if (events.empty()) {
      insert_free(b);
      return;
    }
    for (EventId e : events) {
      pending_.push_back({e, b});
      ++b->pending_events;
    }
  } catch (...) {
    // Only std::bad_alloc of the bookkeeping can land here; the block is leaked, not reused.
  }
}

BlockPool::Block* BlockPool::live_block(const void* ptr, const char* op) const {
  const auto it = live_.find(ptr);
  FORGE_CHECK(it != live_.end(), op, ": ", ptr, " is not the start of a live block of the ", name_);
  return it->second;
}

void BlockPool::record_stream(void* ptr, StreamId stream) {
  Block* b = live_block(ptr, "record_stream");
  if (stream == b->stream) return;
  FORGE_CHECK(backend_.record_event, "record_stream: the ", name_, " does not track events");
  if (std::find(b->stream_uses.begin(), b->stream_uses.end(), stream) == b->stream_uses.end())
    b->stream_uses.push_back(stream);
}

void BlockPool::forget_stream(StreamId stream) noexcept {
  for (auto& [ptr, b] : live_) {
    auto& uses = b->stream_uses;
    uses.erase(std::remove(uses.begin(), uses.end(), stream), uses.end());
  }
}

void BlockPool::add_event(void* ptr, EventId event) {
  const auto it = live_.find(ptr);
  if (it == live_.end()) {
    backend_.release_event(event);
    FORGE_THROW("add_event: ", ptr, " is not the start of a live block of the ", name_);
  }
  Block* b = it->second;
  std::erase_if(b->events, [&](EventId e) {
    if (!backend_.event_done(e)) return false;
    backend_.release_event(e);
    return true;
  });
  b->events.push_back(event);
}

void BlockPool::process_events() {
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (!backend_.event_done(it->event)) {
      ++it;
      continue;
    }
    Block* b = it->block;
    backend_.release_event(it->event);
    it = pending_.erase(it);
    if (--b->pending_events == 0) insert_free(b);
  }
}

void BlockPool::release_cached() {
  while (!pending_.empty()) {
    const Pending p = pending_.front();
    backend_.wait_event(p.event);
    backend_.release_event(p.event);
    pending_.pop_front();
    if (--p.block->pending_events == 0) insert_free(p.block);
  }
  for (FreeSet* pool : {&small_, &large_}) {
    for (auto it = pool->begin(); it != pool->end();) {
      Block* b = *it;
      if (b->prev != nullptr || b->next != nullptr) {
        ++it;
        continue;
      }
      it = pool->erase(it);
      segments_.erase(b);
      backend_.free_segment(b->ptr, b->size);
      stats_.reserved -= static_cast<int64_t>(b->size);
      ++stats_.num_device_frees;
      delete b;
    }
  }
}

void BlockPool::empty_cache() { release_cached(); }

// Note [reserving segments ahead]
// -------------------------------
// Page-locking host memory is slow (cudaHostAlloc pins about 3 GB/s on an H100 host: 18 s for
// the 50 GB a 3.6B model's checkpoint copies to the host), so the first checkpoint of a process
// stalled training that long (24.8 s). The trainer reserves those segments on a thread of its own while the
// first steps run: plan_segments tells which segments the snapshot's requests would create,
// the owner obtains each from its backend without holding its lock (the training thread's
// own allocations are never held up behind a pinning), and add_segment hands it to the pool.
// Replayed in the same order, the requests then find exactly those segments free (best fit),
// so the snapshot allocates nothing new.
std::vector<BlockPool::SegmentPlan> BlockPool::plan_segments(const std::vector<size_t>& requests) {
  // Replays the requests on a pool with a pretend backend (addresses never dereferenced) that
  // already holds `given` as free segments; returns the segments it had to add.
  auto replay = [&](const std::vector<SegmentPlan>& given) {
    std::vector<SegmentPlan> added;
    uintptr_t next = uintptr_t{1} << 44;
    auto address = [&](size_t bytes) {
      void* p = reinterpret_cast<void*>(next);
      next += (bytes + kLargeRound) / kLargeRound * kLargeRound;  // 2 MiB apart at least
      return p;
    };
    Backend pretend;
    pretend.allocate_segment = [&](size_t bytes) -> void* {
      added.push_back({.bytes = bytes, .small = bytes == kSmallSegment});  // (large-pool segments are >= 10 MiB)
      return address(bytes);
    };
    pretend.free_segment = [](void*, size_t) {};
    BlockPool pool("segment plan", pretend);
    for (const SegmentPlan& seg : given) pool.add_segment(address(seg.bytes), seg.bytes, seg.small, 0);
    for (size_t n : requests) (void)pool.allocate(n, 0);
    return added;
  };
  // Made one by one, the requests create these segments; found all free at once, best fit may
  // carve a mid-size request from a segment that a later large request was to have. Each round
  // adds what the replay on the segments so far still lacked, until it lacks nothing (a round or
  // two; the extra segments are mid-size ones).
  std::vector<SegmentPlan> plan = replay({});
  for (int round = 0; round < 16; ++round) {
    const std::vector<SegmentPlan> more = replay(plan);
    if (more.empty()) break;
    plan.insert(plan.end(), more.begin(), more.end());
  }
  return plan;
}

void BlockPool::add_segment(void* ptr, size_t bytes, bool small, StreamId stream) {
  FORGE_CHECK(ptr != nullptr && bytes > 0 && bytes % kRoundBytes == 0, "add_segment: ", bytes,
              " bytes at ", ptr, " is not a segment of the ", name_);
  insert_free(adopt_segment(ptr, bytes, small, stream));
}

MemoryStats BlockPool::stats() const { return stats_; }

void BlockPool::reset_peak() {
  stats_.peak_allocated = stats_.allocated;
  stats_.peak_reserved = stats_.reserved;
}

size_t BlockPool::block_size(const void* ptr) const {
  const auto it = live_.find(ptr);
  return it == live_.end() ? 0 : it->second->size;
}

size_t BlockPool::pending_blocks() const {
  std::unordered_set<const Block*> blocks;
  for (const Pending& p : pending_) blocks.insert(p.block);
  return blocks.size();
}

MemorySnapshot BlockPool::snapshot() const {
  MemorySnapshot s;
  s.allocator = name_;
  s.stats = stats_;
  s.segments = static_cast<int64_t>(segments_.size());
  for (const FreeSet* pool : {&small_, &large_})
    for (const Block* b : *pool) {
      s.cached_free_bytes += static_cast<int64_t>(b->size);
      s.largest_free_block = std::max(s.largest_free_block, static_cast<int64_t>(b->size));
    }
  s.pending_blocks = static_cast<int64_t>(pending_.size());
  std::vector<std::pair<const char*, int64_t>> blocks;
  blocks.reserve(live_.size());
  for (const auto& [p, b] : live_) blocks.emplace_back(b->owner, static_cast<int64_t>(b->size));
  s.live = bytes_by_owner(blocks);
  return s;
}

void BlockPool::throw_out_of_memory(size_t requested, size_t rounded, size_t segment) const {
  MemorySnapshot snap = snapshot();
  snap.requested = static_cast<int64_t>(requested);
  const char* owner = current_memory_owner();
  snap.failed_owner = owner ? owner : "(untagged)";
  std::string device = "unknown";
  if (backend_.memory_info) {
    try {
      const auto [free_b, total_b] = backend_.memory_info();
      if (total_b > 0) {
        device = format_bytes(free_b) + " free of " + format_bytes(total_b);
        snap.device_free = static_cast<int64_t>(free_b);
        snap.device_total = static_cast<int64_t>(total_b);
      }
    } catch (...) {
    }
  }
  if (backend_.limit >= 0) {
    snap.limit = backend_.limit;
    device += detail::concat(" (", backend_.limit_name ? backend_.limit_name : "a limit", " = ", backend_.limit,
                             " bytes: raise it or unset it)");
  }
  std::string held;  // the three largest owners
  for (size_t i = 0; i < snap.live.size() && i < 3; ++i)
    held += (i ? ", " : "") + snap.live[i].owner + " " + format_bytes(static_cast<size_t>(snap.live[i].bytes));
  std::string what =
      detail::concat(name_, ": out of memory: tried to allocate ", format_bytes(requested), " for ", snap.failed_owner,
                     " (rounded to ", rounded, ", a new segment of ", format_bytes(segment),
                     ") after releasing every cached segment; in use: ",
                     format_bytes(static_cast<size_t>(stats_.allocated)), " allocated in live tensors (most: ",
                     held.empty() ? "none" : held, "), ", format_bytes(static_cast<size_t>(stats_.reserved)),
                     " reserved by this allocator, the largest free block ",
                     format_bytes(static_cast<size_t>(snap.largest_free_block)), "; device memory: ", device,
                     ". Free tensors you no longer need, or lower the batch size / sequence length.");
  throw OutOfMemoryError(what, std::move(snap));
}

}  // namespace forge
