// Byte-level BPE: hand-checked merges, lossless round trips on random bytes and real
// text, determinism, compression, special tokens, save/load, errors, and a timing print.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <cstdio>
#include <random>
#include <string>
#include <memory>
#include <thread>
#include <vector>

#include "data/data_testing.h"
#include "forge/forge.h"
#include "testing/tensor_testing.h"

namespace forge::data {
namespace {

using forge::testing::error_of;
using forge::testing::fortune_files;
using forge::testing::fortune_text;
using forge::testing::TempDir;

const std::string kEot = "<|endoftext|>";

// One tokenizer trained on the fortunes, shared by the tests that only read it.
const BpeTokenizer& fortune_tokenizer() {
  static const BpeTokenizer tok = [] {
    const std::string text = fortune_text();
    EXPECT_GT(text.size(), 1000000u) << "the fortunes in " << forge::testing::kFortuneDir << " are missing";
    return BpeTokenizer::train(text, 2000, {kEot});
  }();
  return tok;
}

std::string random_bytes(std::mt19937& rng, size_t max_len) {
  static const std::vector<std::string> pieces = {"the", " of", "'s", " ", "  ", "\n", "\t", "123", "\xC3\xA9",
                                                  "\xE6\x97\xA5", "\xF0\x9F\x98\x80", "\xFF", "\xC3", "\x80", "'ll",
                                                  std::string(1, '\0'), "<|endoftext|>", "<|endof", "!!"};
  std::string s;
  const size_t n = rng() % (max_len + 1);
  while (s.size() < n) {
    if (rng() % 2) s += static_cast<char>(rng() % 256);
    else s += pieces[rng() % pieces.size()];
  }
  return s;
}

TEST(BpeTokenizer, ByteLevelWithoutMerges) {
  BpeTokenizer tok;
  EXPECT_EQ(tok.vocab_size(), 256);
  const std::string s("a\0\xFF z", 5);
  EXPECT_EQ(tok.encode(s), (std::vector<int32_t>{'a', 0, 255, ' ', 'z'}));
  EXPECT_EQ(tok.decode(tok.encode(s)), s);
}

// "aaab aab ab" -> pre-tokens "aaab", " aab", " ab". Pair counts: (a,a) = 2 + 1 = 3,
// (a,b) = 3, (' ',a) = 2. (a,a) and (a,b) tie at 3; the smaller pair (97, 97) wins.
// After it, words are [256 a b], [' ' 256 b], [' ' a b]: (a,b) = 2 is the unique maximum.
TEST(BpeTokenizer, HandCheckedMerges) {
  const BpeTokenizer tok = BpeTokenizer::train("aaab aab ab", 258);
  ASSERT_EQ(tok.num_merges(), 2);
  EXPECT_EQ(tok.merges()[0], (std::pair<int32_t, int32_t>{'a', 'a'}));
  EXPECT_EQ(tok.merges()[1], (std::pair<int32_t, int32_t>{'a', 'b'}));
  EXPECT_EQ(tok.token_bytes(256), "aa");
  EXPECT_EQ(tok.token_bytes(257), "ab");
  EXPECT_EQ(tok.encode("aaab"), (std::vector<int32_t>{256, 257}));
  EXPECT_EQ(tok.encode(" aab"), (std::vector<int32_t>{' ', 256, 'b'}));
  EXPECT_EQ(tok.encode("aaa"), (std::vector<int32_t>{256, 'a'}));  // left to right, like training
  EXPECT_EQ(tok.encode("aaaa"), (std::vector<int32_t>{256, 256}));
}

// Encoding a training word gives what training made of it: with every merge trained,
// each distinct word of a small text becomes as few tokens as training left it.
TEST(BpeTokenizer, EncodeReproducesTraining) {
  const std::string text = "low lower lowest newer newest wider widest low low lower";
  const BpeTokenizer tok = BpeTokenizer::train(text, 100000);  // stops when no pair is left
  EXPECT_LT(tok.vocab_size(), 100000);
  for (auto w : pretokenize(text)) EXPECT_EQ(tok.encode(w).size(), 1u) << "word '" << w << "'";
}

// The textbook algorithm: recount every pair after every merge. Same tie-break (highest
// count, then the smallest (left, right) pair), merges applied left to right.
std::vector<std::pair<int32_t, int32_t>> naive_merges(std::string_view text, int num_merges) {
  std::map<std::vector<int32_t>, int64_t> words;
  for (auto w : pretokenize(text)) {
    std::vector<int32_t> syms;
    for (unsigned char c : w) syms.push_back(c);
    ++words[syms];
  }
  std::vector<std::pair<std::vector<int32_t>, int64_t>> list(words.begin(), words.end());
  std::vector<std::pair<int32_t, int32_t>> merges;
  for (int m = 0; m < num_merges; ++m) {
    std::map<std::pair<int32_t, int32_t>, int64_t> counts;
    for (const auto& [w, c] : list)
      for (size_t i = 0; i + 1 < w.size(); ++i) counts[{w[i], w[i + 1]}] += c;
    if (counts.empty()) break;
    auto best = counts.begin();
    for (auto it = counts.begin(); it != counts.end(); ++it)
      if (it->second > best->second) best = it;  // map order: the first maximum is the smallest pair
    merges.push_back(best->first);
    const int32_t z = 256 + m;
    for (auto& [w, c] : list) {
      std::vector<int32_t> out;
      for (size_t i = 0; i < w.size();) {
        if (i + 1 < w.size() && w[i] == best->first.first && w[i + 1] == best->first.second) {
          out.push_back(z);
          i += 2;
        } else {
          out.push_back(w[i++]);
        }
      }
      w = std::move(out);
    }
  }
  return merges;
}

TEST(BpeTokenizer, IncrementalTrainingMatchesNaive) {
  const auto files = fortune_files();
  ASSERT_FALSE(files.empty());
  std::string text = forge::testing::read_bytes(files[0]).substr(0, 30000);
  text += "aaaa aaaaa abab ababab \xFF\xFF\xFF\xFF zzzz";  // overlapping and repeated pairs
  const auto expected = naive_merges(text, 400);
  const BpeTokenizer tok = BpeTokenizer::train(text, 256 + 400);
  EXPECT_EQ(tok.merges(), expected);
}

TEST(BpeTokenizer, RoundTripsRandomBytes) {
  const BpeTokenizer& tok = fortune_tokenizer();
  std::mt19937 rng(1234);
  for (int i = 0; i < 1000; ++i) {
    const std::string s = random_bytes(rng, 300);
    const auto ids = tok.encode(s);
    for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < tok.vocab_size());
    ASSERT_EQ(tok.decode(ids), s) << "case " << i;
    ASSERT_EQ(tok.decode(tok.encode_ordinary(s)), s) << "case " << i;
  }
  // Long runs without whitespace are one pre-token; encoding must stay fast and exact.
  const std::string run(100000, '=');
  EXPECT_EQ(tok.decode(tok.encode(run)), run);
  std::string noise(200000, '\0');
  for (auto& c : noise) c = static_cast<char>(rng() % 256);
  EXPECT_EQ(tok.decode(tok.encode(noise)), noise);
}

TEST(BpeTokenizer, RoundTripsRealTextAndCompresses) {
  const BpeTokenizer& tok = fortune_tokenizer();
  int64_t bytes = 0, tokens = 0;
  for (const auto& f : fortune_files()) {
    const std::string text = forge::testing::read_bytes(f);
    const auto ids = tok.encode(text);
    ASSERT_EQ(tok.decode(ids), text) << f;
    bytes += static_cast<int64_t>(text.size());
    tokens += static_cast<int64_t>(ids.size());
  }
  // English BPE with a 2000-token vocabulary: well under half a token per byte.
  EXPECT_LT(static_cast<double>(tokens), 0.4 * static_cast<double>(bytes)) << tokens << " tokens for " << bytes << " bytes";
  // Merges also compress text the tokenizer was not trained on.
  const BpeTokenizer small = BpeTokenizer::train(forge::testing::read_bytes(fortune_files().front()), 1000);
  const std::string held_out = forge::testing::read_bytes(fortune_files().back());
  EXPECT_LT(small.encode(held_out).size(), held_out.size() * 6 / 10);
  EXPECT_EQ(small.decode(small.encode(held_out)), held_out);
}

TEST(BpeTokenizer, TrainingIsDeterministic) {
  auto files = fortune_files();
  ASSERT_GE(files.size(), 4u);
  files.resize(4);
  BpeTrainOptions opt;
  opt.vocab_size = 1200;
  opt.special_tokens = {kEot};
  const BpeTokenizer a = BpeTokenizer::train_files(files, opt);
  const BpeTokenizer b = BpeTokenizer::train_files(files, opt);
  std::vector<std::string> reversed(files.rbegin(), files.rend());
  const BpeTokenizer c = BpeTokenizer::train_files(reversed, opt);  // order of files does not matter
  EXPECT_EQ(a.merges(), b.merges());
  EXPECT_EQ(a.merges(), c.merges());
  EXPECT_EQ(a.vocab_size(), 1200);
  // Files are independent texts, like documents cut apart by a special token.
  std::string all;
  for (const auto& f : files) all += forge::testing::read_bytes(f) + kEot;
  EXPECT_EQ(BpeTokenizer::train(all, opt).merges(), a.merges());
}

TEST(BpeTokenizer, SpecialTokens) {
  std::string text;
  for (int i = 0; i < 200; ++i) text += "ab cd" + kEot + "ef gh" + kEot;
  const BpeTokenizer tok = BpeTokenizer::train(text, 400, {kEot, "<|pad|>"});
  EXPECT_EQ(tok.special_id(kEot), tok.vocab_size() - 2);
  EXPECT_EQ(tok.special_id("<|pad|>"), tok.vocab_size() - 1);
  EXPECT_NE(error_of([&] { tok.special_id("<|nope|>"); }).find("not a special token"), std::string::npos);
  // Training text is cut at special tokens: no merged token contains their bytes.
  for (int32_t id = 256; id < tok.vocab_size() - 2; ++id) {
    EXPECT_EQ(tok.token_bytes(id).find('<'), std::string::npos) << id;
    EXPECT_EQ(tok.token_bytes(id).find('|'), std::string::npos) << id;
  }
  const auto ids = tok.encode("ab" + kEot + "<|pad|>cd");
  ASSERT_GE(ids.size(), 4u);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), tok.special_id(kEot)), 1);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), tok.special_id("<|pad|>")), 1);
  EXPECT_EQ(tok.decode(ids), "ab" + kEot + "<|pad|>cd");
  const auto plain = tok.encode_ordinary("ab" + kEot);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), tok.special_id(kEot)), 0);
  EXPECT_EQ(tok.decode(plain), "ab" + kEot);
  EXPECT_NE(error_of([] { BpeTokenizer::train("x", 300, {"a", "a"}); }).find("listed twice"), std::string::npos);
  EXPECT_NE(error_of([] { BpeTokenizer::train("x", 300, {""}); }).find("empty"), std::string::npos);
}

