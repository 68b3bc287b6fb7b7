// GPT and LLaMA behind train::LanguageModel (contracts in language_model.h).
#include "forge/run/language_model.h"

#include "forge/core/error.h"
#include "forge/nn/causal_lm.h"
#include "forge/nn/linear.h"
#include "forge/nn/lora.h"
#include "forge/nn/model_registry.h"
#include "forge/ops/attention.h"
#include "forge/ops/matmul.h"
#include "forge/parallel/tensor_parallel_lora.h"

namespace forge::train {

LanguageModel build_language_model(const RunConfig& cfg, const nn::LayerSpec& spec) {
  const auto& m = cfg.model;
  FORGE_CHECK(m.vocab_size > 0, "build_language_model: model.vocab_size is not resolved (0)");
  FORGE_CHECK(cfg.is_language_model(), "model.type = '", m.type, "' is not a language model; use ",
              nn::model_type_list(/*transformers_only=*/true));
  // The family's module, through the registry (nn/model_registry.h).
  // LoRA (nn/lora.h): the targeted linears wrapped, whatever the spec built (tensor parallelism's
  // split ones get adapters split like them: parallel/tensor_parallel_lora.h); the factors made
  // after the model's own initialisation, the rest frozen.
  const nn::LayerSpec lm_spec =
      cfg.lora.enabled() ? nn::lora_layer_spec(spec, nn::transformer_shape(m).arch, cfg.lora, parallel::tp::lora_wrap)
                         : spec;
  std::shared_ptr<nn::CausalLM> lm = nn::build_causal_lm(m, static_cast<uint64_t>(cfg.run.seed), lm_spec);
  nn::name_linears(*lm);  // (FP8's guardrail events name the layer)
  if (cfg.lora.enabled()) nn::attach_lora(*lm, static_cast<uint64_t>(cfg.run.seed));
  LanguageModel out;
  out.vocab_size = m.vocab_size;
  out.block_size = m.block_size;
  out.forward = [l = lm.get()](const Tensor& idx) { return l->forward(idx); };
  out.set_block_hooks = [l = lm.get()](std::shared_ptr<nn::BlockHooks> h) { l->block_hooks = std::move(h); };
  out.block_of = [l = lm.get()](const std::string& name) { return l->block_of_param(name); };
  // The loss through the model's seam (Note [model seams]): its head computes it.
  out.loss = [l = lm.get()](const data::Batch& b) {
    return l->loss(b.inputs, b.targets, nn::Documents{b.documents, b.positions});
  };
  out.module = lm;
  return out;
}

InferenceKernels::InferenceKernels() : attention_(ops::attention_backend()), gemm_tuning_(ops::gemm_tuning()) {
  if (attention_ != "composed") ops::set_attention_backend("flash");  // (Note [inference kernels])
  ops::set_gemm_tuning(false);
}
InferenceKernels::~InferenceKernels() {
  ops::set_attention_backend(attention_);
  ops::set_gemm_tuning(gemm_tuning_);
}

ParameterCounts parameter_counts(const Model& m) {
  ParameterCounts n;
  for (const auto& [name, p] : m.module->named_parameters()) {
    const int64_t k = shape_numel(m.whole_shape(name));
    n.total += k;
    if (p.requires_grad()) n.trainable += k;
  }
  return n;
}

MatmulParameters matmul_parameters_by_training(const Model& m) {
  MatmulParameters n;
  for (const auto& [name, p] : m.module->named_parameters())
    if (name.find("wpe.") == std::string::npos && name.find("embed_tokens.") == std::string::npos)
      (p.requires_grad() ? n.trained : n.frozen) += shape_numel(m.whole_shape(name));
  return n;
}

int64_t matmul_parameters(const Model& m) {
  const MatmulParameters n = matmul_parameters_by_training(m);
  return n.trained + n.frozen;
}

}  // namespace forge::train
