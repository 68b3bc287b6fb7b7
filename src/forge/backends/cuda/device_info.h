#pragma once
// What the CUDA runtime says about a device (plain C++: no CUDA headers), for the trainer's
// MFU, `forge info` and `forge bench`.
//
//   auto p = forge::cuda::device_properties(0);   // p.name == "NVIDIA H100 80GB HBM3", p.sm_count == 132
#include <cstdint>
#include <string>

namespace forge::cuda {

struct DeviceProperties {
  std::string name;            // as the driver reports it
  int major = 0, minor = 0;    // compute capability
  int sm_count = 0;            // streaming multiprocessors
  int64_t total_memory = 0;    // bytes
  int clock_khz = 0;           // peak SM clock (cudaDevAttrClockRate)
  int memory_clock_khz = 0;    // peak memory clock (cudaDevAttrMemoryClockRate)
  int memory_bus_bits = 0;     // global memory bus width
  int l2_bytes = 0;
  int64_t shared_per_block_optin = 0;  // bytes a block may opt in to
  std::string pci_bus_id;      // "0000:3b:00.0" (cudaDeviceGetPCIBusId), to find the device in NVML
};

// Throws forge::Error for an index that is not a visible device.
DeviceProperties device_properties(int device);

// cudaDriverGetVersion / cudaRuntimeGetVersion as 1000*major + 10*minor (12040 = 12.4);
// 0 when there is no driver (or the call fails). Never throw.
int driver_version();
int runtime_version();

}  // namespace forge::cuda
