#pragma once
// The CUDA runtime as the rest of backends/cuda/ sees it: error checking, the device
// guard, the stream kernels run on, and cached device properties. Streams, events and
// stream guards are in stream.h; the allocators in memory.h and pinned.h (docs/cuda.md).
//
// Internal to backends/cuda/ (it includes the CUDA runtime headers); the ops layer and
// user code see only the plain C++ declarations of tensor_kernels.h, elementwise.h and
// memory.h.
//
// Note [CUDA errors]: every runtime call goes through FORGE_CUDA_CHECK, which throws a
// forge::Error naming the CUDA error, the expression and file:line. Every kernel launch
// is followed by FORGE_CUDA_LAUNCH_CHECK(parts...), whose message names the op and the
// shapes (the parts are only formatted when there is an error). A kernel that faults
// while running reports at the next synchronising call (a copy to the host, synchronize());
// run with CUDA_LAUNCH_BLOCKING=1 to make every launch synchronous and pin the fault on it.
#include <cuda_runtime_api.h>

#include <string>

#include "forge/core/error.h"
#include "forge/core/tensor.h"

namespace forge::cuda {

namespace detail {
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line);
[[noreturn]] void throw_launch_error(cudaError_t err, const std::string& what, const char* file, int line);
}  // namespace detail

}  // namespace forge::cuda

#define FORGE_CUDA_CHECK(expr)                                                             \
  do {                                                                                     \
    const cudaError_t forge_cuda_err_ = (expr);                                            \
    if (forge_cuda_err_ != cudaSuccess)                                                    \
      ::forge::cuda::detail::throw_cuda_error(forge_cuda_err_, #expr, __FILE__, __LINE__); \
  } while (0)

#define FORGE_CUDA_LAUNCH_CHECK(...)                                                                 \
  do {                                                                                               \
    const cudaError_t forge_cuda_err_ = cudaGetLastError();                                          \
    if (forge_cuda_err_ != cudaSuccess)                                                              \
      ::forge::cuda::detail::throw_launch_error(forge_cuda_err_, ::forge::detail::concat(__VA_ARGS__), \
                                                __FILE__, __LINE__);                                 \
  } while (0)

namespace forge::cuda {

// Makes `device` current for its lifetime and restores the previous device after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
  int device_ = -1;
};

// The stream forge's kernels and copies run on for `device`: this thread's current stream
// of the device. By default the device's legacy default stream (nullptr), so every launch
// and copy is ordered with every other on the device; a StreamGuard (stream.h) makes
// another stream current for a scope. Memory allocated while a stream is current belongs
// to it (Note [caching allocator] in core/block_pool.h). Cheap: a thread-local load.
cudaStream_t current_stream(int device);

// Whether all work recorded before `e` has finished (cudaEventQuery; "not ready" is false, not
// an error). Used by the caching allocators to decide when a block may be reused.
inline bool event_completed(cudaEvent_t e) {
  const cudaError_t err = cudaEventQuery(e);
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  FORGE_CUDA_CHECK(err);
  return true;
}

// Streaming multiprocessors of `device` (cached after the first query).
int multiprocessor_count(int device);

// Throws unless 0 <= device < device_count(), naming `op`.
void check_device(int device, const char* op);

// For error messages: "add on cuda:0: out [4, 5] f32 strides [5, 1]; in1 [4, 5] f32
// strides [1, 4]" (operand 0 is the output).
std::string describe_operands(const char* op, const Tensor* const* ops, int n);

}  // namespace forge::cuda
