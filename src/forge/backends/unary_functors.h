#pragma once
// Elementwise unary math and its derivatives, written once for both backends.
//
// Forward functors map x -> y in the compute type T (float for f32/bf16/f16, double for
// f64). Backward functors map (g, x, y) -> dL/dx = g * y'(x), using whichever of x and y
// is cheaper; unary_needs_x/unary_needs_y say which the op must save.
#include <type_traits>

#include "forge/backends/math.h"
#include "forge/core/macros.h"

namespace forge {

enum class UnaryOp { neg, abs, exp, log, sqrt, rsqrt, sin, cos, tanh, sigmoid, relu, gelu, gelu_tanh, silu };

const char* unary_name(UnaryOp op);
// True for ops that map integers to integers (neg, abs, relu).
bool unary_keeps_integers(UnaryOp op);
bool unary_needs_x(UnaryOp op);
bool unary_needs_y(UnaryOp op);

namespace fn {

inline constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2/pi)
inline constexpr double kInvSqrt2 = 0.70710678118654752440;      // 1/sqrt(2)
inline constexpr double kInvSqrt2Pi = 0.39894228040143267794;    // 1/sqrt(2 pi)

template <UnaryOp Op> struct Unary;
template <> struct Unary<UnaryOp::neg> { template <class T> FORGE_HD T operator()(T x) const { return T(-x); } };
template <> struct Unary<UnaryOp::abs> {
  template <class T> FORGE_HD T operator()(T x) const {
    if constexpr (std::is_unsigned_v<T>) return x;
    else return x < T(0) ? T(-x) : x;
  }
};
template <> struct Unary<UnaryOp::exp> { template <class T> FORGE_HD T operator()(T x) const { return fmath::exp(x); } };
template <> struct Unary<UnaryOp::log> { template <class T> FORGE_HD T operator()(T x) const { return fmath::log(x); } };
template <> struct Unary<UnaryOp::sqrt> { template <class T> FORGE_HD T operator()(T x) const { return fmath::sqrt(x); } };
template <> struct Unary<UnaryOp::rsqrt> { template <class T> FORGE_HD T operator()(T x) const { return T(1) / fmath::sqrt(x); } };
template <> struct Unary<UnaryOp::sin> { template <class T> FORGE_HD T operator()(T x) const { return fmath::sin(x); } };
template <> struct Unary<UnaryOp::cos> { template <class T> FORGE_HD T operator()(T x) const { return fmath::cos(x); } };
template <> struct Unary<UnaryOp::tanh> { template <class T> FORGE_HD T operator()(T x) const { return fmath::tanh(x); } };
template <> struct Unary<UnaryOp::sigmoid> {
  template <class T> FORGE_HD T operator()(T x) const { return T(1) / (T(1) + fmath::exp(-x)); }
};
template <> struct Unary<UnaryOp::relu> { template <class T> FORGE_HD T operator()(T x) const { return x > T(0) ? x : T(0); } };
// gelu(x) = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2))
template <> struct Unary<UnaryOp::gelu> {
  template <class T> FORGE_HD T operator()(T x) const { return T(0.5) * x * (T(1) + fmath::erf(x * T(kInvSqrt2))); }
};
// gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
template <> struct Unary<UnaryOp::gelu_tanh> {
  template <class T> FORGE_HD T operator()(T x) const {
    return T(0.5) * x * (T(1) + fmath::tanh(T(kSqrt2OverPi) * (x + T(0.044715) * x * x * x)));
  }
};
// silu(x) = x * sigmoid(x)
template <> struct Unary<UnaryOp::silu> {
  template <class T> FORGE_HD T operator()(T x) const { return x / (T(1) + fmath::exp(-x)); }
};

template <UnaryOp Op> struct UnaryGrad;
template <> struct UnaryGrad<UnaryOp::neg> { template <class T> FORGE_HD T operator()(T g, T, T) const { return -g; } };
template <> struct UnaryGrad<UnaryOp::abs> {
  template <class T> FORGE_HD T operator()(T g, T x, T) const { return x > T(0) ? g : (x < T(0) ? -g : T(0)); }
};
template <> struct UnaryGrad<UnaryOp::exp> { template <class T> FORGE_HD T operator()(T g, T, T y) const { return g * y; } };
template <> struct UnaryGrad<UnaryOp::log> { template <class T> FORGE_HD T operator()(T g, T x, T) const { return g / x; } };
template <> struct UnaryGrad<UnaryOp::sqrt> {
  template <class T> FORGE_HD T operator()(T g, T, T y) const { return g / (T(2) * y); }
};
template <> struct UnaryGrad<UnaryOp::rsqrt> {
  template <class T> FORGE_HD T operator()(T g, T, T y) const { return T(-0.5) * g * y * y * y; }
};
template <> struct UnaryGrad<UnaryOp::sin> { template <class T> FORGE_HD T operator()(T g, T x, T) const { return g * fmath::cos(x); } };
template <> struct UnaryGrad<UnaryOp::cos> { template <class T> FORGE_HD T operator()(T g, T x, T) const { return -g * fmath::sin(x); } };
template <> struct UnaryGrad<UnaryOp::tanh> { template <class T> FORGE_HD T operator()(T g, T, T y) const { return g * (T(1) - y * y); } };
template <> struct UnaryGrad<UnaryOp::sigmoid> {
  template <class T> FORGE_HD T operator()(T g, T, T y) const { return g * y * (T(1) - y); }
};
template <> struct UnaryGrad<UnaryOp::relu> { template <class T> FORGE_HD T operator()(T g, T x, T) const { return x > T(0) ? g : T(0); } };
// d/dx x Phi(x) = Phi(x) + x phi(x)
template <> struct UnaryGrad<UnaryOp::gelu> {
  template <class T> FORGE_HD T operator()(T g, T x, T) const {
    const T cdf = T(0.5) * (T(1) + fmath::erf(x * T(kInvSqrt2)));
    const T pdf = T(kInvSqrt2Pi) * fmath::exp(T(-0.5) * x * x);
    return g * (cdf + x * pdf);
  }
};
template <> struct UnaryGrad<UnaryOp::gelu_tanh> {
  template <class T> FORGE_HD T operator()(T g, T x, T) const {
    const T inner = T(kSqrt2OverPi) * (x + T(0.044715) * x * x * x);
    const T th = fmath::tanh(inner);
    const T dinner = T(kSqrt2OverPi) * (T(1) + T(3 * 0.044715) * x * x);
    return g * (T(0.5) * (T(1) + th) + T(0.5) * x * (T(1) - th * th) * dinner);
  }
};
// d/dx x s(x) = s(x) (1 + x (1 - s(x)))
template <> struct UnaryGrad<UnaryOp::silu> {
  template <class T> FORGE_HD T operator()(T g, T x, T) const {
    const T s = T(1) / (T(1) + fmath::exp(-x));
    return g * s * (T(1) + x * (T(1) - s));
  }
};

}  // namespace fn

