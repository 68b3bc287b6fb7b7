#pragma once
// The language model of a run (model.type = "gpt" | "llama") behind one interface: what the
// trainer, its strategies, sampling and export need of a GPT or a LLaMA. A LanguageModel is a
// train::Model (run/model.h: module, forward, block hooks) that also knows its vocabulary and
// context.
#include <cstdint>
#include <string>

#include "forge/nn/layer_spec.h"
#include "forge/run/config.h"
#include "forge/run/model.h"

namespace forge::train {

// forward: (B, T) i64 token ids -> (B, T, vocab_size) logits.
struct LanguageModel : Model {
  int64_t vocab_size = 0;
  int64_t block_size = 0;
};
// Builds the model cfg.model describes, initialised from run.seed; cfg.model.vocab_size
// must be resolved (> 0). `spec`: its layers (nn/layer_spec.h; tensor parallelism's split ones).
LanguageModel build_language_model(const RunConfig& cfg, const nn::LayerSpec& spec = {});

// Note [inference kernels]: decoding and evaluation run shapes that change from call to call (the
// window one token longer each step without a KV cache, multiple-choice answers of different
// lengths). Kernels planned per shape would plan again on nearly every call: a cuDNN attention
// graph or the timing of cuBLASLt's GEMM candidates costs milliseconds, more than the call itself
// (forge sample without the cache ran at 4.9 tokens/s on an H200, building one cuDNN graph per
// token). For its lifetime this guard runs attention on forge's flash kernels (the composed ones
// where those do not apply; a process set to "composed" keeps it) and GEMMs on cuBLASLt's
// heuristic choice, then restores both. Training's fixed shapes keep the planned kernels, and so
// do validation and `forge eval --files` (windows of one length).
class InferenceKernels {
 public:
  InferenceKernels();
  ~InferenceKernels();
  InferenceKernels(const InferenceKernels&) = delete;
  InferenceKernels& operator=(const InferenceKernels&) = delete;

 private:
  std::string attention_;
  bool gemm_tuning_;
};

// The whole model's parameter elements, and those trained (requires_grad: all but a LoRA run's
// frozen base, nn/lora.h). A split model counts the whole model's.
struct ParameterCounts {
  int64_t trainable = 0, total = 0;
};
ParameterCounts parameter_counts(const Model& m);

// Parameters of the whole model that take part in a matmul (Note [MFU]): all but the
// look-up-only embedding tables, GPT's positions (transformer.wpe) and LLaMA's input embedding
// (model.embed_tokens). A split model (tensor parallelism) counts the whole model's.
int64_t matmul_parameters(const Model& m);
// The same parameters split into those that train and those that do not (a LoRA run's frozen
// base): the model FLOPs per token are then 6 per trained and 4 per frozen one (forward and input
// gradient, no weight gradient), as forge plan counts them.
struct MatmulParameters {
  int64_t trained = 0, frozen = 0;
};
MatmulParameters matmul_parameters_by_training(const Model& m);

}  // namespace forge::train
