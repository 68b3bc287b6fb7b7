// forge train / sample / tokenize: thin wrappers over forge::train (trainer.h, config.h).
#include "commands.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <thread>

#include "forge/core/error.h"
#include "forge/data/bpe.h"
#include "forge/data/shards.h"
#include "forge/data/tokenizer.h"
#include "forge/io/atomic_file.h"
#include "forge/io/hf_checkpoint.h"
#include "forge/io/output_guard.h"
#include "forge/parallel/env.h"
#include "forge/run/config.h"
#include <nlohmann/json.hpp>

#include "forge/bench/top.h"
#include "forge/telemetry/plot.h"
#include "forge/interop/evaluate.h"
#include "forge/train/preemption.h"
#include "forge/run/run_data.h"
#include "forge/train/trainer.h"

namespace forge::app {

int run_train(const TrainArgs& args) {
  std::vector<std::string> overrides = args.overrides;
  if (!args.device.empty()) overrides.push_back("--run.device=" + args.device);
  const train::RunConfig cfg = train::load_config(args.config, overrides);
  if (parallel::launch_env().rank == 0)  // once per job
    for (const auto& key : train::ignored_model_keys(cfg))
      std::cerr << "forge train: note: " << key << " is ignored: model.type = \"" << cfg.model.type
                << "\" does not read it (docs/train.md, [model], says which type reads which key)\n";
  if (args.print_config) {
    std::cout << train::config_to_toml(cfg);
    return 0;
  }
  if (parallel::launch_env().rank == 0)  // the job's header once, as its log (rank 0 speaks for the job)
    std::cout << "forge train " << args.config << " -> " << cfg.run_dir() << "\n";
  train::TrainOptions opt;
  opt.resume = args.resume;
  opt.resume_from = args.resume_from;
  opt.command = "forge train " + args.config;
  for (const auto& o : overrides) opt.command += " " + o;
  // Reports as it goes, ending with a summary line. A run stopped by a signal or run.time_limit
  // has written its checkpoint: exit 75 says "run the same command again" (Note [preemption]).
  const train::TrainResult r = train::run_training(cfg, opt, std::cout);
  return r.stopped ? train::kStoppedExitCode : 0;
}

int run_sample(const SampleArgs& args) {
  train::SampleOptions opt;
  opt.checkpoint = args.checkpoint;
  opt.adapter = args.adapter;
  opt.prompts = args.prompts;
  if (!args.prompts_file.empty()) {
    std::ifstream in(args.prompts_file);
    FORGE_CHECK(in.good(), "sample: cannot read --prompts-file '", args.prompts_file, "'");
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) opt.prompts.push_back(line);
    FORGE_CHECK(!opt.prompts.empty() || !args.prompts.empty(), "sample: --prompts-file '", args.prompts_file,
                "' has no prompt (one per line)");
  }
  opt.tokens = args.tokens;
  opt.temperature = args.temperature;
  opt.top_k = args.top_k;
  opt.top_p = args.top_p;
  opt.stop = args.stop;
  opt.seed = args.seed;
  opt.kv_cache = !args.no_kv_cache;
  opt.device = args.device;
  opt.dtype = args.dtype;
  const train::SampleResult r = train::sample(opt);
  const std::vector<std::string> prompts = opt.prompts.empty() ? std::vector<std::string>{""} : opt.prompts;
  char rate[128];
  std::snprintf(rate, sizeof(rate), "%.1f tok/s (first token after %.3f s, then %.1f tok/s)", r.tokens_per_s,
                r.first_token_seconds, r.decode_tokens_per_s);
  std::cerr << "forge sample: " << r.checkpoint << " (step " << r.step << "), " << prompts.size() << " prompt(s), up to "
            << args.tokens << " tokens, temperature " << args.temperature
            << (args.top_k > 0 ? ", top-k " + std::to_string(args.top_k) : std::string())
            << (args.top_p < 1 ? ", top-p " + std::to_string(args.top_p) : std::string()) << ", seed " << args.seed
            << (args.no_kv_cache ? ", no KV cache" : "") << "; " << rate << "\n";
  if (args.json) {
    nlohmann::json j = {{"checkpoint", r.checkpoint}, {"step", r.step}, {"tokens_per_s", r.tokens_per_s},
                        {"first_token_seconds", r.first_token_seconds},
                        {"decode_tokens_per_s", r.decode_tokens_per_s}, {"kv_cache", !args.no_kv_cache},
                        {"seconds", r.seconds}, {"samples", nlohmann::json::array()}};
    for (size_t k = 0; k < r.completions.size(); ++k)
      j["samples"].push_back({{"prompt", prompts[k]}, {"completion", r.completions[k]}, {"new_tokens", r.new_tokens[k]}});
    // (A completion may hold invalid UTF-8, a byte-level model's partial character: replaced by U+FFFD.)
    std::cout << j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
    return 0;
  }
  for (size_t k = 0; k < r.completions.size(); ++k) {
    if (k > 0) std::cout << "\n---\n";
    std::cout << prompts[k] << r.completions[k];
  }
  std::cout << std::endl;
  return 0;
}

