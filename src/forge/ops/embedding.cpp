// embedding: argument checks, the CPU and CUDA kernels (backends/*/embedding.h) and the
// backward. On CUDA, ids are range-checked by the kernels on the device (Note [device-side
// index checks] in backends/cuda/reduce.cuh), not here: that would need a host sync.
#include "forge/ops/embedding.h"

#include "forge/autograd/node.h"
#include "forge/backends/cpu/embedding.h"
#include "forge/ops/copy.h"
#include "forge/ops/creation.h"
#include "forge/ops/dispatch_device.h"
#include "forge/ops/grad_buffer.h"
#include "forge/ops/registry.h"

#ifdef FORGE_WITH_CUDA
#include "forge/backends/cuda/embedding.h"
#endif

namespace forge::ops {

using autograd::GradMask;
using autograd::record;

// The differentiable ops this file defines (Note [op registry] in ops/registry.h).
[[maybe_unused]] const bool kRegisteredOps = register_ops({"embedding"});

// Backward: dweight = zeros (V, C) with dweight[ids[n]] += g[n] for every position n.
Tensor embedding(const Tensor& weight, const Tensor& ids) {
  FORGE_CHECK(weight.defined() && ids.defined(), "embedding: weight and ids must be defined tensors");
  detail::check_same_device("embedding", {weight, ids});
  FORGE_CHECK(weight.dim() == 2, "embedding: weight must be 2-D (V, C), got shape ", weight.shape(), " (",
              dtype_name(weight.dtype()), "); ids shape ", ids.shape());
  FORGE_CHECK(is_floating(weight.dtype()), "embedding: weight must be floating-point (f32, f64, bf16, f16), got ",
              dtype_name(weight.dtype()), " of shape ", weight.shape());
  FORGE_CHECK(ids.dtype() == DType::i64 || ids.dtype() == DType::i32, "embedding: ids must be i64 or i32, got ",
              dtype_name(ids.dtype()), " of shape ", ids.shape(), " (weight shape ", weight.shape(), ")");
  const int64_t V = weight.shape()[0], C = weight.shape()[1];
  Shape out_shape = ids.shape();
  out_shape.push_back(C);
  Tensor out = empty(out_shape, {.dtype = weight.dtype(), .device = weight.device()});
  const Tensor idx = contiguous(ids.detach());
  if (out.is_cpu()) cpu::embedding_forward(contiguous(weight.detach()), idx, out);
  else FORGE_ON_CUDA("embedding", cuda::embedding_forward(contiguous(weight.detach()), idx, out));
  // The kernels write every row of dweight, so it may be the weight's pre-allocated gradient
  // buffer (Note [claimed grad buffer]).
  const Tensor w_leaf = detail::grad_buffer_owner(weight);
  record("embedding", out, {weight}, [idx, V, C, w_leaf](const Tensor& g, const GradMask&) {
    Tensor dw = detail::grad_output(w_leaf, {V, C}, {.dtype = g.dtype(), .device = g.device()});
    if (dw.is_cpu()) cpu::embedding_backward(contiguous(g), idx, dw);
    else FORGE_ON_CUDA("embedding", cuda::embedding_backward(contiguous(g), idx, dw));
    return TensorList{dw};
  }, {idx});
  return out;
}

}  // namespace forge::ops
