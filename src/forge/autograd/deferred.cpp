// Deferred weight gradients (Note [weight gradients behind the collective] in deferred.h).
#include "forge/autograd/deferred.h"

#include <utility>

#include "forge/autograd/grad_mode.h"
#include "forge/autograd/node.h"
#include "forge/core/error.h"

namespace forge::autograd {

void DeferredGrads::run() {
  std::vector<std::function<void()>> work = std::move(work_);
  work_.clear();
  NoGradGuard no_grad;
  for (auto& w : work) w();
}

void accumulate_leaf_grad(const Tensor& param, const Tensor& grad) {
  if (!grad.defined()) return;
  FORGE_CHECK(param.defined() && param.is_leaf() && param.requires_grad(),
              "accumulate_leaf_grad: the tensor is not a leaf that requires grad");
  const std::shared_ptr<Node> acc = gradient_edge(param);
  acc->apply(grad);
}

}  // namespace forge::autograd
