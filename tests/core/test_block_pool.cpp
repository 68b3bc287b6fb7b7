// BlockPool, the bookkeeping of the CUDA caching allocator and the pinned host allocator,
// on a fake device: segments are address ranges handed out by a counter (never touched),
// events are flags the test completes. Note [caching allocator] in core/block_pool.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/alloc_workload.h"
#include "forge/core/block_pool.h"
#include "forge/core/error.h"
#include "forge/core/memory_owner.h"

namespace forge {
namespace {

constexpr size_t KiB = 1024, MiB = 1024 * 1024;
using StreamId = BlockPool::StreamId;

// A fake device: segments at "addresses" from a bump counter (ascending or descending) or
// in random 256 MiB slots (shuffled), a capacity for out-of-memory, and events that
// complete when the test says so.
struct FakeDevice {
  enum class Order { ascending, descending, shuffled };
  explicit FakeDevice(size_t capacity = SIZE_MAX, Order order = Order::ascending, uint64_t seed = 1)
      : capacity(capacity), order(order), next(order == Order::descending ? uintptr_t{1} << 46 : uintptr_t{1} << 40),
        rng(seed) {}

  struct Event {
    StreamId stream;
    bool done = false;
    bool released = false;
  };

  size_t capacity;
  Order order;
  uintptr_t next;
  std::mt19937_64 rng;
  std::set<uintptr_t> slots_used;
  size_t used = 0;
  int64_t mallocs = 0, frees = 0, waits = 0;
  std::map<uintptr_t, size_t> segments;
  std::vector<std::unique_ptr<Event>> events;

  BlockPool::Backend backend() {
    BlockPool::Backend b;
    b.allocate_segment = [this](size_t bytes) -> void* {
      if (used + bytes > capacity) return nullptr;
      const uintptr_t span = (bytes + 2 * MiB - 1) / (2 * MiB) * (2 * MiB) + 2 * MiB;  // 2 MiB aligned, a gap
      uintptr_t addr;
      if (order == Order::shuffled) {
        EXPECT_LE(bytes, 256 * MiB);
        do addr = (uintptr_t{1} << 40) + (rng() % 4096) * 256 * MiB;
        while (!slots_used.insert(addr).second);
      } else if (order == Order::ascending) {
        addr = next;
        next += span;
      } else {
        next -= span;
        addr = next;
      }
      used += bytes;
      ++mallocs;
      segments.emplace(addr, bytes);
      return reinterpret_cast<void*>(addr);
    };
    b.free_segment = [this](void* p, size_t bytes) {
      const auto it = segments.find(reinterpret_cast<uintptr_t>(p));
      ASSERT_NE(it, segments.end()) << "free of an unknown segment";
      EXPECT_EQ(it->second, bytes) << "segment freed with another size";
      slots_used.erase(it->first);
      segments.erase(it);
      used -= bytes;
      ++frees;
    };
    b.record_event = [this](StreamId s) -> BlockPool::EventId {
      events.push_back(std::make_unique<Event>(Event{s}));
      return events.back().get();
    };
    b.event_done = [](BlockPool::EventId e) { return static_cast<Event*>(e)->done; };
    b.wait_event = [this](BlockPool::EventId e) {
      ++waits;
      static_cast<Event*>(e)->done = true;
    };
    b.release_event = [](BlockPool::EventId e) {
      auto* ev = static_cast<Event*>(e);
      EXPECT_FALSE(ev->released) << "event released twice";
      ev->released = true;
    };
    b.memory_info = [this] { return std::make_pair(capacity - used, capacity); };
    return b;
  }