TEST(BpeTokenizer, VocabTooSmallErrors) {
  const std::string msg = error_of([] { BpeTokenizer::train("hello", 256, {kEot}); });
  EXPECT_NE(msg.find("vocab_size 256"), std::string::npos) << msg;
  EXPECT_NE(msg.find("at least 257"), std::string::npos) << msg;
  const std::string msg2 = error_of([] { BpeTokenizer::train("hello", 100); });
  EXPECT_NE(msg2.find("vocab_size 100"), std::string::npos) << msg2;
  EXPECT_NE(msg2.find("at least 256"), std::string::npos) << msg2;
  EXPECT_EQ(BpeTokenizer::train("hello", 256).vocab_size(), 256);
  const std::string msg3 = error_of([] { BpeTokenizer().decode(std::vector<int32_t>{5, 256}); });
  EXPECT_NE(msg3.find("id 256"), std::string::npos) << msg3;
}

TEST(BpeTokenizer, SaveLoadGivesIdenticalEncodings) {
  const BpeTokenizer& tok = fortune_tokenizer();
  TempDir dir;
  const std::string path = dir.file("tok.json");
  tok.save(path);
  const BpeTokenizer loaded = BpeTokenizer::load(path);
  EXPECT_EQ(loaded.merges(), tok.merges());
  EXPECT_EQ(loaded.special_tokens(), tok.special_tokens());
  EXPECT_EQ(loaded.vocab_size(), tok.vocab_size());
  const std::string text = forge::testing::read_bytes(fortune_files()[1]) + kEot + "\xFF\xFE tail";
  EXPECT_EQ(loaded.encode(text), tok.encode(text));
  const BpeTokenizer copy = tok;  // copies rebuild their own cache
  EXPECT_EQ(copy.encode(text), tok.encode(text));
}

