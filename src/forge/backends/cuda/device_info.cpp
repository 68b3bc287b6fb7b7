// Device properties from the CUDA runtime (contract in device_info.h).
#include "forge/backends/cuda/device_info.h"

#include "forge/backends/cuda/runtime.h"

namespace forge::cuda {

DeviceProperties device_properties(int device) {
  check_device(device, "cuda::device_properties");
  cudaDeviceProp p{};
  FORGE_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  DeviceProperties out;
  out.name = p.name;
  out.major = p.major;
  out.minor = p.minor;
  out.sm_count = p.multiProcessorCount;
  out.total_memory = static_cast<int64_t>(p.totalGlobalMem);
  // CUDA 13 dropped the clock fields from cudaDeviceProp: ask for the attributes.
  FORGE_CUDA_CHECK(cudaDeviceGetAttribute(&out.clock_khz, cudaDevAttrClockRate, device));
  FORGE_CUDA_CHECK(cudaDeviceGetAttribute(&out.memory_clock_khz, cudaDevAttrMemoryClockRate, device));
  FORGE_CUDA_CHECK(cudaDeviceGetAttribute(&out.memory_bus_bits, cudaDevAttrGlobalMemoryBusWidth, device));
  out.l2_bytes = p.l2CacheSize;
  out.shared_per_block_optin = static_cast<int64_t>(p.sharedMemPerBlockOptin);
  return out;
}

}  // namespace forge::cuda
