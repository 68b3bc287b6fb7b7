#pragma once
// Note [documents]: a text corpus file is a sequence of documents.
//   a plain text file (any other name) is one document, its whole content;
//   a JSON Lines file (*.jsonl, or gzip-compressed *.jsonl.gz) holds one JSON object per line,
//     and its string member `text_key` (data.text_key, default "text") is a document; blank
//     lines are skipped. A line that is not a JSON object, or lacks the key, or whose value is
//     not a string, is an error naming the file, the line and the fix.
// The lines are streamed (one line in memory at a time; a .gz file is decompressed as it is
// read), so a corpus file larger than memory can be read. Training a tokenizer and encoding
// shards read every file through for_each_document, and an end-of-text token
// (data.eos_token) follows each document in the shards.
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace forge::data {

// True for *.jsonl and *.jsonl.gz.
bool is_jsonl(const std::string& path);

// Calls `fn` with each document of `path` in order (see above); returns how many.
int64_t for_each_document(const std::string& path, const std::string& text_key,
                          const std::function<void(std::string_view)>& fn);

}  // namespace forge::data
