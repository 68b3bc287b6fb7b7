#pragma once
// A device's runtime, whichever device it is: what the layers above the backends use of it
// (memory statistics, its name and bus address, points in its queue of work, the host waiting for
// them and the time between them), so that they need no `#ifdef FORGE_WITH_CUDA` (DESIGN.md,
// Layers; docs/architecture.md). The conditionals live in device_runtime.cpp.
//
// On the CPU the work a call queues is done when the call returns: an event is complete once
// recorded and its time is the host's clock. On a CUDA device an event is a CUDA event on the
// calling thread's current stream of that device (backends/cuda/stream.h). A CUDA device in a
// build without CUDA is a forge::Error at the call.
#include <memory>
#include <string>

#include "forge/core/allocator.h"
#include "forge/core/device.h"

namespace forge::runtime {

// The device's allocator: live bytes, their peak since the last reset, and (caching allocators)
// the reserved segments and the cudaMalloc/cudaFree calls. On the CPU, the host allocator's.
MemoryStats memory_stats(Device d);
void reset_peak_memory(Device d);  // peak_allocated = allocated (and peak_reserved = reserved)

// The name the driver gives the device ("NVIDIA H200"); "cpu" for the host.
std::string device_name(Device d);
// The PCI bus id of a CUDA device ("0000:3b:00.0"), by which NVML finds it; "" for the host.
std::string pci_bus_id(Device d);

// A point in a device's queue of work. Move-only; an event never recorded is complete.
class Event {
 public:
  // timing: the event can measure elapsed_ms (a CUDA event without timing costs less).
  explicit Event(bool timing = false);
  ~Event();
  Event(Event&& o) noexcept;
  Event& operator=(Event&& o) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  // The work queued so far on d's current stream (the CPU: the work done so far).
  void record(Device d);
  // The host waits until that work is done.
  void synchronize() const;
  // Milliseconds from this event to `later`, both recorded with timing on the same device and
  // complete (synchronize `later` first).
  double elapsed_ms(const Event& later) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace forge::runtime