  // A test-made event (as the pinned allocator records after a copy).
  BlockPool::EventId new_event() {
    events.push_back(std::make_unique<Event>(Event{~StreamId{0}}));
    return events.back().get();
  }
  void complete(StreamId s) {
    for (auto& e : events)
      if (e->stream == s) e->done = true;
  }
  int64_t unreleased_events() const {
    int64_t n = 0;
    for (const auto& e : events) n += e->released ? 0 : 1;
    return n;
  }
};

uintptr_t addr(const void* p) { return reinterpret_cast<uintptr_t>(p); }

TEST(BlockPool, RoundingAndSegmentSizes) {
  EXPECT_EQ(BlockPool::round_size(0), 512u);
  EXPECT_EQ(BlockPool::round_size(1), 512u);
  EXPECT_EQ(BlockPool::round_size(512), 512u);
  EXPECT_EQ(BlockPool::round_size(513), 1024u);
  EXPECT_EQ(BlockPool::segment_size(512), 2 * MiB);
  EXPECT_EQ(BlockPool::segment_size(1 * MiB), 2 * MiB);
  EXPECT_EQ(BlockPool::segment_size(1 * MiB + 512), 20 * MiB);
  EXPECT_EQ(BlockPool::segment_size(10 * MiB - 512), 20 * MiB);
  EXPECT_EQ(BlockPool::segment_size(10 * MiB), 10 * MiB);
  EXPECT_EQ(BlockPool::segment_size(11 * MiB), 12 * MiB);
  EXPECT_EQ(BlockPool::segment_size(100 * MiB + 512), 102 * MiB);
}

TEST(BlockPool, SmallBlocksAreCarvedFromOneSegment) {
  FakeDevice dev;
  BlockPool pool("test pool", dev.backend());
  EXPECT_EQ(pool.allocate(0, 0), nullptr);
  void* a = pool.allocate(1000, 0);
  void* b = pool.allocate(3000, 0);
  EXPECT_EQ(pool.block_size(a), 1024u);
  EXPECT_EQ(pool.block_size(b), 3072u);
  EXPECT_EQ(addr(b), addr(a) + 1024) << "the remainder after a split is the next best fit";
  EXPECT_EQ(addr(a) % 512, 0u);
  const MemoryStats s = pool.stats();
  EXPECT_EQ(s.allocated, 1024 + 3072);
  EXPECT_EQ(s.reserved, static_cast<int64_t>(2 * MiB));
  EXPECT_EQ(s.num_allocs, 2);  // the 0-byte request is not an allocation
  EXPECT_EQ(s.num_device_allocs, 1);
  EXPECT_EQ(dev.mallocs, 1);
  pool.free(a);
  pool.free(b);
  EXPECT_EQ(pool.stats().allocated, 0);
  EXPECT_EQ(pool.stats().reserved, static_cast<int64_t>(2 * MiB)) << "cached, not returned";
}

TEST(BlockPool, FreedBlocksAreReusedAndCoalesced) {
  FakeDevice dev;
  BlockPool pool("test pool", dev.backend());
  void* a = pool.allocate(4 * KiB, 0);
  void* b = pool.allocate(4 * KiB, 0);
  void* c = pool.allocate(4 * KiB, 0);
  pool.free(b);
  void* b2 = pool.allocate(3 * KiB, 0);  // best fit: the 4 KiB hole, split into 3 + 1 KiB
  EXPECT_EQ(b2, b);
  EXPECT_EQ(pool.block_size(b2), 3 * KiB);
  void* d = pool.allocate(1 * KiB, 0);  // exactly the 1 KiB left of the hole
  EXPECT_EQ(addr(d), addr(b) + 3 * KiB);
  for (void* p : {a, b2, c, d}) pool.free(p);
  // Everything merged back into one free 2 MiB block: a 1 MiB request starts the segment.
  void* big = pool.allocate(1 * MiB, 0);
  EXPECT_EQ(big, a);
  EXPECT_EQ(dev.mallocs, 1);
  pool.free(big);
  pool.empty_cache();
  EXPECT_EQ(pool.stats().reserved, 0);
  EXPECT_EQ(pool.stats().num_device_frees, 1);
  EXPECT_EQ(pool.segment_count(), 0u);
  EXPECT_TRUE(dev.segments.empty());
}

TEST(BlockPool, LargeBlocksSplitOnlyAboveOneMiB) {
  FakeDevice dev;
  BlockPool pool("test pool", dev.backend());
  void* a = pool.allocate(3 * MiB, 0);  // a 20 MiB segment: 3 MiB + 17 MiB free
  EXPECT_EQ(pool.block_size(a), 3 * MiB);
  EXPECT_EQ(pool.stats().reserved, static_cast<int64_t>(20 * MiB));
  void* b = pool.allocate(16 * MiB + 512 * KiB, 0);  // fits the 17 MiB rest; 0.5 MiB would be useless
  EXPECT_EQ(addr(b), addr(a) + 3 * MiB);
  EXPECT_EQ(pool.block_size(b), 17 * MiB) << "a remainder <= 1 MiB stays with the large block";
  EXPECT_EQ(pool.stats().allocated, static_cast<int64_t>(20 * MiB));
  EXPECT_EQ(dev.mallocs, 1);
  // Small requests never use the large pool.
  void* s = pool.allocate(4 * KiB, 0);
  EXPECT_EQ(dev.mallocs, 2);
  for (void* p : {a, b, s}) pool.free(p);
}

TEST(BlockPool, BestFitTakesTheSmallestBlockThatFits) {
  FakeDevice dev;
  BlockPool pool("test pool", dev.backend());
  void* x14 = pool.allocate(14 * MiB, 0);
  void* x12 = pool.allocate(12 * MiB, 0);
  void* x16 = pool.allocate(16 * MiB, 0);
  for (void* p : {x14, x12, x16}) pool.free(p);
  void* y = pool.allocate(11 * MiB, 0);
  EXPECT_EQ(y, x12);
  EXPECT_EQ(pool.block_size(y), 12 * MiB);  // 1 MiB rest: not split
  void* z = pool.allocate(13 * MiB, 0);
  EXPECT_EQ(z, x14);
  EXPECT_EQ(dev.mallocs, 3);
  pool.free(y);
  pool.free(z);
}

TEST(BlockPool, StreamsHaveSeparateFreeLists) {
  FakeDevice dev;
  BlockPool pool("test pool", dev.backend());
  const StreamId s1 = 0x1000, s2 = 0x2000;
  void* a = pool.allocate(64 * KiB, s1);
  pool.free(a);
  void* b = pool.allocate(64 * KiB, s2);
  EXPECT_NE(b, a) << "a block freed on s1 must not be handed to s2";
  EXPECT_EQ(dev.mallocs, 2);
  void* c = pool.allocate(64 * KiB, s1);
  EXPECT_EQ(c, a);
  EXPECT_EQ(dev.mallocs, 2);
  pool.free(b);
  pool.free(c);
}

TEST(BlockPool, RecordStreamDefersReuseUntilTheEventCompletes) {
  FakeDevice dev;
  BlockPool pool("test pool", dev.backend());
  const StreamId s1 = 0x1000, s2 = 0x2000;
  void* p = pool.allocate(4 * KiB, s1);
  pool.record_stream(p, s1);  // its own stream: nothing to do
  pool.record_stream(p, s2);
  pool.record_stream(p, s2);  // once per stream
  pool.free(p);
  EXPECT_EQ(pool.pending_blocks(), 1u);
  EXPECT_EQ(dev.events.size(), 1u);
  EXPECT_EQ(pool.stats().allocated, 0) << "a pending block is no longer allocated";
  void* q = pool.allocate(4 * KiB, s1);
  EXPECT_NE(q, p) << "reused while s2 may still use it";
  dev.complete(s2);
  void* r = pool.allocate(4 * KiB, s1);  // polls the event, frees p, best fit
  EXPECT_EQ(r, p);
  EXPECT_EQ(pool.pending_blocks(), 0u);
  EXPECT_EQ(dev.unreleased_events(), 0);
  // Without record_stream the block is reused at once (stream order makes it safe).
  pool.free(r);
  EXPECT_EQ(pool.allocate(4 * KiB, s1), p);
  EXPECT_THROW(pool.record_stream(reinterpret_cast<void*>(0x12345), s2), Error);
}

// A stream destroyed after its work completed (forget_stream) no longer holds the blocks it
// used: freeing them records no event on it.
TEST(BlockPool, AForgottenStreamRecordsNoEventWhenItsBlocksAreFreed) {
  FakeDevice dev;
  BlockPool pool("test pool", dev.backend());
  const StreamId s1 = 0x1000, s2 = 0x2000, s3 = 0x3000;
  void* p = pool.allocate(4 * KiB, s1);
  pool.record_stream(p, s2);
  pool.record_stream(p, s3);
  pool.forget_stream(s2);
  pool.free(p);
  EXPECT_EQ(dev.events.size(), 1u) << "an event on s3 only";
  dev.complete(s3);
  EXPECT_EQ(pool.allocate(4 * KiB, s1), p);
  void* q = pool.allocate(4 * KiB, s1);
  pool.record_stream(q, s2);
  pool.forget_stream(s2);
  pool.free(q);
  EXPECT_EQ(pool.pending_blocks(), 0u) << "nothing left to wait for";
  EXPECT_EQ(pool.allocate(4 * KiB, s1), q);
}

TEST(BlockPool, AttachedEventsDeferReuse) {
  FakeDevice dev;
  BlockPool pool("test pool", dev.backend());
  void* p = pool.allocate(16 * MiB, 0);
  BlockPool::EventId e1 = dev.new_event();
  pool.add_event(p, e1);
  static_cast<FakeDevice::Event*>(e1)->done = true;
  BlockPool::EventId e2 = dev.new_event();
  pool.add_event(p, e2);  // e1 has completed: released now
  EXPECT_TRUE(static_cast<FakeDevice::Event*>(e1)->released);
  pool.free(p);
  void* q = pool.allocate(16 * MiB, 0);
  EXPECT_NE(q, p) << "reused while a copy may still read it";
  static_cast<FakeDevice::Event*>(e2)->done = true;
  void* r = pool.allocate(16 * MiB, 0);
  EXPECT_EQ(r, p);
  EXPECT_EQ(dev.unreleased_events(), 0);
  BlockPool::EventId e3 = dev.new_event();
  EXPECT_THROW(pool.add_event(reinterpret_cast<void*>(0x12345), e3), Error);
  EXPECT_TRUE(static_cast<FakeDevice::Event*>(e3)->released) << "an event that cannot be attached is released";
  pool.free(q);
  pool.free(r);
}

TEST(BlockPool, StatsAndPeaks) {
  FakeDevice dev;
  BlockPool pool("test pool", dev.backend());
  void* a = pool.allocate(12 * MiB, 0);
  void* b = pool.allocate(1000, 0);
  MemoryStats s = pool.stats();
  EXPECT_EQ(s.allocated, static_cast<int64_t>(12 * MiB + 1024));
  EXPECT_EQ(s.reserved, static_cast<int64_t>(14 * MiB));
  EXPECT_EQ(s.peak_allocated, s.allocated);
  EXPECT_EQ(s.peak_reserved, s.reserved);
  pool.free(a);
  s = pool.stats();
  EXPECT_EQ(s.allocated, 1024);
  EXPECT_EQ(s.peak_allocated, static_cast<int64_t>(12 * MiB + 1024));
  EXPECT_GE(s.reserved, s.allocated);
  pool.reset_peak();
  EXPECT_EQ(pool.stats().peak_allocated, 1024);
  EXPECT_EQ(pool.stats().peak_reserved, static_cast<int64_t>(14 * MiB));
  pool.empty_cache();
  s = pool.stats();
  EXPECT_EQ(s.reserved, static_cast<int64_t>(2 * MiB)) << "the segment holding b stays";
  EXPECT_EQ(s.peak_reserved, static_cast<int64_t>(14 * MiB)) << "a peak is not lowered by empty_cache";
  EXPECT_EQ(s.num_allocs, 2);
  EXPECT_EQ(s.num_device_allocs, 2);
  EXPECT_EQ(s.num_device_frees, 1);
  pool.free(b);
  pool.free(b);       // a double free is ignored
  pool.free(nullptr);
  EXPECT_EQ(pool.stats().allocated, 0);
}

TEST(BlockPool, EmptyCacheWaitsForPendingEventsAndKeepsLiveSegments) {
  FakeDevice dev;
  BlockPool pool("test pool", dev.backend());
  void* live = pool.allocate(8 * KiB, 0);
  void* y = pool.allocate(12 * MiB, 0);
  void* z = pool.allocate(12 * MiB, 0);
  pool.record_stream(z, 0x2000);
  pool.free(y);
  pool.free(z);  // pending on stream 0x2000
  pool.empty_cache();
  EXPECT_EQ(dev.waits, 1);
  EXPECT_EQ(pool.pending_blocks(), 0u);
  EXPECT_EQ(pool.stats().reserved, static_cast<int64_t>(2 * MiB));
  EXPECT_EQ(pool.stats().num_device_frees, 2);
  EXPECT_EQ(pool.block_size(live), 8 * KiB);
  pool.free(live);
}

TEST(BlockPool, OutOfMemoryReleasesTheCacheAndRetriesOnceThenThrows) {
  FakeDevice dev(30 * MiB);
  BlockPool pool("CUDA caching allocator on cuda:7", dev.backend());
  void* a = pool.allocate(12 * MiB, 0);
  pool.free(a);  // cached: 12 MiB reserved, nothing allocated
  void* b = pool.allocate(20 * MiB, 0);  // 12 + 20 > 30: release the cached segment, retry
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(pool.stats().num_device_frees, 1);
  EXPECT_EQ(pool.stats().reserved, static_cast<int64_t>(20 * MiB));
  try {
    (void)pool.allocate(20 * MiB, 0);
    ADD_FAILURE() << "expected an out-of-memory error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const char* part : {"CUDA caching allocator on cuda:7", "out of memory", "20971520 bytes (20.00 MiB)",
                             "allocated", "reserved", "10485760 bytes (10.00 MiB) free of 31457280 bytes"})
      EXPECT_NE(msg.find(part), std::string::npos) << "missing '" << part << "' in: " << msg;
  }
  EXPECT_EQ(pool.stats().allocated, static_cast<int64_t>(20 * MiB)) << "a failed allocation changes nothing";
  EXPECT_EQ(pool.stats().num_allocs, 2);
  pool.free(b);
}

