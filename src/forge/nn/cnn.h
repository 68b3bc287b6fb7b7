#pragma once
// A LeNet-style CNN for 28x28 grey images (Fashion-MNIST):
// conv(1->6, 5x5, pad 2) relu pool2 -> conv(6->16, 5x5) relu pool2 -> flatten (16*5*5)
// -> fc 120 relu -> fc 84 relu -> fc num_classes.
#include "forge/nn/layers.h"

namespace forge::nn {

class LeNet : public Module {
 public:
  explicit LeNet(int64_t num_classes = 10, uint64_t seed = 0);
  Tensor forward(const Tensor& x) const;  // (N, 1, 28, 28) -> logits (N, num_classes)
  std::shared_ptr<Conv2d> conv1, conv2;
  std::shared_ptr<MaxPool2d> pool;
  std::shared_ptr<Linear> fc1, fc2, fc3;
};

}  // namespace forge::nn