int run_eval(const EvalArgs& args) {
  const train::EvalResult r = train::evaluate({.checkpoint = args.checkpoint, .adapter = args.adapter, .files = args.files, .tasks = args.tasks,
                                               .max_examples = args.max_examples, .batch = args.batch,
                                               .device = args.device, .dtype = args.dtype});
  if (args.json) {
    nlohmann::json j = {{"checkpoint", r.checkpoint}, {"step", r.step}, {"files", nlohmann::json::array()},
                        {"tasks", nlohmann::json::array()}};
    for (const auto& f : r.files)
      j["files"].push_back({{"file", f.file}, {"documents", f.documents}, {"tokens", f.tokens}, {"loss", f.loss},
                            {"perplexity", f.perplexity}});
    for (const auto& t : r.tasks)
      j["tasks"].push_back({{"task", t.task}, {"file", t.file}, {"examples", t.examples}, {"acc", t.acc},
                            {"acc_norm", t.acc_norm}});
    std::cout << j.dump(1) << std::endl;
    return 0;
  }
  std::cout << "forge eval: " << r.checkpoint << " (step " << r.step << ")\n";
  char buf[512];
  for (const auto& f : r.files) {
    std::snprintf(buf, sizeof(buf), "  %s: loss %.4f, perplexity %.2f (%lld tokens, %lld documents)\n", f.file.c_str(),
                  f.loss, f.perplexity, static_cast<long long>(f.tokens), static_cast<long long>(f.documents));
    std::cout << buf;
  }
  for (const auto& t : r.tasks) {
    std::snprintf(buf, sizeof(buf), "  %s: acc %.4f, acc_norm %.4f (%lld examples)\n", t.task.c_str(), t.acc,
                  t.acc_norm, static_cast<long long>(t.examples));
    std::cout << buf;
  }
  std::cout << std::flush;
  return 0;
}

int run_plot(const PlotArgs& args) {
  std::vector<std::filesystem::path> runs(args.runs.begin(), args.runs.end());
  // Note [nothing deletes what it did not write]: an SVG of forge plot's, or --force.
  io::check_output_file(args.out, "plot: --out", [](std::string_view head) {
    return head.find("<!-- forge plot -->") != std::string_view::npos;
  }, args.force);
  const auto panels = telemetry::plot_panels(runs);
  io::write_file_atomic(args.out, telemetry::plot_svg(panels));
  std::cout << "forge plot: " << runs.size() << " run(s), " << panels.size() << " panel(s) -> " << args.out << std::endl;
  return 0;
}

int run_top(const TopArgs& args) {
  FORGE_CHECK(args.interval > 0, "top: --interval must be > 0 seconds, got ", args.interval);
  // The GPM figures are over a window inside each refresh (at most half a second), so a frame
  // still comes every --interval seconds.
  const double window = std::min(0.5, args.interval / 2);
  for (int64_t n = 0;; ++n) {
    const bench::TopSnapshot s = bench::top_snapshot(window);
    if (s.gpus.empty()) {
      std::cerr << "forge top: no GPU to show (" << s.note << ")" << std::endl;
      if (args.json)  // a reader of stdout gets a JSON object as always
        std::cout << nlohmann::json{{"error", "no GPU to show"}, {"reason", s.note}, {"gpus", nlohmann::json::array()}}.dump()
                  << std::endl;
      return bench::kNoGpuStatus;
    }
    if (args.json) {
      std::cout << bench::top_json(s).dump(args.once ? 1 : -1) << std::endl;
    } else {
      if (!args.once) std::cout << "\033[H\033[2J";  // clear the terminal for the next frame
      std::cout << bench::top_table(s) << std::flush;
    }
    if (args.once || (args.count > 0 && n + 1 >= args.count)) return 0;
    std::this_thread::sleep_for(std::chrono::duration<double>(args.interval - window));
  }
}

int run_export(const ExportArgs& args) {
  const int64_t shard = io::parse_byte_size(args.max_shard_size, "export: --max-shard-size");
  const train::ExportResult r = train::export_model(
      {.checkpoint = args.checkpoint, .out = args.out, .dtype = args.dtype, .max_shard_bytes = shard, .force = args.force,
       .merge = args.merge});
  std::string files;  // the shards as one item
  int64_t shards = 0;
  for (const auto& f : r.files) {
    if (f.rfind("model-", 0) == 0 && shards++ > 0) continue;
    files += (files.empty() ? "" : ", ") + (f.rfind("model-", 0) == 0 ? std::string("SHARDS") : f);
  }
  if (shards > 0) files.replace(files.find("SHARDS"), 6, std::to_string(shards) + " shards model-*.safetensors");
  std::cout << "forge export: " << r.checkpoint << " (step " << r.step << ") -> " << args.out << ": " << r.tensors
            << " tensors, " << r.parameters << " parameters (" << files << ")" << std::endl;
  return 0;
}

