// The CUDA runtime of forge: the caching allocator (steady state, stats, empty_cache,
// record_stream, out of memory), streams, events and the current-stream guard, pinned host
// memory and asynchronous copies. The allocator's bookkeeping itself is tested on the CPU
// (tests/core/test_block_pool.cpp); these tests check it is wired to the device correctly.
//
// Some tests hold a side stream busy with a host function that waits on a gate the test
// opens (Gate below): that makes "the copy is still in flight" a fact rather than a race.
// The gate also opens by itself after a few seconds, so no test can hang.
//
// Without a GPU every test reports SKIPPED (never passed): CTest's label is `cuda`.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <chrono>
#include <string>
#include <thread>
#include <unordered_map>

#include "backends/cuda/cuda_testing.h"
#include "core/alloc_workload.h"
#include "forge/backends/cuda/memory.h"
#include "forge/backends/cuda/stream.h"
#include "forge/backends/cuda/tensor_kernels.h"
#include "forge/forge.h"
#include "testing/cli_testing.h"
#include "train/train_testing.h"

namespace forge {
namespace {

using namespace cuda_testing;
constexpr int64_t MiB = 1024 * 1024;
namespace fs = std::filesystem;

#define SKIP_WITHOUT_CACHING_ALLOCATOR() \
  do { if (!cuda::caching_allocator_enabled()) GTEST_SKIP() << "FORGE_CUDA_ALLOC=plain"; } while (0)

Tensor bytes_on_gpu(int64_t n) { return empty({n}, {.dtype = DType::u8, .device = kGpu}); }

// Holds a stream busy until open() (or a 5 s timeout): work queued behind it stays queued.
struct Gate {
  std::atomic<bool> is_open{false};
  static void CUDART_CB wait(void* self) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    auto* g = static_cast<Gate*>(self);
    while (!g->is_open.load() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  void close_on(const cuda::Stream& s) { ASSERT_EQ(cudaLaunchHostFunc(s.handle(), &Gate::wait, this), cudaSuccess); }
  void open() { is_open.store(true); }
};

// Opens the gate and drains the stream when the test ends, also on a failed ASSERT.
struct GateCloser {
  Gate& gate;
  cuda::Stream stream;
  ~GateCloser() {
    gate.open();
    try {
      stream.synchronize();
    } catch (...) {
    }
  }
};

// A clean starting point: no cached segments (live tensors of other tests are gone).
void fresh_cache() {
  cuda::synchronize(0);
  cuda::empty_cache(0);
}

// ---- caching allocator -----------------------------------------------------------------

TEST(CudaAllocator, TrainingStepNeedsNoCudaMallocAfterTheFirst) {
  FORGE_SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_CACHING_ALLOCATOR();
  fresh_cache();
  const auto ops = testing::training_step_workload();  // 184 tensors, 1 KiB .. 100 MiB
  const Tensor weights = bytes_on_gpu(50 * MiB);
  int64_t after_first = -1;
  for (int step = 0; step < 3; ++step) {
    std::unordered_map<int, Tensor> live;
    for (const auto& op : ops) {
      if (op.alloc) live.emplace(op.id, bytes_on_gpu(static_cast<int64_t>(op.bytes)));
      else live.erase(op.id);
    }
    const MemoryStats s = cuda::memory_stats(0);
    EXPECT_GE(s.reserved, s.allocated);
    EXPECT_GE(s.peak_reserved, s.peak_allocated);
    if (step == 0) after_first = s.num_device_allocs;
    else EXPECT_EQ(s.num_device_allocs, after_first) << "step " << step << " called cudaMalloc";
  }
}

TEST(CudaAllocator, AutogradStepNeedsNoCudaMallocAfterTheFirst) {
  FORGE_SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_CACHING_ALLOCATOR();
  fresh_cache();
  Tensor w = randn({1024, 1024}, {.device = kGpu}).requires_grad_();
  const Tensor upstream = full({1024, 1024}, 0.5, {.device = kGpu});
  int64_t after_first = -1;
  for (int step = 0; step < 4; ++step) {
    Tensor x = randn({1024, 1024}, {.device = kGpu});
    Tensor y = ops::tanh(ops::silu(ops::mul(x, w)));
    y.backward(upstream);
    w.zero_grad();  // drops .grad, as the trainer does
    const MemoryStats s = cuda::memory_stats(0);
    if (step == 0) after_first = s.num_device_allocs;
    else EXPECT_EQ(s.num_device_allocs, after_first) << "step " << step << " called cudaMalloc";
  }
}

TEST(CudaAllocator, StatsReservedPeaksAndEmptyCache) {
  FORGE_SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_CACHING_ALLOCATOR();
  fresh_cache();
  const MemoryStats base = cuda::memory_stats(0);
  {
    Tensor a = bytes_on_gpu(64 * MiB);  // a segment of its own
    Tensor b = bytes_on_gpu(3 * MiB);   // from a 20 MiB segment
    Tensor c = bytes_on_gpu(1000);      // from a 2 MiB segment, rounded to 1024
    const MemoryStats s = cuda::memory_stats(0);
    // A large block may carry up to 1 MiB of slack (Note [caching allocator]).
    EXPECT_GE(s.allocated - base.allocated, 67 * MiB + 1024);
    EXPECT_LE(s.allocated - base.allocated, 69 * MiB + 1024);
    EXPECT_GE(s.reserved - base.reserved, 64 * MiB + 20 * MiB + 2 * MiB);
    EXPECT_GE(s.reserved, s.allocated);
    EXPECT_EQ(s.num_allocs, base.num_allocs + 3);
    EXPECT_EQ(s.num_device_allocs, base.num_device_allocs + 3);
    EXPECT_EQ(cuda::max_memory_allocated(0), s.peak_allocated);
    EXPECT_GE(s.peak_allocated, s.allocated);
    // The re-exports user code sees.
    EXPECT_EQ(cuda_memory_allocated(0), s.allocated);
    EXPECT_EQ(cuda_memory_reserved(0), s.reserved);
    EXPECT_EQ(cuda_max_memory_allocated(0), s.peak_allocated);
    EXPECT_EQ(cuda_memory_stats(0).num_device_allocs, s.num_device_allocs);
  }
  const MemoryStats cached = cuda::memory_stats(0);
  EXPECT_EQ(cached.allocated, base.allocated);
  EXPECT_GE(cached.reserved, base.reserved + 86 * MiB) << "freed blocks stay cached";
  EXPECT_EQ(cached.num_device_frees, base.num_device_frees);
  cuda_empty_cache(0);
  const MemoryStats emptied = cuda::memory_stats(0);
  EXPECT_EQ(emptied.reserved, base.reserved) << "empty_cache releases every segment nothing uses";
  EXPECT_EQ(emptied.num_device_frees, base.num_device_frees + 3);
  EXPECT_GE(emptied.peak_reserved, base.reserved + 86 * MiB);
  cuda::reset_peak_memory_stats(0);
  EXPECT_EQ(cuda::max_memory_allocated(0), emptied.allocated);
  EXPECT_EQ(cuda::max_memory_reserved(0), emptied.reserved);
}

TEST(CudaAllocator, EmptyCacheKeepsSegmentsInUse) {
  FORGE_SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_CACHING_ALLOCATOR();
  fresh_cache();
  const MemoryStats base = cuda::memory_stats(0);
  Tensor keep = bytes_on_gpu(2 * MiB);  // 2 MiB of a 20 MiB segment
  { Tensor drop = bytes_on_gpu(4 * MiB); }  // the same segment
  cuda::empty_cache(0);
  EXPECT_EQ(cuda::memory_reserved(0) - base.reserved, 20 * MiB) << "a partly used segment stays";
  EXPECT_EQ(cuda::memory_allocated(0) - base.allocated, 2 * MiB);
  keep = Tensor();
  cuda::empty_cache(0);
  EXPECT_EQ(cuda::memory_reserved(0), base.reserved);
}

TEST(CudaAllocator, BlocksAreAlignedForVectorLoads) {
  FORGE_SKIP_WITHOUT_GPU();
  for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{513}, int64_t{100000}, 3 * MiB + 1, 11 * MiB + 5}) {
    Tensor t = bytes_on_gpu(n);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data_ptr()) % 256, 0u) << n << " bytes";
  }
}

