// The device runtime behind one interface (device_runtime.h).
#include "forge/backends/device_runtime.h"

#include <chrono>
#include <iomanip>
#include <sstream>
#include <optional>

#include "forge/core/error.h"

#ifdef FORGE_WITH_CUDA
#include "forge/backends/cuda/device_info.h"
#include <nvtx3/nvToolsExt.h>

#include "forge/backends/cuda/graph.h"
#include "forge/backends/cuda/kernel_trace.h"
#include "forge/backends/cuda/matmul.h"
#include "forge/backends/cuda/memory.h"
#include "forge/backends/cuda/stream.h"
#include "forge/backends/cuda/tensor_kernels.h"
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

bool Event::query() const {
#ifdef FORGE_WITH_CUDA
  if (impl_ && impl_->recorded && impl_->on_cuda) return impl_->cuda_event->query();
#endif
  return true;
}

void Event::block_current(Device d) const {
  if (!d.is_cuda() || !impl_ || !impl_->recorded || !impl_->on_cuda) return;
#ifdef FORGE_WITH_CUDA
  impl_->cuda_event->wait(cuda::Stream::current(static_cast<int>(d.index)));
#else
  no_cuda(d, "Event::block_current");
#endif
}

#ifdef FORGE_WITH_CUDA
struct SideStream::Impl {
  cuda::Stream stream;
  std::optional<cuda::StreamGuard> guard;
  explicit Impl(int device) : stream(cuda::Stream::create(device)) {}
};
SideStream::SideStream(Device d) : device_(d) {
  if (d.is_cuda()) impl_ = std::make_unique<Impl>(static_cast<int>(d.index));
}
SideStream::~SideStream() = default;
void SideStream::enter() {
  if (!impl_) return;
  FORGE_CHECK(!impl_->guard, "SideStream::enter: already entered");
  cuda::Event before;
  before.record(cuda::Stream::current(static_cast<int>(device_.index)));
  before.wait(impl_->stream);
  impl_->guard.emplace(impl_->stream);
}
void SideStream::leave() {
  if (impl_) impl_->guard.reset();
}
void SideStream::keep(const Tensor& t) {
  if (impl_ && t.defined() && t.device().is_cuda()) cuda::record_stream(t, impl_->stream);
}
namespace {
void CUDART_CB run_host_call(void* data) {
  std::unique_ptr<std::function<void()>> fn(static_cast<std::function<void()>*>(data));
  try {
    (*fn)();
  } catch (...) {  // (nothing may leave a CUDA host callback)
  }
}
}  // namespace
void SideStream::host_call(std::function<void()> fn) {
  if (!impl_) return fn();
  auto owned = std::make_unique<std::function<void()>>(std::move(fn));
  FORGE_CUDA_CHECK(cudaLaunchHostFunc(impl_->stream.handle(), run_host_call, owned.get()));
  owned.release();  // (run_host_call frees it)
}
#else
struct SideStream::Impl {};
SideStream::SideStream(Device d) : device_(d) {
  if (d.is_cuda()) no_cuda(d, "SideStream");
}
SideStream::~SideStream() = default;
void SideStream::enter() {}
void SideStream::leave() {}
void SideStream::keep(const Tensor&) {}
void SideStream::host_call(std::function<void()> fn) { fn(); }
#endif

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

bool graph_capture_supported(Device d, std::string* why) {
  auto say = [&](const char* reason) {
    if (why) *why = reason;
    return false;
  };
  if (!d.is_cuda()) return say("not a GPU");
#ifdef FORGE_WITH_CUDA
  if (!cuda::caching_allocator_enabled())
    return say("FORGE_CUDA_ALLOC=plain frees memory with cudaFree, which a capture cannot");
  return true;
#else
  return say("this forge was built without CUDA");
#endif
}

void empty_cache(Device d) {
  if (!d.is_cuda()) return;
#ifdef FORGE_WITH_CUDA
  cuda::empty_cache(static_cast<int>(d.index));
#else
  no_cuda(d, "empty_cache");
#endif
}

void synchronize(Device d) {
  if (!d.is_cuda()) return;
#ifdef FORGE_WITH_CUDA
  cuda::synchronize(static_cast<int>(d.index));
#else
  no_cuda(d, "synchronize");
#endif
}

#ifdef FORGE_WITH_CUDA
struct StepGraph::Impl {
  cuda::Stream stream;
  std::optional<cuda::StreamGuard> guard;
  cuda::CudaGraph graph;
  explicit Impl(int device) : stream(cuda::Stream::create(device)) {}
};