namespace {

std::vector<std::string> expand_files(const std::vector<std::string>& files, const std::vector<std::string>& exclude) {
  train::DataSection d;
  d.files = files;
  d.exclude = exclude;
  try {
    return train::resolve_data_files(d);
  } catch (const Error& e) {
    std::string msg = e.what();
    const std::string prefix = "data.files";  // on the command line these are the FILES arguments
    if (msg.rfind(prefix, 0) == 0) msg = "FILES" + msg.substr(prefix.size());
    throw Error(msg);
  }
}

}  // namespace

int run_tokenize_train(const TokenizeTrainArgs& args) {
  FORGE_CHECK(args.vocab_size >= 256, "--vocab-size ", args.vocab_size,
              " is smaller than 256 (a byte-level BPE vocabulary starts with the 256 bytes); use e.g. --vocab-size 1024");
  // Note [nothing deletes what it did not write]: a forge BPE file, or --force.
  io::check_output_file(args.out, "tokenize train: --out", [](std::string_view head) {
    return head.find("\"format\"") != std::string_view::npos && head.find("\"forge-bpe\"") != std::string_view::npos;
  }, args.force);
  const auto files = expand_files(args.files, args.exclude);
  const auto t0 = std::chrono::steady_clock::now();
  data::BpeTrainOptions opt;
  opt.vocab_size = args.vocab_size;
  opt.text_key = args.text_key;
  // As forge train's tokenizer (data.eos_token = "auto"): "<|endoftext|>" unless the command names
  // its own special tokens ("" alone: none).
  if (args.special_tokens.empty()) opt.special_tokens = {train::kDefaultEosToken};
  for (const std::string& t : args.special_tokens)
    if (!t.empty()) opt.special_tokens.push_back(t);
  const auto tok = data::BpeTokenizer::train_files(files, opt);
  tok.save(args.out);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("trained a byte-level BPE of %lld tokens (%lld merges) on %zu file(s) in %.1f s -> %s\n",
              static_cast<long long>(tok.vocab_size()), static_cast<long long>(tok.num_merges()), files.size(), s,
              args.out.c_str());
  return 0;
}

int run_tokenize_encode(const TokenizeEncodeArgs& args) {
  // Note [nothing deletes what it did not write]: a new or empty directory, one of earlier shards
  // (shard_NNNNN.bin, which this run may overwrite), or --force.
  io::check_output_dir(args.out, "tokenize encode: --out", train::is_shard_file_name, args.force);
  const auto files = expand_files(args.files, args.exclude);
  const auto tok = data::load_tokenizer(args.tokenizer);
  // "auto" (the default, as data.eos_token's in forge train): the tokenizer's end-of-text token.
  const bool auto_eos = args.eos_token == train::kAutoEosToken;
  const std::string eos = auto_eos ? tok->eos_token().value_or("") : args.eos_token;
  if (!eos.empty() && !tok->token_id(eos)) {
    const auto sp = tok->special_tokens();
    FORGE_THROW("--eos-token \"", eos, "\" is not a special token of ", args.tokenizer, " (",
                tok->describe(), ", ", sp.size(), " special token(s)); give one of its special tokens (",
                sp.empty() ? std::string("it has none") : "e.g. \"" + sp.front() + "\"",
                "), train the tokenizer with --special-token \"", eos, "\", or --eos-token \"\" for none");
  }
  std::cout << "tokenizer: " << args.tokenizer << ", " << tok->describe() << "\n";
  std::cout << (eos.empty() ? std::string(auto_eos ? "the tokenizer has no end-of-text token: documents are joined as "
                                                     "they are (--eos-token names one)"
                                                   : "documents are joined as they are (--eos-token \"\")")
                            : "every document ends with \"" + eos + "\"")
            << "\n";
  const auto shards = train::encode_files_to_shards(*tok, files, args.out, &std::cout, args.text_key, eos);
  std::printf("wrote %zu shard(s) to %s\n", shards.size(), args.out.c_str());
  return 0;
}

int run_tokenize_ids(const TokenizeIdsArgs& args) {
  const auto tok = data::load_tokenizer(args.tokenizer);
  FORGE_CHECK(args.text.has_value() != !args.files.empty(), "forge tokenize ids: give either --text or FILES");
  auto print = [&](const std::string& text) {
    const auto ids = args.ordinary ? tok->encode_ordinary(text) : tok->encode(text);
    std::cout << '[';
    for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? "," : "") << ids[i];
    std::cout << "]\n";
  };
  if (args.text) print(*args.text);
  for (const auto& f : args.files) print(io::read_file(f));
  return 0;
}

int run_tokenize_decode(const TokenizeDecodeArgs& args) {
  const auto tok = data::load_tokenizer(args.tokenizer);
  FORGE_CHECK(args.ids.empty() != args.shard.empty(), "forge tokenize decode: give either --ids or a SHARD");
  const std::vector<int32_t> ids = args.shard.empty() ? args.ids : data::TokenShard(args.shard).to_vector();
  std::cout << tok->decode(ids) << std::flush;
  return 0;
}

}  // namespace forge::app
