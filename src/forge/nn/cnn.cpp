#include "forge/nn/cnn.h"

#include "forge/ops/unary.h"
#include "forge/ops/view.h"

namespace forge::nn {

LeNet::LeNet(int64_t num_classes, uint64_t seed) {
  Generator gen(seed);
  conv1 = register_module("conv1", std::make_shared<Conv2d>(1, 6, std::array<int64_t, 2>{5, 5},
                                                           std::array<int64_t, 2>{1, 1}, std::array<int64_t, 2>{2, 2},
                                                           true, &gen));
  conv2 = register_module("conv2", std::make_shared<Conv2d>(6, 16, std::array<int64_t, 2>{5, 5},
                                                           std::array<int64_t, 2>{1, 1}, std::array<int64_t, 2>{0, 0},
                                                           true, &gen));
  pool = register_module("pool", std::make_shared<MaxPool2d>(std::array<int64_t, 2>{2, 2}));
  fc1 = register_module("fc1", std::make_shared<Linear>(16 * 5 * 5, 120, true, &gen));
  fc2 = register_module("fc2", std::make_shared<Linear>(120, 84, true, &gen));
  fc3 = register_module("fc3", std::make_shared<Linear>(84, num_classes, true, &gen));
}

Tensor LeNet::forward(const Tensor& x) const {
  FORGE_CHECK(x.dim() == 4 && x.size(1) == 1 && x.size(2) == 28 && x.size(3) == 28,
              "LeNet: expects images of shape (N, 1, 28, 28), got ", x.shape());
  Tensor h = pool->forward(ops::relu(conv1->forward(x)));  // (N, 6, 14, 14)
  h = pool->forward(ops::relu(conv2->forward(h)));         // (N, 16, 5, 5)
  h = ops::flatten(h, 1);                                  // (N, 400)
  h = ops::relu(fc1->forward(h));
  h = ops::relu(fc2->forward(h));
  return fc3->forward(h);
}

}  // namespace forge::nn
