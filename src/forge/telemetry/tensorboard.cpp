// TensorBoard event files (Note [TensorBoard event files] in tensorboard.h).
#include "forge/telemetry/tensorboard.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>

#include "forge/core/error.h"

namespace forge::telemetry {

namespace fs = std::filesystem;

namespace {

const std::array<uint32_t, 256>& crc_table() {
  static const std::array<uint32_t, 256> t = [] {
    std::array<uint32_t, 256> a{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      a[i] = c;
    }
    return a;
  }();
  return t;
}

// Protocol-buffer wire format: varints, tags (field << 3 | wire type), fixed 32/64-bit values.
void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void tag(std::string& out, int field, int wire) { varint(out, static_cast<uint64_t>(field) << 3 | static_cast<uint64_t>(wire)); }
template <class T> void fixed(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian hosts (x86-64, aarch64)
  out.append(b, sizeof(T));
}
void bytes_field(std::string& out, int field, std::string_view s) {
  tag(out, field, 2);
  varint(out, s.size());
  out.append(s);
}

std::string event(double wall_time, int64_t step) {
  std::string e;
  tag(e, 1, 1);
  fixed(e, wall_time);
  tag(e, 2, 0);
  varint(e, static_cast<uint64_t>(step));
  return e;
}

// A minimal protocol-buffer reader over one message.
struct Reader {
  std::string_view s;
  size_t at = 0;
  bool done() const { return at >= s.size(); }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      FORGE_CHECK(at < s.size(), "tensorboard: a varint runs past its message");
      const auto b = static_cast<uint8_t>(s[at++]);
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    FORGE_THROW("tensorboard: a varint longer than 10 bytes");
  }
  template <class T> T fixed() {
    FORGE_CHECK(at + sizeof(T) <= s.size(), "tensorboard: a fixed field runs past its message");
    T v;
    std::memcpy(&v, s.data() + at, sizeof(T));
    at += sizeof(T);
    return v;
  }
  std::string_view bytes() {
    const uint64_t n = varint();
    FORGE_CHECK(at + n <= s.size(), "tensorboard: a length-delimited field runs past its message");
    const std::string_view v = s.substr(at, n);
    at += n;
    return v;
  }
  void skip(int wire) {
    if (wire == 0) varint();
    else if (wire == 1) at += 8;
    else if (wire == 2) bytes();
    else if (wire == 5) at += 4;
    else FORGE_THROW("tensorboard: unknown wire type ", wire);
  }
};

}  // namespace

uint32_t crc32c(std::string_view data) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : data) c = crc_table()[(c ^ b) & 0xff] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(std::string_view data) {
  const uint32_t c = crc32c(data);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::vector<std::pair<std::string, double>> record_scalars(const nlohmann::json& record) {
  std::vector<std::pair<std::string, double>> out;
  const bool final = record.value("final", false);
  for (const auto& [key, v] : record.items())
    if (key != "step" && v.is_number()) out.emplace_back(final ? "final/" + key : key, v.get<double>());
  return out;
}

TensorBoardWriter::TensorBoardWriter(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  FORGE_CHECK(!ec, "tensorboard: cannot create '", dir.string(), "': ", ec.message(),
              "; set telemetry.tensorboard = false to run without it");
  const auto now = std::chrono::system_clock::now();
  const auto secs = std::chrono::duration_cast<std::chrono::seconds>(now.time_since_epoch()).count();
  char host[256] = "host";
  gethostname(host, sizeof(host) - 1);
  path_ = dir / ("events.out.tfevents." + std::to_string(secs) + "." + host + "." + std::to_string(getpid()));
  out_.open(path_, std::ios::binary | std::ios::app);
  FORGE_CHECK(out_.good(), "tensorboard: cannot open '", path_.string(), "' for writing");
  std::string e = event(std::chrono::duration<double>(now.time_since_epoch()).count(), 0);
  bytes_field(e, 3, "brain.Event:2");
  record(e);
}

void TensorBoardWriter::scalars(int64_t step, double wall_time, const std::vector<std::pair<std::string, double>>& values) {
  if (values.empty()) return;
  std::string summary;
  for (const auto& [name, v] : values) {
    std::string value;
    bytes_field(value, 1, name);
    tag(value, 2, 5);
    fixed(value, static_cast<float>(v));
    bytes_field(summary, 1, value);
  }
  std::string e = event(wall_time, step);
  bytes_field(e, 5, summary);
  record(e);
}

void TensorBoardWriter::record(const std::string& data) {
  std::string len;
  fixed(len, static_cast<uint64_t>(data.size()));
  std::string r = len;
  fixed(r, masked_crc32c(len));
  r += data;
  fixed(r, masked_crc32c(data));
  out_.write(r.data(), static_cast<std::streamsize>(r.size()));
  out_.flush();
  FORGE_CHECK(out_.good(), "tensorboard: writing '", path_.string(), "' failed (disk full?)");
}

std::vector<TensorBoardEvent> read_tensorboard(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  FORGE_CHECK(in.good(), "tensorboard: cannot read '", path.string(), "'");
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<TensorBoardEvent> out;
  size_t at = 0;
  for (int n = 0; at < all.size(); ++n) {
    const std::string where = "tensorboard: '" + path.string() + "' record " + std::to_string(n);
    FORGE_CHECK(at + 12 <= all.size(), where, " is truncated (its header)");
    const std::string_view len_bytes(all.data() + at, 8);
    uint64_t len;
    std::memcpy(&len, len_bytes.data(), 8);
    uint32_t crc;
    std::memcpy(&crc, all.data() + at + 8, 4);
    FORGE_CHECK(crc == masked_crc32c(len_bytes), where, ": the length's checksum does not match");
    FORGE_CHECK(at + 12 + len + 4 <= all.size(), where, " is truncated (its data)");
    const std::string_view data(all.data() + at + 12, len);
    std::memcpy(&crc, all.data() + at + 12 + len, 4);
    FORGE_CHECK(crc == masked_crc32c(data), where, ": the data's checksum does not match");
    at += 12 + len + 4;
    TensorBoardEvent ev;
    Reader r{data};
    while (!r.done()) {
      const uint64_t key = r.varint();
      const int field = static_cast<int>(key >> 3), wire = static_cast<int>(key & 7);
      if (field == 1 && wire == 1) ev.wall_time = r.fixed<double>();
      else if (field == 2 && wire == 0) ev.step = static_cast<int64_t>(r.varint());
      else if (field == 3 && wire == 2) ev.file_version = std::string(r.bytes());
      else if (field == 5 && wire == 2) {
        Reader summary{r.bytes()};
        while (!summary.done()) {
          const uint64_t k = summary.varint();
          if ((k >> 3) != 1 || (k & 7) != 2) {
            summary.skip(static_cast<int>(k & 7));
            continue;
          }
          Reader value{summary.bytes()};
          std::string name;
          float v = 0;
          while (!value.done()) {
            const uint64_t vk = value.varint();
            if ((vk >> 3) == 1 && (vk & 7) == 2) name = std::string(value.bytes());
            else if ((vk >> 3) == 2 && (vk & 7) == 5) v = value.fixed<float>();
            else value.skip(static_cast<int>(vk & 7));
          }
          ev.scalars.emplace_back(name, v);
        }
      } else {
        r.skip(wire);
      }
    }
    out.push_back(std::move(ev));
  }
  return out;
}

}  // namespace forge::telemetry
