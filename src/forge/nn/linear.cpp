#include "forge/nn/linear.h"

#include <cmath>
#include <string>
#include <typeinfo>

#include "forge/core/env.h"
#include "forge/ops/fp8.h"
#include "forge/ops/creation.h"
#include "forge/ops/matmul.h"
#include "forge/ops/unary.h"

namespace forge::nn {

Linear::Linear(int64_t in, int64_t out, bool with_bias, Generator* gen) : in_features(in), out_features(out) {
  FORGE_CHECK(in > 0 && out > 0, "Linear: features must be positive, got in=", in, " out=", out);
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  auto init = [&](const Shape& s) { return default_init_enabled() ? uniform(s, -bound, bound, {}, gen) : empty(s); };
  weight = register_parameter("weight", init({out, in}));
  if (with_bias) bias = register_parameter("bias", init({out}));
}

Linear::Linear(const Linear& base, SharedParameters)
    : in_features(base.in_features), out_features(base.out_features), fp8(base.fp8), name(base.name) {
  weight = register_parameter("weight", base.weight);
  if (base.bias.defined()) bias = register_parameter("bias", base.bias);
}

bool Linear::fp8_active() const { return fp8 && fp8::training_recipe().has_value(); }

Tensor Linear::forward(const Tensor& x) const {
  FORGE_CHECK(x.dim() >= 1 && x.shape().back() == in_features, "Linear: input of shape ", x.shape(),
              " does not end in in_features = ", in_features);
  if (fp8)
    if (const std::optional<fp8::Recipe> r = fp8::training_recipe()) return fp8::linear(x, weight, bias, *r, name);
  return ops::linear(x, weight, bias);
}

// On CUDA, a Linear and its GELU are one GEMM (ops::linear_gelu: cuBLASLt's GELU epilogue
// writes the activation and the saved pre-activation together, saving the separate GELU
// pass over the (tokens, out) activation; GPT's MLP uses it for c_fc). FORGE_GELU_FUSION=0
// (core/env.h) turns it off (to measure it, or to match the unfused rounding exactly); the CPU
// always runs linear, then gelu.

Tensor Linear::forward_gelu(const Tensor& x) const {
  // The fused GEMM stands in for forward() only where forward() is this class's own
  // ops::linear: a subclass may compute something else (communication, a shard).
  const bool plain = typeid(*this) == typeid(Linear);
  if (plain && x.is_cuda() && !fp8_active() && env::flag("FORGE_GELU_FUSION")) return ops::linear_gelu(x, weight, bias);
  return ops::gelu(forward(x), true);
}

void name_linears(Module& root, const std::string& prefix) {
  for (const auto& [child, m] : root.named_children()) {
    const std::string path = prefix.empty() ? child : prefix + "." + child;
    if (auto* l = dynamic_cast<Linear*>(m.get())) l->name = path;
    name_linears(*m, path);
  }
}

}  // namespace forge::nn
