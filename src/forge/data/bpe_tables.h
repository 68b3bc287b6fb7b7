#pragma once
// Tables shared by forge's BPE encoders (bpe.cpp, bpe_model.cpp): an open-addressing map keyed
// by a pair of token ids, a string map with heterogeneous lookup, and the per-thread word
// cache of Note [per-thread word cache] (bpe.cpp).
#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace forge::data {

inline uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}
inline int32_t pair_left(uint64_t k) { return static_cast<int32_t>(k >> 32); }
inline int32_t pair_right(uint64_t k) { return static_cast<int32_t>(k & 0xffffffffu); }

// Open-addressing hash map from a pair key to V (linear probing, load <= 1/2). Keys are
// never erased (a pair whose count drops to zero keeps its slot), which keeps probing simple.
template <class V> class PairMap {
 public:
  explicit PairMap(size_t capacity = 1024) { rehash(std::bit_ceil(std::max<size_t>(capacity * 2, 16))); }

  V* find(uint64_t key) {
    for (size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
      if (keys_[i] == key) return &vals_[i];
      if (keys_[i] == kEmpty) return nullptr;
    }
  }
  const V* find(uint64_t key) const { return const_cast<PairMap*>(this)->find(key); }

  V& operator[](uint64_t key) {
    if ((size_ + 1) * 2 > keys_.size()) rehash(keys_.size() * 2);
    size_t i = hash(key) & mask_;
    for (; keys_[i] != kEmpty; i = (i + 1) & mask_)
      if (keys_[i] == key) return vals_[i];
    keys_[i] = key;
    ++size_;
    return vals_[i];
  }

  template <class F> void for_each(F&& f) {
    for (size_t i = 0; i < keys_.size(); ++i)
      if (keys_[i] != kEmpty) f(keys_[i], vals_[i]);
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};  // never a pair: ids are < 2^31
  static size_t hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return static_cast<size_t>(k);
  }
  void rehash(size_t cap) {
    std::vector<uint64_t> old_keys(cap, kEmpty);
    std::vector<V> old_vals(cap);
    old_keys.swap(keys_);
    old_vals.swap(vals_);
    mask_ = cap - 1;
    size_ = 0;
    for (size_t i = 0; i < old_keys.size(); ++i)
      if (old_keys[i] != kEmpty) (*this)[old_keys[i]] = std::move(old_vals[i]);
  }
  std::vector<uint64_t> keys_;
  std::vector<V> vals_;
  size_t size_ = 0, mask_ = 0;
};

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <class V> using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;


// A process-unique id for an encoder that caches words (never an address, which a later
// encoder may reuse).
inline uint64_t next_cache_owner_id() {
  static std::atomic<uint64_t> n{0};
  return ++n;
}

constexpr size_t kMaxCachedWordBytes = 64;    // longer pre-tokens are not cached
constexpr size_t kMaxCacheEntries = 1 << 20;  // a thread's cache is cleared when it grows past this

// This thread's word cache (pre-token -> ids), emptied when the thread moves to another owner.
inline StringMap<std::vector<int32_t>>& thread_word_cache(uint64_t owner) {
  struct Cache {
    uint64_t owner = 0;
    StringMap<std::vector<int32_t>> map;
  };
  thread_local Cache cache;
  if (cache.owner != owner) {
    cache.map.clear();
    cache.owner = owner;
  }
  return cache.map;
}

}  // namespace forge::data