TEST(CudaAllocator, OutOfMemoryIsAClearErrorAndTheAllocatorRecovers) {
  FORGE_SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_CACHING_ALLOCATOR();
  fresh_cache();
  { Tensor cached = bytes_on_gpu(64 * MiB); }  // cached, released by the retry path
  const int64_t reserved_before = cuda::memory_reserved(0);
  size_t free_b = 0, total_b = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_b, &total_b), cudaSuccess);
  try {
    (void)bytes_on_gpu(2 * static_cast<int64_t>(total_b));
    ADD_FAILURE() << "expected an out-of-memory error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const char* part : {"CUDA caching allocator on cuda:0", "out of memory", "allocated in live tensors",
                             "reserved by this allocator", " free of "})
      EXPECT_NE(msg.find(part), std::string::npos) << "missing '" << part << "' in: " << msg;
  }
  EXPECT_EQ(cuda::memory_reserved(0), reserved_before - 64 * MiB) << "the retry released the cached segment";
  expect_equal(full({1000}, 2.0, {.device = kGpu}), full({1000}, 2.0), "allocating after an out-of-memory error");
}

// FORGE_CUDA_MEMORY_LIMIT: forge train on the GPU held to 64 MB fails as on a full 64 MB card,
// the message naming the limit and the snapshot's figures being the limit's (read in a child
// process: the limit is read once per process).
TEST(CudaAllocator, AMemoryLimitFailsARunAsAFullSmallerGpuWould) {
  FORGE_SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_CACHING_ALLOCATOR();
  train_testing::Scratch scratch;
  train_testing::write_corpus(scratch.path() / "corpus");
  const fs::path cfg = scratch.path() / "oom.toml";
  std::ofstream(cfg) << train_testing::tiny_toml(scratch.path(), "oom", 3);
  const auto r = testing::run_forge({"train", cfg.string(), "--run.device=cuda", "--train.batch_size=4096",
                                     "--eval.every=0"},
                                    testing::Stderr::merged, {{"FORGE_CUDA_MEMORY_LIMIT", "64MB"}});
  ASSERT_NE(r.status, 0) << r.out;
  for (const char* part : {"CUDA caching allocator on cuda:0", "out of memory", "FORGE_CUDA_MEMORY_LIMIT = 64000000",
                           "oom_snapshot.rank0.json"})
    EXPECT_NE(r.out.find(part), std::string::npos) << "missing '" << part << "' in:\n" << r.out;
  const fs::path snap = scratch.path() / "runs" / "oom" / "oom_snapshot.rank0.json";
  ASSERT_TRUE(fs::exists(snap)) << r.out;
  const auto j = nlohmann::json::parse(std::ifstream(snap));
  EXPECT_EQ(j["allocator"]["limit_bytes"].get<int64_t>(), 64'000'000) << j.dump(2);
  EXPECT_LE(j["allocator"]["reserved_bytes"].get<int64_t>(), 64'000'000) << j.dump(2);
  EXPECT_GT(j["requested_bytes"].get<int64_t>(), 0);
  // The same run without the limit trains (the failure was the limit's).
  const auto ok = testing::run_forge({"train", cfg.string(), "--run.device=cuda", "--train.batch_size=4096",
                                      "--eval.every=0", "--run.name=unlimited"},
                                     testing::Stderr::merged);
  EXPECT_EQ(ok.status, 0) << ok.out;
}

