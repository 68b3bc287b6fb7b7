// The device runtime interface (backends/device_runtime.h) on a GPU: the same figures as the CUDA
// backend's own calls, and events that wait for and time the device's work, not the host's.
// Without a GPU every test reports SKIPPED (never passed): CTest's label is `cuda`.
#include <gtest/gtest.h>

#include <cmath>

#include "backends/cuda/cuda_testing.h"
#include "forge/backends/cuda/device_info.h"
#include "forge/backends/cuda/memory.h"
#include "forge/backends/device_runtime.h"
#include "forge/ops/creation.h"
#include "forge/ops/matmul.h"

namespace forge {
namespace {

using namespace cuda_testing;

TEST(CudaDeviceRuntime, MemoryStatsAndNamesAreTheBackendsOwn) {
  FORGE_SKIP_WITHOUT_GPU();
  const Tensor t = zeros({1 << 20}, {.dtype = DType::f32, .device = kGpu});
  const MemoryStats a = runtime::memory_stats(kGpu), b = cuda::memory_stats(0);
  EXPECT_EQ(a.allocated, b.allocated);
  EXPECT_EQ(a.reserved, b.reserved);
  EXPECT_GE(a.allocated, int64_t{4} << 20);
  runtime::reset_peak_memory(kGpu);
  EXPECT_EQ(cuda::memory_stats(0).peak_allocated, cuda::memory_stats(0).allocated);
  EXPECT_EQ(runtime::device_name(kGpu), cuda::device_properties(0).name);
  EXPECT_EQ(runtime::pci_bus_id(kGpu), cuda::device_properties(0).pci_bus_id);
  EXPECT_FALSE(runtime::pci_bus_id(kGpu).empty());
}

TEST(CudaDeviceRuntime, EventsTimeTheDevicesWork) {
  FORGE_SKIP_WITHOUT_GPU();
  const Tensor x = host_input({2048, 2048}, Domain::real, DType::f32, 11).to(kGpu);
  (void)ops::matmul(x, x);  // warm-up (handles, plans)
  runtime::Event a(true), b(true), c(true);
  a.record(kGpu);
  b.record(kGpu);  // nothing between a and b
  Tensor y;
  for (int i = 0; i < 20; ++i) y = ops::matmul(x, x);  // 20 x 17 GFLOP between b and c
  c.record(kGpu);
  c.synchronize();
  const double empty = a.elapsed_ms(b), work = b.elapsed_ms(c);
  EXPECT_GE(empty, 0.0);
  EXPECT_GT(work, empty);
  EXPECT_GT(work, 0.01);  // the device's time for the GEMMs, not the host's for queueing them
  EXPECT_TRUE(std::isfinite(y.to(Device::cpu()).sum().item<double>()));
}

}  // namespace
}  // namespace forge
