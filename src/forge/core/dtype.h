#pragma once
// Element types and their C++ counterparts.
#include <cstddef>
#include <cstdint>
#include <string>

#include "forge/core/half.h"

namespace forge {

enum class DType : uint8_t { f32, f64, bf16, f16, i32, i64, u8, boolean };

inline constexpr int kNumDTypes = 8;

size_t element_size(DType t);
const char* dtype_name(DType t);  // "f32", "bf16", ... (as printed and parsed)
DType parse_dtype(const std::string& name);  // accepts forge and PyTorch spellings
bool is_floating(DType t);
bool is_integral(DType t);  // includes bool

// The type a binary op of `a` and `b` computes in, following PyTorch's promotion lattice:
// bool < u8 < i32 < i64 < {f16, bf16} < f32 < f64, with f16 + bf16 -> f32.
DType promote_types(DType a, DType b);

template <class T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::f32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::f64; };
template <> struct dtype_of<bf16> { static constexpr DType value = DType::bf16; };
template <> struct dtype_of<f16> { static constexpr DType value = DType::f16; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::i32; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::i64; };
template <> struct dtype_of<uint8_t> { static constexpr DType value = DType::u8; };
template <> struct dtype_of<bool> { static constexpr DType value = DType::boolean; };
template <class T> inline constexpr DType dtype_v = dtype_of<T>::value;

// Accumulation/compute type: 16-bit floats compute in f32, everything else in itself.
template <class T> struct acc_type { using type = T; };
template <> struct acc_type<bf16> { using type = float; };
template <> struct acc_type<f16> { using type = float; };
template <class T> using acc_t = typename acc_type<T>::type;

}  // namespace forge
