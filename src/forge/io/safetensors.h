#pragma once
// safetensors: the tensor file format of Hugging Face (https://github.com/huggingface/safetensors),
// so weights move between forge and the PyTorch ecosystem.
//
// Format (all integers little-endian):
//   bytes [0, 8)        N, a u64: the length of the header
//   bytes [8, 8 + N)    the header: a UTF-8 JSON object, starting with '{', possibly padded
//                       at the end with spaces (forge pads so that 8 + N is a multiple of 8)
//                         {"__metadata__": {"key": "value", ...},          (optional)
//                          "<name>": {"dtype": "F32", "shape": [2, 3],
//                                     "data_offsets": [begin, end]}, ...}
//   bytes [8 + N, EOF)  the data section: each tensor's elements, row-major, little-endian,
//                       at [begin, end) relative to the start of the data section.
//   dtypes forge reads and writes: F64 F32 F16 BF16 I64 I32 U8 BOOL (BOOL: one byte, 0 or 1).
//
// Writing (save_safetensors): keys in the header and blocks in the data section follow the
// order given; every tensor is detached, copied to the host and made contiguous (a CUDA or a
// strided tensor is fine); the file is written atomically (io/atomic_file.h).
//
// Reading (load_safetensors): the file is mmap()ed and validated before any tensor is built;
// every violation throws a forge::Error naming the file and, where there is one, the tensor:
// a file shorter than 8 bytes or than 8 + N, a header that is not a JSON object, duplicate
// keys, unknown keys or dtypes, shapes or offsets that are not non-negative integers, a
// tensor whose byte range is not numel x element size, ranges that overlap, leave gaps or run
// past the end (the data section must be covered exactly, as in the reference
// implementation), and BOOL bytes other than 0/1. Tensors come back in header order.
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "forge/core/device.h"
#include "forge/core/dtype.h"
#include "forge/core/shape.h"
#include "forge/core/tensor.h"

namespace forge::io {

// Tensors by name, in insertion order (the order of a file's header), with lookup by name.
class NamedTensors {
 public:
  using value_type = std::pair<std::string, Tensor>;

  NamedTensors() = default;
  NamedTensors(std::vector<value_type> items);  // NOLINT(google-explicit-constructor)
  NamedTensors(std::initializer_list<value_type> items) : NamedTensors(std::vector<value_type>(items)) {}

  // Appends; throws if `name` is already present.
  void insert(std::string name, Tensor tensor);
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  // nullptr when absent.
  const Tensor* find(const std::string& name) const;
  // Throws naming `name` when absent.
  const Tensor& at(const std::string& name) const;

  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  auto begin() const { return items_.begin(); }
  auto end() const { return items_.end(); }
  const std::vector<value_type>& items() const { return items_; }

 private:
  std::vector<value_type> items_;
  std::unordered_map<std::string, size_t> index_;
};

using SafetensorsMetadata = std::map<std::string, std::string>;

struct SafetensorsFile {
  NamedTensors tensors;
  SafetensorsMetadata metadata;
};

// One header entry; offsets are relative to the start of the data section.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> entries;  // header order
  SafetensorsMetadata metadata;
  uint64_t data_start = 0;  // 8 + N
  uint64_t file_size = 0;
};

// "F32", "BF16", ... and back (throws on names forge does not support, saying why).
const char* safetensors_dtype_name(DType dtype);
DType parse_safetensors_dtype(const std::string& name);

// (A NamedTensors is saved through its items().)
void save_safetensors(const std::filesystem::path& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const SafetensorsMetadata& metadata = {});

// Loads every tensor onto `device` (the bytes are read through mmap; tensors own their memory).
SafetensorsFile load_safetensors(const std::filesystem::path& path, Device device = Device::cpu());

// The validated header alone (names, dtypes, shapes, offsets, metadata): cheap even for
// multi-gigabyte files.
SafetensorsHeader read_safetensors_header(const std::filesystem::path& path);

}  // namespace forge::io
