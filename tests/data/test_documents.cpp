// Note [documents]: the documents of a corpus file -- a plain text file is one, a JSON Lines file
// (plain or gzip-compressed) one per line under data.text_key -- and their errors, which name the
// file, the line and the fix.
#include <gtest/gtest.h>
#include <zlib.h>

#include <string>
#include <vector>

#include "data/data_testing.h"
#include "forge/core/error.h"
#include "forge/data/documents.h"

namespace forge::data {
namespace {

using forge::testing::TempDir;
using forge::testing::write_bytes;

std::vector<std::string> documents(const std::string& path, const std::string& key = "text") {
  std::vector<std::string> out;
  const int64_t n = for_each_document(path, key, [&](std::string_view d) { out.emplace_back(d); });
  EXPECT_EQ(n, static_cast<int64_t>(out.size()));
  return out;
}

void write_gz(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  gzclose(f);
}

std::string error_of(const std::string& path, const std::string& key = "text") {
  try {
    documents(path, key);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Documents, TextFilesAreOneDocumentAndJsonLinesOnePerLine) {
  TempDir dir;
  write_bytes(dir.file("a.txt"), "line one\n{\"text\": \"not json to a text file\"}\n");
  EXPECT_EQ(documents(dir.file("a.txt")), (std::vector<std::string>{"line one\n{\"text\": \"not json to a text file\"}\n"}));
  // Unicode escapes, embedded newlines, other keys, a blank line, no newline at the end; a line
  // longer than the gzip reader's 64 KiB buffer.
  const std::string long_text(200000, 'x');
  const std::string jsonl = "{\"text\": \"caf\\u00e9 \\ud83d\\ude00\\nsecond line\", \"id\": 1}\n"
                            "\n"
                            "{\"id\": 2, \"text\": \"\"}\n"
                            "{\"text\": \"" + long_text + "\"}\n"
                            "{\"text\": \"last\", \"meta\": {\"text\": \"nested\"}}";
  const std::vector<std::string> want = {"caf\xc3\xa9 \xf0\x9f\x98\x80\nsecond line", "", long_text, "last"};
  write_bytes(dir.file("c.jsonl"), jsonl);
  EXPECT_EQ(documents(dir.file("c.jsonl")), want);
  write_gz(dir.file("c.jsonl.gz"), jsonl + "\n");
  EXPECT_EQ(documents(dir.file("c.jsonl.gz")), want);
  // Another key.
  write_bytes(dir.file("k.jsonl"), "{\"content\": \"a\"}\n{\"content\": \"b\"}\n");
  EXPECT_EQ(documents(dir.file("k.jsonl"), "content"), (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(is_jsonl("x/y.jsonl"));
  EXPECT_TRUE(is_jsonl("y.jsonl.gz"));
  EXPECT_FALSE(is_jsonl("y.json"));
  EXPECT_FALSE(is_jsonl("y.txt"));
}

TEST(Documents, BadLinesNameTheFileTheLineAndTheFix) {
  TempDir dir;
  write_bytes(dir.file("bad.jsonl"), "{\"text\": \"ok\"}\n{\"text\": \"unterminated}\n");
  std::string m = error_of(dir.file("bad.jsonl"));
  EXPECT_NE(m.find("bad.jsonl' line 2 is not JSON"), std::string::npos) << m;
  write_bytes(dir.file("array.jsonl"), "[1, 2]\n");
  m = error_of(dir.file("array.jsonl"));
  EXPECT_NE(m.find("line 1 is a JSON array, not an object"), std::string::npos) << m;
  write_bytes(dir.file("key.jsonl"), "{\"text\": \"a\"}\n\n{\"body\": \"b\"}\n");
  m = error_of(dir.file("key.jsonl"));
  EXPECT_NE(m.find("line 3 has no key \"text\"; set data.text_key"), std::string::npos) << m;
  write_bytes(dir.file("num.jsonl"), "{\"text\": 5}\n");
  m = error_of(dir.file("num.jsonl"));
  EXPECT_NE(m.find("\"text\" is a number, not a string"), std::string::npos) << m;
  // Issue 43: gzip by its magic. Plain bytes named .gz used to be read as text (zlib passes them
  // through); gzip bytes under another name, as text of compressed garbage.
  write_bytes(dir.file("notgz.jsonl.gz"), "{\"text\": \"plain, not gzip\"}\n");
  m = error_of(dir.file("notgz.jsonl.gz"));
  EXPECT_NE(m.find("notgz.jsonl.gz' is named .gz but is not gzip-compressed"), std::string::npos) << m;
  write_bytes(dir.file("hidden.jsonl"), std::string("\x1f\x8b\x08\x00rest", 8));
  m = error_of(dir.file("hidden.jsonl"));
  EXPECT_NE(m.find("hidden.jsonl' is gzip-compressed (it starts with 1f 8b) but not named .gz"), std::string::npos) << m;
  // A NUL in a line is an error naming the line (it used to end the line there and merge the next).
  static const char kNul[] = "{\"text\": \"a\"}\n{\"text\": \"b\0c\"}\n{\"text\": \"d\"}\n";
  write_bytes(dir.file("nul.jsonl"), std::string(kNul, sizeof(kNul) - 1));  // (the length was 2 past the literal: ASan)
  m = error_of(dir.file("nul.jsonl"));
  EXPECT_NE(m.find("nul.jsonl' line 2 is not JSON"), std::string::npos) << m;
  EXPECT_NE(m.find("a NUL byte"), std::string::npos) << m;
  write_gz(dir.file("nul.jsonl.gz"), std::string(kNul, sizeof(kNul) - 1));
  m = error_of(dir.file("nul.jsonl.gz"));
  EXPECT_NE(m.find("nul.jsonl.gz' line 2 is not JSON"), std::string::npos) << m;
  // A line over 64 MiB is refused before it is parsed (a 1 GB one needed 8-20 times its size).
  write_bytes(dir.file("long.jsonl"), "{\"text\": \"ok\"}\n{\"text\": \"" + std::string(kMaxJsonlLineBytes, 'x') + "\"}\n");
  m = error_of(dir.file("long.jsonl"));
  EXPECT_NE(m.find("long.jsonl' line 2 is longer than 64 MiB"), std::string::npos) << m;
  m = error_of(dir.file("missing.jsonl"));
  EXPECT_NE(m.find("cannot open"), std::string::npos) << m;
}

}  // namespace
}  // namespace forge::data