TEST(BpeTokenizer, LoadRejectsBadFiles) {
  TempDir dir;
  auto load_text = [&](const std::string& json) {
    const std::string p = dir.file("bad.json");
    forge::testing::write_bytes(p, json);
    return error_of([&] { BpeTokenizer::load(p); });
  };
  EXPECT_NE(load_text("{not json").find("not valid JSON"), std::string::npos);
  EXPECT_NE(load_text(R"({"format": "other"})").find("not a forge BPE tokenizer"), std::string::npos);
  const std::string future =
      R"({"format":"forge-bpe","version":1,"pretokenizer":"gpt2","vocab_size":257,"merges":[[97,256]],"special_tokens":[]})";
  EXPECT_NE(load_text(future).find("does not exist yet"), std::string::npos);
  const std::string wrong_size =
      R"({"format":"forge-bpe","version":1,"pretokenizer":"gpt2","vocab_size":300,"merges":[[97,98]],"special_tokens":[]})";
  EXPECT_NE(load_text(wrong_size).find("vocab_size 300"), std::string::npos);
  const std::string v2 = R"({"format":"forge-bpe","version":2})";
  EXPECT_NE(load_text(v2).find("unsupported version 2"), std::string::npos);
  const std::string missing = error_of([&] { BpeTokenizer::load(dir.file("missing.json")); });
  EXPECT_NE(missing.find("missing.json"), std::string::npos);
  EXPECT_NE(load_text(R"({"format":"forge-bpe","version":1,"pretokenizer":"gpt2"})").find("bad.json"),
            std::string::npos);
}

