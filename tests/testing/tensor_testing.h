#pragma once
// Small helpers shared by the unit tests.
#include <functional>
#include <string>
#include <vector>

#include "forge/forge.h"

namespace forge::testing {

// All elements as doubles, row-major (any dtype, any device).
inline std::vector<double> vals(const Tensor& t) { return t.to_vector<double>(); }

// The message of the forge::Error that f throws, or "<no error>".
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

// start, start + 1, ... in f64, shaped.
inline Tensor seq(double start, const Shape& s) {
  return arange(start, start + static_cast<double>(shape_numel(s)), 1.0, {.dtype = DType::f64}).reshape(s);
}

}  // namespace forge::testing
