// GPT-2 pre-tokenisation: known splits (derived by hand from the GPT-2 pattern
// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+), character
// classes, invalid UTF-8, and the tiling property on random bytes.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "forge/forge.h"

namespace forge::data {
namespace {

std::vector<std::string> split(std::string_view text) {
  std::vector<std::string> out;
  for (auto piece : pretokenize(text)) out.emplace_back(piece);
  return out;
}

using V = std::vector<std::string>;

TEST(BpePretokenize, Gpt2Examples) {
  EXPECT_EQ(split("Hello world's 123  \n x"), (V{"Hello", " world", "'s", " 123", "  \n", " x"}));
  EXPECT_EQ(split("I'm don't we'll they're I've he'd"),
            (V{"I", "'m", " don", "'t", " we", "'ll", " they", "'re", " I", "'ve", " he", "'d"}));
  EXPECT_EQ(split("abc123def"), (V{"abc", "123", "def"}));
  EXPECT_EQ(split("$1,000.50"), (V{"$", "1", ",", "000", ".", "50"}));
  EXPECT_EQ(split("hello!!! ...world"), (V{"hello", "!!!", " ...", "world"}));
  EXPECT_EQ(split("a-b_c"), (V{"a", "-", "b", "_", "c"}));
  EXPECT_EQ(split(""), V{});
}

TEST(BpePretokenize, Whitespace) {
  EXPECT_EQ(split("   leading"), (V{"  ", " leading"}));  // the run gives its last space to the word
  EXPECT_EQ(split("trailing   "), (V{"trailing", "   "}));  // a run at the end is taken whole
  EXPECT_EQ(split("x  y"), (V{"x", " ", " y"}));
  EXPECT_EQ(split("a\n\nb"), (V{"a", "\n", "\n", "b"}));     // "\n" does not attach to the word
  EXPECT_EQ(split("a\tb"), (V{"a", "\t", "b"}));
  EXPECT_EQ(split("a \n"), (V{"a", " \n"}));
  EXPECT_EQ(split("  "), (V{"  "}));
  EXPECT_EQ(split(" "), (V{" "}));
  EXPECT_EQ(split("x\n\n\n  y"), (V{"x", "\n\n\n ", " y"}));
  EXPECT_EQ(split("x \ty"), (V{"x", " ", "\t", "y"}));
}

TEST(BpePretokenize, Contractions) {
  EXPECT_EQ(split("'S"), (V{"'", "S"}));          // case-sensitive
  EXPECT_EQ(split("''s"), (V{"''", "s"}));        // the other-run is greedy
  EXPECT_EQ(split(" 's"), (V{" '", "s"}));        // a space is not a contraction
  EXPECT_EQ(split("'sup"), (V{"'s", "up"}));
  EXPECT_EQ(split("'llama"), (V{"'ll", "ama"}));
  EXPECT_EQ(split("'x"), (V{"'", "x"}));
  EXPECT_EQ(split("'"), (V{"'"}));
  EXPECT_EQ(split("'r"), (V{"'", "r"}));
  EXPECT_EQ(split("it's'"), (V{"it", "'s", "'"}));
}

TEST(BpePretokenize, Unicode) {
  EXPECT_EQ(split("h\xC3\xA9llo w\xC3\xB6rld"), (V{"h\xC3\xA9llo", " w\xC3\xB6rld"}));  // héllo wörld
  // 日本語 テキスト
  EXPECT_EQ(split("\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xE3\x83\x86\xE3\x82\xAD\xE3\x82\xB9\xE3\x83\x88"),
            (V{"\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E", " \xE3\x83\x86\xE3\x82\xAD\xE3\x82\xB9\xE3\x83\x88"}));
  // Привет, мир!
  EXPECT_EQ(split("\xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82, \xD0\xBC\xD0\xB8\xD1\x80!"),
            (V{"\xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82", ",", " \xD0\xBC\xD0\xB8\xD1\x80", "!"}));
  EXPECT_EQ(split("x\xC2\xB2"), (V{"x", "\xC2\xB2"}));                    // x² : ² is a number
  EXPECT_EQ(split(" 2024\xE5\xB9\xB4"), (V{" 2024", "\xE5\xB9\xB4"}));    // " 2024年"
  EXPECT_EQ(split("\xC2\xA0x"), (V{"\xC2\xA0", "x"}));                   // NBSP is whitespace
  EXPECT_EQ(split("a \xE3\x80\x80" "b"), (V{"a", " ", "\xE3\x80\x80", "b"}));  // U+3000 ideographic space
  EXPECT_EQ(split("\xE2\x80\x9Chi\xE2\x80\x9D"), (V{"\xE2\x80\x9C", "hi", "\xE2\x80\x9D"}));  // “hi”
  EXPECT_EQ(split("\xF0\x9F\x98\x80\xF0\x9F\x98\x80 ok"), (V{"\xF0\x9F\x98\x80\xF0\x9F\x98\x80", " ok"}));  // emoji
}

TEST(BpePretokenize, InvalidUtf8IsOther) {
  EXPECT_EQ(split("ab\xFF\xFE" "cd"), (V{"ab", "\xFF\xFE", "cd"}));
  EXPECT_EQ(split(" \xFF"), (V{" \xFF"}));
  EXPECT_EQ(split("ab\xC3"), (V{"ab", "\xC3"}));                 // truncated 2-byte sequence
  EXPECT_EQ(split("\xC0\xAF" "a"), (V{"\xC0\xAF", "a"}));        // overlong '/'
  EXPECT_EQ(split("\xED\xA0\x80" "a"), (V{"\xED\xA0\x80", "a"}));  // a surrogate
  EXPECT_EQ(split("x\xE9y"), (V{"x", "\xE9", "y"}));               // Latin-1 é, not UTF-8
  EXPECT_EQ(split(std::string("a\0b", 3)), (V{"a", std::string(1, '\0'), "b"}));
  EXPECT_EQ(classify_at("\xC3", 0).cls, CharClass::other);
  EXPECT_EQ(classify_at("\xC3", 0).len, 1);
  EXPECT_EQ(classify_at("\xC3\xA9", 0).len, 2);
  EXPECT_TRUE(is_valid_utf8("h\xC3\xA9llo \xF0\x9F\x98\x80"));
  EXPECT_FALSE(is_valid_utf8("\xF4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_FALSE(is_valid_utf8("\xE0\x80\xAF"));      // overlong
}

TEST(BpePretokenize, CodePointClasses) {
  EXPECT_EQ(classify_code_point('a'), CharClass::letter);
  EXPECT_EQ(classify_code_point('7'), CharClass::number);
  EXPECT_EQ(classify_code_point('\v'), CharClass::space);
  EXPECT_EQ(classify_code_point(0x1F), CharClass::other);
  EXPECT_EQ(classify_code_point(0xE9), CharClass::letter);    // é
  EXPECT_EQ(classify_code_point(0xD7), CharClass::other);     // ×
  EXPECT_EQ(classify_code_point(0x3B1), CharClass::letter);   // α
  EXPECT_EQ(classify_code_point(0x5D0), CharClass::letter);   // א
  EXPECT_EQ(classify_code_point(0x661), CharClass::number);   // Arabic-Indic one
  EXPECT_EQ(classify_code_point(0x4E2D), CharClass::letter);  // 中
  EXPECT_EQ(classify_code_point(0xAC00), CharClass::letter);  // 가
  EXPECT_EQ(classify_code_point(0xFF11), CharClass::number);  // fullwidth 1
  EXPECT_EQ(classify_code_point(0x2028), CharClass::space);
  EXPECT_EQ(classify_code_point(0x20AC), CharClass::other);   // €
  EXPECT_EQ(classify_code_point(0x1F600), CharClass::other);  // 😀
}

// Pieces tile the input, are never empty, and a piece never starts inside a UTF-8 sequence
// that is valid.
TEST(BpePretokenize, TilesRandomBytes) {
  std::mt19937 rng(7);
  const std::string alphabet = "ab Z9'\n\t.,\xC3\xA9\xE6\x97\xA5\xFF\x80 sretvmld";
  for (int iter = 0; iter < 2000; ++iter) {
    std::string s;
    const int n = static_cast<int>(rng() % 60);
    for (int i = 0; i < n; ++i)
      s += (iter % 2) ? static_cast<char>(rng() % 256) : alphabet[rng() % alphabet.size()];
    std::string joined;
    for (auto piece : pretokenize(s)) {
      ASSERT_FALSE(piece.empty());
      joined += piece;
    }
    ASSERT_EQ(joined, s);
  }
}

}  // namespace
}  // namespace forge::data
