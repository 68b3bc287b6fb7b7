// Documents of a corpus file (contract in documents.h).
#include "forge/data/documents.h"

#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "forge/core/error.h"
#include "forge/io/atomic_file.h"
#include "forge/io/json_input.h"

namespace forge::data {

namespace {

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

// One JSON Lines record -> its document, or an error naming the place.
std::string document_of(const std::string& line, const std::string& path, int64_t line_no,
                        const std::string& text_key) {
  const nlohmann::json j = io::parse_json(line, "data: '" + path + "' line " + std::to_string(line_no) +
                                                     " is not JSON (a .jsonl file holds one JSON object per line)");  // Note [untrusted JSON]
  FORGE_CHECK(j.is_object(), "data: '", path, "' line ", line_no, " is a JSON ", j.type_name(),
              ", not an object; a .jsonl file holds one object per line, its text under data.text_key = \"", text_key,
              "\"");
  const auto it = j.find(text_key);
  FORGE_CHECK(it != j.end(), "data: '", path, "' line ", line_no, " has no key \"", text_key,
              "\"; set data.text_key to the key that holds the text");
  FORGE_CHECK(it->is_string(), "data: '", path, "' line ", line_no, ": \"", text_key, "\" is a ", it->type_name(),
              ", not a string");
  return it->get<std::string>();
}

// gzip by its magic, not by luck: gzopen reads a plain file as it is.
void check_gzip_name(const std::string& path, bool gz_name) {
  {
    std::ifstream in(path, std::ios::binary);
    FORGE_CHECK(in, "data: cannot open '", path, "': ", std::strerror(errno));
    unsigned char m[2] = {0, 0};
    in.read(reinterpret_cast<char*>(m), 2);
    const bool gz_magic = in.gcount() == 2 && m[0] == 0x1f && m[1] == 0x8b;
    FORGE_CHECK(gz_magic == gz_name, "data: '", path, "' ",
                gz_name ? "is named .gz but is not gzip-compressed (it does not start with 1f 8b); rename it, or "
                          "compress it with gzip"
                        : "is gzip-compressed (it starts with 1f 8b) but not named .gz; name it *.jsonl.gz, or "
                          "decompress it");
  }
}

}  // namespace

bool is_jsonl(const std::string& path) { return ends_with(path, ".jsonl") || ends_with(path, ".jsonl.gz"); }

int64_t for_each_document(const std::string& path, const std::string& text_key,
                          const std::function<void(std::string_view)>& fn) {
  if (!is_jsonl(path)) {
    check_gzip_name(path, ends_with(path, ".gz"));
    const std::string text = io::read_file(path);
    fn(text);
    return 1;
  }
  return for_each_jsonl_line(path, [&](const std::string& line, int64_t line_no) {
    fn(document_of(line, path, line_no, text_key));
  });
}

int64_t for_each_jsonl_line(const std::string& path, const std::function<void(const std::string&, int64_t)>& fn) {
  const bool gz_name = ends_with(path, ".gz");
  check_gzip_name(path, gz_name);
  int64_t line_no = 0, docs = 0;
  auto take = [&](const std::string& line) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) return;  // a blank line
    fn(line, line_no);
    ++docs;
  };
  // Bytes into lines (a NUL is data here; parse_json refuses it), each at most kMaxJsonlLineBytes.
  std::string line;
  auto feed = [&](const char* p, size_t n) {
    while (n > 0) {
      const void* nl = std::memchr(p, '\n', n);
      const size_t k = nl ? static_cast<size_t>(static_cast<const char*>(nl) - p) : n;
      FORGE_CHECK(line.size() + k <= kMaxJsonlLineBytes, "data: '", path, "' line ", line_no + 1, " is longer than ",
                  kMaxJsonlLineBytes >> 20, " MiB; forge reads JSON Lines documents of up to that size (split the "
                  "document, or give it as a plain text file)");
      line.append(p, k);
      if (!nl) return;
      take(line);
      line.clear();
      p += k + 1;
      n -= k + 1;
    }
  };
  std::vector<char> buf(size_t{1} << 20);
  if (gz_name) {
    gzFile f = gzopen(path.c_str(), "rb");
    FORGE_CHECK(f != nullptr, "data: cannot open '", path, "': ", std::strerror(errno));
    std::unique_ptr<gzFile_s, int (*)(gzFile)> closer(f, gzclose);
    int n;
    while ((n = gzread(f, buf.data(), static_cast<unsigned>(buf.size()))) > 0) feed(buf.data(), static_cast<size_t>(n));
    int err = Z_OK;
    const char* msg = gzerror(f, &err);
    FORGE_CHECK(n == 0 && (err == Z_OK || err == Z_STREAM_END), "data: '", path, "' is not a readable gzip file: ", msg);
  } else {
    std::ifstream in(path, std::ios::binary);
    FORGE_CHECK(in, "data: cannot open '", path, "': ", std::strerror(errno));
    while (in) {
      in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
      if (in.gcount() > 0) feed(buf.data(), static_cast<size_t>(in.gcount()));
    }
    FORGE_CHECK(in.eof(), "data: error reading '", path, "' after line ", line_no);
  }
  if (!line.empty()) take(line);
  return docs;
}

}  // namespace forge::data
