#pragma once
// Conversions and copies: dtype, device, contiguity. Tensor::to/contiguous/clone/copy_
// call these.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "forge/core/tensor.h"

namespace forge::ops {

// Differentiable: the gradient is converted back to the input's dtype/device.
Tensor to(const Tensor& t, DType dtype);
Tensor to(const Tensor& t, Device device);
Tensor to(const Tensor& t, Device device, DType dtype);
// non_blocking: a copy between pinned host memory and a GPU is only queued on the GPU's
// current stream; a GPU -> CPU result is then allocated pinned. The caller synchronises
// before reading a CPU result (docs/cuda.md, "Pinned memory").
Tensor to(const Tensor& t, Device device, DType dtype, bool non_blocking);
// A copy of CPU tensor `t` in pinned host memory, contiguous (`t` itself if already pinned).
// Not differentiable (like detach()). Needs CUDA.
Tensor pin_memory(const Tensor& t);
// Returns `t` itself when already contiguous, else a contiguous copy (differentiable).
Tensor contiguous(const Tensor& t);
// Always a new contiguous copy (differentiable).
Tensor clone(const Tensor& t);

// In-place, not differentiable: dst <- src (broadcast to dst's shape, converted to dst's
// dtype, across devices). Refuses a dst that requires grad while grad mode is on.
Tensor& copy_(Tensor& dst, const Tensor& src);
// The same; with non_blocking, a copy between pinned host memory and a GPU is only queued on
// the GPU's current stream (as to(device, true)): the host must not read or change the pinned
// side before the copy has run (the pinned allocator keeps its block until then).
Tensor& copy_(Tensor& dst, const Tensor& src, bool non_blocking);
Tensor& fill_(Tensor& t, double value);
// dst <- src (same shape and dtype, same device) as a collective writes its output: the storage's
// version is not bumped (autograd's saved tensors over dst stay valid, as they do when a process
// group's engine writes into it). For parallel/hierarchical_group's reordering of an all-gather's
// result (ZeRO-3 gathers a block's weights into the parameters' own storage before backward).
Tensor& copy_as_communication_(Tensor& dst, const Tensor& src);

// A copy of `t` on the host that later changes to `t` never reach (a checkpoint's snapshot):
// a GPU tensor's goes to pinned memory, only queued on the device's current stream (call
// wait_for_host_copies before reading it); a CPU tensor is cloned. Not differentiable.
Tensor host_copy(const Tensor& t);
// Blocks until every host_copy queued so far from `device` has landed (nothing on the CPU).
void wait_for_host_copies(Device device);
// Makes the host memory that host_copy will need for tensors of `bytes` (in that order, all
// kept at once) ready ahead, on the calling thread (pinned memory for a GPU device: Note
// [reserving segments ahead] in core/block_pool.cpp); nothing for the CPU. Stops early when
// *stop becomes true. Returns the bytes made ready.
uint64_t reserve_host_copies(Device device, const std::vector<size_t>& bytes, const std::atomic<bool>* stop);

// Throws naming `op` if `t` requires grad and grad mode is on (in-place ops would
// silently corrupt the recorded history).
void check_inplace(const Tensor& t, const char* op);

}  // namespace forge::ops
