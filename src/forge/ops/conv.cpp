// conv2d and max_pool2d: checks, output sizes, the kernels (backends/cpu/conv.h,
// backends/cuda/conv.h) and their backward.
#include "forge/ops/conv.h"

#include "forge/autograd/node.h"
#include "forge/backends/cpu/conv.h"
#include "forge/ops/copy.h"
#include "forge/ops/creation.h"
#include "forge/ops/dispatch_device.h"
#include "forge/ops/registry.h"

#ifdef FORGE_WITH_CUDA
#include "forge/backends/cuda/conv.h"
#endif

namespace forge::ops {

using autograd::GradMask;
using autograd::record;

// The differentiable ops this file defines (Note [op registry] in ops/registry.h).
[[maybe_unused]] const bool kRegisteredOps = register_ops({"conv2d", "max_pool2d"});

namespace {

Shape pair_shape(Size2 s) { return Shape{s[0], s[1]}; }

// Output size along one dim; the error names op, input shape and the (kernel, stride, padding).
int64_t out_size(const char* op, const Tensor& x, int64_t dim, int64_t in, int64_t k, int64_t s, int64_t pad,
                 Size2 kernel, Size2 stride, Size2 padding) {
  FORGE_CHECK(in + 2 * pad >= k, op, ": kernel ", pair_shape(kernel), " is larger than the padded input: input shape ",
              x.shape(), " with padding ", pair_shape(padding), " has ", in + 2 * pad, " ",
              dim == 2 ? "rows" : "columns", " (", in, " + 2*", pad, ") but the kernel needs ", k, " (stride ",
              pair_shape(stride), ")");
  return (in + 2 * pad - k) / s + 1;
}

void check_geometry(const char* op, const Tensor& x, Size2 kernel, Size2 stride, Size2 padding) {
  FORGE_CHECK(kernel[0] > 0 && kernel[1] > 0, op, ": kernel size must be positive, got ", pair_shape(kernel),
              " (input shape ", x.shape(), ")");
  FORGE_CHECK(stride[0] > 0 && stride[1] > 0, op, ": stride must be positive, got ", pair_shape(stride),
              " (input shape ", x.shape(), ")");
  FORGE_CHECK(padding[0] >= 0 && padding[1] >= 0, op, ": padding must be non-negative, got ", pair_shape(padding),
              " (input shape ", x.shape(), ")");
}

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, Size2 stride, Size2 padding) {
  constexpr const char* op = "conv2d";
  FORGE_CHECK(x.defined() && weight.defined(), op, ": x and weight must be defined tensors");
  detail::check_same_device(op, {x, weight, bias});
  FORGE_CHECK(x.dim() == 4 && weight.dim() == 4, op,
              ": expected x (N, Cin, H, W) and weight (Cout, Cin, kh, kw), got shapes ", x.shape(), " and ",
              weight.shape());
  FORGE_CHECK(is_floating(x.dtype()) && weight.dtype() == x.dtype() && (!bias.defined() || bias.dtype() == x.dtype()),
              op, ": x, weight and bias must share one floating dtype (f32, f64, bf16, f16), got ",
              dtype_name(x.dtype()), ", ", dtype_name(weight.dtype()),
              bias.defined() ? std::string(", ") + dtype_name(bias.dtype()) : std::string(" (no bias)"), " (shapes ",
              x.shape(), ", ", weight.shape(), ")");
  FORGE_CHECK(x.size(1) == weight.size(1), op, ": input channels differ: x ", x.shape(), " has Cin=", x.size(1),
              " but weight ", weight.shape(), " expects Cin=", weight.size(1));
  const int64_t Cout = weight.size(0);
  FORGE_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == Cout), op, ": bias must have shape [", Cout,
              "] (one per output channel of weight ", weight.shape(), "), got ", bias.shape());
  const Size2 kernel{weight.size(2), weight.size(3)};
  check_geometry(op, x, kernel, stride, padding);
  const int64_t Ho = out_size(op, x, 2, x.size(2), kernel[0], stride[0], padding[0], kernel, stride, padding);
  const int64_t Wo = out_size(op, x, 3, x.size(3), kernel[1], stride[1], padding[1], kernel, stride, padding);

  const cpu::Conv2dParams p{stride[0], stride[1], padding[0], padding[1]};
  const Tensor xd = x.detach(), wd = contiguous(weight.detach()), bd = bias.defined() ? bias.detach() : Tensor();
  Tensor out = empty({x.size(0), Cout, Ho, Wo}, {.dtype = x.dtype(), .device = x.device()});
  if (x.is_cpu()) cpu::conv2d_forward(xd, wd, bd, p, out);
  else FORGE_ON_CUDA(op, cuda::conv2d_forward(xd, wd, bd, p, out));

  // x is needed for dweight, weight for dx; save each only when the other needs a gradient.
  const Tensor x_saved = weight.requires_grad() ? xd : Tensor();
  const Tensor w_saved = wd;  // its shape is needed either way; the handle is cheap
  const Shape x_shape = x.shape();
  record(op, out, {x, weight, bias}, [x_saved, w_saved, x_shape, p](const Tensor& g, const GradMask& need) {
    const TensorOptions opt{.dtype = g.dtype(), .device = g.device()};
    Tensor dx = need[0] ? empty(x_shape, opt) : Tensor();
    Tensor dw = need[1] ? empty(w_saved.shape(), opt) : Tensor();
    Tensor db = need[2] ? empty({w_saved.size(0)}, opt) : Tensor();
    const Tensor gc = contiguous(g);
    if (gc.is_cpu()) cpu::conv2d_backward(gc, x_saved, x_shape, w_saved, p, dx, dw, db);
    else FORGE_ON_CUDA("conv2d", cuda::conv2d_backward(gc, x_saved, x_shape, w_saved, p, dx, dw, db));
    return TensorList{dx, dw, db};
  }, {x_saved, w_saved});
  return out;
}

