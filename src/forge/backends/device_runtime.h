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
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "forge/core/allocator.h"
#include "forge/core/device.h"
#include "forge/core/tensor.h"

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
  // Whether that work is done (never blocks; an event never recorded is).
  bool query() const;
  // Work queued from now on on d's current stream waits for that work (a stream wait, not a
  // host one; nothing on the CPU).
  void block_current(Device d) const;
  // Milliseconds from this event to `later`, both recorded with timing on the same device and
  // complete (synchronize `later` first).
  double elapsed_ms(const Event& later) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A queue of work beside the thread's current stream of a device: a stream of its own on a CUDA
// device. Between enter() and leave() the work this thread queues on `d` goes there, after all
// work queued on the previous current stream before enter(); record an Event inside to mark a
// point of it, and block_current() that event to join it back. On the CPU (work is done when
// queued) every call is a no-op. For collectives chained on the host's side of a process group
// (parallel/hierarchical_group.h) without stalling the compute stream.
class SideStream {
 public:
  explicit SideStream(Device d);
  ~SideStream();
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;
  void enter();
  void leave();
  // `t` (allocated on another stream) is read or written by work queued here: the caching
  // allocator keeps its memory until that work is done (Note [stream safety] in
  // backends/cuda/stream.h).
  void keep(const Tensor& t);
  // Queues `fn` on the side stream: the host runs it (on the driver's callback thread) when the
  // work queued there before has completed, and the work queued after waits for it to return. It
  // must not call the device runtime. On the CPU it runs now. Not inside a CUDA graph capture.
  void host_call(std::function<void()> fn);
  Device device() const { return device_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  Device device_;
};

// Whether work on `d` can be captured into a graph (StepGraph): a CUDA device whose allocator is
// the caching one (a plain allocator frees with cudaFree, which a capture cannot). `why` gets the
// reason when not. The CPU: false ("not a GPU").
bool graph_capture_supported(Device d, std::string* why = nullptr);
// Hands the allocator's cached free blocks of `d` back to the device (no-op on the CPU).
void empty_cache(Device d);
// The host waits for all work queued on `d` (no-op on the CPU).
void synchronize(Device d);

// Named ranges and instants on a profiler's timeline (NVTX in a CUDA build, which Nsight Systems
// shows; no-ops otherwise). Host-side: they nest per thread, whatever the device.
void range_push(const char* name);
void range_pop();
void mark(const char* name);

// The kernels a device ran over a stretch of a run (CUPTI's activity records on a CUDA device,
// loaded at run time: backends/cuda/kernel_trace.h). One at a time in a process.
struct KernelRecord {
  std::string name;  // demangled
  uint64_t start_ns = 0, end_ns = 0;  // the trace's clock (now_ns)
  uint32_t device = 0, stream = 0;
};
class KernelTrace {
 public:
  explicit KernelTrace(Device d);
  ~KernelTrace();
  KernelTrace(const KernelTrace&) = delete;
  KernelTrace& operator=(const KernelTrace&) = delete;
  // Starts recording; false (note() says why) when it cannot: the CPU, a build without CUDA, no
  // CUPTI, another profiler collecting.
  bool start();
  // Waits for the device, flushes the records and stops (after a successful start; else nothing).
  void stop();
  uint64_t now_ns() const;  // the trace's clock now (0 when not started)
  const std::vector<KernelRecord>& records() const;
  const std::string& note() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One line on the GEMM algorithm tuning of this process so far (Note [GEMM algorithm tuning] in
// backends/cuda/blaslt.h): shapes tuned and in what time, from the cache, timed as graphs, without
// an algorithm; `mode` is run.gemm_tuning. "" on the CPU.
std::string gemm_tuning_report(Device d, const std::string& mode);

// Work captured once and replayed as one launch (CUDA graphs; Note [the step as a CUDA graph] in
// train/graphed_step.h). Made on a CUDA device: a stream of its own becomes the thread's current
// stream of that device (after waiting for the work queued before, once) until the StepGraph is
// destroyed, which waits for the last replay and restores the previous stream. The capture's
// allocations come from the graph's private pool. On the CPU or without CUDA: a forge::Error.
class StepGraph {
 public:
  explicit StepGraph(Device d);
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // Capture the work this thread queues on the graph's stream (once); end instantiates it, abort
  // discards it after an exception (never throws).
  void capture_begin();
  void capture_end();
  void capture_abort() noexcept;
  // Launches the captured graph on its stream.
  void replay();
  bool captured() const;
  size_t num_nodes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace forge::runtime
