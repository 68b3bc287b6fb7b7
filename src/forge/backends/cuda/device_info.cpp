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
  char bus_id[64] = {};
  if (cudaDeviceGetPCIBusId(bus_id, static_cast<int>(sizeof(bus_id)), device) == cudaSuccess) out.pci_bus_id = bus_id;
  else (void)cudaGetLastError();
  return out;
}

int driver_version() {
  int v = 0;
  if (cudaDriverGetVersion(&v) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return v;
}

int runtime_version() {
  int v = 0;
  if (cudaRuntimeGetVersion(&v) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return v;
}

}  // namespace forge::cuda