// Note [memory owners]: the error carries a snapshot taken at the failure (before anything is
// unwound): live bytes by the owner each block was allocated under, largest first, the request's
// owner, the cached free bytes and the largest free block; the message names the owner and the
// largest holders.
TEST(BlockPool, OutOfMemoryCarriesASnapshotOfTheOwners) {
  FakeDevice dev(40 * MiB);
  BlockPool pool("CUDA caching allocator on cuda:3", dev.backend());
  void *p0, *a0, *a1, *small, *gap;
  {
    const MemoryOwner owner("parameters");
    p0 = pool.allocate(12 * MiB, 0);
  }
  {
    const MemoryOwner owner(forward_block_owner(0));
    a0 = pool.allocate(10 * MiB, 0);
    {
      const MemoryOwner inner("backward: matmul");  // the innermost scope labels
      small = pool.allocate(3 * KiB, 0);
    }
    a1 = pool.allocate(10 * MiB, 0);
  }
  gap = pool.allocate(700 * KiB, 0);  // untagged; freed below: cached free bytes inside a segment
  pool.free(gap);
  const MemoryOwner failing("backward: rms_norm");
  try {
    (void)pool.allocate(16 * MiB, 0);
    ADD_FAILURE() << "expected an out-of-memory error";
  } catch (const OutOfMemoryError& e) {
    const MemorySnapshot& s = e.snapshot();
    EXPECT_EQ(s.allocator, "CUDA caching allocator on cuda:3");
    EXPECT_EQ(s.requested, static_cast<int64_t>(16 * MiB));
    EXPECT_EQ(s.failed_owner, "backward: rms_norm");
    ASSERT_EQ(s.live.size(), 3u);
    EXPECT_EQ(s.live[0].owner, "forward: block 0");
    EXPECT_EQ(s.live[0].blocks, 2);
    EXPECT_EQ(s.live[0].bytes, static_cast<int64_t>(20 * MiB));
    EXPECT_EQ(s.live[1].owner, "parameters");
    EXPECT_EQ(s.live[1].bytes, static_cast<int64_t>(12 * MiB));
    EXPECT_EQ(s.live[2].owner, "backward: matmul");
    EXPECT_EQ(s.live[2].bytes, static_cast<int64_t>(3 * KiB));
    EXPECT_EQ(s.stats.allocated, static_cast<int64_t>(32 * MiB + 3 * KiB));
    EXPECT_GT(s.cached_free_bytes, 0);
    EXPECT_GE(s.cached_free_bytes, s.largest_free_block);
    EXPECT_EQ(s.segments, static_cast<int64_t>(pool.segment_count()));
    EXPECT_EQ(s.device_total, static_cast<int64_t>(40 * MiB));  // the fake device's memory_info
    const std::string msg = e.what();
    for (const char* part : {"for backward: rms_norm", "most: forward: block 0", "parameters", "largest free block"})
      EXPECT_NE(msg.find(part), std::string::npos) << "missing '" << part << "' in: " << msg;
  }
  for (void* p : {p0, a0, a1, small}) pool.free(p);
}

