// forge plan: parses the command line into a plan::PlanInput and prints a plan, a layout
// search or a model summary (src/forge/plan; every formula in docs/plan.md).
#include "plan_command.h"

#include <CLI/CLI.hpp>
#include <cmath>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>

#include "forge/core/error.h"
#include "forge/parallel/layout.h"
#include "forge/plan/cpu_device.h"
#include "forge/plan/names.h"
#include "forge/plan/plan.h"
#include "forge/plan/report.h"
#include "forge/run/config.h"
#include "forge/run/layout.h"
#include "forge/run/run_chat_data.h"
#include "forge/nn/lora.h"
#include "forge/run/run_model_spec.h"

namespace forge::app {

namespace {

struct PlanArgs {
  // model
  std::string model, model_flag, config;
  std::string arch;
  int64_t layers = 0, width = 0, heads = 0, kv_heads = 0, ffn = 0, vocab = 0, seq = 0, context = 0;
  bool no_bias = false;
  int64_t lora_rank = 0;
  std::vector<std::string> lora_targets;
  // data
  std::string tokens, batch_tokens;
  int64_t batch = 0, micro_batch = 0, grad_accum = 0;
  // hardware
  std::string gpu;
  int64_t gpus = 0, gpus_per_node = 8;
  double nvlink = 0, pcie = 0, ib = 25, link_efficiency = 0.8, host_bw = 25, peak_tflops = 0, mfu = 0.4;
  std::string profile;  // --profile
  // training
  std::string precision, optimizer = "adamw", activations, attention = "flash", checkpointing, schedule = "1f1b";
  bool dropout = false;
  double margin = -1, reserve_gb = -1;
  // layout
  int64_t dp = 0, tp = 0, pp = 0, cp = 0, virtual_stages = 2;
  std::string cp_kind;
  std::string dp_reduce;
  std::string grad_compression;
  int64_t powersgd_rank = 4;
  int zero = 0;
  bool offload = false, sp = true;
  // cost
  double price_hour = -1, price_gpu = -1, price_server = 0, power_w = 0, pue = 1.2, electricity = 0.12, years = 4,
         utilisation = 0.8;
  // output
  bool search = false, all = false, json = false, summary = false, expand = false, list_gpus = false,
       list_models = false;
  size_t top = 15;

