#pragma once
// Scalar math overloaded for float and double, callable from host and device code, so
// the elementwise functors below compile unchanged in both backends.
#include <cmath>

#include "forge/core/macros.h"

namespace forge::fmath {

FORGE_HD_INLINE float exp(float x) { return ::expf(x); }
FORGE_HD_INLINE double exp(double x) { return ::exp(x); }
FORGE_HD_INLINE float log(float x) { return ::logf(x); }
FORGE_HD_INLINE double log(double x) { return ::log(x); }
FORGE_HD_INLINE float sqrt(float x) { return ::sqrtf(x); }
FORGE_HD_INLINE double sqrt(double x) { return ::sqrt(x); }
FORGE_HD_INLINE float sin(float x) { return ::sinf(x); }
FORGE_HD_INLINE double sin(double x) { return ::sin(x); }
FORGE_HD_INLINE float cos(float x) { return ::cosf(x); }
FORGE_HD_INLINE double cos(double x) { return ::cos(x); }
FORGE_HD_INLINE float tanh(float x) { return ::tanhf(x); }
FORGE_HD_INLINE double tanh(double x) { return ::tanh(x); }
FORGE_HD_INLINE float erf(float x) { return ::erff(x); }
FORGE_HD_INLINE double erf(double x) { return ::erf(x); }
FORGE_HD_INLINE float pow(float a, float b) { return ::powf(a, b); }
FORGE_HD_INLINE double pow(double a, double b) { return ::pow(a, b); }
FORGE_HD_INLINE float floor(float x) { return ::floorf(x); }
FORGE_HD_INLINE double floor(double x) { return ::floor(x); }

}  // namespace forge::fmath
