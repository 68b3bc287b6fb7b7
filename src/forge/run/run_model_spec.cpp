#include "forge/run/run_model_spec.h"

#include "forge/data/tokenizer.h"

namespace forge::train {

plan::ModelSpec model_spec_of(const RunConfig& cfg) {
  nn::ModelConfig m = cfg.model;
  if (m.vocab_size == 0) {
    m.vocab_size = cfg.data.tokenizer.empty() ? cfg.data.vocab_size  // the tokenizer the trainer trains on the fly
                                              : data::load_tokenizer(cfg.data.tokenizer)->vocab_size();
  }
  return plan::from_model_config(m, cfg.train.seq_len, cfg.source.empty() ? std::string("the config") : cfg.source);
}

}  // namespace forge::train
