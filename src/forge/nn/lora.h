#pragma once
// LoRA (Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", 2021), computed as
// Hugging Face PEFT computes it, so that an adapter trained here loads there (and back):
//
//   y = base(x) + (dropout(x) A^T) B^T * (alpha / r)     A (r, in), B (out, r)
//
// The base linear is frozen; A and B are the only parameters trained. A run turns it on with
// `[lora] targets` (run/config.h; docs/lora.md):
//
//   nn::LoraOptions o{.rank = 8, .alpha = 16, .targets = {"q", "v"}};
//   nn::LayerSpec spec = nn::lora_layer_spec(base_spec, nn::Arch::llama, o);
//   auto model = nn::build_causal_lm(m, seed, spec);   // q_proj, v_proj are LoraLinear
//   nn::LoraCounts n = nn::attach_lora(*model, seed);  // A, B made and initialised; the rest frozen
//
// Note [LoRA]
// -----------
// - Names. A LoraLinear registers its base's weight and bias under the base's names (the same
//   tensors: Linear's SharedParameters constructor) and its factors as children, so a model's
//   state dict keeps every key of the model without LoRA and adds
//   `<linear>.lora_A.weight` (r, in) and `<linear>.lora_B.weight` (out, r): PEFT's names after
//   its `base_model.model.` prefix (interop/peft_adapter.h), in PEFT's layout (nn.Linear's, also
//   for GPT-2's Conv1D layers: fan_in_fan_out only transposes the base weight when PEFT merges).
// - Initialisation (PEFT's default, init_lora_weights=True): A from kaiming_uniform_(a = sqrt(5)):
//   gain = sqrt(2 / (1 + a^2)) = sqrt(1/3), bound = sqrt(3) gain / sqrt(fan_in) = 1 / sqrt(in);
//   so A ~ U(-1/sqrt(in), 1/sqrt(in)), and B = 0: the adapted model starts as the base model.
//   The factors are made after the model has initialised its own parameters (attach_lora), from
//   a generator of their own (the run's seed with a salt), in module order: the base's weights
//   are the ones the same seed gives without LoRA, and the factors the same whatever the layout
//   (tensor parallelism cuts them from the whole model's, as it does the base's).
// - Freezing: attach_lora sets requires_grad false on every other parameter. Everything that
//   gathers what to train asks requires_grad (the optimizer's groups, DDP's buckets, ZeRO's
//   owned slices, the tensor-parallel gradient sums), so the base gets no gradient, no
//   optimizer state and no communication. A 16-bit run keeps the base in its dtype (bf16) and
//   the factors, like every trained parameter, with f32 masters in AdamW (Note [bf16 master
//   weights]).
// - Dropout applies to the adapter's input only (PEFT's lora_dropout), in training mode.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "forge/core/generator.h"
#include "forge/nn/layer_spec.h"
#include "forge/nn/linear.h"
#include "forge/nn/model_registry.h"

namespace forge::nn {

struct LoraOptions {
  int64_t rank = 8;                  // r
  double alpha = 8.0;                // the branch is scaled by alpha / r
  double dropout = 0.0;              // on the adapter's input
  std::vector<std::string> targets = {};  // the linears adapted, by name (lora_target_names); empty: LoRA off
  bool enabled() const { return !targets.empty(); }
  double scale() const { return alpha / static_cast<double>(rank); }
};

// The target names a family's linears answer to (GPT: c_attn, attn.c_proj, c_fc, mlp.c_proj and
// c_proj for both; LLaMA: q, k, v, o, gate, up, down, each also as HF's q_proj, ..., down_proj).
std::vector<std::string> lora_target_names(Arch arch);
// The roles `targets` select in a family. Throws naming the lora.targets entry and the fix when a
// name is unknown, or names a linear the family does not have (LLaMA's "q" in a GPT), or when
// targets is empty.
std::vector<LinearRole> lora_roles(Arch arch, const std::vector<std::string>& targets);
// PEFT's target_modules for the same linears (module-name suffixes: "q_proj", "attn.c_proj", ...).
std::vector<std::string> peft_target_modules(Arch arch, const std::vector<std::string>& targets);
// Checks rank, alpha, dropout and targets (errors name the lora.<key> and the fix).
void validate_lora(const LoraOptions& o, Arch arch);

// One factor of an adapter: a module holding `weight`, so its name is PEFT's `lora_A.weight`.
class LoraFactor : public Module {
 public:
  explicit LoraFactor(Tensor w) { weight = register_parameter("weight", std::move(w)); }
  Tensor weight;
};

// A linear with an adapter: base(x) + delta(x). `base` is the linear the layer spec built (plain
// or tensor-parallel; held, not registered: its parameters are registered here under their own
// names). The factors exist after attach(); before it, forward is the base's alone.
class LoraLinear : public Linear {
 public:
  LoraLinear(std::shared_ptr<Linear> base, const LoraOptions& o);
  Tensor forward(const Tensor& x) const override;  // (*, in) -> (*, out)
  // scale * (dropout(x) A^T) B^T, for an x the base takes whole (a plain linear's).
  virtual Tensor delta(const Tensor& x) const;
  // Makes lora_A (r, in) ~ U(-1/sqrt(in), 1/sqrt(in)) from `gen` and lora_B (out, r) zeros (Note
  // [LoRA]), in / out the base's features (a tensor-parallel base's: this rank's; such a model
  // then loads the whole model's factors, cut like its weights).
  void attach(Generator& gen);
  bool attached() const { return lora_A != nullptr; }
  // W + scale B A in W's dtype (computed in f32, or f64 for f64), of this module's shapes.
  Tensor merged_weight() const;

  std::shared_ptr<Linear> base;
  int64_t rank;
  double alpha, dropout, scale;
  std::shared_ptr<LoraFactor> lora_A, lora_B;
};

// `base` with each linear of the roles `o.targets` selects wrapped: wrap(linear) when given (a
// tensor-parallel linear's adapter: parallel/tensor_parallel_lora.h), else a LoraLinear.
using LoraWrap = std::function<std::shared_ptr<LoraLinear>(std::shared_ptr<Linear> base, const LoraOptions& o)>;
LayerSpec lora_layer_spec(LayerSpec base, Arch arch, const LoraOptions& o, LoraWrap wrap = {});

struct LoraCounts {
  int64_t adapters = 0;   // LoraLinears
  int64_t trainable = 0;  // elements of lora_A and lora_B (this module's)
  int64_t total = 0;      // every parameter element (this module's)
};
// Attaches every LoraLinear's factors in module order from one generator seeded by `seed` (with
// a salt of its own), then freezes every other parameter (Note [LoRA]). Throws when `model` has no
// LoraLinear.
LoraCounts attach_lora(Module& model, uint64_t seed);
// The LoraLinears of `model` by path ("transformer.h.0.attn.c_attn"), in module order.
std::vector<std::pair<std::string, const LoraLinear*>> lora_linears(const Module& model);
// True for a parameter name that is a LoRA factor's (".lora_A.weight" / ".lora_B.weight").
bool is_lora_parameter(const std::string& name);

}  // namespace forge::nn
