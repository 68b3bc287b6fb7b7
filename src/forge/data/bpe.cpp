// Byte-level BPE: training with incremental pair counts, rank-ordered encoding with a
// word cache, decoding, and the JSON file format (all described in bpe.h).
#include "forge/data/bpe.h"

#include "forge/data/documents.h"
#include "forge/io/atomic_file.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <unordered_map>

#include "forge/core/error.h"
#include "forge/data/bpe_tables.h"
#include "forge/data/pretokenize.h"
#include "forge/data/shards.h"
#include "forge/io/json_input.h"

namespace forge::data {

namespace {

constexpr int32_t kNumBytes = 256;


// Calls on_text(segment) for the text between special tokens and on_special(k) for each
// occurrence of special token k (leftmost first; the longest wins at one position).
template <class OnText, class OnSpecial>
void split_specials(std::string_view text, const std::vector<std::string>& specials, OnText&& on_text,
                    OnSpecial&& on_special) {
  if (specials.empty()) {
    if (!text.empty()) on_text(text);
    return;
  }
  constexpr size_t npos = std::string_view::npos;
  std::vector<size_t> next(specials.size());  // next occurrence of each special at or after pos
  for (size_t k = 0; k < specials.size(); ++k) next[k] = text.find(specials[k]);
  size_t pos = 0;
  while (pos < text.size()) {
    size_t best = npos, best_k = 0;
    for (size_t k = 0; k < specials.size(); ++k) {
      if (next[k] != npos && next[k] < pos) next[k] = text.find(specials[k], pos);
      if (next[k] == npos) continue;
      if (next[k] < best || (next[k] == best && specials[k].size() > specials[best_k].size())) {
        best = next[k];
        best_k = k;
      }
    }
    if (best == npos) {
      on_text(text.substr(pos));
      return;
    }
    if (best > pos) on_text(text.substr(pos, best - pos));
    on_special(best_k);
    pos = best + specials[best_k].size();
  }
}

void check_specials(const std::vector<std::string>& specials, const char* where) {
  for (size_t i = 0; i < specials.size(); ++i) {
    FORGE_CHECK(!specials[i].empty(), where, ": special token ", i, " is empty");
    FORGE_CHECK(is_valid_utf8(specials[i]), where, ": special token ", i, " is not valid UTF-8");
    for (size_t j = 0; j < i; ++j)
      FORGE_CHECK(specials[i] != specials[j], where, ": special token \"", specials[i], "\" is listed twice");
  }
}

std::string read_file(const std::string& path, const char* where) {
  std::ifstream in(path, std::ios::binary);
  FORGE_CHECK(in, where, ": cannot open '", path, "' for reading");
  std::ostringstream ss;
  ss << in.rdbuf();
  FORGE_CHECK(!in.bad(), where, ": error while reading '", path, "'");
  return ss.str();
}

// ---- training --------------------------------------------------------------------------

// Pre-token frequencies of the training text (special tokens cut out).
class WordCounter {
 public:
  explicit WordCounter(const std::vector<std::string>& specials) : specials_(specials) {}
  void add(std::string_view text) {
    split_specials(
        text, specials_,
        [&](std::string_view seg) {
          for_each_pretoken(seg, [&](std::string_view w) {
            auto it = counts_.find(w);
            if (it == counts_.end()) counts_.emplace(std::string(w), 1);
            else ++it->second;
          });
        },
        [](size_t) {});
  }
  StringMap<int64_t>& counts() { return counts_; }

 private:
  const std::vector<std::string>& specials_;
  StringMap<int64_t> counts_;
};

struct HeapEntry {
  int64_t count;
  uint64_t pair;
};
// Max-heap order: higher count first; at equal counts the smaller (left, right) pair.
struct HeapLess {
  bool operator()(const HeapEntry& x, const HeapEntry& y) const {
    if (x.count != y.count) return x.count < y.count;
    return x.pair > y.pair;
  }
};

std::vector<std::pair<int32_t, int32_t>> learn_merges(StringMap<int64_t>& counts, int64_t num_merges,
                                                      int64_t min_frequency, bool verbose) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  // Words as a flat array of symbol ids: word w is syms[start[w] .. start[w] + len[w]).
  const size_t num_words = counts.size();
  std::vector<int32_t> syms;
  std::vector<int64_t> start(num_words), freq(num_words);
  std::vector<int32_t> len(num_words);
  {
    size_t total = 0;
    for (const auto& [w, c] : counts) total += w.size();
    syms.reserve(total);
    size_t i = 0;
    for (const auto& [w, c] : counts) {
      start[i] = static_cast<int64_t>(syms.size());
      len[i] = static_cast<int32_t>(w.size());
      freq[i] = c;
      for (unsigned char ch : w) syms.push_back(ch);
      ++i;
    }
  }
  StringMap<int64_t>().swap(counts);  // free the strings

