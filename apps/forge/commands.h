#pragma once
// The actions behind the `forge` subcommands (main.cpp parses the command line with CLI11).
// Each returns the process exit status and throws forge::Error for bad input.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace forge::app {

struct TrainArgs {
  std::string config;
  std::vector<std::string> overrides;  // "--section.key=value", in order
  bool resume = false;
  std::string resume_from;             // "" = the run's latest checkpoint
  bool print_config = false;           // print the resolved config and stop
  std::string device;                  // --device: the same as --run.device=... ("" = the config's)
};
int run_train(const TrainArgs& args);

struct SampleArgs {
  std::string checkpoint;
  std::string adapter;                 // a PEFT LoRA directory on the checkpoint's model
  std::vector<std::string> prompts;    // --prompt, repeatable
  std::string prompts_file;            // one prompt per line
  int64_t tokens = 200;
  double temperature = 0.8;
  int64_t top_k = 0;
  double top_p = 1.0;
  std::vector<std::string> stop;
  uint64_t seed = 0;
  bool json = false;
  bool no_kv_cache = false;
  std::string device = "auto";
  std::string dtype = "f32";
};
int run_sample(const SampleArgs& args);

struct EvalArgs {
  std::string checkpoint;
  std::string adapter;                 // a PEFT LoRA directory on the checkpoint's model
  std::vector<std::string> files;      // loss and perplexity
  std::vector<std::string> tasks;      // multiple choice (HellaSwag layout)
  int64_t max_examples = 0;
  int64_t batch = 8;
  bool json = false;
  std::string device = "auto";
  std::string dtype = "f32";
};
int run_eval(const EvalArgs& args);

struct PlotArgs {
  std::vector<std::string> runs;       // run directories or metrics.jsonl files
  std::string out = "curves.svg";
  bool force = false;                  // replace an --out file that forge plot did not write
};
int run_plot(const PlotArgs& args);

struct TopArgs {
  bool once = false;
  bool json = false;
  double interval = 1.0;  // seconds between refreshes
  int64_t count = 0;      // refreshes before exiting (0 = until interrupted)
};
int run_top(const TopArgs& args);

struct ExportArgs {
  std::string checkpoint;
  std::string out;
  std::string dtype;                   // "" = as trained
  std::string max_shard_size = "5GB";  // io::parse_byte_size
  bool force = false;                  // write into a non-empty --out that is not an earlier export
  bool merge = false;                  // a LoRA run: the merged model instead of the PEFT adapter
};
int run_export(const ExportArgs& args);

struct TokenizeTrainArgs {
  int64_t vocab_size = 0;
  std::string out;
  std::vector<std::string> files;
  std::vector<std::string> exclude;
  std::string text_key = "text";        // .jsonl files (Note [documents])
  std::vector<std::string> special_tokens;  // none given: <|endoftext|> (as forge train's); "" alone: none
  bool force = false;                   // replace an --out file that is not a forge BPE tokenizer
};
int run_tokenize_train(const TokenizeTrainArgs& args);

struct TokenizeEncodeArgs {
  std::string tokenizer;
  std::string out;
  std::vector<std::string> files;
  std::vector<std::string> exclude;
  std::string text_key = "text";  // .jsonl files (Note [documents])
  std::string eos_token = "auto";  // after every document: "auto" = the tokenizer's end-of-text token, "": none
  bool force = false;             // write into a non-empty --out that holds other files than shards
};
int run_tokenize_encode(const TokenizeEncodeArgs& args);

struct TokenizeIdsArgs {
  std::string tokenizer;
  std::optional<std::string> text;  // or the files' texts
  std::vector<std::string> files;
  bool ordinary = false;  // special-token strings as plain text
};
int run_tokenize_ids(const TokenizeIdsArgs& args);

struct TokenizeDecodeArgs {
  std::string tokenizer;
  std::vector<int32_t> ids;  // or the shard's
  std::string shard;
};
int run_tokenize_decode(const TokenizeDecodeArgs& args);

int run_autograd_demo(int argc, char** argv);

}  // namespace forge::app