TEST(MemoryOwner, LabelsNestAndAreInternedOnce) {
  EXPECT_EQ(current_memory_owner(), nullptr);
  EXPECT_EQ(intern_memory_owner("optimizer"), intern_memory_owner(std::string("optim") + "izer"));
  EXPECT_EQ(forward_block_owner(5), intern_memory_owner("forward: block 5"));
  {
    const MemoryOwner a("data");
    EXPECT_STREQ(current_memory_owner(), "data");
    {
      const MemoryOwner b(forward_block_owner(2));
      EXPECT_STREQ(current_memory_owner(), "forward: block 2");
    }
    EXPECT_STREQ(current_memory_owner(), "data");
  }
  EXPECT_EQ(current_memory_owner(), nullptr);
  const auto by = bytes_by_owner({{nullptr, 5}, {intern_memory_owner("x"), 7}, {nullptr, 4}});
  ASSERT_EQ(by.size(), 2u);
  EXPECT_EQ(by[0].owner, "(untagged)");
  EXPECT_EQ(by[0].bytes, 9);
  EXPECT_EQ(by[0].blocks, 2);
  EXPECT_EQ(by[1].owner, "x");
}

TEST(BlockPool, DestructorReleasesEverySegmentAndEvent) {
  FakeDevice dev;
  {
    BlockPool pool("test pool", dev.backend());
    void* a = pool.allocate(1000, 0);
    (void)pool.allocate(12 * MiB, 0);
    void* c = pool.allocate(3 * MiB, 0);
    pool.free(a);
    pool.record_stream(c, 0x2000);
    pool.free(c);  // pending at destruction
  }
  EXPECT_EQ(dev.mallocs, 3);
  EXPECT_EQ(dev.frees, 3);
  EXPECT_TRUE(dev.segments.empty());
  EXPECT_EQ(dev.unreleased_events(), 0);
}