StepGraph::StepGraph(Device d) {
  FORGE_CHECK(d.is_cuda(), "StepGraph: ", d.str(), " is not a GPU; graphs capture CUDA work");
  const int index = static_cast<int>(d.index);
  impl_ = std::make_unique<Impl>(index);
  // The new stream does not wait for the legacy stream's work (a model's upload, a broadcast):
  // wait for it here, once.
  cuda::synchronize(index);
  impl_->guard.emplace(impl_->stream);
}

StepGraph::~StepGraph() {
  try {
    impl_->stream.synchronize();
  } catch (...) {
  }
  impl_->guard.reset();  // the previous current stream again; the graph and its pool go with impl_
}

void StepGraph::capture_begin() { impl_->graph.capture_begin(impl_->stream); }
void StepGraph::capture_end() { impl_->graph.capture_end(); }
void StepGraph::capture_abort() noexcept { impl_->graph.capture_abort(); }
void StepGraph::replay() { impl_->graph.replay(); }
bool StepGraph::captured() const { return impl_->graph.captured(); }
size_t StepGraph::num_nodes() const { return impl_->graph.num_nodes(); }
#else
struct StepGraph::Impl {};
StepGraph::StepGraph(Device d) {
  FORGE_CHECK(d.is_cuda(), "StepGraph: ", d.str(), " is not a GPU; graphs capture CUDA work");
  no_cuda(d, "StepGraph");
}
StepGraph::~StepGraph() = default;
void StepGraph::capture_begin() {}
void StepGraph::capture_end() {}
void StepGraph::capture_abort() noexcept {}
void StepGraph::replay() {}
bool StepGraph::captured() const { return false; }
size_t StepGraph::num_nodes() const { return 0; }
#endif

void range_push(const char* name) {
#ifdef FORGE_WITH_CUDA
  nvtxRangePushA(name);
#else
  (void)name;
#endif
}

void range_pop() {
#ifdef FORGE_WITH_CUDA
  nvtxRangePop();
#endif
}

void mark(const char* name) {
#ifdef FORGE_WITH_CUDA
  nvtxMarkA(name);
#else
  (void)name;
#endif
}

struct KernelTrace::Impl {
  bool cuda = false;
  std::vector<KernelRecord> records;
  std::string note;
#ifdef FORGE_WITH_CUDA
  cuda::KernelTrace trace;
#endif
};

KernelTrace::KernelTrace(Device d) : impl_(std::make_unique<Impl>()) { impl_->cuda = d.is_cuda(); }
KernelTrace::~KernelTrace() = default;

bool KernelTrace::start() {
  if (!impl_->cuda) {
    impl_->note = "not a GPU";
    return false;
  }
#ifdef FORGE_WITH_CUDA
  const bool on = impl_->trace.start();
  impl_->note = impl_->trace.note();
  return on;
#else
  impl_->note = "this forge was built without CUDA";
  return false;
#endif
}

void KernelTrace::stop() {
#ifdef FORGE_WITH_CUDA
  if (!impl_->cuda) return;
  impl_->trace.stop();
  impl_->note = impl_->trace.note();
  impl_->records.clear();
  for (const cuda::KernelRecord& r : impl_->trace.records())
    impl_->records.push_back({r.name, r.start_ns, r.end_ns, r.device, r.stream});
#endif
}

uint64_t KernelTrace::now_ns() const {
#ifdef FORGE_WITH_CUDA
  if (impl_->cuda) return impl_->trace.now_ns();
#endif
  return 0;
}

const std::vector<KernelRecord>& KernelTrace::records() const { return impl_->records; }
const std::string& KernelTrace::note() const { return impl_->note; }

std::string gemm_tuning_report(Device d, const std::string& mode) {
  if (!d.is_cuda()) return "";
#ifdef FORGE_WITH_CUDA
  const cuda::GemmTuningStats g = cuda::gemm_tuning_stats();
  std::ostringstream log;
  log << "gemm: run.gemm_tuning = " << mode;
  if (mode == "cached")
    log << ": " << g.tuned << " shapes tuned in " << std::fixed << std::setprecision(2) << g.tuning_ms / 1e3 << " s ("
        << g.changed << " faster than cuBLASLt's first choice), " << g.loaded << " from the tuning cache";
  if (g.graph_timed + g.graph_refused > 0)  // Note [GEMM timing in CUDA graphs] (FORGE_GEMM_TUNE_IN_GRAPH)
    log << "; timed as CUDA graphs: " << g.graph_timed << " (" << g.graph_refused
        << " could not be captured), with a workspace memset in " << g.memset_first << " first choices and "
        << g.memset_chosen << " chosen";
  log << "; " << g.fallback_shapes << " shapes without a cuBLASLt algorithm";
  return log.str();
#else
  (void)mode;
  no_cuda(d, "gemm_tuning_report");
#endif
}

}  // namespace forge::runtime
