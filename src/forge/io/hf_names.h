#pragma once
// Hugging Face tensor names and layouts for forge's models, so weights move between forge
// and the PyTorch ecosystem as safetensors files.
//
// GPT-2: forge uses nanoGPT's names, which are GPT2LMHeadModel's ("transformer.h.0.attn.
// c_attn.weight", ...), but HF stores the four projections of each block (attn.c_attn,
// attn.c_proj, mlp.c_fc, mlp.c_proj) as Conv1D weights of shape (in, out), where forge's
// Linear holds (out, in): those are transposed both ways. HF files saved from GPT2Model
// have no "transformer." prefix; both spellings load. The tied lm_head.weight and HF's
// attention-mask buffers (".attn.bias", ".attn.masked_bias") are dropped on import and
// not written on export.
//
// LLaMA: forge's names and layouts are LlamaForCausalLM's ("model.layers.0.self_attn.
// q_proj.weight", "lm_head.weight"); no conversion is needed.
#include <string>
#include <utility>
#include <vector>

#include "forge/core/tensor.h"

namespace forge::io {

using TensorItems = std::vector<std::pair<std::string, Tensor>>;

// forge GPT state (nanoGPT names, Linear layout) -> HF GPT2LMHeadModel names and layout.
TensorItems gpt2_to_hf(const TensorItems& forge_state);
// HF GPT-2 tensors (with or without the "transformer." prefix) -> forge GPT state, ready
// for Module::load_state_dict.
TensorItems gpt2_from_hf(const TensorItems& hf_state);

}  // namespace forge::io