// ---- streams and record_stream --------------------------------------------------------

TEST(CudaStreams, GuardSetsTheCurrentStreamOfThisThreadOnly) {
  FORGE_SKIP_WITHOUT_GPU();
  EXPECT_EQ(cuda::current_stream(0), nullptr) << "the default is the legacy stream";
  cuda::Stream side = cuda::Stream::create(0);
  cuda::Stream other = cuda::Stream::create(0, -1);
  EXPECT_NE(side.handle(), nullptr);
  EXPECT_FALSE(side.is_legacy());
  {
    cuda::StreamGuard g(side);
    EXPECT_EQ(cuda::current_stream(0), side.handle());
    EXPECT_EQ(cuda::Stream::current(0), side);
    {
      cuda::StreamGuard inner(other);
      EXPECT_EQ(cuda::current_stream(0), other.handle());
    }
    EXPECT_EQ(cuda::current_stream(0), side.handle());
    cudaStream_t seen = reinterpret_cast<cudaStream_t>(1);
    std::thread([&] { seen = cuda::current_stream(0); }).join();
    EXPECT_EQ(seen, nullptr) << "another thread keeps its own current stream";
  }
  EXPECT_EQ(cuda::current_stream(0), nullptr);
  EXPECT_THROW(cuda::current_stream(-1), Error);
  EXPECT_THROW(cuda::Stream::create(cuda_device_count()), Error);
}

