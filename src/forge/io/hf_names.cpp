#include "forge/io/hf_names.h"

#include "forge/ops/copy.h"
#include "forge/ops/view.h"

namespace forge::io {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The GPT-2 weights HF keeps as Conv1D (in, out).
bool is_conv1d_weight(const std::string& name) {
  return ends_with(name, ".attn.c_attn.weight") || ends_with(name, ".attn.c_proj.weight") ||
         ends_with(name, ".mlp.c_fc.weight") || ends_with(name, ".mlp.c_proj.weight");
}

Tensor transposed(const Tensor& t, const std::string& name) {
  FORGE_CHECK(t.dim() == 2, "GPT-2 weight '", name, "' should be 2-D, got shape ", t.shape());
  return ops::contiguous(ops::transpose(t.detach(), 0, 1));
}

}  // namespace

TensorItems gpt2_to_hf(const TensorItems& forge_state) {
  TensorItems out;
  for (const auto& [name, t] : forge_state) {
    if (name == "lm_head.weight") continue;  // tied to transformer.wte.weight
    out.emplace_back(name, is_conv1d_weight(name) ? transposed(t, name) : t.detach());
  }
  return out;
}

TensorItems gpt2_from_hf(const TensorItems& hf_state) {
  TensorItems out;
  for (const auto& [hf_name, t] : hf_state) {
    if (hf_name == "lm_head.weight" || ends_with(hf_name, ".attn.bias") || ends_with(hf_name, ".attn.masked_bias"))
      continue;
    const std::string name = hf_name.rfind("transformer.", 0) == 0 ? hf_name : "transformer." + hf_name;
    out.emplace_back(name, is_conv1d_weight(name) ? transposed(t, hf_name) : t);
  }
  return out;
}

}  // namespace forge::io
