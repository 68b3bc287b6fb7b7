#pragma once
// The language model of a run (model.type = "gpt" | "llama") behind one interface: what the
// trainer, its strategies, sampling and export need of a GPT or a LLaMA. A LanguageModel is a
// train::Model (train/model.h: module, forward, block hooks) that also knows its vocabulary and
// context.
#include <cstdint>

#include "forge/nn/layer_spec.h"
#include "forge/train/config.h"
#include "forge/train/model.h"

namespace forge::train {

// forward: (B, T) i64 token ids -> (B, T, vocab_size) logits.
struct LanguageModel : Model {
  int64_t vocab_size = 0;
  int64_t block_size = 0;
};
// Builds the model cfg.model describes, initialised from run.seed; cfg.model.vocab_size
// must be resolved (> 0). `spec`: its layers (nn/layer_spec.h; tensor parallelism's split ones).
LanguageModel build_language_model(const RunConfig& cfg, const nn::LayerSpec& spec = {});

// Parameters of the whole model that take part in a matmul (Note [MFU]): all but the
// look-up-only embedding tables, GPT's positions (transformer.wpe) and LLaMA's input embedding
// (model.embed_tokens). A split model (tensor parallelism) counts the whole model's.
int64_t matmul_parameters(const Model& m);

}  // namespace forge::train