TEST(CudaStreams, OpsOnASideStreamMatchTheCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  const Pair a = on_both(host_input({kM, kN}, Domain::real, DType::f32, 101));
  const Pair b = on_both(host_input({kM, kN}, Domain::real, DType::f32, 102));
  cuda::Stream side = cuda::Stream::create(0);
  cuda::Event inputs_ready, done;
  inputs_ready.record(cuda::Stream::current(0));  // a and b were copied on the default stream
  Tensor c;
  {
    cuda::StreamGuard g(side);
    inputs_ready.wait(side);
    c = ops::tanh(ops::add(a.gpu, b.gpu));
    done.record(side);
  }
  done.wait(cuda::Stream::legacy(0));  // the copy to the host runs on the default stream
  cuda::record_stream(c, cuda::Stream::legacy(0));
  expect_close(c, ops::tanh(ops::add(a.cpu, b.cpu)), tolerance(DType::f32), "tanh(a + b) on a side stream");
  side.synchronize();
  EXPECT_TRUE(side.query());
  EXPECT_TRUE(done.query());
}

TEST(CudaStreams, MemoryFreedOnOneStreamIsNotHandedToAnother) {
  FORGE_SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_CACHING_ALLOCATOR();
  fresh_cache();
  cuda::Stream side = cuda::Stream::create(0);
  void* on_side = nullptr;
  {
    cuda::StreamGuard g(side);
    on_side = bytes_on_gpu(4 * MiB).data_ptr();  // allocated and freed on `side`
  }
  Tensor on_default = bytes_on_gpu(4 * MiB);
  EXPECT_NE(on_default.data_ptr(), on_side);
  {
    cuda::StreamGuard g(side);
    EXPECT_EQ(bytes_on_gpu(4 * MiB).data_ptr(), on_side) << "reused on its own stream";
  }
}

TEST(CudaStreams, RecordStreamKeepsABlockUntilTheOtherStreamIsDone) {
  FORGE_SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_CACHING_ALLOCATOR();
  fresh_cache();
  const int64_t n = 12 * MiB;  // a segment of its own
  cuda::Stream side = cuda::Stream::create(0);
  Gate gate;
  GateCloser closer{gate, side};
  Tensor x = bytes_on_gpu(n);  // on the default stream
  void* px = x.data_ptr();
  gate.close_on(side);         // `side` is busy...
  cuda::record_stream(x, side);  // ... and (the test pretends) reads x
  x = Tensor();                  // freed: pending until `side` passes this point
  Tensor y = bytes_on_gpu(n);
  EXPECT_NE(y.data_ptr(), px) << "handed out while another stream may still use it";
  gate.open();
  side.synchronize();
  Tensor z = bytes_on_gpu(n);  // the event has completed: x's block is free again
  EXPECT_EQ(z.data_ptr(), px);
  // Without record_stream a block is reused at once on its own stream.
  z = Tensor();
  EXPECT_EQ(bytes_on_gpu(n).data_ptr(), px);
  EXPECT_THROW(cuda::record_stream(full({4}, 1.0), side), Error);  // a CPU tensor
}

