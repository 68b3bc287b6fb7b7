#include "forge/ops/copy.h"

#include "forge/autograd/grad_mode.h"
#include "forge/autograd/node.h"
#include "forge/backends/cpu/tensor_kernels.h"
#include "forge/ops/creation.h"
#include "forge/ops/dispatch_device.h"
#include "forge/ops/registry.h"
#include "forge/ops/view.h"

#ifdef FORGE_WITH_CUDA
#include "forge/backends/cuda/memory.h"
#endif

namespace forge::ops {

using autograd::GradMask;
using autograd::record;

// The differentiable ops this file defines (Note [op registry] in ops/registry.h).
[[maybe_unused]] const bool kRegisteredOps = register_ops({"to", "clone", "contiguous"});

namespace {

// dst <- src with identical shapes, any devices/dtypes/strides.
void copy_kernel(Tensor& dst, const Tensor& src, [[maybe_unused]] bool non_blocking = false) {
  if (dst.numel() == 0) return;
  if (dst.is_cpu() && src.is_cpu()) {
    cpu::copy(dst, src);
  } else {
    FORGE_ON_CUDA("copy", cuda::copy(dst, src, non_blocking));
  }
}

// A contiguous CPU tensor in pinned host memory.
Tensor empty_pinned(const Shape& shape, DType dtype) {
#ifdef FORGE_WITH_CUDA
  const size_t nbytes = checked_nbytes(shape, element_size(dtype));
  auto storage = std::make_shared<Storage>(nbytes, cuda::pinned_allocator());
  return Tensor::make(std::move(storage), shape, contiguous_strides(shape), 0, dtype);
#else
  (void)shape;
  (void)dtype;
  detail::throw_no_cuda("pin_memory");
#endif
}

}  // namespace

void check_inplace(const Tensor& t, const char* op) {
  FORGE_CHECK(!(grad_enabled() && t.requires_grad()), op, ": in-place operation on a tensor of shape ", t.shape(),
              " that requires grad; use the out-of-place op, or wrap it in NoGradGuard (e.g. in an optimizer step)");
}

Tensor to(const Tensor& t, Device device, DType dtype) { return to(t, device, dtype, false); }

Tensor to(const Tensor& t, Device device, DType dtype, bool non_blocking) {
  if (t.device() == device && t.dtype() == dtype) return t;
  const bool pinned_out = non_blocking && device.is_cpu() && t.is_cuda();
  Tensor out = pinned_out ? empty_pinned(t.shape(), dtype) : empty(t.shape(), {.dtype = dtype, .device = device});
  copy_kernel(out, t, non_blocking);
  if (is_floating(dtype) && is_floating(t.dtype())) {
    const DType in_dtype = t.dtype();
    const Device in_device = t.device();
    record("to", out, {t}, [in_dtype, in_device](const Tensor& g, const GradMask&) {
      return TensorList{to(g, in_device, in_dtype)};
    });
  }
  return out;
}

Tensor to(const Tensor& t, DType dtype) { return to(t, t.device(), dtype); }
Tensor to(const Tensor& t, Device device) { return to(t, device, t.dtype()); }

Tensor pin_memory(const Tensor& t) {
  FORGE_CHECK(t.is_cpu(), "pin_memory: the tensor (shape ", t.shape(), ") is on ", t.device().str(),
              "; only CPU tensors can be pinned");
  if (t.is_pinned()) return t;
  Tensor out = empty_pinned(t.shape(), t.dtype());
  if (t.numel() > 0) cpu::copy(out, t);
  return out;
}

Tensor host_copy(const Tensor& t) {
  const NoGradGuard no_grad;
  if (t.is_cpu()) return clone(t.detach());
  return to(t.detach(), Device::cpu(), t.dtype(), /*non_blocking=*/true);
}

void wait_for_host_copies(Device device) {
  if (device.is_cpu()) return;
  FORGE_ON_CUDA("wait_for_host_copies", cuda::synchronize(static_cast<int>(device.index)));
}

uint64_t reserve_host_copies(Device device, const std::vector<size_t>& bytes, const std::atomic<bool>* stop) {
  if (device.is_cpu() || bytes.empty()) return 0;
  (void)stop;  // (read by the CUDA allocator)
  FORGE_ON_CUDA("reserve_host_copies", return cuda::reserve_pinned(bytes, static_cast<int>(device.index), stop));
}

Tensor clone(const Tensor& t) {
  Tensor out = empty(t.shape(), {.dtype = t.dtype(), .device = t.device()});
  copy_kernel(out, t);
  if (is_floating(t.dtype())) {
    record("clone", out, {t}, [](const Tensor& g, const GradMask&) { return TensorList{g}; });
  }
  return out;
}

Tensor contiguous(const Tensor& t) { return t.is_contiguous() ? t : clone(t); }

Tensor& copy_(Tensor& dst, const Tensor& src) { return copy_(dst, src, false); }

Tensor& copy_(Tensor& dst, const Tensor& src, bool non_blocking) {
  check_inplace(dst, "copy_");
  Tensor s = src;
  if (s.shape() != dst.shape()) s = expand(s, dst.shape());
  copy_kernel(dst, s, non_blocking);
  dst.storage()->bump_version();
  return dst;
}

Tensor& copy_as_communication_(Tensor& dst, const Tensor& src) {
  FORGE_CHECK(dst.shape() == src.shape() && dst.dtype() == src.dtype() && dst.device() == src.device(),
              "copy_as_communication_: dst and src must have the same shape, dtype and device");
  copy_kernel(dst, src, false);
  return dst;
}

Tensor& fill_(Tensor& t, double value) {
  check_inplace(t, "fill_");
  if (t.numel() == 0) return t;
  if (t.is_cpu()) cpu::fill(t, value);
  else FORGE_ON_CUDA("fill_", cuda::fill(t, value));
  t.storage()->bump_version();
  return t;
}

}  // namespace forge::ops
