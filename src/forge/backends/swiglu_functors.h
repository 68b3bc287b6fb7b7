#pragma once
// SwiGLU's gated activation and its two partial derivatives, written once for both backends
// (the compute type A: float for f32/bf16/f16, double for f64).
//
//   y       = silu(gate) * up              silu(a) = a s(a), s the logistic sigmoid
//   d gate  = g * up * s(a) (1 + a (1 - s(a)))
//   d up    = g * silu(a)
#include "forge/backends/math.h"
#include "forge/core/macros.h"

namespace forge::fn {

struct SwiGlu {
  template <class A> FORGE_HD A operator()(A a, A b) const { return a / (A(1) + fmath::exp(-a)) * b; }
};
struct SwiGluGradGate {
  template <class A> FORGE_HD A operator()(A g, A a, A b) const {
    const A s = A(1) / (A(1) + fmath::exp(-a));
    return g * b * s * (A(1) + a * (A(1) - s));
  }
};
struct SwiGluGradUp {
  template <class A> FORGE_HD A operator()(A g, A a) const { return g * (a / (A(1) + fmath::exp(-a))); }
};

}  // namespace forge::fn
