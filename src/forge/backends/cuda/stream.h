#pragma once
// CUDA streams and events, the per-thread current stream, and record_stream.
//
//   cuda::Stream comm = cuda::Stream::create(0);        // a non-blocking stream on cuda:0
//   cuda::Event ready;
//   ready.record(cuda::Stream::current(0));              // after the gradients are computed
//   {
//     cuda::StreamGuard g(comm);                         // kernels and copies of this scope
//     ready.wait(comm);                                  //   run on `comm`, after `ready`
//     cuda::record_stream(grads, comm);                  // grads were allocated on the default stream
//     ... all-reduce grads ...
//   }
//
// Internal to backends/cuda/ and parallel/ (it includes the CUDA runtime headers).
//
// The default current stream of every device is its legacy default stream (nullptr), as
// in PyTorch: every launch and copy is ordered with every other on the device, including
// plain cudaMemcpy and libraries that were not handed a stream, at no cost for a program
// that uses one stream. Streams made by Stream::create are non-blocking (they do not
// synchronise with the legacy stream), so work on them overlaps with the default stream's
// and is ordered only by events: Event::record on the producer's stream, Event::wait on
// the consumer's.
//
// Note [stream safety]: memory belongs to the stream that was current when it was
// allocated (Note [caching allocator], core/block_pool.h). A tensor read or written by
// work on another stream must be (a) made ready for it with an event (the other stream
// waits for the producer), and (b) announced with record_stream(t, other) before its last
// handle goes away, or the allocator may hand its memory to a new tensor while the other
// stream still uses it.
#include <cuda_runtime_api.h>

#include <memory>

#include "forge/backends/cuda/runtime.h"
#include "forge/core/tensor.h"

namespace forge::cuda {

class Event;

// A handle to a CUDA stream of one device. Copies share the stream; a stream made by
// create() is destroyed with its last handle, after its queued work has completed.
class Stream {
 public:
  // The legacy default stream of `device` (forge's default current stream).
  static Stream legacy(int device);
  // A new non-blocking stream on `device`; priority: 0 is the default, lower is higher
  // (cudaDeviceGetStreamPriorityRange), clamped to the device's range.
  static Stream create(int device, int priority = 0);
  // This thread's current stream of `device` (not owning: it is kept alive by whoever
  // made it current, a StreamGuard).
  static Stream current(int device);

  cudaStream_t handle() const { return handle_; }
  int device() const { return device_; }
  bool is_legacy() const { return handle_ == nullptr; }
  // Blocks the host until every piece of work queued so far on the stream has completed.
  void synchronize() const;
  // True when every piece of work queued so far has completed (never blocks).
  bool query() const;
  // Work queued on this stream from now on waits until `e` has completed.
  void wait(const Event& e) const;

  friend bool operator==(const Stream& a, const Stream& b) { return a.handle_ == b.handle_ && a.device_ == b.device_; }
  friend bool operator!=(const Stream& a, const Stream& b) { return !(a == b); }

 private:
  Stream(int device, cudaStream_t handle, std::shared_ptr<void> owner)
      : device_(device), handle_(handle), owner_(std::move(owner)) {}
  int device_ = 0;
  cudaStream_t handle_ = nullptr;
  std::shared_ptr<void> owner_;  // destroys an owned stream (after synchronising it)
};

// Makes `stream` this thread's current stream of its device for the guard's lifetime (it
// does not change the current device: every kernel entry sets that with a DeviceGuard).
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream stream_;  // keeps an owned stream alive while it is current
  cudaStream_t previous_ = nullptr;
};

// A CUDA event. Created on the device of the first stream it is recorded on; an event
// that was never recorded counts as completed.
class Event {
 public:
  explicit Event(bool enable_timing = false) : timing_(enable_timing) {}
  ~Event();
  Event(Event&& o) noexcept;
  Event& operator=(Event&& o) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  // Captures the work queued so far on `stream` (its device must be the event's device).
  void record(const Stream& stream);
  // Work queued on `stream` from now on waits for this event (any device's stream).
  void wait(const Stream& stream) const;
  bool query() const;         // completed? (never blocks)
  void synchronize() const;   // blocks the host until completed
  // Milliseconds from this event to `end`; both recorded with enable_timing and completed.
  float elapsed_ms(const Event& end) const;

  bool recorded() const { return event_ != nullptr; }
  cudaEvent_t handle() const { return event_; }
  int device() const { return device_; }

 private:
  cudaEvent_t event_ = nullptr;
  int device_ = -1;
  bool timing_ = false;
};

// The memory of `t` (a CUDA tensor) is used by work queued on `stream`, which is not the
// stream it was allocated on: the caching allocator will not reuse it before that work is
// done (Note [stream safety]). `stream` must be on t's device. A no-op for the tensor's own
// stream and with FORGE_CUDA_ALLOC=plain (cudaFree waits for the device).
void record_stream(const Tensor& t, const Stream& stream);
// Called when a stream made by Stream::create is destroyed (after synchronising it): the caching
// allocator drops its record_stream uses of that stream. A tensor used on a communication stream
// may outlive the stream (a process group destroyed before the model whose weights it
// broadcast); freeing it must not record an event on a destroyed stream.
void forget_stream(int device, cudaStream_t stream) noexcept;

}  // namespace forge::cuda
