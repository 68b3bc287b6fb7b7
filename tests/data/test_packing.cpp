// data::mark_documents and DocumentMarking (data/packing.h, Note [packed documents]): the
// document ids, positions and dropped targets of packed rows, and a marked source's state.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "data/data_testing.h"
#include "forge/data/packing.h"
#include "forge/data/shards.h"
#include "forge/forge.h"
#include "testing/tensor_testing.h"

namespace forge {
namespace {

using testing::error_of;
using testing::TempDir;

std::vector<int64_t> i64(const Tensor& t) { return t.to(DType::i64).contiguous().to_vector<int64_t>(); }

TEST(Packing, MarksDocumentsPositionsAndTheTargetsThatCrossThem) {
  constexpr int64_t eos = 9;
  data::Batch b;
  b.inputs = from_vector(std::vector<int64_t>{1, 2, 9, 3, 9, 4, 5, /**/ 9, 6, 7, 8, 1, 2, 9}, {2, 7});
  b.targets = from_vector(std::vector<int64_t>{2, 9, 3, 9, 4, 5, 6, /**/ 6, 7, 8, 1, 2, 9, 3}, {2, 7});
  data::mark_documents(b, eos);
  // An end-of-text token closes its document; the next token starts the next one at position 0.
  EXPECT_EQ(i64(b.documents), (std::vector<int64_t>{0, 0, 0, 1, 1, 2, 2, /**/ 0, 1, 1, 1, 1, 1, 1}));
  EXPECT_EQ(i64(b.positions), (std::vector<int64_t>{0, 1, 2, 0, 1, 0, 1, /**/ 0, 0, 1, 2, 3, 4, 5}));
  // Its target (the next document's first token) is not trained; the rest are untouched.
  EXPECT_EQ(i64(b.targets), (std::vector<int64_t>{2, 9, -100, 9, -100, 5, 6, /**/ -100, 7, 8, 1, 2, 9, -100}));
  EXPECT_EQ(b.documents.dtype(), DType::i32);
  EXPECT_EQ(b.positions.dtype(), DType::i64);
  EXPECT_EQ(i64(b.inputs), (std::vector<int64_t>{1, 2, 9, 3, 9, 4, 5, /**/ 9, 6, 7, 8, 1, 2, 9}));
}

TEST(Packing, ARowWithoutAnEndIsOneDocument) {
  data::Batch b;
  b.inputs = from_vector(std::vector<int64_t>{4, 5, 6}, {1, 3});
  b.targets = from_vector(std::vector<int64_t>{5, 6, 7}, {1, 3});
  data::mark_documents(b, 0);
  EXPECT_EQ(i64(b.documents), (std::vector<int64_t>{0, 0, 0}));
  EXPECT_EQ(i64(b.positions), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(i64(b.targets), (std::vector<int64_t>{5, 6, 7}));
}

TEST(Packing, MarkedSourceKeepsTheWrappedSourcesState) {
  // A shard of 40 tokens with an end-of-text token (id 3) every fifth.
  const TempDir dir;
  std::vector<int32_t> tokens(40);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i % 5 == 4 ? 3 : 10 + i);
  data::write_shard(dir.file("packed.bin"), tokens, 65536);
  auto shard = std::make_shared<const data::TokenShard>(dir.file("packed.bin"));
  const std::vector<data::TokenRange> ranges{{shard, 0, 40}};
  data::DocumentMarking marked(std::make_unique<data::RandomWindowSampler>(ranges, 2, 8, 5), 3);
  data::RandomWindowSampler plain(ranges, 2, 8, 5);
  const data::SamplerState start = marked.state();
  for (int i = 0; i < 3; ++i) {
    const data::Batch m = *marked.next(), p = *plain.next();
    EXPECT_EQ(i64(m.inputs), i64(p.inputs));  // the same windows, marked
    ASSERT_TRUE(m.documents.defined() && m.positions.defined());
    const auto in = i64(m.inputs), tg = i64(m.targets), pt = i64(p.targets);
    for (size_t j = 0; j < in.size(); ++j) EXPECT_EQ(tg[j], in[j] == 3 ? -100 : pt[j]);
  }
  const data::SamplerState after = marked.state();
  EXPECT_EQ(after, plain.state());
  marked.set_state(start);
  data::RandomWindowSampler again(ranges, 2, 8, 5);
  EXPECT_EQ(i64(marked.next()->inputs), i64(again.next()->inputs));
}

TEST(Packing, RefusesWhatIsNotATokenBatch) {
  data::Batch b;
  b.inputs = zeros({2, 3});
  b.targets = zeros({2, 3}, {.dtype = DType::i64});
  EXPECT_NE(error_of([&] { data::mark_documents(b, 1); }).find("token inputs and targets (B, T) i64"),
            std::string::npos);
  b.inputs = zeros({2, 3}, {.dtype = DType::i64});
  EXPECT_NE(error_of([&] { data::mark_documents(b, -1); }).find("must be >= 0"), std::string::npos);
}

}  // namespace
}  // namespace forge
