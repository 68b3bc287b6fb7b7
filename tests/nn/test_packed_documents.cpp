// Packed documents through GPT and LLaMA (Note [packed documents] in nn/documents.h): a row that
// packs several documents gives each document's tokens the logits they get alone, and the loss
// of the packed batch is the mean of the documents' own token losses (the targets that cross
// into the next document dropped by data::mark_documents). Checked in f64, with and without
// activation checkpointing (whose recomputation must see the documents too), gradients included.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "forge/data/packing.h"
#include "forge/forge.h"
#include "forge/nn/gpt.h"
#include "forge/nn/llama.h"
#include "testing/attention_blocks.h"
#include "testing/tiny_models.h"

namespace forge {
namespace {

using attention_blocks_testing::max_rel;

// Two rows of 16 tokens: the first packs documents of 4, 3 and 6 tokens, each followed by the
// end-of-text token (4 + 1 + 3 + 1 + 6 + 1 = 16); the second is one document without an end. Tokens are random in [0, V - 1), and V - 1 is the end-of-text token.
data::Batch packed_batch(int64_t V, uint64_t seed) {
  Generator gen(seed);
  const Tensor r = randint(0, V - 1, {2, 17}, {.dtype = DType::i64}, &gen);
  std::vector<int64_t> w = r.to_vector<int64_t>();
  for (int64_t at : {4, 8, 15}) w[static_cast<size_t>(at)] = V - 1;
  const Tensor window = from_vector(w, {2, 17});
  data::Batch b;
  b.inputs = ops::narrow(window, 1, 0, 16).contiguous();
  b.targets = ops::narrow(window, 1, 1, 16).contiguous();
  data::mark_documents(b, V - 1);
  return b;
}

// Each document of each row: (row, start, length).
std::vector<std::array<int64_t, 3>> documents_of(const data::Batch& b) {
  std::vector<std::array<int64_t, 3>> docs;
  const auto ids = b.documents.to(DType::i64).to_vector<int64_t>();
  const int64_t T = b.inputs.size(1);
  for (int64_t row = 0; row < b.inputs.size(0); ++row) {
    int64_t start = 0;
    for (int64_t t = 1; t <= T; ++t)
      if (t == T || ids[static_cast<size_t>(row * T + t)] != ids[static_cast<size_t>(row * T + t - 1)]) {
        docs.push_back({row, start, t - start});
        start = t;
      }
  }
  return docs;
}

template <class Model, class Config>
void check_packed(const Config& config, const std::string& what) {
  auto model = std::make_shared<Model>(config, 7);
  model->to(DType::f64);
  const data::Batch b = packed_batch(config.vocab_size, 3);
  const nn::Documents docs{b.documents, b.positions};
  ASSERT_EQ(documents_of(b).size(), 4u) << what;

  // Logits: every document's as if alone.
  const Tensor packed = model->forward(b.inputs, docs);
  double sum = 0;
  int64_t counted = 0;
  for (const auto& [row, start, len] : documents_of(b)) {
    auto cut = [&](const Tensor& t) { return ops::narrow(ops::narrow(t, 0, row, 1), 1, start, len).contiguous(); };
    const Tensor alone = model->forward(cut(b.inputs));
    EXPECT_LE(max_rel(cut(packed), alone), 1e-12) << what << ": row " << row << ", document at " << start;
    sum += ops::cross_entropy(alone, cut(b.targets), -100, ops::Reduction::sum).item();
    counted += std::llround(ops::sum(ops::ne(cut(b.targets), -100.0)).item());
  }
  // The loss: the documents' token losses over the targets that stay inside a document.
  EXPECT_EQ(counted, 32 - 3);  // the three end-of-text tokens of row 0 (row 1 has none)
  EXPECT_NEAR(model->loss(b.inputs, b.targets, docs).item(), sum / static_cast<double>(counted), 1e-12) << what;

  // Gradients with activation checkpointing equal those without (the recomputed blocks see the
  // documents), and differ from an unpacked batch's.
  Config ck = config;
  ck.checkpoint_activations = true;
  auto checkpointed = std::make_shared<Model>(ck, 7);
  checkpointed->to(DType::f64);
  model->train();
  checkpointed->train();
  model->loss(b.inputs, b.targets, docs).backward();
  checkpointed->loss(b.inputs, b.targets, docs).backward();
  const auto want = model->named_parameters(), got = checkpointed->named_parameters();
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_LE(max_rel(got[i].second.grad(), want[i].second.grad()), 1e-12) << what << ": " << want[i].first;
  auto unpacked = std::make_shared<Model>(config, 7);
  unpacked->to(DType::f64);
  unpacked->loss(b.inputs, b.targets).backward();
  EXPECT_GT(max_rel(unpacked->named_parameters()[0].second.grad(), want[0].second.grad()), 1e-6) << what;
}

TEST(PackedDocuments, GptDocumentsTrainAsIfAlone) {
  check_packed<nn::GPT>(testing::tiny_gpt_config(), "GPT");
}

TEST(PackedDocuments, LlamaDocumentsTrainAsIfAlone) {
  check_packed<nn::Llama>(testing::tiny_llama_config(2), "LLaMA, GQA 8 over 2");
}

TEST(PackedDocuments, BadDocumentsAreRefused) {
  nn::GPT model(testing::tiny_gpt_config(), 1);
  const Tensor idx = zeros({2, 5}, {.dtype = DType::i64});
  const nn::Documents wrong{zeros({2, 4}, {.dtype = DType::i32}), zeros({2, 4}, {.dtype = DType::i64})};
  std::string err;
  try {
    model.forward(idx, wrong);
  } catch (const std::exception& e) {
    err = e.what();
  }
  EXPECT_NE(err.find("ids (B, T) i32 and positions (B, T) i64"), std::string::npos) << err;
}

}  // namespace
}  // namespace forge
