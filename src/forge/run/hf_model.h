#pragma once
// Hugging Face models in: `model.init_from = "PATH"`, a directory as save_pretrained writes it
// (config.json; model.safetensors or model.safetensors.index.json and its shards;
// tokenizer.json), starts a run from its weights. What `forge export` writes (interop/export.h)
// reads back bit for bit.
//
//   RunConfig cfg = load_config(...);      // parse_config calls apply_init_from(cfg) before validate()
//   ... build the model from cfg.model ...
//   io::NamedTensors w = load_init_from(cfg, model.whole_shapes());   // forge names and layouts
//   model.load_whole_state(w);             // the trainer, on a fresh run (never on --resume)
//
// Note [init_from precedence]: config.json decides the architecture and shape. GPT2LMHeadModel
// (model_type "gpt2") sets model.type = "gpt", vocab_size, block_size (n_positions), n_layer,
// n_head, n_embd; LlamaForCausalLM ("llama") sets model.type = "llama", vocab_size, block_size
// (max_position_embeddings), n_layer, n_head, n_kv_head, dim, ffn_hidden, rope_theta, norm_eps
// and, from "rope_scaling" {"rope_type": "llama3", ...}, rope_scaling, rope_factor,
// rope_low_freq_factor, rope_high_freq_factor, rope_original_context. A [model] key still at its
// default value takes config.json's; a key set to any other value must equal config.json's, or
// the config is rejected naming both values (model.type too: "gpt" is its default). One
// exception: a LLaMA's model.block_size may be set below max_position_embeddings (no weight
// depends on it; the run's context is then that). Keys config.json does not know (dropout,
// checkpoint_activations, init_std) stay the run's. data.tokenizer = "" becomes
// PATH/forge_tokenizer.json when that file exists (`forge export` writes it beside tokenizer.json
// for forge's own tokenizer kinds: exactly the source run's tokenizer), else PATH/tokenizer.json.
//
// What forge cannot represent is an error before any work: another architecture (the message
// lists the supported ones), a GPT-2 with untied head, n_inner other than 4 x n_embd, another
// activation than gelu_new or layer_norm_epsilon other than 1e-5; a LLaMA with attention or MLP
// biases, a head_dim other than hidden_size / num_attention_heads, another hidden_act than silu,
// or another rope_scaling type than llama3.
//
// Note [tied LLaMA heads]: forge's LLaMA always has its own lm_head. A LLaMA saved with
// tie_word_embeddings = true (LLaMA-3.2 1B and 3B) and no lm_head.weight starts with lm_head a
// copy of model.embed_tokens; the two then train apart, and `forge export` writes both with
// tie_word_embeddings = false.
//
// Weights: every tensor of the files, renamed to forge's names and layouts (io/hf_names.h),
// is checked against the model before any is loaded: the error lists every missing tensor,
// every unexpected one and every shape mismatch (tensor, the file's shape, the model's).
// HF's buffers are ignored: rotary "inv_freq", GPT-2's attention masks ".attn.bias" and
// ".attn.masked_bias". bf16, f16 and f32 (and f64) tensors load into the run's dtype.
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "forge/io/checkpoint.h"
#include "forge/nn/model_config.h"
#include "forge/run/config.h"

namespace forge::train {

// A config.json as forge reads it.
struct HfModel {
  std::string architecture;   // "GPT2LMHeadModel" | "LlamaForCausalLM"
  nn::ModelConfig model;      // type and the keys below set from config.json; the rest at defaults
  // (model key, config.json field) of every key config.json sets: ("n_layer", "num_hidden_layers").
  std::vector<std::pair<std::string, std::string>> keys;
  bool tied_head = false;     // tie_word_embeddings
  std::optional<int64_t> bos_token_id, eos_token_id;
};

// The supported architectures, for messages: "GPT2LMHeadModel (model_type \"gpt2\") and ...".
std::string supported_hf_architectures();
// Parses a config.json's object; `origin` names it in errors.
HfModel parse_hf_config(const nlohmann::json& j, const std::string& origin);
// Reads <dir>/config.json (errors name the directory and say what a model directory holds).
HfModel read_hf_config(const std::filesystem::path& dir);

// Note [init_from precedence]: the [model] keys (and data.tokenizer) from model.init_from's
// config.json; nothing when model.init_from is "". Throws naming the key, both values and the fix.
void apply_init_from(RunConfig& cfg);

// The weights of model.init_from in forge's names and layouts, checked against `expected` (the
// model's whole state: names and shapes) as above.
//
// Note [grown vocabulary]: a run may need more tokens than the model was saved with (a chat
// template's special tokens the tokenizer lacked: run/run_chat_data.h). Then model.vocab_size is
// the grown vocabulary, and the file's token embedding and head (GPT's tied wte; LLaMA's
// embed_tokens and lm_head) take as many more rows as `expected` asks, each the mean of the file's
// rows (the usual start for new tokens: a likely embedding, no bias toward any old token); every
// other row and tensor is the file's.
io::NamedTensors load_init_from(const RunConfig& cfg, const io::NamedShapes& expected);

}  // namespace forge::train