// Calls f.template operator()<Op>() for the runtime op: one switch, shared by backends.
template <class F> decltype(auto) dispatch_unary(UnaryOp op, F&& f) {
  switch (op) {
    case UnaryOp::neg: return f.template operator()<UnaryOp::neg>();
    case UnaryOp::abs: return f.template operator()<UnaryOp::abs>();
    case UnaryOp::exp: return f.template operator()<UnaryOp::exp>();
    case UnaryOp::log: return f.template operator()<UnaryOp::log>();
    case UnaryOp::sqrt: return f.template operator()<UnaryOp::sqrt>();
    case UnaryOp::rsqrt: return f.template operator()<UnaryOp::rsqrt>();
    case UnaryOp::sin: return f.template operator()<UnaryOp::sin>();
    case UnaryOp::cos: return f.template operator()<UnaryOp::cos>();
    case UnaryOp::tanh: return f.template operator()<UnaryOp::tanh>();
    case UnaryOp::sigmoid: return f.template operator()<UnaryOp::sigmoid>();
    case UnaryOp::relu: return f.template operator()<UnaryOp::relu>();
    case UnaryOp::gelu: return f.template operator()<UnaryOp::gelu>();
    case UnaryOp::gelu_tanh: return f.template operator()<UnaryOp::gelu_tanh>();
    case UnaryOp::silu: return f.template operator()<UnaryOp::silu>();
  }
  return f.template operator()<UnaryOp::neg>();
}

}  // namespace forge
