// Streams, events and the per-thread current stream (stream.h). Host code only.
#include "forge/backends/cuda/stream.h"

#include <algorithm>
#include <utility>

#include "forge/backends/cuda/tensor_kernels.h"

namespace forge::cuda {
namespace {

// This thread's current stream per device; zero-initialised, i.e. the legacy default
// stream. A plain array, so reading it needs no thread_local initialisation guard.
constexpr int kMaxDevices = 64;
thread_local cudaStream_t t_current[kMaxDevices];

[[noreturn]] void throw_bad_device(int device, const char* op) {
  check_device(device, op);  // throws for a device that is not visible
  FORGE_THROW(op, ": forge supports at most ", kMaxDevices, " CUDA devices per process (device ", device, ")");
}

cudaStream_t& current_slot(int device, const char* op) {
  if (static_cast<unsigned>(device) >= static_cast<unsigned>(kMaxDevices) || device >= device_count())
    throw_bad_device(device, op);
  return t_current[device];
}

}  // namespace

cudaStream_t current_stream(int device) {
  if (static_cast<unsigned>(device) >= static_cast<unsigned>(kMaxDevices)) [[unlikely]]
    throw_bad_device(device, "current_stream");
  return t_current[device];
}

// ---- Stream ---------------------------------------------------------------------------

Stream Stream::legacy(int device) {
  check_device(device, "Stream::legacy");
  return Stream(device, nullptr, nullptr);
}

Stream Stream::create(int device, int priority) {
  check_device(device, "Stream::create");
  DeviceGuard guard(device);
  int least = 0, greatest = 0;
  FORGE_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  priority = std::clamp(priority, greatest, least);  // greatest is the lowest number
  cudaStream_t s = nullptr;
  FORGE_CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, priority));
  // Destroyed with its last handle, after its work: a later stream may get the same handle
  // value, and blocks the allocator cached for this one must not be reused while it runs.
  std::shared_ptr<void> owner(static_cast<void*>(s), [device](void* p) {
    auto stream = static_cast<cudaStream_t>(p);
    if (cudaStreamSynchronize(stream) != cudaSuccess) (void)cudaGetLastError();
    forget_stream(device, stream);
    if (cudaStreamDestroy(stream) != cudaSuccess) (void)cudaGetLastError();
  });
  return Stream(device, s, std::move(owner));
}

Stream Stream::current(int device) {
  cudaStream_t s = current_slot(device, "Stream::current");
  return Stream(device, s, nullptr);
}

void Stream::synchronize() const {
  DeviceGuard guard(device_);  // the legacy stream (nullptr) means the current device's
  FORGE_CUDA_CHECK(cudaStreamSynchronize(handle_));
}

bool Stream::query() const {
  DeviceGuard guard(device_);
  const cudaError_t err = cudaStreamQuery(handle_);
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();  // not an error: work is still queued
    return false;
  }
  FORGE_CUDA_CHECK(err);
  return true;
}

void Stream::wait(const Event& e) const {
  if (!e.recorded()) return;
  DeviceGuard guard(device_);
  FORGE_CUDA_CHECK(cudaStreamWaitEvent(handle_, e.handle(), 0));
}

// ---- StreamGuard ----------------------------------------------------------------------

StreamGuard::StreamGuard(const Stream& stream) : stream_(stream) {
  cudaStream_t& slot = current_slot(stream_.device(), "StreamGuard");
  previous_ = slot;
  slot = stream_.handle();
}

StreamGuard::~StreamGuard() { t_current[stream_.device()] = previous_; }

// ---- Event ----------------------------------------------------------------------------

Event::~Event() {
  if (event_ != nullptr && cudaEventDestroy(event_) != cudaSuccess) (void)cudaGetLastError();
}

Event::Event(Event&& o) noexcept
    : event_(std::exchange(o.event_, nullptr)), device_(std::exchange(o.device_, -1)), timing_(o.timing_) {}

Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    if (event_ != nullptr && cudaEventDestroy(event_) != cudaSuccess) (void)cudaGetLastError();
    event_ = std::exchange(o.event_, nullptr);
    device_ = std::exchange(o.device_, -1);
    timing_ = o.timing_;
  }
  return *this;
}

void Event::record(const Stream& stream) {
  DeviceGuard guard(stream.device());
  if (event_ == nullptr) {
    FORGE_CUDA_CHECK(cudaEventCreateWithFlags(&event_, timing_ ? cudaEventDefault : cudaEventDisableTiming));
    device_ = stream.device();
  }
  FORGE_CHECK(stream.device() == device_, "Event::record: the event belongs to cuda:", device_,
              " but the stream is on cuda:", stream.device());
  FORGE_CUDA_CHECK(cudaEventRecord(event_, stream.handle()));
}

void Event::wait(const Stream& stream) const { stream.wait(*this); }

bool Event::query() const {
  if (event_ == nullptr) return true;
  const cudaError_t err = cudaEventQuery(event_);
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  FORGE_CUDA_CHECK(err);
  return true;
}

void Event::synchronize() const {
  if (event_ != nullptr) FORGE_CUDA_CHECK(cudaEventSynchronize(event_));
}

float Event::elapsed_ms(const Event& end) const {
  FORGE_CHECK(timing_ && end.timing_, "Event::elapsed_ms: both events need enable_timing = true");
  FORGE_CHECK(recorded() && end.recorded(), "Event::elapsed_ms: both events must have been recorded");
  float ms = 0;
  FORGE_CUDA_CHECK(cudaEventElapsedTime(&ms, event_, end.event_));
  return ms;
}

}  // namespace forge::cuda
