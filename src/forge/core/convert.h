#pragma once
// Element conversion between any two forge element types, host and device.
// Float -> int truncates toward zero (as C++ and PyTorch do); anything -> bool is != 0;
// double -> bf16/f16 goes through float, as PyTorch does.
#include <type_traits>

#include "forge/core/dtype.h"
#include "forge/core/macros.h"

namespace forge {

template <class T> inline constexpr bool is_half_v = std::is_same_v<T, bf16> || std::is_same_v<T, f16>;

template <class To, class From> FORGE_HD_INLINE To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (is_half_v<From>) {
    return convert<To>(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else if constexpr (is_half_v<To>) {
    return To(static_cast<float>(v));
  } else {
    return static_cast<To>(v);
  }
}

}  // namespace forge
