// forge's side of the safetensors interoperability check (tests/python/safetensors_check.py).
//
//   forge_safetensors_tool write <path>        writes the fixed set of tensors below
//   forge_safetensors_tool dump <path>         loads <path> and prints it (format below)
//   forge_safetensors_tool copy <in> <out>     loads <in> and saves its tensors and metadata to <out>
//
// Exit status 0 on success; 1 with "error: <forge::Error message>" on stderr when forge refuses
// a file; 2 on bad usage.
//
// `write` (keep in step with FORGE_FILE in safetensors_check.py): ramp(n)[i] = (i - 5) * 0.375,
//   f64.ramp F64 [2,6] ramp(12)          f32.ramp F32 [3,4] ramp(12)
//   f32.specials F32 [6] bits 7f800000 ff800000 80000000 7fc00001 00000001 7f7fffff
//   bf16.ramp BF16 [12] ramp(12)          bf16.specials BF16 [2,3] bits 7f80 ff80 8000 7fc1 0001 3f80
//   f16.ramp F16 [4,3] ramp(12)
//   i64.values I64 [5] -2^40 -1 0 1 2^40+7       i32.values I32 [4] -2^31 -1 7 2^31-1
//   u8.values U8 [5] 0 1 127 128 255             bool.values BOOL [2,2] 1 0 0 1
//   scalar.f64 F64 [] 3.5                        scalar.i64 I64 [] -9
//   empty.f32 F32 [2,0]                          empty.bf16 BF16 [0]
//   transposed.i32 I32 [3,2]  = arange(6).reshape(2,3).T           (a transposed view)
//   strided.f32 F32 [2,3]     = arange(24).reshape(4,6)[0:4:2, 1:6:2] (a strided view)
//   expanded.u8 U8 [3,2]      = [[5,6]] broadcast to 3 rows         (a stride-0 view)
//   metadata {"writer": "forge_safetensors_tool", "answer": "42"}
//
// `dump` prints one JSON object per line: first {"metadata": {...}}, then per tensor, in the
// order forge returns them, {"name": str, "dtype": "F32", "shape": [..], "values": [..]} with
// values row-major; floating values are strings in C99 hex-float notation (printf "%a" of the
// value as a double: exact, keeps -0; "inf", "-inf", "nan"), integers are JSON integers, BOOL 0/1.
#include <cinttypes>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "forge/forge.h"

namespace {

using namespace forge;
using nlohmann::ordered_json;

std::vector<double> ramp(int n) {
  std::vector<double> v;
  for (int i = 0; i < n; ++i) v.push_back((i - 5) * 0.375);
  return v;
}

template <class Bits> Tensor from_bits(const std::vector<Bits>& bits, DType dtype, const Shape& shape) {
  return from_blob(bits.data(), dtype, shape, {.dtype = dtype});
}

void write(const std::string& path) {
  std::vector<std::pair<std::string, Tensor>> t;
  t.emplace_back("f64.ramp", from_vector(ramp(12), {2, 6}, {.dtype = DType::f64}));
  t.emplace_back("f32.ramp", from_vector(ramp(12), {3, 4}, {.dtype = DType::f32}));
  t.emplace_back("f32.specials",
                 from_bits<uint32_t>({0x7f800000u, 0xff800000u, 0x80000000u, 0x7fc00001u, 0x00000001u, 0x7f7fffffu},
                                     DType::f32, {6}));
  t.emplace_back("bf16.ramp", from_vector(ramp(12), {12}, {.dtype = DType::bf16}));
  t.emplace_back("bf16.specials",
                 from_bits<uint16_t>({0x7f80, 0xff80, 0x8000, 0x7fc1, 0x0001, 0x3f80}, DType::bf16, {2, 3}));
  t.emplace_back("f16.ramp", from_vector(ramp(12), {4, 3}, {.dtype = DType::f16}));
  t.emplace_back("i64.values", from_vector<int64_t>({-(1LL << 40), -1, 0, 1, (1LL << 40) + 7}, {5}));
  t.emplace_back("i32.values", from_vector<int32_t>({INT32_MIN, -1, 7, INT32_MAX}, {4}));
  t.emplace_back("u8.values", from_vector<uint8_t>({0, 1, 127, 128, 255}, {5}));
  t.emplace_back("bool.values", from_bits<uint8_t>({1, 0, 0, 1}, DType::boolean, {2, 2}));
  t.emplace_back("scalar.f64", scalar_tensor(3.5, {.dtype = DType::f64}));
  t.emplace_back("scalar.i64", scalar_tensor(-9, {.dtype = DType::i64}));
  t.emplace_back("empty.f32", empty({2, 0}));
  t.emplace_back("empty.bf16", empty({0}, {.dtype = DType::bf16}));
  t.emplace_back("transposed.i32", arange(0, 6, 1, {.dtype = DType::i32}).reshape({2, 3}).t());
  t.emplace_back("strided.f32", arange(0, 24, 1, {.dtype = DType::f32}).reshape({4, 6}).slice(0, 0, 4, 2).slice(1, 1, 6, 2));
  t.emplace_back("expanded.u8", from_vector<uint8_t>({5, 6}, {1, 2}).expand({3, 2}));
  io::save_safetensors(path, t, {{"writer", "forge_safetensors_tool"}, {"answer", "42"}});
}

std::string hex_float(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%a", v);
  return buf;
}

void dump(const std::string& path) {
  const io::SafetensorsFile f = io::load_safetensors(path);
  ordered_json meta = ordered_json::object();
  for (const auto& [k, v] : f.metadata) meta[k] = v;
  std::cout << ordered_json{{"metadata", meta}}.dump() << "\n";
  for (const auto& [name, t] : f.tensors) {
    ordered_json line = ordered_json::object();
    line["name"] = name;
    line["dtype"] = io::safetensors_dtype_name(t.dtype());
    line["shape"] = t.shape();
    ordered_json values = ordered_json::array();
    if (is_floating(t.dtype())) {
      for (double v : t.to_vector<double>()) values.push_back(hex_float(v));
    } else {
      for (int64_t v : t.to_vector<int64_t>()) values.push_back(v);
    }
    line["values"] = std::move(values);
    std::cout << line.dump() << "\n";
  }
}

void copy(const std::string& in, const std::string& out) {
  const io::SafetensorsFile f = io::load_safetensors(in);
  io::save_safetensors(out, f.tensors.items(), f.metadata);
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  try {
    if (args.size() == 2 && args[0] == "write") {
      write(args[1]);
    } else if (args.size() == 2 && args[0] == "dump") {
      dump(args[1]);
    } else if (args.size() == 3 && args[0] == "copy") {
      copy(args[1], args[2]);
    } else {
      std::cerr << "usage: forge_safetensors_tool write <path> | dump <path> | copy <in> <out>\n";
      return 2;
    }
  } catch (const forge::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
