#include "forge/ops/index.h"

#include "forge/autograd/node.h"
#include "forge/backends/cpu/index.h"
#include "forge/ops/copy.h"
#include "forge/ops/creation.h"
#include "forge/ops/dispatch_device.h"
#include "forge/ops/registry.h"
#include "forge/ops/view.h"

#ifdef FORGE_WITH_CUDA
#include "forge/backends/cuda/index.h"
#endif

// On CUDA, indices are range-checked by the kernels on the device (Note [device-side index
// checks] in backends/cuda/reduce.cuh), not here: that would need a host sync.

namespace forge::ops {

using autograd::GradMask;
using autograd::record;

// The differentiable ops this file defines (Note [op registry] in ops/registry.h).
[[maybe_unused]] const bool kRegisteredOps = register_ops({"index_select", "gather", "scatter_add"});

namespace {

void check_index(const char* op, const Tensor& x, const Tensor& index) {
  FORGE_CHECK(index.dtype() == DType::i64 || index.dtype() == DType::i32, op, ": index must be i64 or i32, got ",
              dtype_name(index.dtype()), " (index shape ", index.shape(), ", input shape ", x.shape(), ")");
  FORGE_CHECK(x.dim() > 0, op, ": cannot index a 0-d tensor (shape ", x.shape(), ")");
}

// gather/scatter_add: index has x's number of dims and fits inside x on every dim but `d`.
void check_index_fits(const char* op, const Tensor& x, int64_t d, const Tensor& index) {
  FORGE_CHECK(index.dim() == x.dim(), op, ": index must have as many dims as the input, got index shape ",
              index.shape(), " for input shape ", x.shape());
  for (int64_t k = 0; k < x.dim(); ++k)
    FORGE_CHECK(k == d || index.shape()[k] <= x.shape()[k], op, ": index shape ", index.shape(),
                " is larger than the input shape ", x.shape(), " at dim ", k, " (only dim ", d, " may be larger)");
}

// zeros(shape) with src scatter-added along d: the backward of index_select and gather.
// Scatters straight into the fresh zeros (no clone of x) unless the gradient is itself
// being differentiated, in which case the recorded op is used.
Tensor scatter_add_into_zeros(const Shape& shape, int64_t d, const Tensor& index, const Tensor& src) {
  Tensor z = zeros(shape, {.dtype = src.dtype(), .device = src.device()});
  if (autograd::any_requires_grad({src})) return scatter_add(z, d, index, src);
  if (z.is_cpu()) cpu::scatter_add_(z, d, index, src);
  else FORGE_ON_CUDA("scatter_add", cuda::scatter_add_(z, d, index, src));
  return z;
}

}  // namespace

// Backward: grad_x[..., index[j], ...] += g[..., j, ...], i.e. index_add into zeros, done
// as scatter_add with the index broadcast (stride 0) over g's other dims. Repeated
// indices accumulate.
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  detail::check_same_device("index_select", {x, index});
  check_index("index_select", x, index);
  FORGE_CHECK(index.dim() <= 1, "index_select: index must be 1-D, got shape ", index.shape(), " (input shape ",
              x.shape(), ")");
  const int64_t d = wrap_dim(dim, x.dim(), "index_select");
  Shape out_shape = x.shape();
  out_shape[d] = index.numel();
  Tensor out = empty(out_shape, {.dtype = x.dtype(), .device = x.device()});
  if (out.is_cpu()) cpu::index_select(x, d, index, out);
  else FORGE_ON_CUDA("index_select", cuda::index_select(x, d, index, out));
  if (!is_floating(out.dtype())) return out;
  const Shape x_shape = x.shape();
  const Tensor idx = index.detach();
  record("index_select", out, {x}, [d, x_shape, idx](const Tensor& g, const GradMask&) {
    Shape along(static_cast<size_t>(g.dim()), 1);
    along[d] = idx.numel();
    const Tensor spread = expand(reshape(idx, along), g.shape());
    return TensorList{scatter_add_into_zeros(x_shape, d, spread, g)};
  }, {idx});
  return out;
}

// Backward: grad_x = scatter_add(zeros, dim, index, g) (repeated indices accumulate).
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  detail::check_same_device("gather", {x, index});
  check_index("gather", x, index);
  const int64_t d = wrap_dim(dim, x.dim(), "gather");
  check_index_fits("gather", x, d, index);
  Tensor out = empty(index.shape(), {.dtype = x.dtype(), .device = x.device()});
  if (out.is_cpu()) cpu::gather(x, d, index, out);
  else FORGE_ON_CUDA("gather", cuda::gather(x, d, index, out));
  if (!is_floating(out.dtype())) return out;
  const Shape x_shape = x.shape();
  const Tensor idx = index.detach();
  record("gather", out, {x}, [d, x_shape, idx](const Tensor& g, const GradMask&) {
    return TensorList{scatter_add_into_zeros(x_shape, d, idx, g)};
  }, {idx});
  return out;
}

// Backward: grad_x = g; grad_src = gather(g, dim, index), zero where src lies outside
// index's extent (src may be larger than index).
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  detail::check_same_device("scatter_add", {x, index, src});
  check_index("scatter_add", x, index);
  FORGE_CHECK(src.dtype() == x.dtype(), "scatter_add: src must have the input's dtype, got ", dtype_name(src.dtype()),
              " (shape ", src.shape(), ") for input ", dtype_name(x.dtype()), " (shape ", x.shape(), ")");
  const int64_t d = wrap_dim(dim, x.dim(), "scatter_add");
  check_index_fits("scatter_add", x, d, index);
  FORGE_CHECK(src.dim() == index.dim(), "scatter_add: src must have as many dims as index, got src shape ",
              src.shape(), " and index shape ", index.shape(), " (input shape ", x.shape(), ")");
  for (int64_t k = 0; k < src.dim(); ++k)
    FORGE_CHECK(index.shape()[k] <= src.shape()[k], "scatter_add: index shape ", index.shape(),
                " is larger than the src shape ", src.shape(), " at dim ", k, " (input shape ", x.shape(), ")");
  Tensor out = clone(x.detach());
  if (out.is_cpu()) cpu::scatter_add_(out, d, index, src);
  else FORGE_ON_CUDA("scatter_add", cuda::scatter_add_(out, d, index, src));
  if (!is_floating(out.dtype())) return out;
  const Tensor idx = index.detach();
  const Shape src_shape = src.shape();
  record("scatter_add", out, {x, src}, [d, idx, src_shape](const Tensor& g, const GradMask& need) {
    Tensor gx = need[0] ? g : Tensor(), gs;
    if (need[1]) {
      gs = gather(g, d, idx);
      if (gs.shape() != src_shape) {
        Tensor full = zeros(src_shape, {.dtype = g.dtype(), .device = g.device()});
        Tensor region = full;
        for (int64_t k = 0; k < region.dim(); ++k) region = narrow(region, k, 0, idx.shape()[k]);
        copy_(region, gs);
        gs = full;
      }
    }
    return TensorList{gx, gs};
  }, {idx});
  return out;
}

}  // namespace forge::ops