TEST(BlockPool, EveryBlockIs512ByteAligned) {
  FakeDevice dev;
  BlockPool pool("test pool", dev.backend());
  std::vector<void*> ps;
  for (size_t n : {size_t{1}, size_t{17}, size_t{513}, size_t{4095}, 3 * MiB + 7, size_t{100000}, 11 * MiB + 1})
    ps.push_back(pool.allocate(n, 0));
  for (void* p : ps) EXPECT_EQ(addr(p) % 512, 0u);
  for (void* p : ps) pool.free(p);
}

// Random allocations, frees and cross-stream uses on three streams against a model of the
// memory: no block handed out overlaps a live block or a freed block whose events are
// pending; every block lies in a segment of its stream's; stats add up; everything is
// released at the end.
TEST(BlockPool, RandomizedOperationsKeepTheInvariants) {
  FakeDevice dev(size_t{64} << 30);  // addresses only: nothing is touched
  BlockPool pool("test pool", dev.backend());
  std::mt19937_64 rng(7);
  const StreamId streams[3] = {0, 0x1000, 0x2000};
  struct Live {
    size_t size;
    StreamId stream;
    std::vector<StreamId> uses;
  };
  std::map<uintptr_t, Live> live;                 // by address
  std::map<uintptr_t, std::pair<size_t, StreamId>> pending;  // freed, waiting for `stream`
  std::map<uintptr_t, StreamId> segment_stream;   // not tracked by the fake: learnt on first use
  auto overlaps = [](const auto& m, uintptr_t p, size_t n) {
    auto it = m.upper_bound(p);
    if (it != m.end() && it->first < p + n) return true;
    if (it == m.begin()) return false;
    --it;
    const size_t size = [&] {
      if constexpr (std::is_same_v<std::decay_t<decltype(it->second)>, Live>) return it->second.size;
      else return it->second.first;
    }();
    return it->first + size > p;
  };
  const size_t sizes[] = {1, 700, 4 * KiB, 100 * KiB, 1 * MiB, 1 * MiB + 1, 3 * MiB, 9 * MiB, 12 * MiB, 40 * MiB};
  for (int i = 0; i < 20000; ++i) {
    const int what = static_cast<int>(rng() % 10);
    if (what < 4 || live.empty()) {
      const size_t n = sizes[rng() % std::size(sizes)] + rng() % 3000;
      const StreamId s = streams[rng() % 3];
      void* p = pool.allocate(n, s);
      const uintptr_t a = addr(p);
      const size_t got = pool.block_size(p);
      ASSERT_GE(got, n);
      ASSERT_EQ(a % 512, 0u);
      ASSERT_FALSE(overlaps(live, a, got)) << "overlaps a live block";
      ASSERT_FALSE(overlaps(pending, a, got)) << "reuses a block a stream may still use";
      auto seg = dev.segments.upper_bound(a);
      ASSERT_NE(seg, dev.segments.begin());
      --seg;
      ASSERT_LE(a + got, seg->first + seg->second) << "outside its segment";
      const auto [known, fresh] = segment_stream.emplace(seg->first, s);
      ASSERT_EQ(known->second, s) << "a segment serves two streams";
      (void)fresh;
      live.emplace(a, Live{got, s, {}});
    } else if (what < 8) {
      auto it = std::next(live.begin(), static_cast<long>(rng() % live.size()));
      const bool used_elsewhere = !it->second.uses.empty();
      if (used_elsewhere) pending.emplace(it->first, std::make_pair(it->second.size, it->second.uses.front()));
      pool.free(reinterpret_cast<void*>(it->first));
      live.erase(it);
    } else if (what < 9) {
      auto it = std::next(live.begin(), static_cast<long>(rng() % live.size()));
      const StreamId other = streams[rng() % 3];
      pool.record_stream(reinterpret_cast<void*>(it->first), other);
      if (other != it->second.stream && it->second.uses.empty()) it->second.uses.push_back(other);
    } else {
      const StreamId s = streams[rng() % 3];
      dev.complete(s);
      std::erase_if(pending, [&](const auto& kv) { return kv.second.second == s; });
    }
    if (i % 997 == 0) {
      int64_t bytes = 0;
      for (const auto& [a, l] : live) bytes += static_cast<int64_t>(l.size);
      ASSERT_EQ(pool.stats().allocated, bytes);
      ASSERT_EQ(pool.stats().reserved, static_cast<int64_t>(dev.used));
      ASSERT_GE(pool.stats().peak_allocated, bytes);
      if (i % 5 == 0) {
        pool.empty_cache();  // completes every pending event
        pending.clear();
        segment_stream.clear();
      }
    }
  }
  for (const auto& [a, l] : live) pool.free(reinterpret_cast<void*>(a));
  pool.empty_cache();
  EXPECT_EQ(pool.stats().allocated, 0);
  EXPECT_EQ(pool.stats().reserved, 0);
  EXPECT_TRUE(dev.segments.empty());
  EXPECT_EQ(dev.unreleased_events(), 0);
  EXPECT_EQ(pool.stats().num_device_allocs, pool.stats().num_device_frees);
}

