#pragma once
// Helpers shared by the forge::io tests: a scratch directory per test, raw file access, and
// tensors of random bit patterns (so round trips are checked bit for bit, NaN payloads too).
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "forge/forge.h"

namespace forge::testing {

namespace fs = std::filesystem;

// A fresh directory under the system temp dir, removed with everything in it at scope exit.
class ScratchDir {
 public:
  ScratchDir() {
    std::string tmpl = (fs::temp_directory_path() / "forge_io_test_XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw Error("mkdtemp failed for " + tmpl);
    path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const fs::path& path() const { return path_; }
  fs::path operator/(const std::string& name) const { return path_ / name; }

 private:
  fs::path path_;
};

inline std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void spit(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Names in `dir` (files and directories), sorted.
inline std::vector<std::string> listing(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// A contiguous CPU tensor of random bytes (bool: random 0/1).
inline Tensor random_bits(DType dtype, const Shape& shape, uint64_t seed) {
  std::vector<uint8_t> bytes(static_cast<size_t>(shape_numel(shape)) * element_size(dtype));
  std::mt19937_64 rng(seed);
  for (auto& b : bytes) b = static_cast<uint8_t>(rng());
  if (dtype == DType::boolean)
    for (auto& b : bytes) b &= 1;
  return from_blob(bytes.data(), dtype, shape, {.dtype = dtype});
}

// random_bits without NaN or infinity (a floating-point element whose exponent bits are all ones
// loses the top one): what a checkpoint may hold (io::check_finite), still every other pattern.
inline Tensor random_finite_bits(DType dtype, const Shape& shape, uint64_t seed) {
  Tensor t = random_bits(dtype, shape, seed);
  const int64_t n = t.numel();
  auto clear = [n](auto* p, auto exponent, auto top) {
    for (int64_t i = 0; i < n; ++i)
      if ((p[i] & exponent) == exponent) p[i] = static_cast<std::remove_reference_t<decltype(p[i])>>(p[i] & ~top);
  };
  switch (dtype) {
    case DType::f32: clear(static_cast<uint32_t*>(t.data_ptr()), uint32_t{0x7F800000}, uint32_t{0x40000000}); break;
    case DType::f64: clear(static_cast<uint64_t*>(t.data_ptr()), uint64_t{0x7FF0000000000000}, uint64_t{0x4000000000000000}); break;
    case DType::bf16: clear(static_cast<uint16_t*>(t.data_ptr()), uint16_t{0x7F80}, uint16_t{0x4000}); break;
    case DType::f16: clear(static_cast<uint16_t*>(t.data_ptr()), uint16_t{0x7C00}, uint16_t{0x4000}); break;
    default: break;
  }
  return t;
}

// The bytes of `t` in row-major order (any strides, any device).
inline std::string bytes_of(const Tensor& t) {
  const Tensor c = t.detach().to(Device::cpu()).contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), c.nbytes());
}

// A safetensors file assembled by hand: 8-byte length, `header` padded with `pad` spaces, `data`.
inline std::string raw_safetensors(const std::string& header, const std::string& data, size_t pad = 0) {
  const std::string h = header + std::string(pad, ' ');
  std::string out(8, '\0');
  const uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out + h + data;
}

}  // namespace forge::testing
