#include "forge/ops/copy.h"

#include "forge/autograd/grad_mode.h"
#include "forge/autograd/node.h"
#include "forge/backends/cpu/tensor_kernels.h"
#include "forge/ops/creation.h"
#include "forge/ops/dispatch_device.h"
#include "forge/ops/view.h"

namespace forge::ops {

using autograd::GradMask;
using autograd::record;

namespace {

// dst <- src with identical shapes, any devices/dtypes/strides.
void copy_kernel(Tensor& dst, const Tensor& src) {
  if (dst.numel() == 0) return;
  if (dst.is_cpu() && src.is_cpu()) {
    cpu::copy(dst, src);
  } else {
    FORGE_ON_CUDA("copy", cuda::copy(dst, src));
  }
}

}  // namespace

void check_inplace(const Tensor& t, const char* op) {
  FORGE_CHECK(!(grad_enabled() && t.requires_grad()), op, ": in-place operation on a tensor of shape ", t.shape(),
              " that requires grad; use the out-of-place op, or wrap it in NoGradGuard (e.g. in an optimizer step)");
}

Tensor to(const Tensor& t, Device device, DType dtype) {
  if (t.device() == device && t.dtype() == dtype) return t;
  Tensor out = empty(t.shape(), {.dtype = dtype, .device = device});
  copy_kernel(out, t);
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

Tensor clone(const Tensor& t) {
  Tensor out = empty(t.shape(), {.dtype = t.dtype(), .device = t.device()});
  copy_kernel(out, t);
  if (is_floating(t.dtype())) {
    record("clone", out, {t}, [](const Tensor& g, const GradMask&) { return TensorList{g}; });
  }
  return out;
}

Tensor contiguous(const Tensor& t) { return t.is_contiguous() ? t : clone(t); }

Tensor& copy_(Tensor& dst, const Tensor& src) {
  check_inplace(dst, "copy_");
  Tensor s = src;
  if (s.shape() != dst.shape()) s = expand(s, dst.shape());
  copy_kernel(dst, s);
  dst.storage()->bump_version();
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
