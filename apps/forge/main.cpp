// forge: the command-line entry point (CLI11). Exit status: 0 on success, 1 for an error
// while running ("forge: error: <message>"), 2 for a usage error (bad or missing arguments).
#include <csignal>
#include <cstring>
#include <execinfo.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <new>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "bench_command.h"
#include "commands.h"
#include "info_command.h"
#include "launch_command.h"
#include "plan_command.h"
#include "threading_defaults.h"
#include "forge/core/memory_owner.h"
#include "forge/core/error.h"
#include "forge/run/config.h"

namespace {

constexpr const char* kTrainFooter =
    "Any config key can be overridden: --section.key=value (or --section.key value), e.g.\n"
    "  forge train configs/tiny.toml --train.steps=100 --optim.lr=3e-4 --run.name=short\n"
    "The keys, their types and defaults: docs/train.md.";

// An error line written whole (one write): under forge launch, Open MPI's --tag-output tags each
// write a rank makes, and the launcher joins the pieces (Note [launch output]).
void print_error(const std::string& message, const char* kind = "error") {
  std::cerr << ("forge: " + std::string(kind) + ": " + message + "\n") << std::flush;
}

int usage_error(const std::string& message, const std::string& help_cmd) {
  print_error(message + "\n(see 'forge " + help_cmd + "--help')");
  return 2;
}

// A word where a command was expected that names none ("forge trian", "forge tokenize encod"):
// the message that says so with the nearest commands of that level and where their help is;
// empty when the line has no such word (then CLI11's own message stands).
std::string unknown_command(CLI::App& app, const std::vector<std::string>& args) {
  CLI::App* level = &app;
  std::string path = "forge";
  for (const std::string& word : args) {
    if (word.empty() || word[0] == '-') return "";
    std::vector<std::string> names;
    for (const CLI::App* sub : level->get_subcommands([](CLI::App*) { return true; })) names.push_back(sub->get_name());
    if (names.empty()) return "";
    if (std::find(names.begin(), names.end(), word) != names.end()) {
      level = level->get_subcommand(word);
      path += " " + word;
      continue;
    }
    std::vector<std::pair<size_t, std::string>> near;
    for (const std::string& n : names) {
      const bool prefix = word.size() >= 2 && n.rfind(word, 0) == 0;
      const size_t d = prefix ? 0 : forge::train::edit_distance(word, n);
      if (d <= std::max<size_t>(2, word.size() / 3)) near.emplace_back(d, n);
    }
    std::sort(near.begin(), near.end());
    std::string msg = "'" + word + "' is not a command of '" + path + "'";
    if (!near.empty()) {
      msg += "; did you mean '" + near[0].second + "'";
      if (near.size() > 1 && near[1].first == near[0].first) msg += " or '" + near[1].second + "'";
      msg += "?";
    } else {
      std::string all;
      for (const std::string& n : names)
        if (n != "help") all += (all.empty() ? "" : ", ") + n;
      msg += "; the commands are: " + all;
    }
    return msg + "\n(see '" + path + " --help')";
  }
  return "";
}

}  // namespace

namespace {
// A fatal signal (a crash: SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT) prints where it happened before
// the process dies with that signal as before (forge launch still reports it): the frames of the
// call stack, with function names (the binary is linked with -rdynamic). Async-signal-safe calls only.
void on_fatal_signal(int sig) {
  const char* name = sig == SIGSEGV ? "SIGSEGV" : sig == SIGBUS ? "SIGBUS" : sig == SIGFPE ? "SIGFPE"
                     : sig == SIGILL ? "SIGILL" : "SIGABRT";
  const char head[] = "forge: fatal signal ";
  (void)!::write(STDERR_FILENO, head, sizeof(head) - 1);
  (void)!::write(STDERR_FILENO, name, std::strlen(name));
  const char tail[] = "; call stack:\n";
  (void)!::write(STDERR_FILENO, tail, sizeof(tail) - 1);
  void* frames[64];
  const int n = ::backtrace(frames, 64);
  ::backtrace_symbols_fd(frames, n, STDERR_FILENO);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

void install_crash_handler() {
  void* warm[1];
  ::backtrace(warm, 1);  // loads libgcc's unwinder now, not inside the handler
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) std::signal(sig, on_fatal_signal);
}

// --device and --dtype of the commands that load a checkpoint's model (sample, eval).
void add_model_placement(CLI::App* cmd, std::string& device, std::string& dtype) {
  cmd->add_option("--device", device, "where the model runs: auto (the first GPU if any), cpu, cuda, cuda:N")
      ->capture_default_str();
  cmd->add_option("--dtype", dtype, "the weights' dtype there: f32, bf16 or f16")->capture_default_str();
}
}  // namespace

