#pragma once
// Internal to ops/: routing a kernel call to the tensor's device.
//
//   if (out.is_cpu()) cpu::fill(out, v); else FORGE_ON_CUDA("fill", cuda::fill(out, v));
//
// Without CUDA support FORGE_ON_CUDA throws a clear error instead of calling.
#include "forge/core/tensor.h"

#ifdef FORGE_WITH_CUDA
#include "forge/backends/cuda/tensor_kernels.h"
#define FORGE_ON_CUDA(op, ...) __VA_ARGS__
#else
#define FORGE_ON_CUDA(op, ...) ::forge::ops::detail::throw_no_cuda(op)
#endif

namespace forge::ops::detail {

[[noreturn]] void throw_no_cuda(const char* op);
// For ops that have a CPU kernel only so far.
[[noreturn]] void throw_not_on_cuda(const char* op);

// All defined tensors on one device; the error names op, devices and shapes.
void check_same_device(const char* op, const TensorList& ts);

}  // namespace forge::ops::detail
