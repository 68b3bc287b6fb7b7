#pragma once
// The optimizers' element math, written once for the CPU and CUDA backends (as
// unary_functors.h and binary_functors.h are for the elementwise ops), with every rounding
// spelled out so that both backends compute the same bits.
//
// Note [optimizer rounding]: every arithmetic step below is one IEEE round-to-nearest
// operation on both sides. On the host that is the plain operator (forge is built in ISO
// C++ mode without -mfma, so GCC never contracts a * b + c into an FMA); on the device
// it is the __fmul_rn / __fadd_rn / __fdiv_rn / __fsqrt_rn intrinsics (and their double
// forms), which nvcc never contracts either. So a CUDA AdamW step equals the CPU one bit
// for bit, including the per-tensor scalars: beta^t is computed by binary exponentiation
// with rounded multiplications (pow_int), not by the libraries' pow, whose last bits
// differ between glibc and CUDA.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "forge/core/macros.h"

namespace forge::fn {

FORGE_HD_INLINE float rn_mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
FORGE_HD_INLINE double rn_mul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
FORGE_HD_INLINE float rn_add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
FORGE_HD_INLINE double rn_add(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
FORGE_HD_INLINE float rn_div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
FORGE_HD_INLINE double rn_div(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}
FORGE_HD_INLINE float rn_sqrt(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}
FORGE_HD_INLINE double rn_sqrt(double a) {
#if defined(__CUDA_ARCH__)
  return __dsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

// b^t for t >= 0 by binary exponentiation: about 2 log2(t) rounded multiplications, the
// same bits on host and device (Note [optimizer rounding]). Each squaring doubles the
// relative error of its input, so the result is within about t * 1.1e-16 of b^t
// (relative): 1e-12 at t = 10^4, where 1 - b^t is all the bias corrections need and the
// result is rounded to f32 anyway.
FORGE_HD_INLINE double pow_int(double b, int64_t t) {
  double result = 1.0;
  while (t > 0) {
    if (t & 1) result = rn_mul(result, b);
    t >>= 1;
    if (t > 0) b = rn_mul(b, b);
  }
  return result;
}

// ---- AdamW ------------------------------------------------------------------------------

// One parameter group's hyper-parameters (optim/adamw.h).
struct AdamWHyper {
  double lr = 0;
  double beta1 = 0;
  double beta2 = 0;
  double eps = 0;
  double weight_decay = 0;
};

// The per-tensor constants of one step, in the state precision S (float, or double for
// f64 parameters), computed in double from the hyper-parameters and the tensor's step t
// (1-based), then rounded once to S.
template <class S> struct AdamWScalars {
  S decay, beta1, one_minus_beta1, beta2, one_minus_beta2, step_size, bias_correction2_sqrt, eps;
};

template <class S> FORGE_HD_INLINE AdamWScalars<S> adamw_scalars(const AdamWHyper& h, int64_t t) {
  const double bias_correction1 = rn_add(1.0, -pow_int(h.beta1, t));
  const double bias_correction2 = rn_add(1.0, -pow_int(h.beta2, t));
  return {static_cast<S>(rn_add(1.0, -rn_mul(h.lr, h.weight_decay))),
          static_cast<S>(h.beta1),
          static_cast<S>(rn_add(1.0, -h.beta1)),
          static_cast<S>(h.beta2),
          static_cast<S>(rn_add(1.0, -h.beta2)),
          static_cast<S>(rn_div(h.lr, bias_correction1)),
          static_cast<S>(rn_sqrt(bias_correction2)),
          static_cast<S>(h.eps)};
}

// One element of an AdamW step in S: x is the weight of record (the parameter itself, or
// its f32 master for a 16-bit parameter), m and v its moments, g its gradient.
//   x *= decay;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g g;
//   x -= step_size * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
template <class S> FORGE_HD_INLINE void adamw_update(S& x, S& m, S& v, S g, const AdamWScalars<S>& c) {
  x = rn_mul(x, c.decay);
  m = rn_add(rn_mul(c.beta1, m), rn_mul(c.one_minus_beta1, g));
  v = rn_add(rn_mul(c.beta2, v), rn_mul(rn_mul(c.one_minus_beta2, g), g));
  const S denom = rn_add(rn_div(rn_sqrt(v), c.bias_correction2_sqrt), c.eps);
  x = rn_add(x, -rn_div(rn_mul(c.step_size, m), denom));
}

// ---- SGD --------------------------------------------------------------------------------

// The constants of one SGD step for parameters of dtype T computed in A (acc_t<T>):
// exactly the scalars the ops of optim/sgd.cpp use, so the fused CUDA kernel reproduces
// that op sequence (each op computes in A and rounds its result to T):
//   d = add(g, p, wd)       -> T(g + A(wd) p)            (only when wd != 0)
//   mul_(b, mu)             -> T(b * A(T(mu)))           (the scalar takes b's dtype)
//   add_(b, d, 1 - tau)     -> T(b + A(1 - tau) d)
//   d = add(d, b, mu)       -> T(d + A(mu) b)            (Nesterov)
//   add_(p, d, -lr)         -> T(p + A(-lr) d)
template <class A> struct SGDScalars {
  A weight_decay;      // A(wd)
  A momentum_rounded;  // A(T(mu)): mul_'s scalar operand
  A momentum;          // A(mu): the alpha of Nesterov's add
  A one_minus_dampening;
  A neg_lr;
  bool has_weight_decay;
  bool has_momentum;
  bool nesterov;
};

// x rounded to T and read back in A (a no-op when T is A).
template <class T, class A> FORGE_HD_INLINE A round_to(A x) {
  if constexpr (std::is_same_v<T, A>) return x;
  else return static_cast<A>(T(x));
}

// One element of an SGD step: p, g in A (already T values); b the momentum buffer element
// (read and written; unused without momentum); first: b is new (b = d, no dampening).
template <class T, class A>
FORGE_HD_INLINE void sgd_update(A& p, A g, A& b, bool first, const SGDScalars<A>& c) {
  A d = c.has_weight_decay ? round_to<T>(rn_add(g, rn_mul(c.weight_decay, p))) : g;
  if (c.has_momentum) {
    if (first) {
      b = d;
    } else {
      b = round_to<T>(rn_mul(b, c.momentum_rounded));
      b = round_to<T>(rn_add(b, rn_mul(c.one_minus_dampening, d)));
    }
    d = c.nesterov ? round_to<T>(rn_add(d, rn_mul(c.momentum, b))) : b;
  }
  p = round_to<T>(rn_add(p, rn_mul(c.neg_lr, d)));
}

}  // namespace forge::fn
