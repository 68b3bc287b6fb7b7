#pragma once
// y = x W^T + b (ops::linear), W (out, in), b (out): torch.nn.Linear's layout and default init
// (U(-1/sqrt(in), 1/sqrt(in)) for both; models override it, e.g. GPT-2's N(0, 0.02)).
//
// forward and forward_gelu are virtual so that a tensor-parallel linear (column- or
// row-parallel) derives from Linear, keeps `weight` / `bias` (and so the state dict's names)
// and replaces the computation; models get such a module from a LayerSpec (nn/layer_spec.h).
#include <string>

#include "forge/core/generator.h"
#include "forge/nn/module.h"

namespace forge::nn {

class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true, Generator* gen = nullptr);
  virtual Tensor forward(const Tensor& x) const;  // (*, in) -> (*, out)
  // gelu_tanh(forward(x)). For a plain Linear on CUDA it is one GEMM with a GELU epilogue
  // (ops::linear_gelu) unless FORGE_GELU_FUSION=0; a subclass gets the unfused
  // gelu(forward(x)), which stays correct whatever its forward does, unless it overrides this.
  virtual Tensor forward_gelu(const Tensor& x) const;

  int64_t in_features, out_features;
  // Whether run.fp8 applies to this layer (Note [FP8 linear] in ops/fp8.h): true but for the
  // output head (nn::LayerSpec builds it with false).
  bool fp8 = true;
  // Whether this layer's forward runs through fp8::linear now (fp8 and a training recipe set): the
  // fused paths that bypass forward() (linear_gelu, gelu_mlp, packed q/k/v) step aside then.
  bool fp8_active() const;
  std::string name = "linear";  // the module's path in its model (name_linears), for FP8's guardrail events
  Tensor weight;  // (out, in)
  Tensor bias;    // (out), undefined without bias

 protected:
  // A linear that computes with `base`'s parameters, registered here under the same names
  // ("weight", "bias": the same tensors, not copies), so that a module wrapping another (LoRA's
  // adapter around a plain or tensor-parallel linear: nn/lora.h) keeps the state dict's keys.
  struct SharedParameters {};
  Linear(const Linear& base, SharedParameters);
};

// Sets every Linear's `name` under `root` to its path ("transformer.h.0.attn.c_attn").
void name_linears(Module& root, const std::string& prefix = "");

}  // namespace forge::nn
