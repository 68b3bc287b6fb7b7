#pragma once
// ModelConfig: the [model] section of a run config (run/config.h), the one description of a
// model a user writes. Every family reads the keys it needs (nn/model_registry.h lists them per
// family, checks them and builds the module); the others are ignored for it.
//
//   nn::ModelConfig m;              // type "gpt", the defaults below
//   m.type = "llama";
//   m.dim = 256, m.n_head = 8, m.n_kv_head = 2;
//   nn::validate_model(m);          // nn/model_registry.h: errors name model.<key> and the fix
//
// The defaults are the config file's defaults (docs/train.md, the [model] table); 0 for
// vocab_size, n_kv_head and ffn_hidden means "derived": the tokenizer's vocabulary (resolved by
// the trainer and `forge plan`), n_head, and LLaMA's 8·dim/3 rounded up to a multiple of 32
// (resolved by the family's shape()).
#include <cstdint>
#include <string>

namespace forge::nn {

struct ModelConfig {
  std::string type = "gpt";        // a registered family: "gpt" | "llama" | "lenet"
  int64_t vocab_size = 0;          // 0: the tokenizer's vocabulary size
  int64_t block_size = 256;        // maximum context (tokens)
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 128;            // GPT width
  double dropout = 0.0;            // GPT
  bool bias = true;                // GPT: biases in Linear and LayerNorm
  bool checkpoint_activations = false;
  int64_t n_kv_head = 0;           // LLaMA: key/value heads (0: n_head)
  int64_t dim = 128;               // LLaMA width
  int64_t ffn_hidden = 0;          // LLaMA SwiGLU width (0: 8·dim/3 rounded up to a multiple of 32)
  double rope_theta = 10000.0;     // LLaMA
  std::string rope_scaling;        // LLaMA: "" (none) | "llama3" (Note [llama3 rope scaling], backends/rope_functors.h)
  double rope_factor = 8.0;        // llama3: how much longer the context gets
  double rope_low_freq_factor = 1.0;   // llama3: wavelengths above original_context / this are divided by factor
  double rope_high_freq_factor = 4.0;  // llama3: wavelengths below original_context / this are unchanged
  int64_t rope_original_context = 8192;  // llama3: the context the model was pretrained at
  double norm_eps = 1e-5;          // LLaMA RMSNorm epsilon
  double init_std = 0.02;          // LLaMA weight init
  std::string init_from;           // gpt, llama: a Hugging Face model directory to start from (io/hf_checkpoint.h)
};

}  // namespace forge::nn
