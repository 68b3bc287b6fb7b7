#include "forge/nn/linear.h"

#include <cmath>

#include "forge/ops/creation.h"
#include "forge/ops/matmul.h"

namespace forge::nn {

Linear::Linear(int64_t in, int64_t out, bool with_bias, Generator* gen) : in_features(in), out_features(out) {
  FORGE_CHECK(in > 0 && out > 0, "Linear: features must be positive, got in=", in, " out=", out);
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  auto init = [&](const Shape& s) { return default_init_enabled() ? uniform(s, -bound, bound, {}, gen) : empty(s); };
  weight = register_parameter("weight", init({out, in}));
  if (with_bias) bias = register_parameter("bias", init({out}));
}

Tensor Linear::forward(const Tensor& x) const {
  FORGE_CHECK(x.dim() >= 1 && x.shape().back() == in_features, "Linear: input of shape ", x.shape(),
              " does not end in in_features = ", in_features);
  return ops::linear(x, weight, bias);
}

}  // namespace forge::nn
