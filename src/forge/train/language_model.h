#pragma once
// The language model of a run (model.type = "gpt" | "llama") behind one interface: what the
// trainer, its strategies, sampling and export need of a GPT or a LLaMA.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "forge/core/tensor.h"
#include "forge/nn/block_hooks.h"
#include "forge/nn/module.h"
#include "forge/train/config.h"

namespace forge::train {

struct LanguageModel {
  std::shared_ptr<nn::Module> module;
  std::function<Tensor(const Tensor&)> forward;  // (B, T) i64 token ids -> (B, T, vocab_size) logits
  int64_t vocab_size = 0;
  int64_t block_size = 0;
  // ZeRO-3: installs the hooks the model calls around each block (nn/block_hooks.h), and the
  // block a parameter name belongs to (-1 outside the blocks).
  std::function<void(std::shared_ptr<nn::BlockHooks>)> set_block_hooks;
  std::function<int(const std::string&)> block_of;
  Device device() const;  // where its parameters are
};
// Builds the model cfg.model describes, initialised from run.seed; cfg.model.vocab_size
// must be resolved (> 0).
LanguageModel build_language_model(const RunConfig& cfg);

// Parameters that take part in a matmul (Note [MFU]): all but the look-up-only embedding
// tables, GPT's positions (transformer.wpe) and LLaMA's input embedding (model.embed_tokens).
int64_t matmul_parameters(const nn::Module& m);

}  // namespace forge::train