  PairMap<int64_t> pair_count(1 << 16);
  PairMap<std::vector<int32_t>> where(1 << 16);  // words that (may) contain the pair
  for (size_t w = 0; w < num_words; ++w) {
    const int32_t* s = syms.data() + start[w];
    for (int32_t i = 0; i + 1 < len[w]; ++i) {
      const uint64_t k = pair_key(s[i], s[i + 1]);
      pair_count[k] += freq[w];
      where[k].push_back(static_cast<int32_t>(w));
    }
  }
  std::priority_queue<HeapEntry, std::vector<HeapEntry>, HeapLess> heap;
  pair_count.for_each([&](uint64_t k, int64_t c) { heap.push({c, k}); });

  std::vector<std::pair<int32_t, int32_t>> merges;
  merges.reserve(static_cast<size_t>(std::max<int64_t>(num_merges, 0)));
  std::vector<uint64_t> touched;  // pairs that gained occurrences in this merge (all contain z)
  while (static_cast<int64_t>(merges.size()) < num_merges && !heap.empty()) {
    const HeapEntry top = heap.top();
    heap.pop();
    const int64_t current = *pair_count.find(top.pair);
    if (current != top.count) {  // stale: counts only fall, so re-queue at the true count
      if (current > 0) heap.push({current, top.pair});
      continue;
    }
    if (current < min_frequency || current <= 0) break;
    const int32_t a = pair_left(top.pair), b = pair_right(top.pair);
    const int32_t z = kNumBytes + static_cast<int32_t>(merges.size());
    merges.emplace_back(a, b);

    std::vector<int32_t> words = std::move(*where.find(top.pair));
    std::sort(words.begin(), words.end());
    words.erase(std::unique(words.begin(), words.end()), words.end());
    touched.clear();
    for (const int32_t w : words) {
      int32_t* s = syms.data() + start[w];
      const int32_t n = len[w];
      const int64_t f = freq[w];
      auto add = [&](int32_t x, int32_t y) {
        const uint64_t k = pair_key(x, y);
        pair_count[k] += f;
        where[k].push_back(w);
        touched.push_back(k);
      };
      auto sub = [&](int32_t x, int32_t y) { *pair_count.find(pair_key(x, y)) -= f; };
      int32_t out = 0;
      for (int32_t i = 0; i < n;) {
        if (s[i] == a && i + 1 < n && s[i + 1] == b) {
          if (out > 0) {  // the symbol before (possibly a z written by this loop)
            sub(s[out - 1], a);
            add(s[out - 1], z);
          }
          if (i + 2 < n) {
            sub(b, s[i + 2]);
            add(z, s[i + 2]);
          }
          sub(a, b);
          s[out++] = z;
          i += 2;
        } else {
          s[out++] = s[i++];
        }
      }
      len[w] = out;
    }
    std::sort(touched.begin(), touched.end());
    touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
    for (const uint64_t k : touched) {
      const int64_t c = *pair_count.find(k);
      if (c > 0) heap.push({c, k});
    }
    if (verbose && merges.size() % 500 == 0) {
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      std::fprintf(stderr, "bpe: %zu merges, last count %lld, %.2f s\n", merges.size(),
                   static_cast<long long>(current), s);
    }
  }
  return merges;
}

}  // namespace

// ---- the tokenizer ---------------------------------------------------------------------

// Note [per-thread word cache]: a pre-token's ids are cached per thread (no lock on the path
// of every word: threads encoding documents at once would otherwise serialise on one cache's
// lock, and did, 2.3x slower on 2 threads than on one). A thread's cache belongs to one
// tokenizer, named by a process-unique id (never an address, which a later tokenizer may
// reuse), and is emptied when the thread encodes with another.
struct BpeTokenizer::Impl {
  PairMap<int32_t> rank{1024};  // pair -> merge index
  uint64_t id = next_cache_owner_id();
};


BpeTokenizer::BpeTokenizer() : BpeTokenizer({}, {}) {}

BpeTokenizer::BpeTokenizer(std::vector<std::pair<int32_t, int32_t>> merges, std::vector<std::string> special_tokens)
    : merges_(std::move(merges)), specials_(std::move(special_tokens)) {
  build();
}

