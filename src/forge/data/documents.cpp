// Documents of a corpus file (contract in documents.h).
#include "forge/data/documents.h"

#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

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

}  // namespace

bool is_jsonl(const std::string& path) { return ends_with(path, ".jsonl") || ends_with(path, ".jsonl.gz"); }

int64_t for_each_document(const std::string& path, const std::string& text_key,
                          const std::function<void(std::string_view)>& fn) {
  if (!is_jsonl(path)) {
    const std::string text = io::read_file(path);
    fn(text);
    return 1;
  }
  int64_t line_no = 0, docs = 0;
  auto take = [&](const std::string& line) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) return;  // a blank line
    fn(document_of(line, path, line_no, text_key));
    ++docs;
  };
  if (ends_with(path, ".gz")) {
    gzFile f = gzopen(path.c_str(), "rb");
    FORGE_CHECK(f != nullptr, "data: cannot open '", path, "': ", std::strerror(errno));
    std::unique_ptr<gzFile_s, int (*)(gzFile)> closer(f, gzclose);
    std::string line;
    char buf[1 << 16];
    while (gzgets(f, buf, sizeof buf) != nullptr) {
      const size_t n = std::strlen(buf);
      line.append(buf, n);
      if (n > 0 && buf[n - 1] == '\n') {
        line.pop_back();
        take(line);
        line.clear();
      }
    }
    int err = Z_OK;
    const char* msg = gzerror(f, &err);
    FORGE_CHECK(err == Z_OK || err == Z_STREAM_END, "data: '", path, "' is not a readable gzip file: ", msg);
    if (!line.empty()) take(line);
    return docs;
  }
  std::ifstream in(path);
  FORGE_CHECK(in, "data: cannot open '", path, "': ", std::strerror(errno));
  std::string line;
  while (std::getline(in, line)) take(line);
  FORGE_CHECK(in.eof(), "data: error reading '", path, "' after line ", line_no);
  return docs;
}

}  // namespace forge::data
