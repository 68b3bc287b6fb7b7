// safetensors reading and writing; the format and the validation rules are in safetensors.h.
#include "forge/io/safetensors.h"


#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <system_error>

#include "forge/core/error.h"
#include "forge/io/atomic_file.h"
#include "forge/io/json_input.h"
#include "forge/ops/copy.h"
#include "forge/ops/creation.h"

namespace forge::io {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; forge reads and writes it as raw host bytes");

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

// The reference implementation's limit: a larger header is a corrupt or hostile file.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

std::string where(const fs::path& path) { return "safetensors file '" + path.string() + "': "; }

// A read-only private mapping of a whole file.
class MappedFile {
 public:
  explicit MappedFile(const fs::path& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail(path, "cannot open it", errno);
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      fail(path, "cannot stat it", err);
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      FORGE_THROW(where(path), "not a regular file");
    }
    size_ = static_cast<uint64_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        const int err = errno;
        ::close(fd);
        fail(path, "cannot mmap it", err);
      }
      ::madvise(p, size_, MADV_SEQUENTIAL);
      data_ = static_cast<const uint8_t*>(p);
    }
    ::close(fd);  // the mapping stays valid
  }
  ~MappedFile() {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  [[noreturn]] static void fail(const fs::path& path, const char* what, int err) {
    FORGE_THROW(where(path), what, ": ", std::system_category().message(err), " (errno ", err, ")");
  }
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

std::string json_kind(const ojson& j) { return j.type_name(); }

// Parses the JSON header, refusing duplicate keys at any level (nlohmann would keep the last).
ojson parse_header_json(const char* begin, const char* end, const fs::path& path) {
  // Note [untrusted JSON] (io/json_input.h): no NUL byte, nesting bounded while parsing.
  if (const void* nul = std::memchr(begin, '\0', static_cast<size_t>(end - begin)))
    FORGE_THROW(where(path), "the header holds a NUL byte at offset ",
                static_cast<const char*>(nul) - begin, " (a JSON text holds none)");
  std::vector<std::set<std::string>> keys;  // one set per open object
  std::string duplicate;
  auto callback = [&](int depth, ojson::parse_event_t event, ojson& parsed) {
    if ((event == ojson::parse_event_t::object_start || event == ojson::parse_event_t::array_start) &&
        depth >= kMaxJsonDepth)
      FORGE_THROW(where(path), "the header nests deeper than ", kMaxJsonDepth,
                  " levels of arrays and objects (a safetensors header nests 3)");
    switch (event) {
      case ojson::parse_event_t::object_start: keys.emplace_back(); break;
      case ojson::parse_event_t::object_end: keys.pop_back(); break;
      case ojson::parse_event_t::key:
        if (!keys.back().insert(parsed.get<std::string>()).second && duplicate.empty())
          duplicate = parsed.get<std::string>();
        break;
      default: break;
    }
    return true;
  };
  ojson header;
  try {
    header = ojson::parse(begin, end, callback);
  } catch (const ojson::exception& e) {
    FORGE_THROW(where(path), "the header is not valid JSON: ", e.what());
  }
  FORGE_CHECK(duplicate.empty(), where(path), "duplicate key '", duplicate,
              "' in the header (a tensor name or field given twice)");
  return header;
}

uint64_t checked_numel_bytes(const Shape& shape, DType dtype, const fs::path& path, const std::string& name) {
  uint64_t n = element_size(dtype);
  for (int64_t d : shape) {
    FORGE_CHECK(!__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n), where(path), "tensor '", name,
                "': shape ", shape, " is too large (its byte size overflows 64 bits)");
  }
  return n;
}

SafetensorsEntry parse_entry(const std::string& name, const ojson& info, const fs::path& path) {
  const std::string tensor = "tensor '" + name + "': ";
  FORGE_CHECK(info.is_object(), where(path), tensor, "expected an object with dtype, shape and data_offsets, got ",
              json_kind(info));
  for (const auto& [key, value] : info.items()) {
    FORGE_CHECK(key == "dtype" || key == "shape" || key == "data_offsets", where(path), tensor, "unknown field '",
                key, "' (expected dtype, shape, data_offsets)");
  }
  for (const char* key : {"dtype", "shape", "data_offsets"})
    FORGE_CHECK(info.contains(key), where(path), tensor, "missing field '", key, "'");

  SafetensorsEntry e;
  e.name = name;
  const ojson& dtype = info["dtype"];
  FORGE_CHECK(dtype.is_string(), where(path), tensor, "dtype must be a string, got ", json_kind(dtype));
  try {
    e.dtype = parse_safetensors_dtype(dtype.get<std::string>());
  } catch (const Error& err) {
    FORGE_THROW(where(path), tensor, err.what());
  }

  const ojson& shape = info["shape"];
  FORGE_CHECK(shape.is_array(), where(path), tensor, "shape must be an array, got ", json_kind(shape));
  for (const auto& d : shape) {
    FORGE_CHECK(d.is_number_unsigned() && d.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX), where(path),
                tensor, "shape ", shape.dump(), " must hold non-negative integers");
    e.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
  }

  const ojson& offsets = info["data_offsets"];
  FORGE_CHECK(offsets.is_array() && offsets.size() == 2 && offsets[0].is_number_unsigned() &&
                  offsets[1].is_number_unsigned(),
              where(path), tensor, "data_offsets must be [begin, end] with non-negative integers, got ",
              offsets.dump());
  e.begin = offsets[0].get<uint64_t>();
  e.end = offsets[1].get<uint64_t>();
  FORGE_CHECK(e.begin <= e.end, where(path), tensor, "data_offsets [", e.begin, ", ", e.end,
              "] end before they begin");
  const uint64_t need = checked_numel_bytes(e.shape, e.dtype, path, name);
  FORGE_CHECK(e.end - e.begin == need, where(path), tensor, safetensors_dtype_name(e.dtype), " ", e.shape,
              " needs ", need, " bytes but data_offsets [", e.begin, ", ", e.end, "] hold ", e.end - e.begin);
  return e;
}

