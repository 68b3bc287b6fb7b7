// Rank-ordered BPE over token ids (bpe_model.h).
#include "forge/data/bpe_model.h"

#include <array>
#include <cstdio>
#include <functional>
#include <queue>

#include "forge/core/error.h"
#include "forge/data/bpe_tables.h"
#include "forge/data/regex.h"

namespace forge::data {

namespace {
inline uint64_t pack(int32_t rank, int32_t result) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(rank)) << 32) | static_cast<uint32_t>(result);
}
}  // namespace

struct BpeModel::Impl {
  Options opt;
  std::vector<std::string> keys;
  StringMap<int32_t> ids;                 // key -> id
  PairMap<uint64_t> pairs{1024};          // (left, right) -> (rank, result)
  std::array<int32_t, 256> byte_ids{};    // bytes: the token of each byte; chars: its <0xNN> token
  uint64_t owner = next_cache_owner_id();  // Note [per-thread word cache] (bpe.cpp)
};

BpeModel::BpeModel(std::vector<std::string> keys, const std::vector<BpeMerge>& merges, Options opt,
                   const std::string& origin)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.opt = opt;
  m.keys = std::move(keys);
  m.ids.reserve(m.keys.size());
  for (size_t id = 0; id < m.keys.size(); ++id) {
    if (m.keys[id].empty()) continue;
    const auto [it, fresh] = m.ids.emplace(m.keys[id], static_cast<int32_t>(id));
    FORGE_CHECK(fresh, origin, ": token \"", m.keys[id], "\" has two ids, ", it->second, " and ", id);
  }
  m.byte_ids.fill(-1);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    const char byte = static_cast<char>(b);
    const auto it = opt.symbols == Symbols::bytes ? m.ids.find(std::string_view(&byte, 1)) : m.ids.find(std::string_view(name));
    if (it != m.ids.end()) m.byte_ids[static_cast<size_t>(b)] = it->second;
  }
  m.pairs = PairMap<uint64_t>(merges.size() + 16);
  const auto n = static_cast<int32_t>(m.keys.size());
  for (const BpeMerge& g : merges) {
    FORGE_CHECK(g.left >= 0 && g.left < n && g.right >= 0 && g.right < n && g.result >= 0 && g.result < n, origin,
                ": merge (", g.left, ", ", g.right, ") -> ", g.result, " names an id outside the vocabulary of ", n);
    const uint64_t k = pair_key(g.left, g.right);
    if (m.pairs.find(k) != nullptr) continue;  // a repeated merge: the first (lowest) rank counts
    m.pairs[k] = pack(g.rank, g.result);
  }
}

BpeModel::BpeModel(BpeModel&&) noexcept = default;
BpeModel& BpeModel::operator=(BpeModel&&) noexcept = default;
BpeModel::~BpeModel() = default;

std::optional<int32_t> BpeModel::id_of(std::string_view key) const {
  const auto it = impl_->ids.find(key);
  if (it == impl_->ids.end()) return std::nullopt;
  return it->second;
}

const std::string& BpeModel::key(int32_t id) const { return impl_->keys.at(static_cast<size_t>(id)); }
int64_t BpeModel::size() const { return static_cast<int64_t>(impl_->keys.size()); }
const BpeModel::Options& BpeModel::options() const { return impl_->opt; }

void BpeModel::initial_symbols(std::string_view piece, std::vector<int32_t>& syms) const {
  const Impl& m = *impl_;
  auto unknown = [&](std::string_view what) {
    FORGE_CHECK(m.opt.unk_id >= 0, "BPE: \"", what, "\" is no token of this vocabulary and it has no unknown token");
    if (!(m.opt.fuse_unk && !syms.empty() && syms.back() == m.opt.unk_id)) syms.push_back(m.opt.unk_id);
  };
  if (m.opt.symbols == Symbols::bytes) {
    for (const unsigned char c : piece) {
      const int32_t id = m.byte_ids[c];
      if (id >= 0) syms.push_back(id);
      else unknown(std::string_view(reinterpret_cast<const char*>(&c), 1));
    }
    return;
  }
  for (size_t pos = 0; pos < piece.size();) {
    const size_t len = utf8_char_len(piece, pos);
    const std::string_view ch = piece.substr(pos, len > 0 ? len : 1);  // an invalid byte alone
    pos += ch.size();
    if (len > 0) {
      const auto it = m.ids.find(ch);
      if (it != m.ids.end()) {
        syms.push_back(it->second);
        continue;
      }
    }
    bool all_bytes = m.opt.byte_fallback;
    for (const unsigned char c : ch) all_bytes = all_bytes && m.byte_ids[c] >= 0;
    if (all_bytes) {
      for (const unsigned char c : ch) syms.push_back(m.byte_ids[c]);
    } else {
      unknown(ch);
    }
  }
}

std::vector<int32_t> BpeModel::merge_symbols(std::vector<int32_t> ids) const {
  const Impl& m = *impl_;
  const auto n = static_cast<int32_t>(ids.size());
  if (n < 2) return ids;
  struct Sym {
    int32_t id, prev, next;
  };
  std::vector<Sym> s(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) s[i] = {ids[static_cast<size_t>(i)], i - 1, i + 1};
  s[n - 1].next = -1;
  struct Entry {
    int32_t rank, pos, result;
    bool operator>(const Entry& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  auto push = [&](int32_t i) {
    const int32_t j = s[i].next;
    if (j < 0) return;
    if (const uint64_t* v = m.pairs.find(pair_key(s[i].id, s[j].id)))
      heap.push({static_cast<int32_t>(*v >> 32), i, static_cast<int32_t>(*v & 0xffffffffu)});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Entry e = heap.top();
    heap.pop();
    const int32_t i = e.pos, j = s[i].next;
    if (s[i].id < 0 || j < 0) continue;
    const uint64_t* v = m.pairs.find(pair_key(s[i].id, s[j].id));
    if (v == nullptr || *v != pack(e.rank, e.result)) continue;  // stale entry
    s[i].id = e.result;
    s[j].id = -1;
    s[i].next = s[j].next;
    if (s[j].next >= 0) s[s[j].next].prev = i;
    if (s[i].prev >= 0) push(s[i].prev);
    push(i);
  }
  ids.clear();
  for (int32_t i = 0; i >= 0; i = s[i].next) ids.push_back(s[i].id);
  return ids;
}

void BpeModel::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  const Impl& m = *impl_;
  if (m.opt.ignore_merges) {
    const auto it = m.ids.find(piece);
    if (it != m.ids.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = piece.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    auto& cache = thread_word_cache(m.owner);  // Note [per-thread word cache] (bpe.cpp)
    const auto it = cache.find(piece);
    if (it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> syms;
  syms.reserve(piece.size());
  initial_symbols(piece, syms);
  syms = merge_symbols(std::move(syms));
  out.insert(out.end(), syms.begin(), syms.end());
  if (cacheable) {
    auto& cache = thread_word_cache(m.owner);
    if (cache.size() >= kMaxCacheEntries) cache.clear();
    cache.emplace(std::string(piece), std::move(syms));
  }
}

}  // namespace forge::data
