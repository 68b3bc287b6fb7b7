#pragma once
// Elementwise binary math, written once for both backends. Functors take the compute
// type T (float for 16-bit floats, else the element type); comparisons return bool.
// maximum/minimum propagate NaN, like PyTorch.
#include <type_traits>

#include "forge/backends/math.h"
#include "forge/core/macros.h"

namespace forge {

enum class BinaryOp { add, sub, mul, div, pow, maximum, minimum, eq, ne, lt, le, gt, ge };

const char* binary_name(BinaryOp op);
bool binary_is_comparison(BinaryOp op);

namespace fn {

template <class T> FORGE_HD_INLINE bool is_nan(T v) {
  if constexpr (std::is_floating_point_v<T>) return v != v;
  else return false;
}

template <BinaryOp Op> struct Binary;
// add/sub carry alpha: a + alpha * b, a - alpha * b.
template <> struct Binary<BinaryOp::add> {
  double alpha = 1.0;
  template <class T> FORGE_HD T operator()(T a, T b) const { return alpha == 1.0 ? a + b : T(a + T(alpha) * b); }
};
template <> struct Binary<BinaryOp::sub> {
  double alpha = 1.0;
  template <class T> FORGE_HD T operator()(T a, T b) const { return alpha == 1.0 ? a - b : T(a - T(alpha) * b); }
};
template <> struct Binary<BinaryOp::mul> { double alpha = 1.0; template <class T> FORGE_HD T operator()(T a, T b) const { return a * b; } };
template <> struct Binary<BinaryOp::div> {
  double alpha = 1.0;
  template <class T> FORGE_HD T operator()(T a, T b) const {
    if constexpr (std::is_floating_point_v<T>) {
      return a / b;
    } else {
      // integer division is not true division; ops promote integer div to f32 (as PyTorch)
      return b == T(0) ? T(0) : T(a / b);
    }
  }
};
template <> struct Binary<BinaryOp::pow> {
  double alpha = 1.0;
  template <class T> FORGE_HD T operator()(T a, T b) const {
    if constexpr (std::is_floating_point_v<T>) {
      return fmath::pow(a, b);
    } else {
      if constexpr (std::is_signed_v<T>) {
        if (b < T(0)) return a == T(1) ? T(1) : T(0);
      }
      T r = 1, base = a;
      for (T e = b; e > T(0); e = T(e / 2)) {
        if (e % 2) r = T(r * base);
        base = T(base * base);
      }
      return r;
    }
  }
};
template <> struct Binary<BinaryOp::maximum> {
  double alpha = 1.0;
  template <class T> FORGE_HD T operator()(T a, T b) const { return is_nan(a) ? a : (is_nan(b) ? b : (a > b ? a : b)); }
};
template <> struct Binary<BinaryOp::minimum> {
  double alpha = 1.0;
  template <class T> FORGE_HD T operator()(T a, T b) const { return is_nan(a) ? a : (is_nan(b) ? b : (a < b ? a : b)); }
};
template <> struct Binary<BinaryOp::eq> { double alpha = 1.0; template <class T> FORGE_HD bool operator()(T a, T b) const { return a == b; } };
template <> struct Binary<BinaryOp::ne> { double alpha = 1.0; template <class T> FORGE_HD bool operator()(T a, T b) const { return a != b; } };
template <> struct Binary<BinaryOp::lt> { double alpha = 1.0; template <class T> FORGE_HD bool operator()(T a, T b) const { return a < b; } };
template <> struct Binary<BinaryOp::le> { double alpha = 1.0; template <class T> FORGE_HD bool operator()(T a, T b) const { return a <= b; } };
template <> struct Binary<BinaryOp::gt> { double alpha = 1.0; template <class T> FORGE_HD bool operator()(T a, T b) const { return a > b; } };
template <> struct Binary<BinaryOp::ge> { double alpha = 1.0; template <class T> FORGE_HD bool operator()(T a, T b) const { return a >= b; } };

}  // namespace fn

template <class F> decltype(auto) dispatch_binary(BinaryOp op, F&& f) {
  switch (op) {
    case BinaryOp::add: return f.template operator()<BinaryOp::add>();
    case BinaryOp::sub: return f.template operator()<BinaryOp::sub>();
    case BinaryOp::mul: return f.template operator()<BinaryOp::mul>();
    case BinaryOp::div: return f.template operator()<BinaryOp::div>();
    case BinaryOp::pow: return f.template operator()<BinaryOp::pow>();
    case BinaryOp::maximum: return f.template operator()<BinaryOp::maximum>();
    case BinaryOp::minimum: return f.template operator()<BinaryOp::minimum>();
    case BinaryOp::eq: return f.template operator()<BinaryOp::eq>();
    case BinaryOp::ne: return f.template operator()<BinaryOp::ne>();
    case BinaryOp::lt: return f.template operator()<BinaryOp::lt>();
    case BinaryOp::le: return f.template operator()<BinaryOp::le>();
    case BinaryOp::gt: return f.template operator()<BinaryOp::gt>();
    case BinaryOp::ge: return f.template operator()<BinaryOp::ge>();
  }
  return f.template operator()<BinaryOp::add>();
}

}  // namespace forge
