// The worked autograd example behind `forge autograd-demo` (and `make train` until the
// demo language model exists): a 2-layer MLP fits y = sin(3x) + 0.5 x^2 on [-1, 1] with
// plain SGD, every gradient computed by forge's reverse-mode autograd.
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <string>

#include "forge/forge.h"

namespace forge::app {

int run_autograd_demo(int argc, char** argv) {
  int steps = 500;
  uint64_t seed = 0;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      FORGE_CHECK(i + 1 < argc, "autograd-demo: ", a, " needs a value");
      return argv[++i];
    };
    if (a == "--steps") steps = std::stoi(value());
    else if (a == "--seed") seed = std::stoull(value());
    else FORGE_THROW("autograd-demo: unknown option '", a, "' (expected --steps N or --seed S)");
  }
  FORGE_CHECK(steps > 0, "autograd-demo: --steps must be positive, got ", steps);
  manual_seed(seed);
  using namespace forge::ops;

  const int64_t n = 256, hidden = 32;
  Tensor x = sub(mul(rand({n, 1}), 2.0), 1.0);                // (N, 1) in [-1, 1)
  Tensor y = add(sin(mul(x, 3.0)), mul(pow(x, 2.0), 0.5));     // (N, 1)

  Tensor w1 = mul(randn({1, hidden}), 1.0).requires_grad_();   // (1, H)
  Tensor b1 = zeros({hidden}, {.requires_grad = true});         // (H)
  Tensor w2 = mul(randn({hidden, 1}), 1.0 / std::sqrt(double(hidden))).requires_grad_();  // (H, 1)
  Tensor b2 = zeros({1}, {.requires_grad = true});
  std::vector<Tensor> params{w1, b1, w2, b2};
  const double lr = 0.1;

  std::cout << "forge autograd demo: fit y = sin(3x) + 0.5x^2 with a 1-" << hidden << "-1 tanh MLP, " << n
            << " points, SGD lr " << lr << "\n";
  double first = 0, last = 0;
  for (int step = 1; step <= steps; ++step) {
    Tensor h = tanh(add(matmul(x, w1), b1));        // (N, H)
    Tensor pred = add(matmul(h, w2), b2);           // (N, 1)
    Tensor loss = mean(pow(sub(pred, y), 2.0));     // ()
    for (auto& p : params) p.zero_grad();
    loss.backward();
    {
      NoGradGuard no_grad;
      for (auto& p : params) p.add_(p.grad(), -lr);
    }
    last = loss.item();
    if (step == 1) first = last;
    if (step == 1 || step % 50 == 0 || step == steps) std::cout << "step " << step << "  loss " << last << "\n";
  }
  std::cout << "loss " << first << " -> " << last << " (" << (first / last) << "x lower)\n";
  return last < first ? 0 : 1;
}

}  // namespace forge::app
