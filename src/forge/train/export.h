#pragma once
#include <cstdint>
#include <string>

namespace forge::train {

// `forge export`: the model of a checkpoint (any: one process, DDP or ZeRO at any world
// size — the weights are whole in every one) as a Hugging Face model directory:
//   <out>/model.safetensors   HF tensor names and layouts (io/hf_names.h: GPT2LMHeadModel or
//                             LlamaForCausalLM), in `dtype` ("" = as trained)
//   <out>/config.json         the HF config of the architecture, so from_pretrained(<out>) loads it
//   <out>/forge_tokenizer.json  the run's forge BPE tokenizer, when the run had one (forge's own
//                             format, so HF's tokenizer.json name stays free)
// Written through a temporary directory and an atomic rename: a crash leaves no half model.
struct ExportOptions {
  std::string checkpoint;  // a checkpoint directory, or a run directory (its latest)
  std::string out;         // the output directory (replaced if it exists)
  std::string dtype;       // "", "f32", "bf16" or "f16"
};
struct ExportResult {
  std::string checkpoint;
  int64_t step = 0;
  int64_t tensors = 0;
  int64_t parameters = 0;
};
ExportResult export_model(const ExportOptions& opt);

}  // namespace forge::train