BpeTokenizer::BpeTokenizer(const BpeTokenizer& other) : BpeTokenizer(other.merges_, other.specials_) {}
BpeTokenizer& BpeTokenizer::operator=(const BpeTokenizer& other) {
  if (this != &other) *this = BpeTokenizer(other);
  return *this;
}
BpeTokenizer::BpeTokenizer(BpeTokenizer&&) noexcept = default;
BpeTokenizer& BpeTokenizer::operator=(BpeTokenizer&&) noexcept = default;
BpeTokenizer::~BpeTokenizer() = default;

void BpeTokenizer::build() {
  check_specials(specials_, "BpeTokenizer");
  impl_ = std::make_unique<Impl>();
  impl_->rank = PairMap<int32_t>(merges_.size() + 16);
  tokens_.clear();
  tokens_.reserve(kNumBytes + merges_.size() + specials_.size());
  for (int i = 0; i < kNumBytes; ++i) tokens_.emplace_back(1, static_cast<char>(i));
  for (size_t i = 0; i < merges_.size(); ++i) {
    const auto [l, r] = merges_[i];
    const int32_t id = kNumBytes + static_cast<int32_t>(i);
    FORGE_CHECK(l >= 0 && l < id && r >= 0 && r < id, "BpeTokenizer: merge ", i, " (", l, ", ", r,
                ") refers to an id that does not exist yet (merge ", i, " makes id ", id, ")");
    FORGE_CHECK(impl_->rank.find(pair_key(l, r)) == nullptr, "BpeTokenizer: merge ", i, " (", l, ", ", r,
                ") is listed twice");
    impl_->rank[pair_key(l, r)] = static_cast<int32_t>(i);
    // Note [tokenizer file limits]: merges that each double the last token would ask for gigabytes.
    const size_t n = tokens_[static_cast<size_t>(l)].size() + tokens_[static_cast<size_t>(r)].size();
    FORGE_CHECK(static_cast<int64_t>(n) <= kMaxTokenBytes, "BpeTokenizer: merge ", i, " (", l, ", ", r, ") makes a token of ",
                n, " bytes; forge reads tokens of up to ", kMaxTokenBytes, " bytes (Note [tokenizer file limits])");
    tokens_.push_back(tokens_[static_cast<size_t>(l)] + tokens_[static_cast<size_t>(r)]);
  }
  for (const auto& s : specials_) tokens_.push_back(s);
}

BpeTokenizer BpeTokenizer::train(std::string_view text, int64_t vocab_size, std::vector<std::string> special_tokens) {
  BpeTrainOptions opt;
  opt.vocab_size = vocab_size;
  opt.special_tokens = std::move(special_tokens);
  return train(text, opt);
}

namespace {
int64_t merges_for(const BpeTrainOptions& opt, const char* where) {
  check_specials(opt.special_tokens, where);
  const int64_t min_vocab = kNumBytes + static_cast<int64_t>(opt.special_tokens.size());
  FORGE_CHECK(opt.vocab_size >= min_vocab, where, ": vocab_size ", opt.vocab_size, " is too small: it must be at least ",
              min_vocab, " (256 byte tokens + ", opt.special_tokens.size(), " special token(s))");
  FORGE_CHECK(opt.vocab_size <= (int64_t{1} << 31) - 1, where, ": vocab_size ", opt.vocab_size,
              " does not fit int32 token ids");
  return opt.vocab_size - min_vocab;
}
}  // namespace

BpeTokenizer BpeTokenizer::train(std::string_view text, const BpeTrainOptions& opt) {
  const int64_t num_merges = merges_for(opt, "BpeTokenizer::train");
  WordCounter counter(opt.special_tokens);
  counter.add(text);
  return BpeTokenizer(learn_merges(counter.counts(), num_merges, opt.min_frequency, opt.verbose), opt.special_tokens);
}

BpeTokenizer BpeTokenizer::train_files(const std::vector<std::string>& paths, const BpeTrainOptions& opt) {
  const int64_t num_merges = merges_for(opt, "BpeTokenizer::train_files");
  WordCounter counter(opt.special_tokens);
  for (const auto& p : paths) {
    if (!is_jsonl(p)) {
      counter.add(read_file(p, "BpeTokenizer::train_files"));
      continue;
    }
    for_each_document(p, opt.text_key, [&](std::string_view doc) { counter.add(doc); });
  }
  return BpeTokenizer(learn_merges(counter.counts(), num_merges, opt.min_frequency, opt.verbose), opt.special_tokens);
}