// The property the GPU test checks on the real allocator: after one training step, the
// same step needs no new segment (no cudaMalloc in the steady state), whatever order the
// device hands out addresses in; and every step frees what it allocated.
TEST(BlockPool, TrainingStepReachesSteadyStateAfterOneStep) {
  const auto ops = testing::training_step_workload();
  int64_t allocs = 0;
  for (const auto& op : ops) allocs += op.alloc ? 1 : 0;
  EXPECT_EQ(allocs, 184);
  struct Layout {
    FakeDevice::Order order;
    uint64_t seed;
  };
  for (const Layout layout : {Layout{FakeDevice::Order::ascending, 0}, Layout{FakeDevice::Order::descending, 0},
                              Layout{FakeDevice::Order::shuffled, 1}, Layout{FakeDevice::Order::shuffled, 2},
                              Layout{FakeDevice::Order::shuffled, 3}, Layout{FakeDevice::Order::shuffled, 4}}) {
    FakeDevice dev(SIZE_MAX, layout.order, layout.seed);
    BlockPool pool("test pool", dev.backend());
    void* param = pool.allocate(50 * MiB, 0);  // live across steps, like the weights
    int64_t after_first = 0;
    for (int step = 0; step < 4; ++step) {
      std::unordered_map<int, void*> live;
      for (const auto& op : ops) {
        if (op.alloc) {
          live[op.id] = pool.allocate(op.bytes, 0);
        } else {
          pool.free(live.at(op.id));
          live.erase(op.id);
        }
      }
      EXPECT_TRUE(live.empty());
      const MemoryStats s = pool.stats();
      EXPECT_EQ(s.allocated, static_cast<int64_t>(50 * MiB));
      EXPECT_GE(s.reserved, s.peak_allocated);
      if (step == 0) after_first = s.num_device_allocs;
      else EXPECT_EQ(s.num_device_allocs, after_first) << "step " << step << " called cudaMalloc (layout seed "
                                                        << layout.seed << ")";
    }
    EXPECT_EQ(pool.stats().num_device_frees, 0);
    pool.free(param);
  }
}

