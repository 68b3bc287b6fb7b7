#include "forge/core/dtype.h"

#include "forge/core/error.h"

namespace forge {

size_t element_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::u8: return 1;
    case DType::boolean: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u8: return "u8";
    case DType::boolean: return "bool";
  }
  return "?";
}

DType parse_dtype(const std::string& s) {
  if (s == "f32" || s == "float32" || s == "float") return DType::f32;
  if (s == "f64" || s == "float64" || s == "double") return DType::f64;
  if (s == "bf16" || s == "bfloat16") return DType::bf16;
  if (s == "f16" || s == "float16" || s == "half" || s == "fp16") return DType::f16;
  if (s == "i32" || s == "int32" || s == "int") return DType::i32;
  if (s == "i64" || s == "int64" || s == "long") return DType::i64;
  if (s == "u8" || s == "uint8") return DType::u8;
  if (s == "bool" || s == "boolean") return DType::boolean;
  FORGE_THROW("unknown dtype '", s, "': expected one of f32, f64, bf16, f16, i32, i64, u8, bool");
}

bool is_floating(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::bf16 || t == DType::f16;
}

bool is_integral(DType t) { return !is_floating(t); }

namespace {
int rank(DType t) {
  switch (t) {
    case DType::boolean: return 0;
    case DType::u8: return 1;
    case DType::i32: return 2;
    case DType::i64: return 3;
    case DType::f16: return 4;
    case DType::bf16: return 4;
    case DType::f32: return 5;
    case DType::f64: return 6;
  }
  return 0;
}
}  // namespace

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  if ((a == DType::f16 && b == DType::bf16) || (a == DType::bf16 && b == DType::f16)) return DType::f32;
  return rank(a) >= rank(b) ? a : b;
}

}  // namespace forge