// Applies the merges to one pre-token in rank order: a min-heap of (rank, position) over
// a doubly linked list of symbols. Merging creates only pairs that contain the new id,
// whose ranks are higher, so ranks come out of the heap in order and, within a rank,
// left to right: exactly what training did to the word.
std::vector<int32_t> BpeTokenizer::encode_word(std::string_view word) const {
  const int32_t n = static_cast<int32_t>(word.size());
  struct Sym {
    int32_t id, prev, next;
  };
  std::vector<Sym> s(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) s[i] = {static_cast<unsigned char>(word[static_cast<size_t>(i)]), i - 1, i + 1};
  s[n - 1].next = -1;
  using Entry = std::pair<int32_t, int32_t>;  // (rank, position of the left symbol)
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  auto push = [&](int32_t i) {
    const int32_t j = s[i].next;
    if (j < 0) return;
    if (const int32_t* r = impl_->rank.find(pair_key(s[i].id, s[j].id))) heap.push({*r, i});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const auto [r, i] = heap.top();
    heap.pop();
    const int32_t j = s[i].next;
    if (s[i].id < 0 || j < 0) continue;
    const auto& m = merges_[static_cast<size_t>(r)];
    if (s[i].id != m.first || s[j].id != m.second) continue;  // stale entry
    s[i].id = kNumBytes + r;
    s[j].id = -1;
    s[i].next = s[j].next;
    if (s[j].next >= 0) s[s[j].next].prev = i;
    if (s[i].prev >= 0) push(s[i].prev);
    push(i);
  }
  std::vector<int32_t> out;
  for (int32_t i = 0; i >= 0; i = s[i].next) out.push_back(s[i].id);
  return out;
}

void BpeTokenizer::encode_word_into(std::string_view word, std::vector<int32_t>& out) const {
  if (word.size() == 1) {
    out.push_back(static_cast<unsigned char>(word[0]));
    return;
  }
  if (merges_.empty()) {
    for (unsigned char c : word) out.push_back(c);
    return;
  }
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  auto& cache = thread_word_cache(impl_->id);  // Note [per-thread word cache]
  if (cacheable) {
    auto it = cache.find(word);
    if (it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids = encode_word(word);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    if (cache.size() >= kMaxCacheEntries) cache.clear();
    cache.emplace(std::string(word), std::move(ids));
  }
}

void BpeTokenizer::encode_ordinary_into(std::string_view text, std::vector<int32_t>& out) const {
  for_each_pretoken(text, [&](std::string_view w) { encode_word_into(w, out); });
}

std::vector<int32_t> BpeTokenizer::encode_ordinary(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 16);
  encode_ordinary_into(text, out);
  return out;
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 16);
  const int32_t first_special = kNumBytes + static_cast<int32_t>(merges_.size());
  split_specials(
      text, specials_, [&](std::string_view seg) { encode_ordinary_into(seg, out); },
      [&](size_t k) { out.push_back(first_special + static_cast<int32_t>(k)); });
  return out;
}

std::string BpeTokenizer::describe() const {
  return "forge byte-level BPE, " + std::to_string(vocab_size()) + " tokens";
}

std::string BpeTokenizer::decode(std::span<const int32_t> ids) const {
  size_t total = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    FORGE_CHECK(ids[i] >= 0 && ids[i] < vocab_size(), "BpeTokenizer::decode: id ", ids[i], " at position ", i,
                " is outside the vocabulary [0, ", vocab_size(), ")");
    total += tokens_[static_cast<size_t>(ids[i])].size();
  }
  std::string out;
  out.reserve(total);
  for (const int32_t id : ids) out += tokens_[static_cast<size_t>(id)];
  return out;
}

std::optional<int32_t> BpeTokenizer::token_id(std::string_view special) const {
  for (size_t k = 0; k < specials_.size(); ++k)
    if (specials_[k] == special) return kNumBytes + static_cast<int32_t>(merges_.size() + k);
  return std::nullopt;
}

int32_t BpeTokenizer::special_id(std::string_view token) const {
  for (size_t k = 0; k < specials_.size(); ++k)
    if (specials_[k] == token) return kNumBytes + static_cast<int32_t>(merges_.size() + k);
  FORGE_THROW("BpeTokenizer::special_id: \"", token, "\" is not a special token of this tokenizer (it has ",
              specials_.size(), ")");
}