// Header and offsets of a mapped file, validated (everything but the tensor values).
SafetensorsHeader parse_header(const uint8_t* data, uint64_t size, const fs::path& path) {
  FORGE_CHECK(size >= 8, where(path), "the file has ", size,
              " bytes, fewer than the 8-byte header length that starts every safetensors file (truncated?)");
  const uint64_t n = read_u64_le(data);
  FORGE_CHECK(n > 0, where(path), "the header length is 0");
  FORGE_CHECK(n <= kMaxHeaderBytes, where(path), "the header length ", n, " is implausibly large (limit ",
              kMaxHeaderBytes, " bytes): not a safetensors file, or a corrupt one");
  FORGE_CHECK(n <= size - 8, where(path), "the header length ", n, " runs past the end of the file (", size,
              " bytes, so at most ", size - 8, " for the header): truncated?");
  const char* hbegin = reinterpret_cast<const char*>(data + 8);
  FORGE_CHECK(hbegin[0] == '{', where(path), "the header does not start with '{'");

  SafetensorsHeader h;
  h.data_start = 8 + n;
  h.file_size = size;
  const ojson header = parse_header_json(hbegin, hbegin + n, path);
  FORGE_CHECK(header.is_object(), where(path), "the header is not a JSON object");

  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      FORGE_CHECK(value.is_object(), where(path), "__metadata__ must be an object of strings, got ",
                  json_kind(value));
      for (const auto& [mk, mv] : value.items()) {
        FORGE_CHECK(mv.is_string(), where(path), "__metadata__ value of '", mk, "' must be a string, got ",
                    json_kind(mv));
        h.metadata.emplace(mk, mv.get<std::string>());
      }
      continue;
    }
    h.entries.push_back(parse_entry(key, value, path));
  }

  // The data section must be covered exactly: sorted by offsets, each range starts where the
  // previous ended and the last ends at the end of the file.
  const uint64_t data_bytes = size - h.data_start;
  std::vector<const SafetensorsEntry*> sorted;
  for (const auto& e : h.entries) sorted.push_back(&e);
  std::stable_sort(sorted.begin(), sorted.end(), [](const SafetensorsEntry* a, const SafetensorsEntry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t covered = 0;
  const SafetensorsEntry* prev = nullptr;
  for (const SafetensorsEntry* e : sorted) {
    FORGE_CHECK(e->end <= data_bytes, where(path), "tensor '", e->name, "': data_offsets [", e->begin, ", ",
                e->end, "] run past the end of the data section (", data_bytes, " bytes): truncated?");
    FORGE_CHECK(e->begin >= covered, where(path), "tensor '", e->name, "': data_offsets [", e->begin, ", ",
                e->end, "] overlap tensor '", prev->name, "' [", prev->begin, ", ", prev->end, "]");
    FORGE_CHECK(e->begin == covered, where(path), "tensor '", e->name, "': data_offsets [", e->begin, ", ",
                e->end, "] leave a gap of ", e->begin - covered, " bytes after ",
                prev ? "tensor '" + prev->name + "'" : std::string("the start of the data section"));
    covered = e->end;
    prev = e;
  }
  FORGE_CHECK(covered == data_bytes, where(path), "the data section has ", data_bytes,
              " bytes but the tensors cover only ", covered, " (", data_bytes - covered, " bytes of trailing data)");
  return h;
}

}  // namespace

// ---- NamedTensors --------------------------------------------------------------------------

NamedTensors::NamedTensors(std::vector<value_type> items) {
  items_.reserve(items.size());
  for (auto& [name, t] : items) insert(std::move(name), std::move(t));
}

