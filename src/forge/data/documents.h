#pragma once
// Note [documents]: a text corpus file is a sequence of documents.
//   a plain text file (any other name) is one document, its whole content;
//   a JSON Lines file (*.jsonl, or gzip-compressed *.jsonl.gz) holds one JSON object per line,
//     and its string member `text_key` (data.text_key, default "text") is a document; blank
//     lines are skipped. A line that is not a JSON object, or lacks the key, or whose value is
//     not a string, is an error naming the file, the line and the fix.
// The lines are streamed (one line in memory at a time; a .gz file is decompressed as it is
// read), so a corpus file larger than memory can be read. Untrusted input (issue 43): a line
// longer than kMaxJsonlLineBytes (64 MiB: a whole book is a few) is refused, naming the file and
// the line, rather than parsed into many times its size; a NUL byte in a line is an error (Note
// [untrusted JSON]); a file named *.gz must start with gzip's magic (1f 8b), and a gzip file must
// be named *.gz, so neither is read as the other. Training a tokenizer and encoding
// shards read every file through for_each_document, and an end-of-text token
// (data.eos_token) follows each document in the shards.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace forge::data {

// True for *.jsonl and *.jsonl.gz.
bool is_jsonl(const std::string& path);

inline constexpr size_t kMaxJsonlLineBytes = size_t{64} << 20;

// Calls `fn` with each document of `path` in order (see above); returns how many.
int64_t for_each_document(const std::string& path, const std::string& text_key,
                          const std::function<void(std::string_view)>& fn);

// Calls `fn` with each non-blank line of a JSON Lines file (*.jsonl, *.jsonl.gz) and its number
// (from 1), streamed and checked as above; returns how many. The chat corpora read their
// conversations through it (data/chat_encoding.h).
int64_t for_each_jsonl_line(const std::string& path, const std::function<void(const std::string&, int64_t)>& fn);

}  // namespace forge::data
