#include "forge/autograd/checkpoint.h"

#include "forge/autograd/engine.h"
#include "forge/autograd/grad_mode.h"
#include "forge/autograd/node.h"
#include "forge/core/generator.h"

namespace forge::autograd {
namespace {

Tensor grad_anchor() {
  static const Tensor anchor = [] {
    auto storage = std::make_shared<Storage>(sizeof(float), cpu_allocator());
    *static_cast<float*>(storage->data()) = 0.0f;
    Tensor t = Tensor::make(storage, {}, {}, 0, DType::f32);
    t.requires_grad_(true);
    return t;
  }();
  return anchor;
}

}  // namespace

Tensor checkpoint(const RegionFn& fn, const TensorList& inputs) {
  Generator& gen = default_generator();
  const uint64_t seed = gen.seed(), offset = gen.offset();
  Tensor out;
  {
    NoGradGuard no_grad;
    out = fn(inputs);
  }
  FORGE_CHECK(out.defined(), "checkpoint: the region returned an undefined tensor");
  if (!grad_enabled()) return out;
  // Whether the region depends on anything that needs a gradient is only known by
  // running it with grad on; assume it does when any input or the region's parameters
  // could (the recomputation decides for real).
  Tensor result = out.detach();
  if (!is_floating(result.dtype())) return out;
  TensorList saved_inputs;
  for (const auto& t : inputs) saved_inputs.push_back(t.defined() ? t.detach() : Tensor());
  std::vector<bool> input_requires;
  for (const auto& t : inputs) input_requires.push_back(t.defined() && t.requires_grad());
  // Record against the inputs. A region whose inputs need no gradient may still use
  // parameters that do, so the node then hangs off an anchor: a one-element leaf that
  // requires grad and never receives a gradient.
  TensorList edges = inputs;
  edges.push_back(grad_anchor());
  record("checkpoint", result, edges,
         [fn, saved_inputs, input_requires, seed, offset, &gen](const Tensor& g, const GradMask&) {
           TensorList in;
           for (size_t i = 0; i < saved_inputs.size(); ++i) {
             Tensor t = saved_inputs[i].defined() ? saved_inputs[i].detach() : Tensor();
             if (t.defined() && input_requires[i]) t.requires_grad_(true);
             in.push_back(t);
           }
           const uint64_t s0 = gen.seed(), o0 = gen.offset();
           gen.set_state(seed, offset);
           Tensor y;
           {
             EnableGradGuard grad_on;
             y = fn(in);
           }
           gen.set_state(s0, o0);
           if (y.requires_grad()) backward({y}, {g});
           TensorList grads;
           for (auto& t : in) grads.push_back(t.defined() && t.requires_grad() ? t.grad() : Tensor());
           grads.push_back(Tensor());  // the anchor
           return grads;
         },
         saved_inputs);
  return result;
}

}  // namespace forge::autograd