// Note [reserving segments ahead]: the segments plan_segments names, obtained outside the pool and
// added with add_segment, serve the same requests in the same order without one new segment; a
// LLaMA-like checkpoint (parameters, master weights, two moments) and random mixes of small,
// mid-size and large requests.
TEST(BlockPool, PlannedSegmentsServeTheirRequestsWithoutNewAllocations) {
  std::vector<std::vector<size_t>> cases;
  std::vector<size_t> llama;  // bf16 parameters then f32 master weights and moments, per tensor
  for (size_t copies : {2, 4, 4, 4}) {
    llama.push_back(32000 * 2048 * copies);  // embedding
    for (int layer = 0; layer < 4; ++layer)
      for (size_t n : {size_t{2048}, size_t{2048 * 2048}, size_t{512 * 2048}, size_t{512 * 2048}, size_t{2048 * 2048},
                       size_t{2048}, size_t{5632 * 2048}, size_t{5632 * 2048}, size_t{2048 * 5632}})
        llama.push_back(n * copies);
  }
  cases.push_back(llama);
  std::mt19937_64 rng(7);
  for (int c = 0; c < 40; ++c) {
    std::vector<size_t> r(1 + rng() % 60);
    for (size_t& n : r) {
      const int kind = static_cast<int>(rng() % 3);
      n = kind == 0 ? 1 + rng() % (1 * MiB) : kind == 1 ? 1 * MiB + 1 + rng() % (9 * MiB) : 10 * MiB + rng() % (300 * MiB);
    }
    cases.push_back(r);
  }
  double max_extra = 0.0;
  for (size_t c = 0; c < cases.size(); ++c) {
    SCOPED_TRACE("case " + std::to_string(c));
    const std::vector<size_t>& requests = cases[c];
    const std::vector<BlockPool::SegmentPlan> plan = BlockPool::plan_segments(requests);
    FakeDevice dev;
    BlockPool pool("test pool", dev.backend());
    size_t planned = 0, plain_bytes = 0;
    {  // Made one by one, the requests create about as much (the plan adds mid-size segments).
      FakeDevice plain;
      BlockPool p("plain pool", plain.backend());
      for (size_t n : requests) (void)p.allocate(n, 0);
      plain_bytes = plain.used;
      EXPECT_LE(plain.mallocs, static_cast<int64_t>(plan.size()));
    }
    BlockPool::Backend b = dev.backend();
    for (const BlockPool::SegmentPlan& seg : plan) {
      void* p = b.allocate_segment(seg.bytes);
      pool.add_segment(p, seg.bytes, seg.small, 0);
      planned += seg.bytes;
    }
    const int64_t before = dev.mallocs;
    EXPECT_EQ(pool.stats().reserved, static_cast<int64_t>(planned));
    // The LLaMA-like case is exact; 2 of the 40 random mixes need a few more segments (a mid-size
    // request carved from a large segment, whose request then needs another: the same memory the
    // snapshot would have allocated itself, here allocated ahead).
    EXPECT_LE(planned, c == 0 ? plain_bytes : plain_bytes * 3 / 2) << "the plan reserves much more than the requests take";
    max_extra = std::max(max_extra, static_cast<double>(planned) / static_cast<double>(plain_bytes));
    EXPECT_EQ(pool.stats().allocated, 0);
    std::vector<void*> live;
    for (size_t n : requests) live.push_back(pool.allocate(n, 0));
    EXPECT_EQ(dev.mallocs, before) << "the snapshot's requests found their segments";
    for (size_t i = 0; i < live.size(); ++i) EXPECT_GE(pool.block_size(live[i]), requests[i]);
    for (void* p : live) pool.free(p);
    pool.empty_cache();  // added segments are released like the others
    EXPECT_EQ(pool.stats().reserved, 0);
    EXPECT_EQ(dev.frees, dev.mallocs);
  }
  std::printf("plan / one-by-one reserved bytes: at most %.3f\n", max_extra);
  EXPECT_TRUE(BlockPool::plan_segments({}).empty());
  FakeDevice dev;
  BlockPool pool("test pool", dev.backend());
  EXPECT_THROW(pool.add_segment(nullptr, 2 * MiB, true, 0), Error);
  EXPECT_THROW(pool.add_segment(reinterpret_cast<void*>(uintptr_t{1} << 40), 1000, false, 0), Error);
}

}  // namespace
}  // namespace forge