// A tensor used on a stream that is destroyed before the tensor (a process group's communication
// stream, the group gone before the model whose weights it broadcast) is freed without touching
// that stream (which crashed in cudaEventRecord before forget_stream), and its block is reused.
TEST(CudaStreams, ATensorOutlivesAStreamItWasRecordedOn) {
  FORGE_SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_CACHING_ALLOCATOR();
  fresh_cache();
  const int64_t n = 12 * MiB;
  Tensor x = bytes_on_gpu(n);
  void* px = x.data_ptr();
  {
    cuda::Stream side = cuda::Stream::create(0);
    cuda::record_stream(x, side);
  }  // destroyed (synchronised first)
  for (int i = 0; i < 8; ++i) cuda::Stream::create(0);  // new streams may take its handle value
  x = Tensor();
  EXPECT_EQ(bytes_on_gpu(n).data_ptr(), px) << "reused at once: the destroyed stream's work is done";
}

TEST(CudaEvents, RecordQuerySynchronizeAndTime) {
  FORGE_SKIP_WITHOUT_GPU();
  cuda::Event never;
  EXPECT_TRUE(never.query()) << "an event never recorded counts as completed";
  EXPECT_NO_THROW(never.synchronize());
  cuda::Event start(/*enable_timing=*/true), end(true);
  const cuda::Stream s = cuda::Stream::current(0);
  start.record(s);
  Tensor t = full({64 * MiB / 4}, 1.5, {.device = kGpu});
  t.mul_(2.0);
  end.record(s);
  end.synchronize();
  EXPECT_TRUE(end.query());
  EXPECT_GE(start.elapsed_ms(end), 0.0f);
  cuda::Event untimed;
  untimed.record(s);
  EXPECT_THROW((void)untimed.elapsed_ms(end), Error);
  cuda::Event moved = std::move(start);
  EXPECT_TRUE(moved.recorded());
  EXPECT_FALSE(start.recorded());  // a moved-from event is empty
}

// ---- pinned memory and asynchronous copies --------------------------------------------

TEST(CudaPinned, PinMemoryAndNonBlockingCopiesGiveTheRightValues) {
  FORGE_SKIP_WITHOUT_GPU();
  const Tensor h = host_input({1000, 1037}, Domain::real, DType::f32, 201);
  EXPECT_FALSE(h.is_pinned());
  const Tensor p = h.pin_memory();
  EXPECT_TRUE(p.is_pinned());
  EXPECT_TRUE(p.is_cpu());
  EXPECT_EQ(p.pin_memory().data_ptr(), p.data_ptr()) << "pinning a pinned tensor is a no-op";
  expect_equal(p, h, "pin_memory keeps the values");
  EXPECT_TRUE(p.t().is_pinned()) << "views share the pinned storage";

  Tensor g = p.to(kGpu, /*non_blocking=*/true);
  Tensor g_bf16 = ops::to(p, kGpu, DType::bf16, /*non_blocking=*/true);  // staged, then converted
  Tensor g_t = p.t().to(kGpu, true);                                      // a strided pinned view
  Tensor back = g.to(Device::cpu(), /*non_blocking=*/true);
  EXPECT_TRUE(back.is_pinned()) << "a non_blocking copy to the CPU lands in pinned memory";
  cuda::synchronize(0);
  expect_equal(g, h, "pinned -> GPU, non_blocking");
  expect_equal(g_bf16, h.to(DType::bf16), "pinned f32 -> GPU bf16, non_blocking");
  expect_equal(g_t, h.t(), "pinned transposed view -> GPU, non_blocking");
  expect_equal(back, h, "GPU -> pinned, non_blocking");
  // A non_blocking copy of pageable memory is an ordinary (blocking) copy.
  expect_equal(h.to(kGpu, true), h, "pageable -> GPU with non_blocking");
  EXPECT_THROW(g.pin_memory(), Error);
  const MemoryStats ps = cuda::pinned_memory_stats();
  EXPECT_GE(ps.reserved, ps.allocated);
  EXPECT_GE(ps.allocated, static_cast<int64_t>(p.nbytes() + back.nbytes()));
}