  CLI::App* cmd = nullptr;
  bool given(const char* name) const { return cmd->get_option(name)->count() > 0; }
};

PlanArgs& args() {
  static PlanArgs a;
  return a;
}

constexpr const char* kFooter =
    "Examples:\n"
    "  forge plan llama2-7b --tokens 2T --gpu h100 --gpus 64 --search\n"
    "  forge plan --arch llama --layers 32 --width 5120 --heads 40 --vocab 32000 --seq 4096 --tokens 200B \\\n"
    "             --gpu a100-80gb --gpus 64 --tp 4 --pp 2 --micro-batch 2 --zero 1 --checkpointing full\n"
    "  forge plan gpt2 --gpu h100 --gpus 1 --micro-batch 16 --tokens 10B\n"
    "  forge plan --config configs/tiny.toml --gpu cpu          (the CPU demo, forge's activation model)\n"
    "  forge plan llama3-8b --summary                           (per-module shapes, parameters, FLOPs)\n"
    "Every formula, its source and the validation against forge's own runs: docs/plan.md.";

// Chat SFT's data (train::summarize_chat_data) beside the plan: how many rows the conversations
// fill, what share of the computed tokens the loss covers, and how many epochs train.steps is.
struct SftFigures {
  double fill = 0, trained_share = 0, rows_trained = 0, epochs = 0, steps_per_epoch = 0, epoch_s = 0;
};
SftFigures sft_figures(const train::ChatDataSummary& s, const train::RunConfig& cfg, const plan::PlanResult& r) {
  SftFigures f;
  const double positions = static_cast<double>(s.rows) * static_cast<double>(s.seq_len);
  // A conversation of n tokens takes n - 1 positions (Note [chat rows]).
  f.fill = positions > 0 ? static_cast<double>(s.train_tokens - s.train_conversations) / positions : 0;
  f.trained_share = positions > 0 ? static_cast<double>(s.trained_targets) / positions : 0;
  f.rows_trained = static_cast<double>(cfg.train.steps * cfg.train.batch_size);
  f.epochs = s.rows > 0 ? f.rows_trained / static_cast<double>(s.rows) : 0;
  f.steps_per_epoch = static_cast<double>(s.rows) / static_cast<double>(std::max<int64_t>(1, cfg.train.batch_size));
  f.epoch_s = f.steps_per_epoch * r.time.step;
  return f;
}

std::string format_sft(const train::ChatDataSummary& s, const train::RunConfig& cfg, const plan::PlanResult& r) {
  const SftFigures f = sft_figures(s, cfg, r);
  auto n = [](int64_t v) { return plan::with_commas(v); };
  std::ostringstream o;
  o << "\nchat SFT (data.format = \"chat\", train_on = \"" << cfg.data.train_on
    << "\"; the files encoded as the run encodes them)\n";
  o << "  conversations  " << n(s.encoded.conversations) << " in " << s.files << " file(s): " << n(s.train_conversations)
    << " train, " << n(s.val_conversations) << " validation";
  if (s.skipped > 0) o << "; " << n(s.skipped) << " skipped (no trained token left)";
  if (s.encoded.cut > 0)
    o << "; " << n(s.encoded.cut) << " cut at train.seq_len + 1 = " << s.seq_len + 1 << " tokens ("
      << n(s.encoded.trained_cut) << " trained tokens lost)";
  o << "\n";
  o << "  rows           " << n(s.rows) << " rows of " << s.seq_len << " positions, " << plan::fixed(100 * f.fill, 1)
    << "% filled by conversations (packed whole, each attending to itself)\n";
  o << "  trained        " << n(s.trained_targets) << " targets, " << plan::fixed(100 * f.trained_share, 1)
    << "% of the positions computed: the loss covers these, the step computes them all\n";
  o << "  epochs         train.steps " << cfg.train.steps << " x batch " << cfg.train.batch_size << " = "
    << n(static_cast<int64_t>(f.rows_trained)) << " rows = " << plan::fixed(f.epochs, 2) << " epochs"
    << (cfg.data.order == "random" ? " (rows drawn at random, with replacement)" : "") << "; one epoch = "
    << plan::fixed(f.steps_per_epoch, 1) << " steps, " << plan::duration(f.epoch_s) << " at this plan's step time\n";
  return o.str();
}

nlohmann::json sft_json(const train::ChatDataSummary& s, const train::RunConfig& cfg, const plan::PlanResult& r) {
  const SftFigures f = sft_figures(s, cfg, r);
  return {{"files", s.files},
          {"conversations", s.encoded.conversations},
          {"train_conversations", s.train_conversations},
          {"val_conversations", s.val_conversations},
          {"skipped", s.skipped},
          {"cut", s.encoded.cut},
          {"trained_tokens_cut", s.encoded.trained_cut},
          {"train_tokens", s.train_tokens},
          {"rows", s.rows},
          {"seq_len", s.seq_len},
          {"fill", f.fill},
          {"trained_targets", s.trained_targets},
          {"trained_share", f.trained_share},
          {"epochs", f.epochs},
          {"steps_per_epoch", f.steps_per_epoch},
          {"epoch_s", f.epoch_s}};
}

// The config's model. forge::train::load_config checks the data files too; a config whose
// data is not on this machine is read again with the data keys pointed at the config itself,
// which changes nothing plan reads but the vocabulary of an external tokenizer.
plan::ModelSpec model_from_config(const std::string& path, const std::vector<std::string>& overrides,
                                  train::RunConfig& cfg_out) {
  try {
    cfg_out = train::load_config(path, overrides);
  } catch (const Error& e) {
    const std::string msg = e.what();
    if (msg.rfind("data.", 0) != 0 && msg.find(": data.") == std::string::npos) throw;
    std::vector<std::string> o = overrides;
    o.push_back("--data.files=" + path);
    o.push_back("--data.exclude=");
    o.push_back("--data.tokenizer=");
    cfg_out = train::load_config(path, o);
    FORGE_CHECK(cfg_out.model.vocab_size > 0 || args().vocab > 0, "forge plan --config ", path,
                ": the config's data is not on this machine (", msg,
                ") and model.vocab_size = 0 takes the tokenizer's size; give --vocab");
    std::cerr << "forge plan: note: " << msg << " (ignored: plan reads only the model and batch)\n";
  }
  return train::model_spec_of(cfg_out);
}

int64_t pow2_at_most(double v) {
  int64_t p = 1;
  while (static_cast<double>(p * 2) <= v) p *= 2;
  return p;
}

}  // namespace

CLI::App* add_plan_command(CLI::App& app) {
  PlanArgs& a = args();
  auto* c = app.add_subcommand("plan", "the cost model of a training run: memory per GPU, time, GPU-hours, cost");
  a.cmd = c;
  c->footer(kFooter);
  c->add_option("preset", a.model, "a model preset (forge plan --list-models), e.g. gpt2, llama2-7b");
  c->add_option("--model", a.model_flag, "the same as the positional MODEL");
  c->add_option("--config", a.config, "a forge run config (TOML): its [model], batch and sequence length");
  c->add_option("--arch", a.arch, "gpt or llama (with --layers --width --heads: a model by its shape)");
  c->add_option("--layers", a.layers, "transformer blocks");
  c->add_option("--width", a.width, "model width h (GPT n_embd, LLaMA dim)");
  c->add_option("--heads", a.heads, "attention heads");
  c->add_option("--kv-heads", a.kv_heads, "LLaMA key/value heads (default: heads)");
  c->add_option("--ffn", a.ffn, "MLP width (default: 4h for GPT, 8h/3 rounded up to 32 for LLaMA)");
  c->add_option("--vocab", a.vocab, "vocabulary size");
  c->add_option("--seq", a.seq, "tokens per training sequence");
  c->add_option("--context", a.context, "the model's context (GPT's position table; default: seq)");
  c->add_flag("--no-bias", a.no_bias, "GPT without Linear/LayerNorm biases");
  c->add_option("--lora-rank", a.lora_rank, "LoRA: adapters of this rank, the base frozen (with --lora-targets)");
  c->add_option("--lora-targets", a.lora_targets, "LoRA: the adapted linears, as lora.targets names them (q,v; c_attn)")
      ->delimiter(',');

  c->add_option("--tokens", a.tokens, "training tokens, e.g. 2T, 300B, 1e12 (default: the config's run, else 20 per parameter)");
  c->add_option("--batch", a.batch, "global batch in sequences per optimizer step (default: the preset's or config's)");
  c->add_option("--batch-tokens", a.batch_tokens, "global batch in tokens, e.g. 4M (rounded to whole sequences)");
  c->add_option("--micro-batch", a.micro_batch, "sequences per micro-batch per GPU");
  c->add_option("--grad-accum", a.grad_accum, "micro-batches per step (default: batch / (micro-batch x dp))");

  c->add_option("--gpu", a.gpu, "the accelerator (forge plan --list-gpus), or cpu (default: h100; cpu for a CPU config)");
  c->add_option("--gpus", a.gpus, "number of GPUs (default: dp x tp x pp, else 1)");
  c->add_option("--gpus-per-node", a.gpus_per_node, "GPUs per server")->capture_default_str();
  c->add_option("--nvlink", a.nvlink, "intra-node GPU-GPU bandwidth, GB/s per GPU per direction (default: catalogue)");
  c->add_option("--pcie", a.pcie, "host link GB/s per direction; also the GPU-GPU link of cards without NVLink");
  c->add_option("--ib", a.ib, "network bandwidth per GPU across nodes, GB/s (25 = 200 Gb/s, 50 = 400 Gb/s)")
      ->capture_default_str();
  c->add_option("--link-efficiency", a.link_efficiency, "achievable fraction of link peaks in collectives")
      ->capture_default_str();
  c->add_option("--host-bw", a.host_bw, "host memory GB/s per GPU for an offloaded optimizer")->capture_default_str();
  c->add_option("--peak-tflops", a.peak_tflops, "override the device's dense peak (TFLOP/s) for the precision");
  c->add_option("--mfu", a.mfu,
                "plan the compute at this utilisation (model FLOPs / peak) instead of the GPU's efficiency profile")
      ->capture_default_str();
  c->add_option("--profile", a.profile,
                "an efficiency profile (JSON from forge bench calibrate) to price each kernel, or none; default: the "
                "GPU's shipped profile (forge plan --list-gpus says which ship)");

  c->add_option("--precision", a.precision, "fp32, tf32, bf16, fp16 or fp8 (default: bf16 on GPUs, fp32 on the CPU)");
  c->add_option("--optimizer", a.optimizer, "adamw or sgd (with momentum)")->capture_default_str();
  c->add_option("--activations", a.activations,
                "activation model: forge (what forge's autograd keeps; the default) or megatron (Korthikanti et al.)");
  c->add_option("--attention", a.attention, "flash (no s x s matrix kept) or naive")->capture_default_str();
  c->add_flag("--dropout", a.dropout, "count dropout masks (GPT)");
  c->add_option("--margin", a.margin, "allocator margin, a fraction of the memory (default 0.10 on GPUs, 0 on the CPU)");
  c->add_option("--reserve-gb", a.reserve_gb, "memory outside the allocator: CUDA context, workspaces (default 1; CPU 0)");

  c->add_option("--dp", a.dp, "data-parallel degree (default: gpus / (tp x pp x cp))");
  c->add_option("--tp", a.tp, "tensor-parallel degree (default 1)");
  c->add_option("--pp", a.pp, "pipeline stages (default 1)");
  c->add_option("--cp", a.cp, "context-parallel degree: GPUs that each hold 1/cp of every sequence (default: a config's dist.cp, else 1)");
  c->add_option("--dp-reduce", a.dp_reduce,
                "data-parallel reductions: flat or hierarchical (within each node first); default: a config's "
                "dist.dp_reduce, else flat; --search tries both where the data-parallel group spans nodes");
  c->add_option("--grad-compression", a.grad_compression,
                "how the data-parallel gradient reductions travel: none, fp8 or powersgd (default: a config's "
                "dist.grad_compression, else none; --search keeps it: compression changes the numbers)");
  c->add_option("--powersgd-rank", a.powersgd_rank, "--grad-compression powersgd: the rank r (default: a config's, else 4)");
  c->add_option("--cp-kind", a.cp_kind, "context parallelism's attention: ring or ulysses (default: a config's dist.cp_kind, else ring)");
  c->add_option("--zero", a.zero, "ZeRO stage 0-3 over the data-parallel group")->capture_default_str();
  c->add_flag("--offload", a.offload, "optimizer state and step in host memory (ZeRO-Offload)");
  c->add_option("--checkpointing", a.checkpointing, "activation checkpointing: none, selective or full");
  c->add_flag("--sp,!--no-sp", a.sp, "sequence parallelism with tp > 1 (default: a config's dist.sequence_parallel, else on)");
  c->add_option("--schedule", a.schedule, "pipeline schedule: 1f1b, gpipe, zb-h1 or interleaved (default: a config's dist.pp_schedule)")->capture_default_str();
  c->add_option("--virtual-stages", a.virtual_stages, "--schedule interleaved: model chunks per pipeline rank (>= 2)")
      ->capture_default_str();

  c->add_option("--price-hour", a.price_hour, "rent: USD per GPU-hour (default: the catalogue's indicative price)");
  c->add_option("--price-gpu", a.price_gpu, "buy: USD per GPU (default: the catalogue's indicative price)");
  c->add_option("--price-server", a.price_server, "buy: USD per server of --gpus-per-node GPUs (instead of --price-gpu)");
  c->add_option("--power-w", a.power_w, "watts per GPU with its share of the server (default 1.5 x TDP)");
  c->add_option("--pue", a.pue, "data-centre power usage effectiveness")->capture_default_str();
  c->add_option("--electricity", a.electricity, "USD per kWh")->capture_default_str();
  c->add_option("--years", a.years, "service life of bought GPUs")->capture_default_str();
  c->add_option("--utilisation", a.utilisation, "fraction of that life the GPUs are busy")->capture_default_str();

  c->add_flag("--search", a.search, "every layout of --gpus GPUs that fits, ranked by time (flags given fix a dimension)");
  c->add_option("--top", a.top, "layouts shown by --search")->capture_default_str();
  c->add_flag("--all", a.all, "--search: list every rejected layout with its reason");
  c->add_flag("--summary", a.summary, "per-module output shapes, parameters and forward FLOPs (like torchinfo)");
  c->add_flag("--expand-blocks", a.expand, "--summary: list every block, not only the first");
  c->add_flag("--json", a.json, "print JSON instead of tables");
  c->add_flag("--list-gpus", a.list_gpus, "the GPU catalogue with its sources");
  c->add_flag("--list-models", a.list_models, "the model presets");
  return c;
}

int run_plan(const std::vector<std::string>& overrides) {
  using namespace forge::plan;
  PlanArgs& a = args();
  if (a.list_gpus || a.list_models) {
    if (a.json) {
      nlohmann::json j = nlohmann::json::object();
      if (a.list_gpus) {
        for (const auto& g : gpu_catalog())
          j["gpus"].push_back({{"name", g.name},           {"aliases", g.aliases},       {"memory_gb", g.memory_gb},
                               {"memory_bw_gbs", g.memory_bw_gbs}, {"fp32_tflops", g.fp32_tflops},
                               {"tf32_tflops", g.tf32_tflops},     {"bf16_tflops", g.bf16_tflops},
                               {"fp16_tflops", g.fp16_tflops},     {"fp8_tflops", g.fp8_tflops},
                               {"nvlink_gbs", g.nvlink_gbs},       {"pcie_gbs", g.pcie_gbs},
                               {"tdp_w", g.tdp_w},                 {"rent_per_hour", g.rent_per_hour},
                               {"price_usd", g.price_usd},         {"source", g.source},
                               {"profile", shipped_profile(g) ? to_json(*shipped_profile(g)) : nlohmann::json(nullptr)}});
      }
      if (a.list_models) {
        for (const auto& p : presets())
          j["models"].push_back({{"name", p.name},
                                 {"aliases", p.aliases},
                                 {"description", p.spec.describe()},
                                 {"parameters", count_parameters(p.spec).total},
                                 {"source", p.source}});
      }
      std::cout << j.dump(2) << "\n";
    } else {
      if (a.list_models) std::cout << format_presets();
      if (a.list_gpus) std::cout << (a.list_models ? "\n" : "") << format_gpu_catalog();
    }
    return 0;
  }

  // ---- the model --------------------------------------------------------------------------------
  FORGE_CHECK(a.model.empty() || a.model_flag.empty() || a.model == a.model_flag, "forge plan: two models given ('",
              a.model, "' and --model '", a.model_flag, "')");
  const std::string preset_name = a.model.empty() ? a.model_flag : a.model;
  FORGE_CHECK(preset_name.empty() || a.config.empty(), "forge plan: give a preset (", preset_name, ") or --config (",
              a.config, "), not both");
  FORGE_CHECK(overrides.empty() || !a.config.empty(), "config overrides (", overrides.empty() ? "" : overrides.front(),
              ") need --config");
  ModelSpec m;
  int64_t default_batch = 0, default_micro_batch = 0, default_grad_accum = 0;
  train::RunConfig config;          // --config's, resolved
  parallel::Layout config_layout;  // a config's own [dist] keys: the defaults of --tp, --pp, --zero, --offload
  double default_tokens = 0;
  bool cpu_config = false, config_checkpointing = false, data_given = false;
  const bool shape_given = a.given("--layers") || a.given("--width") || a.given("--heads");
  if (!preset_name.empty()) {
    const Preset& p = find_preset(preset_name);
    m = p.spec;
    default_batch = p.default_batch;
  } else if (!a.config.empty()) {
    train::RunConfig& cfg = config;
    m = model_from_config(a.config, overrides, cfg);
    // Note [global batch]: train.batch_size is the batch of an optimizer step; with one data-parallel
    // rank a micro-batch is batch_size / grad_accum.
    default_batch = cfg.train.batch_size;
    default_grad_accum = cfg.train.grad_accum;
    data_given = cfg.data.source == "files";
    default_micro_batch = cfg.train.batch_size / std::max<int64_t>(1, cfg.train.grad_accum);
    config_layout.tp = cfg.dist.tp;
    config_layout.pp = cfg.dist.pp;
    config_layout.cp = cfg.dist.cp;
    train::set_reduction_keys(cfg, config_layout);
    config_layout.cp_kind = cfg.dist.cp_kind == "ulysses" ? parallel::ContextKind::ulysses : parallel::ContextKind::ring;
    config_layout.zero = static_cast<int>(cfg.dist.zero_stage);
    config_layout.offload = cfg.dist.offload_optimizer;
    config_layout.sequence_parallel = cfg.dist.sequence_parallel;
    config_layout.schedule = parse_schedule(cfg.dist.pp_schedule);
    config_layout.virtual_stages = cfg.dist.pp_virtual_stages;
    default_tokens = static_cast<double>(cfg.train.steps * default_batch * cfg.train.seq_len);
    // Where the config trains: "cpu"; "auto" is the CPU in a build without CUDA.
#ifdef FORGE_WITH_CUDA
    cpu_config = cfg.run.device == "cpu";
#else
    cpu_config = cfg.run.device == "cpu" || cfg.run.device == "auto";
#endif
    // Several GPUs asked for: "auto" means the GPUs of that job, whatever this build can run.
    if (cfg.run.device == "auto" && a.given("--gpus") && a.gpus > 1) cpu_config = false;
    config_checkpointing = cfg.model.checkpoint_activations;
  } else {
    FORGE_CHECK(shape_given, "forge plan: which model? Give a preset (forge plan --list-models), --config FILE.toml, "
                             "or the shape: --arch gpt|llama --layers N --width H --heads A [--kv-heads --ffn --vocab --seq]");
    FORGE_CHECK(a.given("--layers") && a.given("--width") && a.given("--heads"),
                "forge plan: a model by its shape needs --layers, --width and --heads (missing: ",
                !a.given("--layers") ? "--layers " : "", !a.given("--width") ? "--width " : "",
                !a.given("--heads") ? "--heads" : "", ")");
    m.name = "custom";
    m.arch = a.arch.empty() || normalize_name(a.arch) == "gpt" ? Arch::gpt : Arch::llama;
    if (!a.arch.empty()) {
      const std::string n = normalize_name(a.arch);
      FORGE_CHECK(n == "gpt" || n == "llama", "--arch must be gpt or llama, got '", a.arch, "'");
    }
    m.vocab_size = m.arch == Arch::gpt ? 50257 : 32000;
    m.seq_len = m.block_size = m.arch == Arch::gpt ? 1024 : 4096;
    m.bias = m.arch == Arch::gpt;
  }
  // Explicit shape flags override a preset's or config's.
  if (!a.arch.empty() && (!preset_name.empty() || !a.config.empty())) {
    const std::string n = normalize_name(a.arch);
    FORGE_CHECK(n == "gpt" || n == "llama", "--arch must be gpt or llama, got '", a.arch, "'");
    m.arch = n == "gpt" ? Arch::gpt : Arch::llama;
  }
  if (a.given("--layers")) m.n_layer = a.layers;
  if (a.given("--width")) m.d_model = a.width;
  if (a.given("--heads")) m.n_head = a.heads;
  // K/V heads: given, else a preset's or config's (LLaMA GQA), else = heads.
  const bool from_file = !preset_name.empty() || !a.config.empty();
  if (a.given("--kv-heads")) m.n_kv_head = a.kv_heads;
  else if (m.arch == Arch::gpt || !from_file) m.n_kv_head = m.n_head;
  if (a.given("--ffn")) m.ffn_hidden = a.ffn;
  else if (a.given("--width")) m.ffn_hidden = nn::default_ffn_hidden(m.arch, m.d_model);
  if (a.given("--vocab")) m.vocab_size = a.vocab;
  if (a.given("--seq")) {
    m.seq_len = a.seq;
    if (!a.given("--context")) m.block_size = std::max(m.block_size, a.seq);
  }
  if (a.given("--context")) m.block_size = a.context;
  if (a.no_bias) m.bias = false;
  if (m.arch == Arch::llama) m.bias = false;
  // LoRA (nn/lora.h): given here, else the config's [lora].
  if (a.given("--lora-rank") || a.given("--lora-targets")) {
    FORGE_CHECK(a.lora_rank > 0 && !a.lora_targets.empty(), "--lora-rank R and --lora-targets T,... go together (R > "
                "0; targets as lora.targets names them: docs/lora.md)");
    m.lora_rank = a.lora_rank;
    m.lora_roles = nn::lora_roles(m.arch, a.lora_targets);
  }
  if (shape_given && preset_name.empty() && a.config.empty()) m.name = "custom";
  else if (shape_given) m.name += " (modified)";
  m.validate();

  if (a.summary) {
    const Summary s = summarize(m, a.micro_batch > 0 ? a.micro_batch : 1, a.expand);
    if (a.json) {
      nlohmann::json rows = nlohmann::json::array();
      for (const auto& r : s.rows)
        rows.push_back({{"name", r.name}, {"type", r.type}, {"depth", r.depth}, {"shape", r.shape}, {"params", r.params},
                        {"flops", r.flops}, {"leaf", r.leaf}, {"note", r.note}});
      std::cout << nlohmann::json{{"model", m.describe()}, {"batch", s.batch}, {"rows", rows},
                                  {"total_params", s.total_params}, {"total_flops", s.total_flops}}
                       .dump(2)
                << "\n";
    } else {
      std::cout << format_summary(m, s);
    }
    return 0;
  }

  // ---- the hardware ---------------------------------------------------------------------------
  const bool on_cpu = normalize_name(a.gpu) == "cpu" || (a.gpu.empty() && cpu_config);
  if (a.gpu.empty() && !a.config.empty())
    std::cerr << "forge plan: no --gpu: planning on " << (on_cpu ? "the cpu, where the config trains" : "an H100 SXM")
              << " (--gpu NAME chooses)\n";
  GpuSpec gpu = on_cpu ? cpu_device(a.peak_tflops) : find_gpu(a.gpu.empty() ? "h100" : a.gpu);
  PlanInput in;
  in.data_given = data_given;
  // A config's run.fp8 (a recipe) plans FP8 on a GPU (Note [FP8 in the plan]).
  const bool config_fp8 = !a.config.empty() && config.run.fp8 != "off";
  in.setup.precision = !a.precision.empty() ? parse_precision(a.precision)
                       : on_cpu             ? Precision::fp32
                       : config_fp8         ? Precision::fp8
                                            : Precision::bf16;
  if (a.peak_tflops > 0 && !on_cpu) {
    switch (in.setup.precision) {
      case Precision::fp32: gpu.fp32_tflops = a.peak_tflops; break;
      case Precision::tf32: gpu.tf32_tflops = a.peak_tflops; break;
      case Precision::bf16: gpu.bf16_tflops = a.peak_tflops; break;
      case Precision::fp16: gpu.fp16_tflops = a.peak_tflops; break;
      case Precision::fp8: gpu.fp8_tflops = a.peak_tflops; break;
    }
  }
  FORGE_CHECK(!a.given("--tp") || a.tp >= 1, "--tp must be >= 1, got ", a.tp);
  FORGE_CHECK(!a.given("--pp") || a.pp >= 1, "--pp must be >= 1, got ", a.pp);
  FORGE_CHECK(!a.given("--dp") || a.dp >= 1, "--dp must be >= 1, got ", a.dp);
  FORGE_CHECK(!a.given("--cp") || a.cp >= 1, "--cp must be >= 1, got ", a.cp);
  FORGE_CHECK(!a.given("--dp-reduce") || a.dp_reduce == "flat" || a.dp_reduce == "hierarchical", "--dp-reduce '",
              a.dp_reduce, "' is unknown; use flat or hierarchical");
  FORGE_CHECK(!a.given("--grad-compression") || a.grad_compression == "none" || a.grad_compression == "fp8" ||
                  a.grad_compression == "powersgd",
              "--grad-compression '", a.grad_compression, "' is unknown; use none, fp8 or powersgd");
  FORGE_CHECK(!a.given("--powersgd-rank") || a.powersgd_rank >= 1, "--powersgd-rank must be >= 1, got ", a.powersgd_rank);
  FORGE_CHECK(!a.given("--cp-kind") || a.cp_kind == "ring" || a.cp_kind == "ulysses", "--cp-kind '", a.cp_kind,
              "' is unknown; use ring or ulysses");
  const int64_t tp = a.given("--tp") ? a.tp : config_layout.tp, pp = a.given("--pp") ? a.pp : config_layout.pp;
  const int64_t cp = a.given("--cp") ? a.cp : config_layout.cp;
  int64_t gpus = a.gpus;
  if (!a.given("--gpus")) gpus = (a.given("--dp") ? a.dp : 1) * tp * pp * cp;
  FORGE_CHECK(gpus >= 1, "--gpus must be >= 1, got ", gpus);
  in.cluster = make_cluster(gpu, gpus, a.gpus_per_node);
  if (a.given("--nvlink")) in.cluster.intra_gbs = a.nvlink, in.cluster.intra_name = "NVLink";
  if (a.given("--pcie")) {
    in.cluster.pcie_gbs = a.pcie;
    if (gpu.nvlink_gbs <= 0 && !a.given("--nvlink")) in.cluster.intra_gbs = a.pcie;
  }
  in.cluster.inter_gbs = a.ib;
  in.cluster.link_efficiency = a.link_efficiency;
  in.cluster.host_gbs = a.host_bw;
  FORGE_CHECK(a.link_efficiency > 0 && a.link_efficiency <= 1, "--link-efficiency must be in (0, 1], got ",
              a.link_efficiency);

  // ---- training -------------------------------------------------------------------------------
  in.model = m;
  in.mfu = a.mfu;
  // Note [efficiency profiles]: --profile FILE (forge bench calibrate's), else the GPU's shipped
  // profile unless --mfu or --peak-tflops asks for the single-utilisation model (or none ships).
  if (!a.profile.empty() && normalize_name(a.profile) != "none") {
    FORGE_CHECK(!on_cpu, "--profile: the CPU is planned at its measured f32 peak and --mfu, not from a GPU profile");
    in.profile = read_profile(a.profile);
    FORGE_CHECK(in.profile->gpu == gpu.name, "--profile '", a.profile, "' describes the ", in.profile->gpu,
                ", not the ", gpu.name, " being planned; pass --gpu for its GPU");
  } else if (a.profile.empty() && !on_cpu && !a.given("--mfu") && a.peak_tflops <= 0) {
    if (const GpuProfile* p = shipped_profile(gpu)) in.profile = *p;
  }
  in.setup.optimizer = parse_optimizer(a.optimizer);
  if (!a.activations.empty()) {
    const std::string n = normalize_name(a.activations);
    FORGE_CHECK(n == "megatron" || n == "forge", "--activations must be megatron or forge, got '", a.activations, "'");
    in.setup.activations.model = n == "forge" ? ActivationModel::forge : ActivationModel::megatron;
  } else {
    // forge's own saved-tensor lists: within 5% of every forge run measured (2 x H200: DDP, tp,
    // each pipeline stage; the CPU: tp), where Korthikanti et al.'s count was 7-24% below the
    // pipeline and tensor-parallel runs (docs/plan.md, Validation).
    in.setup.activations.model = ActivationModel::forge;
  }
  {
    const std::string n = normalize_name(a.attention);
    FORGE_CHECK(n == "flash" || n == "naive", "--attention must be flash or naive, got '", a.attention, "'");
    in.setup.activations.attention = n == "flash" ? AttentionKind::flash : AttentionKind::naive;
  }
  in.setup.activations.dropout = a.dropout;
  in.setup.margin = a.margin >= 0 ? a.margin : on_cpu ? 0.0 : 0.10;
  in.setup.reserve_bytes = (a.reserve_gb >= 0 ? a.reserve_gb : on_cpu ? 0.0 : 1.0) * 1e9;

  // Batch: --batch, --batch-tokens, the preset's or config's, else about 1M tokens.
  FORGE_CHECK(!(a.given("--batch") && a.given("--batch-tokens")), "give --batch or --batch-tokens, not both");
  int64_t batch = 0;
  if (a.given("--batch")) batch = a.batch;
  else if (a.given("--batch-tokens"))
    batch = std::max<int64_t>(1, std::llround(parse_count(a.batch_tokens, "--batch-tokens") / static_cast<double>(m.seq_len)));
  else if (default_batch > 0) batch = default_batch;
  else batch = pow2_at_most(std::max(1.0, 1048576.0 / static_cast<double>(m.seq_len)));
  in.global_batch = batch;
  const ParamCount pc = count_parameters(m);
  const bool default_tokens_used = !a.given("--tokens");
  in.tokens = a.given("--tokens") ? parse_count(a.tokens, "--tokens")
              : default_tokens > 0 ? default_tokens
                                   : 20.0 * static_cast<double>(pc.total);

  // ---- cost -----------------------------------------------------------------------------------
  in.cost.rent_per_hour = a.price_hour >= 0 ? a.price_hour : gpu.rent_per_hour;
  in.cost.price_per_gpu = a.price_gpu >= 0 ? a.price_gpu : a.price_server > 0 ? 0 : gpu.price_usd;
  in.cost.price_per_server = a.price_server;
  in.cost.power_w = a.power_w;
  in.cost.pue = a.pue;
  in.cost.electricity = a.electricity;
  in.cost.years = a.years;
  in.cost.utilisation = a.utilisation;

  // ---- layout ---------------------------------------------------------------------------------
  Layout l;
  l.tp = tp;
  l.pp = pp;
  l.cp = cp;
  l.cp_kind = a.given("--cp-kind") ? (a.cp_kind == "ulysses" ? parallel::ContextKind::ulysses : parallel::ContextKind::ring)
                                   : config_layout.cp_kind;
  l.zero = a.given("--zero") ? a.zero : config_layout.zero;
  l.dp_reduce = a.given("--dp-reduce")
                    ? (a.dp_reduce == "hierarchical" ? parallel::DpReduce::hierarchical : parallel::DpReduce::flat)
                    : config_layout.dp_reduce;
  l.grad_compression = a.given("--grad-compression") ? parallel::grad_compression_from_name(a.grad_compression)
                                                     : config_layout.grad_compression;
  l.powersgd_rank = a.given("--powersgd-rank") ? a.powersgd_rank : config_layout.powersgd_rank;
  l.fp8_feedback_all_reduce = config_layout.fp8_feedback_all_reduce;
  l.fp8_feedback_reduce_scatter = config_layout.fp8_feedback_reduce_scatter;
  l.offload = a.given("--offload") ? a.offload : config_layout.offload;
  // Sequence parallelism: --sp / --no-sp, else a config's dist.sequence_parallel, else on.
  l.sequence_parallel = a.given("--sp") || a.config.empty() ? a.sp : config_layout.sequence_parallel;
  // The pipeline schedule: --schedule, else a config's dist.pp_schedule (and its virtual stages).
  const bool schedule_from_config = !a.given("--schedule") && !a.config.empty();
  l.schedule = schedule_from_config ? config_layout.schedule : parse_schedule(a.schedule);
  if (l.schedule == Schedule::interleaved) {
    const int64_t v = schedule_from_config && !a.given("--virtual-stages") ? config_layout.virtual_stages : a.virtual_stages;
    FORGE_CHECK(v >= 2, "--virtual-stages must be >= 2 with --schedule interleaved, got ", v);
    l.virtual_stages = v;
  }
  l.checkpointing = a.given("--checkpointing") ? parse_checkpointing(a.checkpointing)
                    : config_checkpointing     ? Checkpointing::full
                                               : Checkpointing::none;

  if (a.search) {
    SearchSpace fixed;
    if (a.given("--dp")) fixed.dp = a.dp;
    if (a.given("--tp")) fixed.tp = a.tp;
    if (a.given("--pp")) fixed.pp = a.pp;
    if (a.given("--micro-batch")) fixed.micro_batch = a.micro_batch;
    if (a.given("--zero")) fixed.zero = a.zero;
    if (a.given("--dp-reduce")) fixed.dp_reduce = l.dp_reduce;
    if (a.given("--offload")) fixed.offload = a.offload;
    if (a.given("--sp")) fixed.sequence_parallel = a.sp;
    if (a.given("--checkpointing")) fixed.checkpointing = l.checkpointing;
    in.layout = l;
    const SearchResult s = search(in, fixed);
    if (a.json) {
      nlohmann::json j = search_json(in, s);
      j["tokens_default"] = default_tokens_used;
      std::cout << j.dump(2) << "\n";
    } else {
      if (default_tokens_used)
        std::cerr << "forge plan: no --tokens: planning " << si(in.tokens) << " tokens"
                  << (default_tokens > 0 ? " (the config's run)" : " (20 per parameter, Chinchilla-optimal)") << "\n";
      std::cout << format_search(in, s, a.top, a.all);
    }
    return 0;
  }

  l.dp = a.given("--dp") ? a.dp : std::max<int64_t>(1, gpus / (tp * pp * cp));
  l.micro_batch = a.given("--micro-batch") ? a.micro_batch : default_micro_batch > 0 ? default_micro_batch : 1;
  // A config's micro-batches split over its data-parallel ranks when the batch allows it.
  if (!a.given("--micro-batch") && !a.given("--grad-accum") && default_grad_accum > 0 && !a.given("--batch") &&
      !a.given("--batch-tokens") && in.global_batch % (l.dp * default_grad_accum) == 0)
    l.micro_batch = in.global_batch / (l.dp * default_grad_accum);
  // A config's batch that does not split over this many data-parallel ranks (the config written for
  // fewer GPUs): its micro-batch per GPU kept, the global batch scaled to dp of them, and said so.
  if (!a.config.empty() && default_grad_accum > 0 && !a.given("--micro-batch") && !a.given("--grad-accum") &&
      !a.given("--batch") && !a.given("--batch-tokens") && in.global_batch % (l.micro_batch * l.dp) != 0) {
    const int64_t scaled = default_micro_batch * l.dp * default_grad_accum;
    std::cerr << "forge plan: the config's batch of " << in.global_batch << " sequences does not split over dp = "
              << l.dp << " GPUs; planning " << scaled << " (its " << default_micro_batch << " per GPU x " << l.dp
              << (default_grad_accum > 1 ? " x " + std::to_string(default_grad_accum) + " micro-batches" : std::string())
              << "): train it with --train.batch_size=" << scaled << ", or give --batch\n";
    in.global_batch = scaled;
    l.micro_batch = default_micro_batch;
  }
  FORGE_CHECK(l.micro_batch >= 1, "--micro-batch must be >= 1, got ", l.micro_batch);
  if (a.given("--grad-accum")) {
    FORGE_CHECK(a.grad_accum >= 1, "--grad-accum must be >= 1, got ", a.grad_accum);
    l.grad_accum = a.grad_accum;
    if (!a.given("--batch") && !a.given("--batch-tokens")) in.global_batch = l.global_batch();
  } else {
    const int64_t per = l.micro_batch * l.dp;
    FORGE_CHECK(in.global_batch % per == 0, "batch = ", in.global_batch,
                " sequences is not divisible by micro-batch x dp = ", l.micro_batch, " x ", l.dp, " = ", per,
                "; give --batch as a multiple of ", per, " (or --grad-accum), or another --micro-batch");
    l.grad_accum = in.global_batch / per;
  }
  in.layout = l;
  const PlanResult r = evaluate(in);
  // Chat SFT (docs/chat.md): what the config's conversations come to, encoded as the run encodes them.
  std::optional<train::ChatDataSummary> sft;
  if (!a.config.empty() && config.data.format == "chat" && data_given) {
    std::ostringstream quiet;  // (the template's and tokenizer's log lines: the run says them)
    sft = train::summarize_chat_data(config, quiet);
  }
  if (a.json) {
    nlohmann::json j = plan_json(in, r);
    j["training"]["tokens_default"] = default_tokens_used;
    if (sft) j["sft"] = sft_json(*sft, config, r);
    std::cout << j.dump(2) << "\n";
  } else {
    if (default_tokens_used)
      std::cerr << "forge plan: no --tokens: planning " << si(in.tokens) << " tokens"
                << (default_tokens > 0 ? " (the config's run)" : " (20 per parameter, Chinchilla-optimal)") << "\n";
    std::cout << format_plan(in, r);
    if (sft) std::cout << format_sft(*sft, config, r);
    if (!r.memory.fits)
      std::cout << "\nThis layout does not fit. The same command with --search lists the layouts of " << gpus
                << " GPU(s) that fit (data, tensor and pipeline parallelism, ZeRO, offload, checkpointing), ranked "
                   "by time; flags given there fix a dimension.\n";
  }
  return 0;
}

}  // namespace forge::app
