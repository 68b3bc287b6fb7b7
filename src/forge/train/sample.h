#pragma once
// `forge sample`: text from a checkpoint of a language-model run.
#include <cstdint>
#include <string>
#include <vector>

#include "forge/train/language_model.h"

namespace forge::train {

struct SampleOptions {
  std::string checkpoint;      // a checkpoint directory, or a run directory (its latest checkpoint)
  std::string prompt;
  int64_t tokens = 200;        // new tokens to generate
  double temperature = 0.8;    // 0 = greedy (argmax)
  int64_t top_k = 0;           // sample among the k most likely tokens (0 = all)
  uint64_t seed = 0;
};

struct SampleResult {
  std::string text;            // the prompt followed by the generated text
  std::string completion;      // the generated text alone
  std::string checkpoint;      // the checkpoint directory used
  int64_t step = 0;            // its step
};

// Loads the checkpoint, its run's config (from the checkpoint) and tokenizer
// (<run dir>/tokenizer.json), and samples autoregressively under NoGradGuard with the
// model in eval mode. Deterministic for a given seed.
SampleResult sample(const SampleOptions& opt);

// The autoregressive loop: appends `n` tokens to `ids` (each from the last block_size
// tokens' logits), drawing from a Philox Generator seeded with `seed`.
std::vector<int32_t> generate(const LanguageModel& model, std::vector<int32_t> ids, int64_t n, double temperature,
                              int64_t top_k, uint64_t seed);

}  // namespace forge::train
