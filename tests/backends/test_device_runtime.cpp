// The device runtime interface (backends/device_runtime.h) on the CPU: memory statistics follow
// the host allocator, events are complete once recorded and time the host's clock, and misuse is
// an error. tests/backends/cuda/test_cuda_device_runtime.cpp checks the same calls on a GPU.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "forge/backends/device_runtime.h"
#include "forge/core/error.h"
#include "forge/ops/creation.h"

namespace forge {
namespace {

TEST(DeviceRuntime, CpuMemoryStatsAreTheHostAllocators) {
  runtime::reset_peak_memory(Device::cpu());
  const MemoryStats before = runtime::memory_stats(Device::cpu());
  EXPECT_EQ(before.peak_allocated, before.allocated);
  {
    const Tensor t = zeros({1 << 20}, {.dtype = DType::f32, .device = Device::cpu()});  // 4 MiB
    const MemoryStats during = runtime::memory_stats(Device::cpu());
    EXPECT_EQ(during.allocated - before.allocated, int64_t{4} << 20);
    EXPECT_EQ(during.allocated, cpu_memory_stats().allocated);
  }
  const MemoryStats after = runtime::memory_stats(Device::cpu());
  EXPECT_EQ(after.allocated, before.allocated);
  EXPECT_GE(after.peak_allocated, before.allocated + (int64_t{4} << 20));
  runtime::reset_peak_memory(Device::cpu());
  EXPECT_EQ(runtime::memory_stats(Device::cpu()).peak_allocated, after.allocated);
}

TEST(DeviceRuntime, CpuEventsTimeTheHostClock) {
  runtime::Event a(/*timing=*/true), b(/*timing=*/true);
  a.record(Device::cpu());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  b.record(Device::cpu());
  b.synchronize();  // complete: returns at once
  const double ms = a.elapsed_ms(b);
  EXPECT_GE(ms, 19.0);
  EXPECT_LT(ms, 5000.0);
  EXPECT_LE(b.elapsed_ms(a), -19.0);
}

TEST(DeviceRuntime, AnEventNeverRecordedIsComplete) {
  runtime::Event e;
  e.synchronize();
  runtime::Event moved = std::move(e);
  moved.synchronize();
  e.record(Device::cpu());  // a moved-from event records anew
  e.synchronize();
}

TEST(DeviceRuntime, ElapsedNeedsTimingAndRecordedEvents) {
  runtime::Event plain, timed(true), never(true);
  plain.record(Device::cpu());
  timed.record(Device::cpu());
  EXPECT_THROW(plain.elapsed_ms(timed), Error);
  EXPECT_THROW(timed.elapsed_ms(never), Error);
}

TEST(DeviceRuntime, CpuNames) {
  EXPECT_EQ(runtime::device_name(Device::cpu()), "cpu");
  EXPECT_EQ(runtime::pci_bus_id(Device::cpu()), "");
}

#ifndef FORGE_WITH_CUDA
TEST(DeviceRuntime, ACudaDeviceWithoutCudaIsAnErrorThatSaysSo) {
  try {
    runtime::memory_stats(Device::cuda(0));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("built without CUDA"), std::string::npos) << e.what();
  }
  runtime::Event e;
  EXPECT_THROW(e.record(Device::cuda(0)), Error);
}
#endif

}  // namespace
}  // namespace forge
