#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "forge/io/hf_checkpoint.h"

namespace forge::train {

// `forge export`: the model of a checkpoint (any: one process, DDP or ZeRO at any world
// size — the weights are whole in every one) as a Hugging Face model directory, the files
// save_pretrained and a tokenizer's save_pretrained write, so from_pretrained(<out>) and
// AutoTokenizer.from_pretrained(<out>) load it, and `model.init_from = "<out>"` starts a run
// from it bit for bit (run/hf_model.h):
//   <out>/model.safetensors   HF tensor names and layouts (io/hf_names.h: GPT2LMHeadModel or
//                             LlamaForCausalLM), in `dtype` ("" = as trained); over
//                             `max_shard_bytes`, model-0000i-of-0000n.safetensors shards and
//                             model.safetensors.index.json (io/hf_checkpoint.h)
//   <out>/config.json         the HF config of the architecture (LLaMA: rope_scaling when
//                             model.rope_scaling = "llama3"), with bos/eos token ids
//   <out>/generation_config.json  {"bos_token_id", "eos_token_id"} (those the tokenizer has)
//   <out>/tokenizer.json      the run's tokenizer: a Hugging Face tokenizer.json as it is, forge's
//                             own BPE converted to one (data/bpe_hf.h)
//   <out>/forge_tokenizer.json  a tokenizer of forge's kinds (forge's BPE, tiktoken, sentencepiece)
//                             in forge's serialisation, exactly the run's (data.tokenizer and
//                             model.init_from read it; transformers does not)
//   <out>/tokenizer_config.json  {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token",
//                             "eos_token", "model_max_length": model.block_size} (with tokenizer.json)
//   <out>/forge_export.json   {"format": "forge-export", "checkpoint", "step", "files": [...]}:
//                             what this export wrote (the next export recognises its own files)
// A run without a tokenizer (pre-encoded shards, random tokens) writes no tokenizer files.
// Note [nothing deletes what it did not write] (io/output_guard.h): <out> must not exist, be
// empty, or hold exactly an earlier export's files (forge_export.json lists them); then it is
// written through a temporary directory and an atomic rename, so a crash leaves no half model.
// Anything else in <out> is refused before any work, unless `force`: then the files are written
// into <out> one by one (each atomically), the others left as they are. A forge run directory
// or checkpoint is never an <out>.
struct ExportOptions {
  std::string checkpoint;  // a checkpoint directory, or a run directory (its latest)
  std::string out;         // the output directory (see above)
  std::string dtype;       // "", "f32", "bf16" or "f16"
  int64_t max_shard_bytes = io::kHfDefaultMaxShardBytes;  // --max-shard-size (io::parse_byte_size)
  bool force = false;      // --force: write into a non-empty <out> that is not an earlier export
  // A LoRA run (nn/lora.h): false writes its adapters in PEFT's layout (adapter_config.json,
  // adapter_model.safetensors: interop/peft_adapter.h, with the tokenizer files); true (--merge)
  // the model above with each adapted weight W + alpha / r B A.
  bool merge = false;
};
struct ExportResult {
  std::string checkpoint;
  int64_t step = 0;
  int64_t tensors = 0;
  int64_t parameters = 0;
  std::vector<std::string> files;  // the files written, in <out>
};
ExportResult export_model(const ExportOptions& opt);

}  // namespace forge::train
