#pragma once
// The shape `forge plan` prices for a run config: its [model] section, trained at train.seq_len,
// with model.vocab_size = 0 resolved as the trainer resolves it (data.tokenizer's vocabulary, or
// data.vocab_size for a tokenizer trained on the fly). The trainer sizes its OOM report and
// pipeline stages with it; `forge plan --config` prices it.
#include "forge/plan/model_spec.h"
#include "forge/run/config.h"

namespace forge::train {

plan::ModelSpec model_spec_of(const RunConfig& cfg);

}  // namespace forge::train
