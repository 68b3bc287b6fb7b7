// The device runtime behind one interface (device_runtime.h).
#include "forge/backends/device_runtime.h"

#include <chrono>
#include <optional>

#include "forge/core/error.h"

#ifdef FORGE_WITH_CUDA
#include "forge/backends/cuda/device_info.h"
#include "forge/backends/cuda/memory.h"
#include "forge/backends/cuda/stream.h"
#endif

namespace forge::runtime {

#ifndef FORGE_WITH_CUDA
namespace {
[[noreturn]] void no_cuda(Device d, const char* what) {
  FORGE_THROW(what, ": ", d.str(), " is a CUDA device and this forge was built without CUDA (FORGE_CUDA=ON builds it)");
}
}  // namespace
#endif

MemoryStats memory_stats(Device d) {
  if (d.is_cuda()) {
#ifdef FORGE_WITH_CUDA
    return cuda::memory_stats(static_cast<int>(d.index));
#else
    no_cuda(d, "memory_stats");
#endif
  }
  return cpu_memory_stats();
}

void reset_peak_memory(Device d) {
  if (d.is_cuda()) {
#ifdef FORGE_WITH_CUDA
    return cuda::reset_peak_memory_stats(static_cast<int>(d.index));
#else
    no_cuda(d, "reset_peak_memory");
#endif
  }
  reset_cpu_peak_memory();
}

std::string device_name(Device d) {
  if (d.is_cuda()) {
#ifdef FORGE_WITH_CUDA
    return cuda::device_properties(static_cast<int>(d.index)).name;
#else
    no_cuda(d, "device_name");
#endif
  }
  return d.is_cpu() ? "cpu" : d.str();
}

std::string pci_bus_id(Device d) {
  if (d.is_cuda()) {
#ifdef FORGE_WITH_CUDA
    return cuda::device_properties(static_cast<int>(d.index)).pci_bus_id;
#else
    no_cuda(d, "pci_bus_id");
#endif
  }
  return {};
}

struct Event::Impl {
  bool timing = false;
  bool recorded = false;
  bool on_cuda = false;
  std::chrono::steady_clock::time_point host_time;  // the CPU's events
#ifdef FORGE_WITH_CUDA
  std::optional<cuda::Event> cuda_event;
#endif
};

Event::Event(bool timing) : impl_(std::make_unique<Impl>()) { impl_->timing = timing; }
Event::~Event() = default;
Event::Event(Event&& o) noexcept = default;
Event& Event::operator=(Event&& o) noexcept = default;

void Event::record(Device d) {
  if (!impl_) impl_ = std::make_unique<Impl>();  // (a moved-from event records anew)
  impl_->recorded = true;
  impl_->on_cuda = d.is_cuda();
  if (d.is_cuda()) {
#ifdef FORGE_WITH_CUDA
    if (!impl_->cuda_event) impl_->cuda_event.emplace(impl_->timing);
    impl_->cuda_event->record(cuda::Stream::current(static_cast<int>(d.index)));
    return;
#else
    no_cuda(d, "Event::record");
#endif
  }
  impl_->host_time = std::chrono::steady_clock::now();
}

void Event::synchronize() const {
#ifdef FORGE_WITH_CUDA
  if (impl_ && impl_->recorded && impl_->on_cuda) impl_->cuda_event->synchronize();
#endif
}

double Event::elapsed_ms(const Event& later) const {
  FORGE_CHECK(impl_ && later.impl_, "Event::elapsed_ms: a moved-from event");
  FORGE_CHECK(impl_->timing && later.impl_->timing, "Event::elapsed_ms: both events need timing (Event(true))");
  FORGE_CHECK(impl_->recorded && later.impl_->recorded, "Event::elapsed_ms: an event was never recorded");
  FORGE_CHECK(impl_->on_cuda == later.impl_->on_cuda, "Event::elapsed_ms: the events were recorded on different devices");
#ifdef FORGE_WITH_CUDA
  if (impl_->on_cuda) return impl_->cuda_event->elapsed_ms(*later.impl_->cuda_event);
#endif
  return std::chrono::duration<double, std::milli>(later.impl_->host_time - impl_->host_time).count();
}

}  // namespace forge::runtime