TEST(CudaPinned, APinnedBlockIsNotReusedWhileACopyReadsIt) {
  FORGE_SKIP_WITHOUT_GPU();
  cuda::synchronize(0);
  cuda::empty_pinned_cache();
  const int64_t n = 4 * MiB;  // 16 MiB of f32: a pinned segment of its own
  const Tensor threes = full({n}, 3.0);
  cuda::Stream side = cuda::Stream::create(0);
  Gate gate;
  GateCloser closer{gate, side};
  Tensor g;
  void* pinned_block = nullptr;
  {
    cuda::StreamGuard guard(side);
    Tensor p = threes.pin_memory();
    pinned_block = p.data_ptr();
    gate.close_on(side);
    g = p.to(kGpu, /*non_blocking=*/true);  // queued behind the gate: not copied yet
  }  // p's last handle is gone while its copy is in flight
  Tensor q = full({n}, 5.0).pin_memory();
  EXPECT_NE(q.data_ptr(), pinned_block) << "a pinned block was reused while a copy may still read it";
  q.fill_(7.0);  // if q were p's memory, the copy would now read 7s
  gate.open();
  side.synchronize();
  expect_equal(g, threes, "the in-flight copy read the original values");
  Tensor r = threes.pin_memory();  // the copy completed: the block is free again
  EXPECT_EQ(r.data_ptr(), pinned_block);
}

// Note [reserving segments ahead]: the pinned memory of a snapshot's host copies reserved on
// another thread (as the trainer does during the first steps); the copies then pin nothing new and
// hold the GPU tensors' values.
TEST(CudaPinned, ReservedSegmentsServeTheHostCopiesOfASnapshot) {
  FORGE_SKIP_WITHOUT_GPU();
  cuda::synchronize(0);
  cuda::empty_pinned_cache();
  std::vector<Tensor> state;
  std::vector<size_t> bytes;
  for (int64_t n : {int64_t{3} * MiB, int64_t{1000}, int64_t{700} * 1024, int64_t{9} * MiB, int64_t{2048}}) {
    state.push_back(randn({n}, {.device = kGpu}));
    bytes.push_back(static_cast<size_t>(n) * sizeof(float));
  }
  uint64_t reserved = 0;
  std::atomic<bool> stop{false};
  std::thread t([&] { reserved = ops::reserve_host_copies(kGpu, bytes, &stop); });
  t.join();
  EXPECT_GE(reserved, static_cast<uint64_t>(3 * 4 * MiB + 9 * 4 * MiB));
  const MemoryStats before = cuda::pinned_memory_stats();
  EXPECT_EQ(before.reserved, static_cast<int64_t>(reserved));
  std::vector<Tensor> copies;
  for (const Tensor& x : state) copies.push_back(ops::host_copy(x));
  ops::wait_for_host_copies(kGpu);
  EXPECT_EQ(cuda::pinned_memory_stats().num_device_allocs, before.num_device_allocs) << "a copy pinned new memory";
  for (size_t i = 0; i < state.size(); ++i) {
    EXPECT_TRUE(copies[i].is_pinned());
    expect_equal(copies[i], state[i].to(Device::cpu()), "host copy in reserved memory");
  }
  // A stop already asked for reserves nothing.
  copies.clear();
  cuda::empty_pinned_cache();
  stop = true;
  EXPECT_EQ(ops::reserve_host_copies(kGpu, bytes, &stop), 0u);
  EXPECT_EQ(ops::reserve_host_copies(Device::cpu(), bytes, nullptr), 0u);
}

}  // namespace
}  // namespace forge
