#pragma once
// The model-family registry: one entry per model.type ("gpt", "llama", "lenet"), the one place
// where a family's [model] keys, its shape rules and its module meet. The config (train/config),
// the trainer (train/language_model), the layout checks (train/layout), the Hugging Face export
// (train/export) and the cost model (plan/model_spec) all read a model through it, so a rule
// such as LLaMA's FFN width or "n_kv_head = 0 means n_head" is written once.
//
//   const nn::ModelFamily& f = nn::model_family(cfg.type);   // throws listing the known types
//   f.validate(cfg);                                         // every shape rule, errors name model.<key>
//   nn::TransformerShape s = f.shape(cfg);                   // kv-heads and FFN width resolved
//   std::shared_ptr<nn::CausalLM> lm = f.build(cfg, seed, spec);
//
// Each entry (model_registry.cpp) holds:
//   type, doc     the model.type value and one line of documentation;
//   keys          the [model] keys it reads besides `type` (the others are ignored for it);
//   validate      the checks of those keys and their relations; each error names model.<key> and
//                 the fix. The modules' own configs (GPTConfig, LlamaConfig) validate through it;
//   shape         (transformer families) the architecture as TransformerShape: what `forge plan`
//                 prices and the tensor-parallel checks split (vocab_size stays 0 while unresolved);
//   build         (transformer families) the CausalLM, initialised from `seed`, its layers from
//                 the LayerSpec; model.vocab_size must be resolved (> 0);
//   ffn_rule      the key or formula the FFN width comes from, for messages ("4 x model.n_embd").
// LeNet is registered (model.type validation lists it; it reads no [model] key) but has neither
// shape nor build: it is not a CausalLM, and its classes come from the data set
// (train/image_task.cpp builds it).
//
// Adding a model family (docs/architecture.md, "Adding a model family"): 5 files when it reuses
// today's [model] keys and a block layout plan prices (TransformerShape::arch): its module
// (nn/<family>.{h,cpp}, a CausalLM taking a LayerSpec), its entry in model_registry.cpp, its rows
// in tests/nn/test_model_registry.cpp, and docs/train.md. A new [model] key adds its member in
// nn/model_config.h and its row in run/config.cpp's schema; a new block layout adds an Arch and
// its formulas in plan/.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "forge/nn/layer_spec.h"
#include "forge/nn/model_config.h"
#include "forge/ops/rope.h"

namespace forge::nn {

class CausalLM;
struct GPTConfig;
struct LlamaConfig;

// The block layouts forge builds, as the cost model (plan/) counts them:
//   gpt    learned positions, pre-LN blocks with a fused QKV projection, a 2-matrix GELU MLP,
//          biases optional, the head tied to the token embedding;
//   llama  rotary positions, RMSNorm, grouped-query attention, a 3-matrix SwiGLU MLP, no
//          biases, an untied head.
enum class Arch { gpt, llama };
const char* arch_name(Arch a);  // "GPT" | "LLaMA"

// The architecture of a decoder-only transformer with every derived width resolved. The
// defaults are GPT-2 small's.
struct TransformerShape {
  Arch arch = Arch::gpt;
  int64_t n_layer = 12;
  int64_t d_model = 768;       // h: the residual width (GPT n_embd, LLaMA dim)
  int64_t n_head = 12;         // a
  int64_t n_kv_head = 12;      // key/value heads (= n_head without grouped-query attention)
  int64_t ffn_hidden = 3072;   // f: the MLP width (GPT 4h, LLaMA the SwiGLU width)
  int64_t vocab_size = 50257;  // V (0: not resolved yet, the tokenizer's)
  int64_t block_size = 1024;   // the longest context (GPT's position table)
  bool bias = true;            // biases in the Linear and norm layers
  int64_t head_dim() const { return d_model / n_head; }
  bool tied_head() const { return arch == Arch::gpt; }          // the head reuses the token embedding
  bool gated_mlp() const { return arch == Arch::llama; }        // gate, up, down (SwiGLU) vs up, down
  bool learned_positions() const { return arch == Arch::gpt; }  // a (block_size, h) position table
};

// The FFN width of a layout at width d_model when none is given: GPT's 4 x n_embd
// (GPTConfig::ffn_hidden), LLaMA's 8 x dim / 3 rounded up to 32 (LlamaConfig::default_ffn_hidden).
int64_t default_ffn_hidden(Arch arch, int64_t d_model);

struct ModelFamily {
  std::string type;               // model.type
  std::string doc;                // one line
  std::vector<std::string> keys;  // the [model] keys it reads besides `type` ("n_embd", ...)
  std::string ffn_rule;           // the key or formula the FFN width comes from, for messages ("" without one)
  void (*validate)(const ModelConfig&) = nullptr;
  TransformerShape (*shape)(const ModelConfig&) = nullptr;  // null: not a transformer
  std::shared_ptr<CausalLM> (*build)(const ModelConfig&, uint64_t seed, const LayerSpec& spec) = nullptr;

  bool is_transformer() const { return shape != nullptr; }
  bool reads(const std::string& key) const;  // `key` without "model."; "type" always
};

// Every family, in registration order.
const std::vector<ModelFamily>& model_families();
// The family of model.type `type`, or nullptr.
const ModelFamily* find_model_family(const std::string& type);
// The same, or a forge::Error naming model.type and listing the known types.
const ModelFamily& model_family(const std::string& type);
// The known types as a message lists them: "\"gpt\", \"llama\" or \"lenet\"" (only the
// transformer families with `transformers_only`; `last` joins the last two).
std::string model_type_list(bool transformers_only = false, const char* last = " or ");

// LLaMA's rotary frequency scaling from model.rope_scaling and the rope_* keys (none for "").
ops::RopeScaling rope_scaling(const ModelConfig& m);

// model_family(m.type).validate(m).
void validate_model(const ModelConfig& m);
// The shape of a transformer family's config, after validate_model; throws naming model.type
// for a family without one.
TransformerShape transformer_shape(const ModelConfig& m);
// The module of a transformer family (validated; model.vocab_size resolved).
std::shared_ptr<CausalLM> build_causal_lm(const ModelConfig& m, uint64_t seed, const LayerSpec& spec = {});

// A module config as the [model] keys it corresponds to (type set, the rest at the defaults),
// so the modules' own validate() runs the registry's rules.
ModelConfig model_config(const GPTConfig& c);
ModelConfig model_config(const LlamaConfig& c);

}  // namespace forge::nn
