// Deferred weight gradients (Note [weight gradients behind the collective] in deferred.h).
#include "forge/autograd/deferred.h"

#include <utility>

#include "forge/autograd/grad_mode.h"
#include "forge/autograd/node.h"
#include "forge/core/error.h"

namespace forge::autograd {

void DeferredGrads::run(const Tensor& input) {
  FORGE_CHECK(!provides_input_ || input.defined() || work_.empty(),
              "DeferredGrads::run: the queue provides its linears' input; give it");
  std::vector<std::function<void()>> work = std::move(work_);
  work_.clear();
  input_ = input;
  struct Clear {
    Tensor& t;
    ~Clear() { t = Tensor(); }
  } clear{input_};
  NoGradGuard no_grad;
  for (auto& w : work) w();
}

const Tensor& DeferredGrads::input() const {
  FORGE_CHECK(provides_input_ && input_.defined(), "DeferredGrads::input: ",
              provides_input_ ? "only while the queue runs" : "this queue does not provide its linears' input");
  return input_;
}

namespace {
thread_local std::shared_ptr<DeferredGrads> t_queue;
}

DeferWeightGrads::DeferWeightGrads(std::shared_ptr<DeferredGrads> queue) : previous_(std::move(t_queue)) {
  t_queue = std::move(queue);
}
DeferWeightGrads::~DeferWeightGrads() { t_queue = std::move(previous_); }
const std::shared_ptr<DeferredGrads>& current_weight_grad_queue() { return t_queue; }

void accumulate_leaf_grad(const Tensor& param, const Tensor& grad) {
  if (!grad.defined()) return;
  FORGE_CHECK(param.defined() && param.is_leaf() && param.requires_grad(),
              "accumulate_leaf_grad: the tensor is not a leaf that requires grad");
  const std::shared_ptr<Node> acc = gradient_edge(param);
  acc->apply(grad);
}

}  // namespace forge::autograd
