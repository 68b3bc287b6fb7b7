// forge's BPE as a Hugging Face tokenizer.json (data/bpe_hf.h): the file forge's own Hugging Face
// reader loads encodes and decodes exactly as the BPE it came from, special tokens included.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "forge/data/bpe.h"
#include "forge/data/bpe_hf.h"
#include "forge/data/tokenizer.h"

namespace forge::data {
namespace {

TEST(BpeHf, TokenizerJsonEncodesLikeTheBpe) {
  if (!have_regex_support()) GTEST_SKIP() << "this build reads no Hugging Face tokenizer.json (no PCRE2)";
  std::string corpus;
  for (int i = 0; i < 200; ++i)
    corpus += "The cat's 12 red balls; a dog likes " + std::to_string(i * 7) + " bones!\n  Tabs\tand  spaces.  ";
  const BpeTokenizer bpe = BpeTokenizer::train(corpus, 400, {"<|endoftext|>"});
  const std::string text = bpe_to_hf_tokenizer_json(bpe);
  const auto j = nlohmann::json::parse(text);
  EXPECT_EQ(j["model"]["type"], "BPE");
  EXPECT_EQ(j["pre_tokenizer"]["type"], "ByteLevel");
  EXPECT_EQ(j["model"]["vocab"]["\xC4\xA0"], static_cast<int>(' '));  // byte 0x20 spelled U+0120 'Ġ'
  const auto hf = tokenizer_from_bytes(text, "tokenizer.json");
  EXPECT_EQ(hf->kind(), "hf");
  EXPECT_EQ(hf->vocab_size(), bpe.vocab_size());
  EXPECT_EQ(hf->token_id("<|endoftext|>"), bpe.token_id("<|endoftext|>"));
  EXPECT_EQ(hf->eos_token(), std::optional<std::string>("<|endoftext|>"));
  for (const std::string& s : {std::string("The cat's 12 red balls<|endoftext|>A dog likes 4 bones!"),
                              std::string("  leading spaces, trailing  \n\n"), std::string("unseen: xyzzy QUUX 99999"),
                              corpus.substr(0, 500), std::string("bytes \xff\xfe and \xc3\xa9t\xc3\xa9")}) {
    SCOPED_TRACE(s);
    const auto ids = bpe.encode(s);
    EXPECT_EQ(hf->encode(s), ids);
    EXPECT_EQ(hf->decode(ids), s);
  }
}

}  // namespace
}  // namespace forge::data