int main(int argc, char** argv) {
  forge::app::apply_threading_defaults(argv);  // Note [CPU threading defaults]: may start forge again
  install_crash_handler();
  std::vector<std::string> args(argv + 1, argv + argc);
  // Config overrides (--section.key=value) are taken out before CLI11 sees the line (not for
  // `forge launch`, whose command line is the ranks' and keeps its overrides).
  const bool is_launch = !args.empty() && args.front() == "launch";
  const forge::train::SplitArgs split =
      is_launch ? forge::train::SplitArgs{{}, args} : forge::train::split_overrides(args);

  CLI::App app{"forge " FORGE_VERSION " - train GPT- and LLaMA-style models from one CPU to a GPU cluster", "forge"};
  app.require_subcommand(0, 1);
  app.set_version_flag("--version", "forge " FORGE_VERSION);

  forge::app::TrainArgs train_args;
  auto* train = app.add_subcommand("train", "train a model from a TOML config");
  train->add_option("config", train_args.config, "the run config (TOML), e.g. configs/tiny.toml")->required();
  auto* resume = train->add_option("--resume", train_args.resume_from,
                                   "continue from the run's latest checkpoint, or from PATH (a checkpoint or run directory)")
                     ->expected(0, 1)
                     ->type_name("[PATH]");
  train->add_option("--device", train_args.device,
                    "where to train: auto (the first GPU if any), cpu, cuda or cuda:N (= --run.device=...)");
  train->add_flag("--print-config", train_args.print_config, "print the resolved config (TOML) and stop");
  train->footer(kTrainFooter);

  forge::app::SampleArgs sample_args;
  auto* sample = app.add_subcommand("sample", "generate text from a trained language model");
  sample->add_option("--checkpoint", sample_args.checkpoint, "a checkpoint directory, a run directory (its latest), or a Hugging Face model directory (config.json, weights, tokenizer.json)")
      ->required();
  sample->add_option("--adapter", sample_args.adapter,
                     "a PEFT LoRA directory (forge export of a LoRA run) applied to the checkpoint's model");
  sample->add_option("--prompt", sample_args.prompts, "a text to continue (repeat for several; \"\" = start from a newline)");
  sample->add_option("--prompts-file", sample_args.prompts_file, "a file of prompts, one per line");
  sample->add_option("--tokens", sample_args.tokens, "new tokens to generate")->capture_default_str();
  sample->add_option("--temperature", sample_args.temperature, "softmax temperature (0 = greedy)")->capture_default_str();
  sample->add_option("--top-k", sample_args.top_k, "sample among the k most likely tokens (0 = all)")->capture_default_str();
  sample->add_option("--top-p", sample_args.top_p, "nucleus: sample among the likeliest tokens holding this much "
                     "probability (1 = all)")->capture_default_str();
  sample->add_option("--stop", sample_args.stop, "end a completion before this string (repeatable)");
  sample->add_option("--seed", sample_args.seed, "random seed of the sampling (prompt i uses seed + i)")->capture_default_str();
  sample->add_flag("--json", sample_args.json, "print one JSON object: every completion, tokens/s");
  sample->add_flag("--no-kv-cache", sample_args.no_kv_cache, "run the whole window for every token (what the KV cache saves)");
  add_model_placement(sample, sample_args.device, sample_args.dtype);

  forge::app::EvalArgs eval_args;
  auto* eval = app.add_subcommand("eval", "a checkpoint's loss and perplexity on files, accuracy on multiple-choice tasks");
  eval->add_option("--checkpoint", eval_args.checkpoint, "a checkpoint directory, a run directory (its latest), or a Hugging Face model directory (config.json, weights, tokenizer.json)")
      ->required();
  eval->add_option("--adapter", eval_args.adapter,
                   "a PEFT LoRA directory (forge export of a LoRA run) applied to the checkpoint's model");
  eval->add_option("--files", eval_args.files, "text or JSON Lines files: loss and perplexity");
  eval->add_option("--tasks", eval_args.tasks, "multiple-choice files in the HellaSwag layout: acc and acc_norm");
  eval->add_option("--max-examples", eval_args.max_examples, "score the first N examples of each task (0 = all)")
      ->capture_default_str();
  eval->add_option("--batch", eval_args.batch, "windows per forward pass (files)")->capture_default_str();
  eval->add_flag("--json", eval_args.json, "print one JSON object");
  add_model_placement(eval, eval_args.device, eval_args.dtype);

  forge::app::PlotArgs plot_args;
  auto* plot_cmd = app.add_subcommand("plot", "curves of one or several runs (loss, validation loss, lr, throughput, MFU) as SVG");
  plot_cmd->add_option("runs", plot_args.runs, "run directories (or their metrics.jsonl); several are compared")
      ->required();
  plot_cmd->add_option("--out", plot_args.out, "the SVG file to write")->capture_default_str();
  plot_cmd->add_flag("--force", plot_args.force, "replace --out even when it is not an SVG forge plot wrote");

  forge::app::TopArgs top_args;
  auto* top = app.add_subcommand("top", "live per-GPU and per-process view: utilisation, memory, power, clocks, "
                                        "throttle reasons (NVML); exit 3 without a GPU");
  top->add_flag("--once", top_args.once, "print one table (or JSON object) and exit");
  top->add_flag("--json", top_args.json, "JSON instead of the table (one object per refresh)");
  top->add_option("--interval", top_args.interval, "seconds between refreshes")->capture_default_str();
  top->add_option("--count", top_args.count, "refreshes before exiting (0 = until interrupted)")->capture_default_str();

  forge::app::ExportArgs export_args;
  auto* exp = app.add_subcommand("export", "write a checkpoint's model as a Hugging Face model directory (safetensors)");
  exp->add_option("--checkpoint", export_args.checkpoint, "a checkpoint directory, or a run directory (its latest)")
      ->required();
  exp->add_option("--out", export_args.out, "the directory to write (weights, config.json, tokenizer files)")->required();
  exp->add_option("--dtype", export_args.dtype, "f32, bf16 or f16 (default: as trained)");
  exp->add_option("--max-shard-size", export_args.max_shard_size,
                  "split the weights into shards of at most this size, with model.safetensors.index.json: 5GB, "
                  "500MB, 2GiB, or bytes")
      ->capture_default_str();
  exp->add_flag("--merge", export_args.merge,
                "a LoRA run: write the model with its adapters merged (W + alpha / r B A) instead of the PEFT "
                "adapter (adapter_config.json, adapter_model.safetensors)");
  exp->add_flag("--force", export_args.force,
                "write into a non-empty --out that is not an earlier export (its other files are kept; never a run "
                "directory or checkpoint)");

  auto* tokenize =
      app.add_subcommand("tokenize", "train a BPE tokenizer, encode files into token shards, or encode/decode text");
  tokenize->require_subcommand(1);
  forge::app::TokenizeTrainArgs tok_train_args;
  auto* tok_train = tokenize->add_subcommand("train", "train a byte-level BPE tokenizer on text files");
  tok_train->add_option("--vocab-size", tok_train_args.vocab_size, "vocabulary size (>= 256)")->required();
  tok_train->add_option("--out", tok_train_args.out, "the tokenizer JSON to write")->required();
  tok_train->add_flag("--force", tok_train_args.force, "replace --out even when it is not a forge BPE tokenizer");
  tok_train->add_option("--exclude", tok_train_args.exclude, "glob patterns of files to skip in directories/globs");
  tok_train->add_option("--text-key", tok_train_args.text_key, "*.jsonl files: the key of each line's text")
      ->capture_default_str();
  tok_train->add_option("--special-token", tok_train_args.special_tokens,
                        "a special token of the tokenizer (repeatable); default \"<|endoftext|>\", as forge train's "
                        "tokenizer; --special-token \"\" for none");
  tok_train->add_option("files", tok_train_args.files, "text or JSON Lines files, glob patterns or directories")->required();
  forge::app::TokenizeEncodeArgs tok_encode_args;
  auto* tok_encode = tokenize->add_subcommand("encode", "encode text and JSON Lines files into token shards (streamed, over the cores)");
  const char* tok_help =
      "a tokenizer file: forge BPE JSON, Hugging Face tokenizer.json, tiktoken ranks or sentencepiece .model";
  tok_encode->add_option("--tokenizer", tok_encode_args.tokenizer, tok_help)->required();
  tok_encode->add_option("--out", tok_encode_args.out, "the directory for the shards")->required();
  tok_encode->add_flag("--force", tok_encode_args.force,
                       "write into a non-empty --out that holds other files than shards (they are kept)");
  tok_encode->add_option("--exclude", tok_encode_args.exclude, "glob patterns of files to skip in directories/globs");
  tok_encode->add_option("--text-key", tok_encode_args.text_key, "*.jsonl files: the key of each line's text")
      ->capture_default_str();
  tok_encode->add_option("--eos-token", tok_encode_args.eos_token,
                         "the special token written after every document: auto = the tokenizer's end-of-text token "
                         "(as forge train's data.eos_token), a special token such as \"</s>\", or \"\" for none")
      ->capture_default_str();
  tok_encode->add_option("files", tok_encode_args.files, "text or JSON Lines files, glob patterns or directories")->required();
  forge::app::TokenizeIdsArgs tok_ids_args;
  auto* tok_ids = tokenize->add_subcommand("ids", "print the token ids of a text (or of each file) as a JSON array");
  tok_ids->add_option("--tokenizer", tok_ids_args.tokenizer, tok_help)->required();
  tok_ids->add_option("--text", tok_ids_args.text, "the text to encode");
  tok_ids->add_flag("--ordinary", tok_ids_args.ordinary, "encode special-token strings as plain text");
  tok_ids->add_option("files", tok_ids_args.files, "files whose whole contents to encode, one array each");
  forge::app::TokenizeDecodeArgs tok_decode_args;
  auto* tok_decode = tokenize->add_subcommand("decode", "write the text of token ids (--ids) or of a token shard");
  tok_decode->add_option("--tokenizer", tok_decode_args.tokenizer, tok_help)->required();
  tok_decode->add_option("--ids", tok_decode_args.ids, "token ids, e.g. --ids 15496 995")->delimiter(',');
  tok_decode->add_option("shard", tok_decode_args.shard, "a token shard (forge, llm.c or Megatron .bin)");

  auto* plan = forge::app::add_plan_command(app);
  auto* info = forge::app::add_info_command(app);
  auto* bench = forge::app::add_bench_command(app);
  auto* launch = forge::app::add_launch_command(app);

  auto* demo = app.add_subcommand("autograd-demo", "fit a small MLP with forge's autograd (the worked example)");
  demo->allow_extras();
  demo->prefix_command();
  auto* version = app.add_subcommand("version", "print the version");
  app.add_subcommand("help", "print this help")->silent();

  std::string help_cmd;
  try {
    std::vector<std::string> rest(split.rest.rbegin(), split.rest.rend());  // CLI11 takes them reversed
    app.parse(rest);
    if (app.got_subcommand("train")) help_cmd = "train ";
    if (!split.overrides.empty() && !app.got_subcommand("train") && !app.got_subcommand("plan"))
      return usage_error("config overrides (" + split.overrides.front() + ") are options of 'forge train'", help_cmd);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::CallForVersion&) {
    std::cout << "forge " << FORGE_VERSION << "\n";
    return 0;
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help of a subcommand
    if (const std::string u = unknown_command(app, split.rest); !u.empty()) {
      print_error(u);
      return 2;
    }
    std::string cmd;
    for (const auto* sub : {train, sample, eval, plot_cmd, top, exp, tokenize, tok_train, tok_encode, tok_ids, tok_decode, plan, info, launch})
      if (sub->parsed()) cmd = (sub->get_parent() == tokenize ? "tokenize " : "") + sub->get_name() + " ";
    if (bench->parsed()) cmd = bench->get_subcommand("gemm")->parsed() ? "bench gemm " : "bench ";
    return usage_error(e.what(), cmd);
  }

  try {
    (void)forge::cpu_memory_limit();  // a bad FORGE_CPU_MEMORY_LIMIT is refused before any work
    if (train->parsed()) {
      train_args.overrides = split.overrides;
      train_args.resume = resume->count() > 0;
      return forge::app::run_train(train_args);
    }
    if (sample->parsed()) return forge::app::run_sample(sample_args);
    if (eval->parsed()) return forge::app::run_eval(eval_args);
    if (plot_cmd->parsed()) return forge::app::run_plot(plot_args);
    if (top->parsed()) return forge::app::run_top(top_args);
    if (exp->parsed()) return forge::app::run_export(export_args);
    if (plan->parsed()) return forge::app::run_plan(split.overrides);
    if (info->parsed()) return forge::app::run_info();
    if (bench->parsed()) return forge::app::run_bench(*bench);
    if (launch->parsed()) return forge::app::run_launch(*launch);
    if (tok_train->parsed()) return forge::app::run_tokenize_train(tok_train_args);
    if (tok_encode->parsed()) return forge::app::run_tokenize_encode(tok_encode_args);
    if (tok_ids->parsed()) return forge::app::run_tokenize_ids(tok_ids_args);
    if (tok_decode->parsed()) return forge::app::run_tokenize_decode(tok_decode_args);
    if (demo->parsed()) {
      std::vector<std::string> extra = demo->remaining();
      std::vector<char*> ptrs;
      for (auto& s : extra) ptrs.push_back(s.data());
      return forge::app::run_autograd_demo(static_cast<int>(ptrs.size()), ptrs.data());
    }
    if (version->parsed()) {
      std::cout << "forge " << FORGE_VERSION << "\n";
      return 0;
    }
    if (app.get_subcommand("help")->parsed()) {
      std::cout << app.help();
      return 0;
    }
    std::cerr << app.help();
    return 2;
  } catch (const forge::Error& e) {
    print_error(e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    // A request the host could not serve (a file asking for an absurd size is refused before any
    // allocation: Note [checked sizes]; this is memory really running out).
    print_error("out of host memory (an allocation failed); a smaller batch, model or input would fit, or "
                "FORGE_CPU_MEMORY_LIMIT shows what needed it (docs/environment.md)");
    return 1;
  } catch (const nlohmann::json::exception& e) {
    // Every file forge reads names itself in its errors; a JSON error that gets this far lacks the
    // name of its file: said as such rather than as an internal error.
    print_error("a JSON document has a missing field or one of the wrong type (" + std::string(e.what()) + ")");
    return 1;
  } catch (const std::exception& e) {
    print_error(e.what(), "internal error");
    return 1;
  }
}
