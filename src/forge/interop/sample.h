#pragma once
// `forge sample`: text from a checkpoint of a language-model run.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <functional>
#include <string>
#include <vector>

#include "forge/core/generator.h"
#include "forge/data/tokenizer.h"
#include "forge/run/config.h"
#include "forge/run/language_model.h"

namespace forge::train {

struct SampleOptions {
  std::string checkpoint;      // a checkpoint directory, or a run directory (its latest checkpoint)
  std::string adapter = "";    // a PEFT LoRA directory applied to the checkpoint's model ("" = none)
  std::string prompt;          // one prompt (when `prompts` is empty)
  std::vector<std::string> prompts;  // several prompts, each continued in turn with its own draws
  int64_t tokens = 200;        // new tokens to generate (at most, with stop strings)
  double temperature = 0.8;    // 0 = greedy (argmax)
  int64_t top_k = 0;           // sample among the k most likely tokens (0 = all)
  double top_p = 1.0;          // nucleus: the smallest set of likeliest tokens whose mass reaches p (1 = all)
  std::vector<std::string> stop;  // a completion ends before the first of these strings it produces
  uint64_t seed = 0;
  bool kv_cache = true;        // false: every token runs the whole window (to measure what the cache saves)
  std::string device = "auto";  // where the model runs: auto (the first GPU if any), cpu, cuda, cuda:N
  std::string dtype = "f32";    // the weights' dtype there: f32 (the master weights as saved), bf16, f16
};

struct SampleResult {
  std::string text;            // the (first) prompt followed by its completion
  std::string completion;      // the (first) generated text alone
  std::vector<std::string> completions;  // one per prompt
  std::vector<int64_t> new_tokens;       // tokens generated per prompt (fewer than asked when a stop string ended it)
  std::string checkpoint;      // the checkpoint directory used
  int64_t step = 0;            // its step
  double seconds = 0;          // generation time, every prompt
  double tokens_per_s = 0;     // generated tokens / seconds
  // The first token of every prompt (the prompt's window, and on a GPU each kernel's first
  // launch), and the rate after it: the steady decoding speed, as a server reports it.
  double first_token_seconds = 0;
  double decode_tokens_per_s = 0;  // tokens after each prompt's first / seconds after the first token
};

// A language model's checkpoint loaded for inference (forge sample, forge eval): `checkpoint` is a
// checkpoint directory or a run directory (its latest); the run's config from the checkpoint, its
// tokenizer (<run dir>/tokenizer.json) and the model with the checkpoint's weights. `who` names
// the command in errors ("sample", "eval").
struct LoadedCheckpoint {
  std::filesystem::path dir;
  int64_t step = 0;
  RunConfig cfg;
  std::shared_ptr<const data::Tokenizer> tok;
  LanguageModel model;
};
// The model moved to `device` (run.device's forms) in `dtype` ("f32", "bf16", "f16").
// `adapter` (a PEFT LoRA directory, interop/peft_adapter.h; "" = none): the checkpoint's model is
// the base, built with the adapter's LoRA options (cfg.lora, replacing the run's own adapters if it
// had some) and its factors loaded: forge sample / eval --adapter.
LoadedCheckpoint load_language_checkpoint(const std::string& checkpoint, const std::string& who,
                                          const std::string& device = "cpu", const std::string& dtype = "f32",
                                          const std::string& adapter = "");

// Loads the checkpoint, its run's config (from the checkpoint) and tokenizer
// (<run dir>/tokenizer.json), and samples autoregressively under NoGradGuard with the
// model in eval mode. Deterministic for a given seed (prompt i draws from seed + i).
SampleResult sample(const SampleOptions& opt);

// Sampling controls of one step (pick_token): temperature 0 = argmax; top_k > 0 keeps the k
// likeliest; top_p < 1 keeps the smallest set of likeliest tokens whose probability reaches p
// (after top_k and the temperature), always at least one.
struct Sampling {
  double temperature = 0.8;
  int64_t top_k = 0;
  double top_p = 1.0;
  bool kv_cache = true;  // decode over a KV cache (Note [KV cache], nn/causal_lm.h); false: the whole window every token
};

// The autoregressive loop: appends up to `n` tokens to `ids` (each from the last block_size
// tokens' logits), drawing from a Philox Generator seeded with `seed`; `stop(ids)` true after a
// token ends it early. A GPT or LLaMA decodes over a KV cache (how.kv_cache): the prompt's window
// once, then one position per token; past block_size the window slides and each token runs it
// whole again, as without the cache, so both give the same tokens.
std::vector<int32_t> generate(const LanguageModel& model, std::vector<int32_t> ids, int64_t n, const Sampling& how,
                              uint64_t seed, const std::function<bool(const std::vector<int32_t>&)>& stop = {});
// Several prompts decoded as one batch over one KV cache (a GPT or LLaMA with how.kv_cache;
// prompts of different lengths left-padded, Note [padded prompts] in nn/causal_lm.h), or without
// the cache the whole window each token, one length at a time: row k draws from seeds[k], so each
// row gets the tokens generate() would give it alone (up to the batched GEMMs' rounding);
// stop(k, ids) ends row k.
std::vector<std::vector<int32_t>> generate_batch(const LanguageModel& model, std::vector<std::vector<int32_t>> rows,
                                                int64_t n, const Sampling& how, const std::vector<uint64_t>& seeds,
                                                const std::function<bool(size_t, const std::vector<int32_t>&)>& stop = {});
// One draw from `logits` under `how` (exposed for tests).
int32_t pick_token(std::vector<double> logits, const Sampling& how, Generator& gen);

}  // namespace forge::train
