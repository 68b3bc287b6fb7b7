#pragma once
// y = x W^T + b (ops::linear), W (out, in), b (out): torch.nn.Linear's layout and default init
// (U(-1/sqrt(in), 1/sqrt(in)) for both; models override it, e.g. GPT-2's N(0, 0.02)).
#include "forge/core/generator.h"
#include "forge/nn/module.h"

namespace forge::nn {

class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) const;  // (*, in) -> (*, out)

  int64_t in_features, out_features;
  Tensor weight;  // (out, in)
  Tensor bias;    // (out), undefined without bias
};

}  // namespace forge::nn
