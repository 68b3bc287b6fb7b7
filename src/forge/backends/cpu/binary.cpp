#include "forge/backends/cpu/binary.h"

#include "forge/backends/cpu/loops.h"
#include "forge/core/dispatch.h"

namespace forge::cpu {

void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out, double alpha) {
  dispatch_binary(op, [&]<BinaryOp Op>() {
    fn::Binary<Op> f;
    f.alpha = alpha;
    if constexpr (Op == BinaryOp::eq || Op == BinaryOp::ne || Op == BinaryOp::lt || Op == BinaryOp::le ||
                  Op == BinaryOp::gt || Op == BinaryOp::ge) {
      dispatch_all(a.dtype(), binary_name(op), [&]<class T>() {
        using A = acc_t<T>;
        elementwise<bool, T, T>(out, [f](T x, T y) { return f(static_cast<A>(x), static_cast<A>(y)); }, {&a, &b});
      });
    } else {
      dispatch_numeric(a.dtype(), binary_name(op), [&]<class T>() {
        using A = acc_t<T>;
        elementwise<T, T, T>(out, [f](T x, T y) { return T(f(static_cast<A>(x), static_cast<A>(y))); }, {&a, &b});
      });
    }
  });
}

void where(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out) {
  dispatch_all(a.dtype(), "where", [&]<class T>() {
    elementwise<T, bool, T, T>(out, [](bool c, T x, T y) { return c ? x : y; }, {&cond, &a, &b});
  });
}

}  // namespace forge::cpu
