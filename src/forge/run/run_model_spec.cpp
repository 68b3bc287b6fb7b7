#include "forge/run/run_model_spec.h"

#include "forge/data/tokenizer.h"
#include "forge/nn/lora.h"

namespace forge::train {

plan::ModelSpec model_spec_of(const RunConfig& cfg) {
  nn::ModelConfig m = cfg.model;
  if (m.vocab_size == 0) {
    m.vocab_size = cfg.data.tokenizer.empty() ? cfg.data.vocab_size  // the tokenizer the trainer trains on the fly
                                              : data::load_tokenizer(cfg.data.tokenizer)->vocab_size();
  }
  plan::ModelSpec spec =
      plan::from_model_config(m, cfg.train.seq_len, cfg.source.empty() ? std::string("the config") : cfg.source);
  if (cfg.lora.enabled()) {  // LoRA (nn/lora.h): what the adapters add and the base no longer needs
    spec.lora_rank = cfg.lora.rank;
    spec.lora_roles = nn::lora_roles(spec.arch, cfg.lora.targets);
  }
  return spec;
}

}  // namespace forge::train