void NamedTensors::insert(std::string name, Tensor tensor) {
  FORGE_CHECK(!index_.count(name), "NamedTensors: duplicate tensor name '", name, "'");
  index_.emplace(name, items_.size());
  items_.emplace_back(std::move(name), std::move(tensor));
}

const Tensor* NamedTensors::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &items_[it->second].second;
}

const Tensor& NamedTensors::at(const std::string& name) const {
  const Tensor* t = find(name);
  FORGE_CHECK(t != nullptr, "no tensor named '", name, "' (", items_.size(), " tensors present)");
  return *t;
}

// ---- dtypes --------------------------------------------------------------------------------

const char* safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
    case DType::u8: return "U8";
    case DType::boolean: return "BOOL";
  }
  FORGE_THROW("safetensors: dtype ", static_cast<int>(dtype), " has no safetensors name");
}

DType parse_safetensors_dtype(const std::string& name) {
  for (DType t : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64, DType::u8,
                  DType::boolean}) {
    if (name == safetensors_dtype_name(t)) return t;
  }
  static const char* const kKnownUnsupported[] = {"I8",  "I16", "U16",     "U32",     "U64",     "F8_E4M3",
                                                  "F8_E5M2", "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2", "C64"};
  for (const char* known : kKnownUnsupported) {
    FORGE_CHECK(name != known, "dtype '", name,
                "' is a safetensors dtype forge does not support (supported: F64 F32 F16 BF16 I64 I32 U8 BOOL)");
  }
  FORGE_THROW("unknown dtype '", name, "' (safetensors dtypes forge reads: F64 F32 F16 BF16 I64 I32 U8 BOOL)");
}

// ---- writing -------------------------------------------------------------------------------

void save_safetensors(const fs::path& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const SafetensorsMetadata& metadata) {
  // Everything is checked and the header built before the file is touched.
  ojson header = ojson::object();
  if (!metadata.empty()) {
    ojson meta = ojson::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = std::move(meta);
  }
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    FORGE_CHECK(!name.empty(), "save_safetensors '", path.string(), "': empty tensor name");
    FORGE_CHECK(name != "__metadata__", "save_safetensors '", path.string(),
                "': '__metadata__' is reserved and cannot name a tensor");
    FORGE_CHECK(seen.insert(name).second, "save_safetensors '", path.string(), "': duplicate tensor name '", name,
                "'");
    FORGE_CHECK(t.defined(), "save_safetensors '", path.string(), "': tensor '", name, "' is undefined");
    ojson shape = ojson::array();
    for (int64_t d : t.shape()) shape.push_back(d);
    const uint64_t nbytes = t.nbytes();
    ojson entry = ojson::object();
    entry["dtype"] = safetensors_dtype_name(t.dtype());
    entry["shape"] = std::move(shape);
    entry["data_offsets"] = ojson::array({offset, offset + nbytes});
    header[name] = std::move(entry);
    offset += nbytes;
  }
  std::string json;
  try {
    json = header.dump();
  } catch (const ojson::exception& e) {  // names and metadata must be valid UTF-8
    FORGE_THROW("save_safetensors '", path.string(), "': cannot encode the header: ", e.what());
  }
  json.append((8 - json.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned

  write_file_atomic(path, [&](OutputFile& f) {
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(json.size()) >> (8 * i));
    f.write(len, sizeof(len));
    f.write(json);
    for (const auto& [name, t] : tensors) {
      // One host copy at a time: a model on the GPU is not duplicated whole in host memory.
      const Tensor host = ops::contiguous(ops::to(t.detach(), Device::cpu()));
      FORGE_CHECK(host.nbytes() == t.nbytes(), "save_safetensors: tensor '", name, "' changed size while saving");
      if (host.nbytes() > 0) f.write(host.data_ptr(), host.nbytes());
    }
  });
}

// ---- reading -------------------------------------------------------------------------------

SafetensorsHeader read_safetensors_header(const fs::path& path) {
  const MappedFile file(path);
  return parse_header(file.data(), file.size(), path);
}

SafetensorsFile load_safetensors(const fs::path& path, Device device) {
  const MappedFile file(path);
  SafetensorsHeader h = parse_header(file.data(), file.size(), path);
  SafetensorsFile out;
  out.metadata = std::move(h.metadata);
  for (const SafetensorsEntry& e : h.entries) {
    const uint8_t* src = file.data() + h.data_start + e.begin;
    if (e.dtype == DType::boolean) {
      for (uint64_t i = 0; i < e.end - e.begin; ++i) {
        FORGE_CHECK(src[i] <= 1, where(path), "tensor '", e.name, "': BOOL element ", i, " has byte value ",
                    static_cast<int>(src[i]), " (must be 0 or 1)");
      }
    }
    out.tensors.insert(e.name, from_blob(src, e.dtype, e.shape, {.dtype = e.dtype, .device = device}));
  }
  return out;
}

}  // namespace forge::io
