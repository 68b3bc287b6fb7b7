#include "forge/backends/cpu/unary.h"
#include "forge/backends/swiglu_functors.h"

#include "forge/backends/cpu/loops.h"
#include "forge/core/dispatch.h"

namespace forge::cpu {

void unary(UnaryOp op, const Tensor& x, Tensor& out) {
  dispatch_unary(op, [&]<UnaryOp Op>() {
    const fn::Unary<Op> f;
    if (is_floating(x.dtype())) {
      dispatch_float(x.dtype(), unary_name(op), [&]<class T>() {
        elementwise<T, T>(out, [f](T v) { return T(f(static_cast<acc_t<T>>(v))); }, {&x});
      });
    } else if constexpr (Op == UnaryOp::neg || Op == UnaryOp::abs || Op == UnaryOp::relu) {
      dispatch_numeric(x.dtype(), unary_name(op), [&]<class T>() {
        elementwise<T, T>(out, [f](T v) { return f(v); }, {&x});
      });
    } else {
      FORGE_THROW(unary_name(op), ": expected a floating dtype, got ", dtype_name(x.dtype()));
    }
  });
}

void unary_backward(UnaryOp op, const Tensor& g, const Tensor& x, const Tensor& y, Tensor& out) {
  dispatch_unary(op, [&]<UnaryOp Op>() {
    const fn::UnaryGrad<Op> f;
    dispatch_float(g.dtype(), unary_name(op), [&]<class T>() {
      using A = acc_t<T>;
      elementwise<T, T, T, T>(
          out, [f](T gv, T xv, T yv) { return T(f(static_cast<A>(gv), static_cast<A>(xv), static_cast<A>(yv))); },
          {&g, &x, &y});
    });
  });
}

void swiglu(const Tensor& gate, const Tensor& up, Tensor& out) {
  dispatch_float(gate.dtype(), "swiglu", [&]<class T>() {
    using A = acc_t<T>;
    elementwise<T, T, T>(out, [](T a, T b) { return T(fn::SwiGlu{}(static_cast<A>(a), static_cast<A>(b))); },
                         {&gate, &up});
  });
}

void swiglu_backward(const Tensor& g, const Tensor& gate, const Tensor& up, Tensor& dgate, Tensor& dup) {
  dispatch_float(gate.dtype(), "swiglu", [&]<class T>() {
    using A = acc_t<T>;
    if (dgate.defined())
      elementwise<T, T, T, T>(
          dgate,
          [](T gv, T a, T b) {
            return T(fn::SwiGluGradGate{}(static_cast<A>(gv), static_cast<A>(a), static_cast<A>(b)));
          },
          {&g, &gate, &up});
    if (dup.defined())
      elementwise<T, T, T>(dup, [](T gv, T a) { return T(fn::SwiGluGradUp{}(static_cast<A>(gv), static_cast<A>(a))); },
                           {&g, &gate});
  });
}

}  // namespace forge::cpu