ValuesIndices max_pool2d_with_indices(const Tensor& x, Size2 kernel, Size2 stride, Size2 padding) {
  constexpr const char* op = "max_pool2d";
  FORGE_CHECK(x.defined(), op, ": x must be a defined tensor");
  FORGE_CHECK(x.dim() == 4, op, ": expected x of shape (N, C, H, W), got ", x.shape());
  FORGE_CHECK(is_floating(x.dtype()), op, ": expected a floating-point x (f32, f64, bf16, f16), got ",
              dtype_name(x.dtype()), " of shape ", x.shape());
  if (stride[0] == 0 && stride[1] == 0) stride = kernel;
  check_geometry(op, x, kernel, stride, padding);
  FORGE_CHECK(2 * padding[0] <= kernel[0] && 2 * padding[1] <= kernel[1], op, ": padding ", pair_shape(padding),
              " must be at most half the kernel ", pair_shape(kernel), " (input shape ", x.shape(), ")");
  const int64_t Ho = out_size(op, x, 2, x.size(2), kernel[0], stride[0], padding[0], kernel, stride, padding);
  const int64_t Wo = out_size(op, x, 3, x.size(3), kernel[1], stride[1], padding[1], kernel, stride, padding);

  const cpu::Pool2dParams p{kernel[0], kernel[1], stride[0], stride[1], padding[0], padding[1]};
  const Shape out_shape{x.size(0), x.size(1), Ho, Wo};
  Tensor out = empty(out_shape, {.dtype = x.dtype(), .device = x.device()});
  Tensor indices = empty(out_shape, {.dtype = DType::i64, .device = x.device()});
  if (x.is_cpu()) cpu::max_pool2d_forward(x.detach(), p, out, indices);
  else FORGE_ON_CUDA(op, cuda::max_pool2d_forward(x.detach(), p, out, indices));
  const Shape x_shape = x.shape();
  record(op, out, {x}, [indices, x_shape, p](const Tensor& g, const GradMask&) {
    Tensor dx = empty(x_shape, {.dtype = g.dtype(), .device = g.device()});
    if (g.is_cpu()) cpu::max_pool2d_backward(g, indices, dx);
    else FORGE_ON_CUDA("max_pool2d", cuda::max_pool2d_backward(g, indices, p, dx));
    return TensorList{dx};
  }, {indices});
  return {out, indices};
}

Tensor max_pool2d(const Tensor& x, Size2 kernel, Size2 stride, Size2 padding) {
  return max_pool2d_with_indices(x, kernel, stride, padding).values;
}

}  // namespace forge::ops