// encode is const and thread-safe: threads sharing one tokenizer (and its cache) agree
// with a tokenizer used by one thread.
TEST(BpeTokenizer, ConcurrentEncode) {
  const BpeTokenizer& shared = fortune_tokenizer();
  const auto files = fortune_files();
  ASSERT_GE(files.size(), 4u);
  std::vector<std::string> texts;
  for (size_t i = 0; i < 4; ++i) texts.push_back(forge::testing::read_bytes(files[i]));
  std::vector<std::vector<int32_t>> got(texts.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < texts.size(); ++i) threads.emplace_back([&, i] { got[i] = shared.encode(texts[i]); });
  for (auto& t : threads) t.join();
  const BpeTokenizer fresh(shared.merges(), shared.special_tokens());
  for (size_t i = 0; i < texts.size(); ++i) EXPECT_EQ(got[i], fresh.encode(texts[i])) << files[i];
}

// Note [per-thread word cache]: one thread encoding with two tokenizers in turn (each empties
// the thread's cache of the other's words), and a tokenizer made after another was destroyed
// (possibly at its address), give each tokenizer's own ids.
TEST(BpeTokenizer, AThreadsWordCacheServesOneTokenizerAtATime) {
  const std::string text = "the cat sat on the mat; the cat sat on the hat. " + std::string(40, 'a');
  const BpeTokenizer small = BpeTokenizer::train(text, 262);
  const BpeTokenizer large = BpeTokenizer::train(text, 300);
  const auto want_small = BpeTokenizer(small.merges(), {}).encode(text);
  const auto want_large = BpeTokenizer(large.merges(), {}).encode(text);
  ASSERT_NE(want_small, want_large);
  for (int round = 0; round < 3; ++round) {
    EXPECT_EQ(small.encode(text), want_small) << round;
    EXPECT_EQ(large.encode(text), want_large) << round;
  }
  for (int round = 0; round < 3; ++round) {
    auto t = std::make_unique<BpeTokenizer>(round % 2 ? large.merges() : small.merges(), std::vector<std::string>{});
    EXPECT_EQ(t->encode(text), round % 2 ? want_large : want_small) << round;
  }
}

// Not an assertion: prints training and encoding speed (Release build, one core).
TEST(BpeTokenizer, TimingSanity) {
  const std::string fortunes = fortune_text();
  std::string text;
  while (text.size() < 5'000'000) text += fortunes;
  text.resize(5'000'000);
  using Clock = std::chrono::steady_clock;
  auto t0 = Clock::now();
  const BpeTokenizer tok = BpeTokenizer::train(text, 4096, {kEot});
  const double train_s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::string big;
  while (big.size() < 10'000'000) big += fortunes;
  t0 = Clock::now();
  const auto ids = tok.encode(big);
  const double enc_s = std::chrono::duration<double>(Clock::now() - t0).count();
  const BpeTokenizer cold(tok.merges(), tok.special_tokens());  // empty cache
  t0 = Clock::now();
  const auto ids_cold = cold.encode(fortunes);
  const double cold_s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("[ timing   ] BPE train: vocab 4096 on %.1f MB in %.2f s; encode: %.1f MB in %.2f s = %.1f MB/s "
              "(%.2f bytes/token); cold-cache encode %.1f MB/s\n",
              text.size() / 1e6, train_s, big.size() / 1e6, enc_s, big.size() / 1e6 / enc_s,
              static_cast<double>(big.size()) / static_cast<double>(ids.size()), fortunes.size() / 1e6 / cold_s);
  EXPECT_EQ(tok.vocab_size(), 4096);
  EXPECT_EQ(cold.decode(ids_cold), fortunes);
}

}  // namespace
}  // namespace forge::data
