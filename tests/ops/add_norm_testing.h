#pragma once
// Helpers shared by the fused residual add + norm tests (test_add_layer_norm.cpp,
// test_add_rms_norm.cpp): seeded inputs, bitwise comparison, the message of an Error.
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "forge/forge.h"

namespace forge::add_norm_testing {

inline Tensor input(const Shape& s, DType dtype, uint64_t seed, bool grad = true) {
  Generator g(seed);
  return randn(s, {}, &g).to(dtype).requires_grad_(grad);
}

inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.contiguous().data_ptr(), b.contiguous().data_ptr(), a.nbytes()) == 0;
}

// The message of the forge::Error that fn throws ("no error" when it throws none).
inline std::string message(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return std::string(e.what());
  }
  return std::string("no error");
}

// The logits forward() gives, then every parameter's gradient of sum(logits * w) in
// named_parameters() order (each zeroed after it is read, so the next call starts clean).
template <class Model>
std::vector<Tensor> logits_and_grads(const Model& model, const std::function<Tensor()>& forward, const Tensor& w) {
  Tensor logits = forward();
  ops::sum(ops::mul(logits, w)).backward();
  std::vector<Tensor> out{logits.detach()};
  for (const auto& [name, p] : model.named_parameters()) {
    out.push_back(p.grad());
    Tensor q = p;
    q.zero_grad();
  }
  return out;
}

}  // namespace forge::add_norm_testing