const std::string& BpeTokenizer::token_bytes(int32_t id) const {
  FORGE_CHECK(id >= 0 && id < vocab_size(), "BpeTokenizer::token_bytes: id ", id, " is outside the vocabulary [0, ",
              vocab_size(), ")");
  return tokens_[static_cast<size_t>(id)];
}

// ---- file format -----------------------------------------------------------------------

std::string BpeTokenizer::to_json() const {
  nlohmann::json j;
  j["format"] = "forge-bpe";
  j["version"] = 1;
  j["pretokenizer"] = "gpt2";
  j["vocab_size"] = vocab_size();
  nlohmann::json merges = nlohmann::json::array();
  for (const auto& [l, r] : merges_) merges.push_back({l, r});
  j["merges"] = std::move(merges);
  nlohmann::json specials = nlohmann::json::array();
  for (size_t k = 0; k < specials_.size(); ++k)
    specials.push_back({{"id", kNumBytes + static_cast<int64_t>(merges_.size() + k)}, {"content", specials_[k]}});
  j["special_tokens"] = std::move(specials);
  return j.dump();
}

BpeTokenizer BpeTokenizer::from_json(std::string_view text, const std::string& origin) {
  const std::string where = "BpeTokenizer::load('" + origin + "')";
  const nlohmann::json j = io::parse_json(text, where);  // Note [untrusted JSON]
  try {
    FORGE_CHECK(j.is_object() && j.value("format", "") == "forge-bpe", where,
                ": not a forge BPE tokenizer file (expected \"format\": \"forge-bpe\")");
    FORGE_CHECK(j.value("version", 0) == 1, where, ": unsupported version ", j.value("version", 0),
                " (this forge reads version 1)");
    FORGE_CHECK(j.value("pretokenizer", "") == "gpt2", where, ": unsupported pretokenizer \"",
                j.value("pretokenizer", ""), "\" (this forge has \"gpt2\")");
    std::vector<std::pair<int32_t, int32_t>> merges;
    const nlohmann::json& mj = j.at("merges");
    FORGE_CHECK(mj.is_array(), where, ": merges is not an array");
    // Note [tokenizer file limits]: integers in range here; build() checks that merge i names ids below 256 + i.
    FORGE_CHECK(static_cast<int64_t>(mj.size()) + kNumBytes <= kMaxVocabSize, where, ": ", mj.size(),
                " merges; forge reads vocabularies of up to ", kMaxVocabSize, " ids");
    for (const auto& m : mj) {
      FORGE_CHECK(m.is_array() && m.size() == 2, where, ": merge ", merges.size(), " is not a [left, right] pair");
      const int64_t limit = kMaxVocabSize - 1;  // (build() names an id that does not exist yet)
      const std::string what = where + ": merge " + std::to_string(merges.size());
      merges.emplace_back(static_cast<int32_t>(io::json_integer(m[0], 0, limit, what + " (left)")),
                          static_cast<int32_t>(io::json_integer(m[1], 0, limit, what + " (right)")));
    }
    std::vector<std::string> specials;
    for (const auto& s : j.at("special_tokens")) {
      const int64_t expected = kNumBytes + static_cast<int64_t>(merges.size() + specials.size());
      io::json_integer(s.at("id"), expected, expected,
                       where + ": the id of special token \"" + s.at("content").get<std::string>() +
                           "\" (specials follow the merges)");
      specials.push_back(s.at("content").get<std::string>());
    }
    const int64_t vocab = kNumBytes + static_cast<int64_t>(merges.size() + specials.size());
    FORGE_CHECK(j.at("vocab_size").get<int64_t>() == vocab, where, ": vocab_size ", j.at("vocab_size").get<int64_t>(),
                " does not match 256 + ", merges.size(), " merges + ", specials.size(), " special tokens = ", vocab);
    try {
      return BpeTokenizer(std::move(merges), std::move(specials));
    } catch (const Error& e) {
      FORGE_THROW(where, ": ", e.what());
    }
  } catch (const nlohmann::json::exception& e) {
    FORGE_THROW(where, ": malformed tokenizer file: ", e.what());
  }
}

void BpeTokenizer::save(const std::string& path) const {
  const std::string json = to_json() + "\n";
  io::write_file_atomic(path, json);
}

BpeTokenizer BpeTokenizer::load(const std::string& path) {
  return from_json(read_file(path, "BpeTokenizer::load"), path);
}

}  // namespace forge::data
