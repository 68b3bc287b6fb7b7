#pragma once
// Dtype dispatch: run a templated lambda with the C++ type of a runtime DType.
//
//   dispatch_float(t.dtype(), "gelu", [&]<class T>() { kernel<T>(...); });
//
// Each backend dispatches once, inside its kernel entry point.
#include "forge/core/dtype.h"
#include "forge/core/error.h"

namespace forge {

template <class F> decltype(auto) dispatch_float(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::f32: return f.template operator()<float>();
    case DType::f64: return f.template operator()<double>();
    case DType::bf16: return f.template operator()<bf16>();
    case DType::f16: return f.template operator()<f16>();
    default: FORGE_THROW(op, ": expected a floating-point dtype (f32, f64, bf16, f16), got ", dtype_name(t));
  }
}

template <class F> decltype(auto) dispatch_index(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::i32: return f.template operator()<int32_t>();
    case DType::i64: return f.template operator()<int64_t>();
    default: FORGE_THROW(op, ": expected an integer index dtype (i32 or i64), got ", dtype_name(t));
  }
}

template <class F> decltype(auto) dispatch_all(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::f32: return f.template operator()<float>();
    case DType::f64: return f.template operator()<double>();
    case DType::bf16: return f.template operator()<bf16>();
    case DType::f16: return f.template operator()<f16>();
    case DType::i32: return f.template operator()<int32_t>();
    case DType::i64: return f.template operator()<int64_t>();
    case DType::u8: return f.template operator()<uint8_t>();
    case DType::boolean: return f.template operator()<bool>();
  }
  FORGE_THROW(op, ": unsupported dtype");
}

// Numeric types only (no bool): arithmetic ops.
template <class F> decltype(auto) dispatch_numeric(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::f32: return f.template operator()<float>();
    case DType::f64: return f.template operator()<double>();
    case DType::bf16: return f.template operator()<bf16>();
    case DType::f16: return f.template operator()<f16>();
    case DType::i32: return f.template operator()<int32_t>();
    case DType::i64: return f.template operator()<int64_t>();
    case DType::u8: return f.template operator()<uint8_t>();
    default:
      FORGE_THROW(op, ": not supported for bool tensors; convert with .to(DType::i64) or .to(DType::f32) first");
  }
}

}  // namespace forge
