#pragma once
// A LoRA run's adapters in Hugging Face PEFT's layout, out and in (nn/lora.h, Note [LoRA]; docs/lora.md):
//
//   <dir>/adapter_config.json        {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r", "lora_alpha",
//                                    "lora_dropout", "target_modules", "base_model_name_or_path",
//                                    "bias": "none", "fan_in_fan_out", ...}
//   <dir>/adapter_model.safetensors  base_model.model.<forge name>.lora_A.weight (r, in) and
//                                    ...lora_B.weight (out, r) of every adapted linear
//
// forge's LLaMA names are Hugging Face's (model.layers.0.self_attn.q_proj) and its GPT's are
// GPT2LMHeadModel's module paths (transformer.h.0.attn.c_attn), so PEFT's name of a factor is
// "base_model.model." + forge's. The factors are in nn.Linear's layout for GPT-2 too: GPT-2's
// c_attn, c_proj and c_fc are transformers' Conv1D (weight (in, out)), which PEFT records as
// fan_in_fan_out = true (it then transposes B A when merging into the base weight); A and B
// themselves are (r, in) and (out, r) either way.
#include <string>
#include <utility>
#include <vector>

#include "forge/io/hf_names.h"
#include "forge/nn/lora.h"
#include "forge/run/config.h"

namespace forge::train {

constexpr const char* kPeftConfigFile = "adapter_config.json";
constexpr const char* kPeftWeightsFile = "adapter_model.safetensors";
constexpr const char* kPeftPrefix = "base_model.model.";

// adapter_config.json of a LoRA run's config (cfg.lora enabled). base_model_name_or_path is
// model.init_from (the model the run adapted), else "".
nlohmann::json peft_adapter_config(const RunConfig& cfg);
// The LoRA factors of a forge model state, under PEFT's names, in the state's order.
io::TensorItems peft_adapter_tensors(const io::TensorItems& state);
// The state with every adapted linear's weight merged (W + alpha / r B A, in W's dtype, computed
// in f32) and the factors dropped: the state of the same model without LoRA.
io::TensorItems merge_lora_state(const io::TensorItems& state, const nn::LoraOptions& o);

// A PEFT LoRA directory read back: its options (targets as PEFT's target_modules, which
// nn::lora_roles reads) and its factors under forge's names. Refuses what forge does not compute
// (another peft_type, bias other than "none", per-module ranks or alphas, rsLoRA, DoRA, ...) by name.
struct PeftAdapter {
  nn::LoraOptions options;
  std::string base_model;
  io::TensorItems tensors;
};
PeftAdapter load_peft_adapter(const std::string& dir);

}  // namespace forge::train
