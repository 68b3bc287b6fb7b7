#pragma once
// The kernels and timers of `forge bench memory` and `forge bench burn` (docs/bench.md). Plain
// C++ (no CUDA headers), so src/forge/bench/*.cpp can include it under FORGE_WITH_CUDA.
// Everything runs on the current stream of the tensors' device.
//
//   cuda::EventMarks ev(0);
//   ev.mark(); cuda::bench_copy_kernel(src, dst); ev.mark();
//   ev.synchronize();  double ms = ev.ms(0, 1);
#include <cstddef>
#include <cstdint>
#include <memory>

#include "forge/core/tensor.h"

namespace forge::cuda {

// dst = src byte for byte with a grid-stride kernel moving 16 bytes per load and store (4
// independent loads in flight per thread); a byte loop for a pointer not 16-byte aligned and
// for the tail. Both contiguous, on one device, the same nbytes.
void bench_copy_kernel(const Tensor& src, Tensor& dst);
// The same copy as cudaMemcpyAsync(device to device).
void bench_copy_memcpy(const Tensor& src, Tensor& dst);
// cudaMemcpyAsync between host memory (pageable or pinned) and a contiguous device tensor.
void bench_copy_to_device(const void* host, Tensor& dst, size_t bytes);
void bench_copy_to_host(const Tensor& src, void* host, size_t bytes);
// Turns on peer access from `device` to `peer` when the GPUs can (cudaDeviceCanAccessPeer);
// returns whether they can. Idempotent.
bool bench_enable_peer_access(int device, int peer);
// cudaMemcpyPeerAsync from src's device to dst's device, on the source device's current stream.
void bench_copy_peer(const Tensor& src, Tensor& dst);

// counter[0] += the number of 32-bit words in which a and b differ (bitwise; a trailing
// partial word counts as one word). a, b contiguous with the same nbytes on one device;
// counter an i64 tensor of 1 element on that device.
void bench_count_mismatches(const Tensor& a, const Tensor& b, Tensor& counter);
// Flips the lowest bit of byte `byte_index` of t (contiguous): the test hook of bench burn.
void bench_flip_bit(Tensor& t, int64_t byte_index);

// Timing events recorded on the current stream of `device` (cudaEvent with timing), for
// benchmarks that time several spans of one run (forward, then backward).
class EventMarks {
 public:
  explicit EventMarks(int device);
  ~EventMarks();
  EventMarks(const EventMarks&) = delete;
  EventMarks& operator=(const EventMarks&) = delete;
  // Records the next event (index size() before the call).
  void mark();
  int size() const;
  // Blocks the host until the last marked event has completed.
  void synchronize() const;
  // Milliseconds between marks i and j (i < j), after synchronize().
  double ms(int i, int j) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace forge::cuda
