// validate(): the value checks of a RunConfig and the relations between its keys, run after
// every load and override and again by run_training (contracts in config.h). Each error names the
// key and the fix; nothing is read but the metadata of the data files.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "forge/core/error.h"
#include "forge/data/idx.h"
#include "forge/nn/model_registry.h"
#include "forge/ops/fp8.h"
#include "forge/ops/attention.h"
#include "forge/parallel/sharding.h"
#include "forge/run/config.h"
#include "forge/run/run_values.h"

namespace forge::train {

namespace fs = std::filesystem;

// " (did you mean \"f16\"?)" for a mistyped value of a key that takes one of `choices`: a common
// other spelling (fp16, bfloat16, adam, cos), a different case, a prefix either way, or the one
// choice nearest by edit distance; empty when nothing is close.
std::string suggest_choice(const std::string& value, const std::vector<std::string>& choices) {
  static const std::vector<std::pair<std::string, std::string>> aliases = {
      {"fp16", "f16"},   {"float16", "f16"},   {"half", "f16"},       {"fp32", "f32"},     {"float32", "f32"},
      {"float", "f32"},  {"bfloat16", "bf16"}, {"bfp16", "bf16"},     {"adam", "adamw"},   {"cos", "cosine"},
      {"const", "constant"}, {"zbh1", "zb-h1"}, {"zb_h1", "zb-h1"},   {"random_tokens", "random"}};
  auto has = [&](const std::string& c) { return std::find(choices.begin(), choices.end(), c) != choices.end(); };
  auto said = [](const std::string& c) { return " (did you mean \"" + c + "\"?)"; };
  std::string lower = value;
  for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  for (const auto& [from, to] : aliases)
    if (lower == from && has(to)) return said(to);
  if (has(lower)) return said(lower);
  const std::string* best = nullptr;
  size_t best_d = SIZE_MAX;
  bool tie = false;
  for (const std::string& c : choices) {
    if (lower.size() >= 2 && (c.rfind(lower, 0) == 0 || lower.rfind(c, 0) == 0)) return said(c);
    const size_t d = edit_distance(lower, c);
    if (d < best_d) best_d = d, best = &c, tie = false;
    else if (d == best_d) tie = true;
  }
  if (best != nullptr && !tie && best_d <= std::max<size_t>(1, lower.size() / 3)) return said(*best);
  return "";
}

void validate(const RunConfig& c) {
  // What the data-parallel group shards (dist.zero_stage, checked here first: the checks below ask it).
  const parallel::Sharding zero = parallel::Sharding::from_stage(c.dist.zero_stage);
  // [run]
  FORGE_CHECK(!c.run.name.empty() && c.run.name.find('/') == std::string::npos,
              "run.name must be a non-empty name without '/', got '", c.run.name, "'");
  FORGE_CHECK(!c.run.dir.empty(), "run.dir must not be empty (use \".\" for the current directory)");
  FORGE_CHECK(c.run.seed >= 0, "run.seed must be >= 0, got ", c.run.seed);
  check_run_device_syntax(c.run.device);  // the syntax; whether the GPU exists is checked when the run starts
  FORGE_CHECK(c.run.dtype == "auto" || c.run.dtype == "f32" || c.run.dtype == "bf16" || c.run.dtype == "f16",
              "run.dtype = '", c.run.dtype, "' is unknown; use \"auto\", \"f32\", \"bf16\" or \"f16\"",
              suggest_choice(c.run.dtype, {"auto", "f32", "bf16", "f16"}));
  FORGE_CHECK(ops::is_attention_backend(c.run.attention), "run.attention = '", c.run.attention,
              "' is unknown; use \"auto\", \"flash\" or \"composed\"",
              suggest_choice(c.run.attention, {"auto", "flash", "composed"}));
  FORGE_CHECK(c.run.gemm_tuning == "cached" || c.run.gemm_tuning == "off", "run.gemm_tuning = '", c.run.gemm_tuning,
              "' is unknown; use \"cached\" (time each GEMM shape's algorithms once) or \"off\" (cuBLASLt's "
              "heuristic)", suggest_choice(c.run.gemm_tuning, {"cached", "off"}));
  if (c.run.fp8 != "off") {
    (void)fp8::recipe_from_name(c.run.fp8);  // the name (the error lists the recipes)
  }
  FORGE_CHECK(c.run.fp8_scaling == "current" || c.run.fp8_scaling == "delayed", "run.fp8_scaling = '", c.run.fp8_scaling,
              "' is unknown; use \"current\" or \"delayed\"", suggest_choice(c.run.fp8_scaling, {"current", "delayed"}));
  FORGE_CHECK(c.run.fp8_select == "measured" || c.run.fp8_select == "all", "run.fp8_select = '", c.run.fp8_select,
              "' is unknown; use \"measured\" or \"all\"", suggest_choice(c.run.fp8_select, {"measured", "all"}));
  FORGE_CHECK(c.run.fp8_amax_history >= 1, "run.fp8_amax_history must be >= 1, got ", c.run.fp8_amax_history);
  if (c.run.fp8_scaling == "delayed") {
    FORGE_CHECK(c.run.fp8 == "tensorwise", "run.fp8_scaling = \"delayed\" scales a whole tensor from its history: it "
                "needs run.fp8 = \"tensorwise\" (run.fp8 is \"", c.run.fp8, "\"); rowwise and blockwise scale "
                "each group by its own amax (run.fp8_scaling = \"current\")");
    FORGE_CHECK(!c.model.checkpoint_activations, "run.fp8_scaling = \"delayed\" with model.checkpoint_activations: "
                "a recomputed forward would cast again and move the amax histories, so that its activations differ "
                "from the first forward's; use run.fp8_scaling = \"current\" or turn checkpointing off");
  }
  FORGE_CHECK(!c.telemetry.fp8_amax || c.run.fp8 != "off", "telemetry.fp8_amax records the FP8 casts' amaxes: it needs "
              "run.fp8 (\"tensorwise\", \"rowwise\" or \"blockwise\")");
  (void)parse_duration(c.run.time_limit, "run.time_limit");  // Note [preemption]
  (void)parse_stop_signal(c.run.preempt_signal, "run.preempt_signal");

  // [model]: the family's own rules (nn/model_registry.h), then what training adds to them.
  const auto& m = c.model;
  nn::validate_model(m);
  const bool lm = c.is_language_model();
  if (lm) {
    FORGE_CHECK(m.vocab_size == 0 || m.vocab_size >= 256, "model.vocab_size = ", m.vocab_size,
                " is smaller than 256 (a byte-level BPE vocabulary has 256 byte tokens); set model.vocab_size = 0 "
                "to use the tokenizer's size, or a value >= 256");
  }

  // [optim] and [schedule]
  const auto& o = c.optim;
  FORGE_CHECK(o.name == "adamw" || o.name == "sgd", "optim.name = '", o.name, "' is unknown; use \"adamw\" or \"sgd\"",
              suggest_choice(o.name, {"adamw", "sgd"}));
  FORGE_CHECK(std::isfinite(o.lr) && o.lr > 0, "optim.lr must be > 0, got ", o.lr);
  FORGE_CHECK(o.weight_decay >= 0, "optim.weight_decay must be >= 0, got ", o.weight_decay);
  // Each optimizer's own keys are checked for it only (AdamW ignores momentum, SGD the betas).
  if (o.name == "adamw") {
    FORGE_CHECK(o.beta1 >= 0 && o.beta1 < 1, "optim.beta1 must be in [0, 1), got ", o.beta1);
    FORGE_CHECK(o.beta2 >= 0 && o.beta2 < 1, "optim.beta2 must be in [0, 1), got ", o.beta2);
    FORGE_CHECK(o.eps > 0, "optim.eps must be > 0, got ", o.eps);
  } else {
    FORGE_CHECK(o.momentum >= 0 && o.momentum < 1, "optim.momentum must be in [0, 1), got ", o.momentum);
    FORGE_CHECK(!o.nesterov || o.momentum > 0, "optim.nesterov = true needs optim.momentum > 0, got momentum ",
                o.momentum, "; set optim.momentum (e.g. 0.9) or optim.nesterov = false");
  }
  FORGE_CHECK(o.grad_clip >= 0, "optim.grad_clip must be >= 0 (0 = no clipping), got ", o.grad_clip);
  const auto& s = c.schedule;
  FORGE_CHECK(s.kind == "cosine" || s.kind == "linear" || s.kind == "constant", "schedule.kind = '", s.kind,
              "' is unknown; use \"cosine\", \"linear\" or \"constant\"",
              suggest_choice(s.kind, {"cosine", "linear", "constant"}));
  FORGE_CHECK(s.warmup_steps >= 0, "schedule.warmup_steps must be >= 0, got ", s.warmup_steps);
  FORGE_CHECK(s.min_lr >= 0 && s.min_lr <= o.lr, "schedule.min_lr = ", s.min_lr, " must be in [0, optim.lr = ", o.lr,
              "]");
  FORGE_CHECK(s.decay_steps >= 0, "schedule.decay_steps must be >= 0 (0 = train.steps), got ", s.decay_steps);

  // [train], [eval], [checkpoint]
  const auto& t = c.train;
  FORGE_CHECK(t.batch_size > 0, "train.batch_size must be > 0, got ", t.batch_size);
  FORGE_CHECK(t.log_every > 0, "train.log_every must be > 0, got ", t.log_every);
  FORGE_CHECK(t.max_bad_steps >= 1, "train.max_bad_steps must be >= 1, got ", t.max_bad_steps);
  if (lm) {
    FORGE_CHECK(t.steps > 0, "train.steps must be > 0, got ", t.steps);
    FORGE_CHECK(t.grad_accum <= 0 || t.batch_size % t.grad_accum == 0, "train.batch_size = ", t.batch_size,
                " is not divisible by train.grad_accum = ", t.grad_accum,
                "; train.batch_size is the global batch of an optimizer step (Note [global batch]): make it a multiple "
                "of ", t.grad_accum, " (e.g. ", t.batch_size / t.grad_accum * t.grad_accum + t.grad_accum, ")");
    FORGE_CHECK(t.seq_len > 0, "train.seq_len must be > 0, got ", t.seq_len);
    FORGE_CHECK(t.seq_len <= m.block_size, "train.seq_len = ", t.seq_len, " exceeds model.block_size = ", m.block_size,
                "; lower train.seq_len or raise model.block_size");
    FORGE_CHECK(t.grad_accum > 0, "train.grad_accum must be > 0, got ", t.grad_accum);
  } else {
    FORGE_CHECK(t.epochs > 0, "train.epochs must be > 0, got ", t.epochs);
    FORGE_CHECK(t.eval_batch_size > 0, "train.eval_batch_size must be > 0, got ", t.eval_batch_size);
    FORGE_CHECK(t.grad_accum == 1, "train.grad_accum = ", t.grad_accum, ": model.type = '", m.type,
                "' trains one batch of train.batch_size images per step; set train.grad_accum = 1");
    FORGE_CHECK(c.run.dtype == "auto" || c.run.dtype == "f32", "run.dtype = '", c.run.dtype, "': model.type = '",
                m.type, "' trains in f32; set run.dtype = \"auto\" or \"f32\"");
  }
  FORGE_CHECK(c.eval.every >= 0, "eval.every must be >= 0 (0 = only at the end), got ", c.eval.every);
  FORGE_CHECK(c.eval.batches >= 0, "eval.batches must be >= 0 (0 = every validation window), got ", c.eval.batches);
  FORGE_CHECK(c.eval.task_examples >= 0, "eval.task_examples must be >= 0 (0 = every example), got ",
              c.eval.task_examples);
  if (!c.eval.tasks.empty()) {
    FORGE_CHECK(lm && c.data.source != "random", "eval.tasks scores a language model on text: it needs model.type = "
                "\"gpt\" or \"llama\" and a tokenizer (data.files, not data.source = \"random\")");
    FORGE_CHECK(c.dist.tp == 1 && c.dist.pp == 1 && !zero.parameters(), "eval.tasks runs on a whole model on each "
                "rank; dist.tp = ", c.dist.tp, ", dist.pp = ", c.dist.pp, ", dist.zero_stage = ", c.dist.zero_stage,
                " split it: score the checkpoints with forge eval --tasks instead");
    std::error_code ec;
    for (const auto& t : c.eval.tasks)
      FORGE_CHECK(std::filesystem::is_regular_file(t, ec), "eval.tasks: '", t, "' is not a readable file");
  }
  if (!c.telemetry.profile_steps.empty()) parse_step_range(c.telemetry.profile_steps, "telemetry.profile_steps");
  FORGE_CHECK(c.telemetry.idle_warn_pct >= 0 && c.telemetry.idle_warn_pct <= 100,
              "telemetry.idle_warn_pct must be in [0, 100] (percent of an interval), got ", c.telemetry.idle_warn_pct);
  FORGE_CHECK(c.checkpoint.every >= 0, "checkpoint.every must be >= 0 (0 = none by steps), got ", c.checkpoint.every);
  FORGE_CHECK(std::isfinite(c.checkpoint.interval_minutes) && c.checkpoint.interval_minutes >= 0,
              "checkpoint.interval_minutes must be >= 0 (0 = none by time), got ", c.checkpoint.interval_minutes);
  FORGE_CHECK(c.checkpoint.keep_last >= 1, "checkpoint.keep_last must be >= 1, got ", c.checkpoint.keep_last);
  // [lora] (nn/lora.h): the values whatever the model; targets against the family's linears.
  if (c.lora.enabled()) {
    FORGE_CHECK(lm, "lora.targets adapts the linears of a GPT or LLaMA; model.type = '", c.model.type,
                "' has none: set lora.targets = [] (LoRA off)");
    nn::validate_lora(c.lora, nn::transformer_shape(c.model).arch);
  } else {
    nn::validate_lora(c.lora, nn::Arch::gpt);
  }
  // [dist]
  FORGE_CHECK(!zero.parameters() || lm,
              "dist.zero_stage = 3 shards the blocks of a GPT or LLaMA; model.type = '", c.model.type,
              "' has none: use dist.zero_stage = 2");
  FORGE_CHECK(!c.dist.offload_optimizer || zero.optimizer_state(),
              "dist.offload_optimizer = true needs dist.zero_stage = 1, 2 or 3 (it offloads the sharded optimizer)");
  FORGE_CHECK(c.dist.dp_reduce == "flat" || c.dist.dp_reduce == "hierarchical", "dist.dp_reduce = '",
              c.dist.dp_reduce, "' is unknown; use \"flat\" or \"hierarchical\"",
              suggest_choice(c.dist.dp_reduce, {"flat", "hierarchical"}));
  FORGE_CHECK(c.dist.link_gbps >= 0 && std::isfinite(c.dist.link_gbps), "dist.link_gbps must be >= 0 (0 = off), got ",
              c.dist.link_gbps);
  FORGE_CHECK(c.dist.link_latency_us >= 0 && std::isfinite(c.dist.link_latency_us),
              "dist.link_latency_us must be >= 0, got ", c.dist.link_latency_us);
  FORGE_CHECK(c.dist.grad_compression == "none" || c.dist.grad_compression == "powersgd" ||
                  c.dist.grad_compression == "fp8",
              "dist.grad_compression = '", c.dist.grad_compression, "' is unknown; use \"none\", \"fp8\" or \"powersgd\"",
              suggest_choice(c.dist.grad_compression, {"none", "fp8", "powersgd"}));
  FORGE_CHECK(c.dist.fp8_error_feedback == "auto" || c.dist.fp8_error_feedback == "on" ||
                  c.dist.fp8_error_feedback == "off",
              "dist.fp8_error_feedback = '", c.dist.fp8_error_feedback, "' is unknown; use \"auto\", \"on\" or \"off\"",
              suggest_choice(c.dist.fp8_error_feedback, {"auto", "on", "off"}));
  FORGE_CHECK(c.dist.grad_compression == "none" || c.run.dtype != "f16",
              "dist.grad_compression = \"", c.dist.grad_compression, "\" with run.dtype = \"f16\" is not supported (its "
              "error feedback would carry residues of one step's loss scale into a step of another); use run.dtype = "
              "\"bf16\" or dist.grad_compression = \"none\"");
  FORGE_CHECK(c.dist.powersgd_rank >= 1, "dist.powersgd_rank must be >= 1, got ", c.dist.powersgd_rank);
  FORGE_CHECK(c.dist.powersgd_start_step >= 0, "dist.powersgd_start_step must be >= 0, got ", c.dist.powersgd_start_step);
  FORGE_CHECK(c.dist.grad_compression != "powersgd" || (c.dist.zero_stage == 0 && c.dist.pp == 1),
              "dist.grad_compression = \"powersgd\" compresses DDP's all-reduces: it needs dist.zero_stage = 0 and "
              "dist.pp = 1 (got ", c.dist.zero_stage, " and ", c.dist.pp, "); set those or dist.grad_compression = \"none\"");
  FORGE_CHECK(c.dist.node_size >= 0, "dist.node_size must be >= 0 (0 = the launcher's ranks per host), got ",
              c.dist.node_size);
  FORGE_CHECK(c.dist.bucket_mb > 0 && std::isfinite(c.dist.bucket_mb), "dist.bucket_mb must be > 0, got ",
              c.dist.bucket_mb);
  FORGE_CHECK(!(c.run.dtype == "f16" && c.dist.offload_optimizer),
              "run.dtype = \"f16\" with dist.offload_optimizer = true is not supported (the gradients reach the "
              "offloaded optimizer before the loss scale is known to be finite); use run.dtype = \"bf16\" or "
              "dist.offload_optimizer = false");
  FORGE_CHECK(c.dist.tp >= 1, "dist.tp must be >= 1 (1 = no tensor parallelism), got ", c.dist.tp);
  FORGE_CHECK(c.dist.pp >= 1, "dist.pp must be >= 1 (1 = no pipeline parallelism), got ", c.dist.pp);
  FORGE_CHECK(lm || (c.dist.tp == 1 && c.dist.pp == 1), "dist.tp and dist.pp split a transformer; model.type = '",
              m.type, "' trains with dist.tp = 1 and dist.pp = 1");
  FORGE_CHECK(c.dist.pp_schedule == "1f1b" || c.dist.pp_schedule == "gpipe" || c.dist.pp_schedule == "zb-h1" ||
                  c.dist.pp_schedule == "interleaved",
              "dist.pp_schedule = '", c.dist.pp_schedule,
              "' is unknown; use \"1f1b\", \"gpipe\", \"zb-h1\" or \"interleaved\"",
              suggest_choice(c.dist.pp_schedule, {"1f1b", "gpipe", "zb-h1", "interleaved"}));
  FORGE_CHECK((c.dist.pp_schedule == "interleaved") == (c.dist.pp_virtual_stages >= 2),
              c.dist.pp_schedule == "interleaved"
                  ? "dist.pp_schedule = \"interleaved\" needs dist.pp_virtual_stages >= 2 (model chunks per rank), got "
                  : "dist.pp_virtual_stages > 1 needs dist.pp_schedule = \"interleaved\"; dist.pp_virtual_stages = ",
              c.dist.pp_virtual_stages);
  FORGE_CHECK(c.dist.pp_layers.empty() || (c.dist.pp > 1 && c.dist.pp_virtual_stages == 1),
              "dist.pp_layers sets the blocks of each pipeline stage; it needs dist.pp > 1 and no virtual stages "
              "(dist.pp_virtual_stages = 1); leave it empty otherwise");
  if (!c.dist.pp_layers.empty()) {
    std::string list = "[";
    for (size_t i = 0; i < c.dist.pp_layers.size(); ++i) list += (i ? ", " : "") + std::to_string(c.dist.pp_layers[i]);
    list += "]";
    int64_t sum = 0;
    for (int64_t n : c.dist.pp_layers) {
      FORGE_CHECK(n >= 1, "dist.pp_layers = ", list,
                  ": every stage needs at least one block");
      sum += n;
    }
    FORGE_CHECK(static_cast<int64_t>(c.dist.pp_layers.size()) == c.dist.pp, "dist.pp_layers = ",
                list, " has ", c.dist.pp_layers.size(), " entries for dist.pp = ",
                c.dist.pp, " stages; give one block count per stage");
    FORGE_CHECK(sum == c.model.n_layer, "dist.pp_layers = ", list, " sums to ",
                sum, " blocks, but model.n_layer = ", c.model.n_layer, "; make them add up");
  }
  FORGE_CHECK(c.dist.pp_virtual_stages == 1 || c.train.grad_accum % c.dist.pp == 0, "the interleaved pipeline "
              "schedule needs train.grad_accum (", c.train.grad_accum, ") a multiple of dist.pp = ", c.dist.pp,
              "; choose train.grad_accum accordingly");
  FORGE_CHECK(c.dist.pp_schedule != "zb-h1" || !zero.gradients(), "dist.pp_schedule = \"zb-h1\" with "
              "dist.zero_stage = ", c.dist.zero_stage, " is not supported (ZeRO-2 reduces each micro-batch's "
              "gradients as they arrive; ZB-H1's weight passes arrive out of step); use dist.zero_stage = 0 or 1");
  FORGE_CHECK(c.dist.pp == 1 || !zero.parameters(), "dist.zero_stage = 3 with dist.pp = ", c.dist.pp,
              " is not supported (each stage holds only its blocks already); use dist.zero_stage = 0, 1 or 2");
  FORGE_CHECK(c.dist.pp == 1 || !c.dist.offload_optimizer, "dist.offload_optimizer = true with dist.pp = ", c.dist.pp,
              " is not supported yet; set dist.offload_optimizer = false");
  FORGE_CHECK(c.dist.pp == 1 || c.model.dropout == 0, "model.dropout = ", c.model.dropout, " with dist.pp = ",
              c.dist.pp, " is not supported yet (the stages would draw other masks than one process); set "
              "model.dropout = 0");
  FORGE_CHECK(c.dist.cp >= 1, "dist.cp must be >= 1 (1 = no context parallelism), got ", c.dist.cp);
  FORGE_CHECK(c.dist.cp_kind == "ring" || c.dist.cp_kind == "ulysses", "dist.cp_kind = '", c.dist.cp_kind,
              "' is unknown; use \"ring\" or \"ulysses\"", suggest_choice(c.dist.cp_kind, {"ring", "ulysses"}));
  if (c.dist.cp > 1) {
    FORGE_CHECK(lm, "dist.cp = ", c.dist.cp, " splits the sequences of a GPT or LLaMA; model.type = '", c.model.type,
                "' trains with dist.cp = 1");
    FORGE_CHECK(c.train.seq_len % (2 * c.dist.cp) == 0, "train.seq_len = ", c.train.seq_len,
                " does not cut into 2 x dist.cp = ", 2 * c.dist.cp,
                " equal chunks (context parallelism gives each rank an early and a late chunk); choose train.seq_len "
                "a multiple of ", 2 * c.dist.cp);
    FORGE_CHECK(!c.dist.sequence_parallel || (c.train.seq_len / c.dist.cp) % c.dist.tp == 0, "train.seq_len / dist.cp = ",
                c.train.seq_len / c.dist.cp, " tokens per context-parallel rank are not divisible by dist.tp = ",
                c.dist.tp, " (sequence parallelism splits them further); choose train.seq_len a multiple of ",
                c.dist.cp * c.dist.tp * 2);
    FORGE_CHECK(c.model.dropout == 0, "model.dropout = ", c.model.dropout, " with dist.cp = ", c.dist.cp,
                " is not supported yet (the ranks' parts would draw other masks than one process); set model.dropout = 0");
  }
  FORGE_CHECK(!c.dist.sequence_parallel || c.dist.tp > 1, "dist.sequence_parallel = true splits the sequence over "
              "the tensor-parallel ranks; it needs dist.tp > 1 (got dist.tp = ", c.dist.tp, ")");
  FORGE_CHECK(c.dist.tp == 1 || !zero.parameters(), "dist.zero_stage = 3 with dist.tp = ", c.dist.tp,
              " is not supported (ZeRO-3 gathers whole blocks; tensor parallelism splits them); use dist.zero_stage "
              "= 0, 1 or 2 on the data-parallel groups");
  FORGE_CHECK(c.dist.tp == 1 || c.model.dropout == 0, "model.dropout = ", c.model.dropout, " with dist.tp = ",
              c.dist.tp, " is not supported yet (the split layers would draw other masks than one process); set "
              "model.dropout = 0");
  FORGE_CHECK(!c.dist.sequence_parallel || c.train.seq_len % c.dist.tp == 0, "train.seq_len = ", c.train.seq_len,
              " is not divisible by dist.tp = ", c.dist.tp, " (sequence parallelism splits each sequence evenly); "
              "choose train.seq_len a multiple of ", c.dist.tp);
  // [debug]
  FORGE_CHECK(!c.debug.skip_reductions || !zero.gradients(),
              "debug.skip_reductions = true works with dist.zero_stage = 0 or 1 only (ZeRO-2/3 own their gradients "
              "through the reduce-scatter)");
  parse_rank_step(c.debug.abort_at, "debug.abort_at");
  parse_rank_step(c.debug.hang_at, "debug.hang_at");

  // [data]
  const auto& d = c.data;
  if (lm) {
    FORGE_CHECK(d.source == "files" || d.source == "random", "data.source = '", d.source,
                "' is unknown; use \"files\" (data.files) or \"random\" (random tokens)",
                suggest_choice(d.source, {"files", "random"}));
    FORGE_CHECK(d.val_fraction >= 0 && d.val_fraction < 1, "data.val_fraction must be in [0, 1), got ", d.val_fraction);
    FORGE_CHECK(d.order == "random" || d.order == "sequential", "data.order = '", d.order,
                "' is unknown; use \"random\" or \"sequential\"", suggest_choice(d.order, {"random", "sequential"}));
    FORGE_CHECK(d.packing == "none" || d.packing == "documents", "data.packing = '", d.packing,
                "' is unknown; use \"none\" or \"documents\"", suggest_choice(d.packing, {"none", "documents"}));
    if (d.packing == "documents") {
      FORGE_CHECK(d.source == "files", "data.packing = \"documents\" with data.source = \"", d.source,
                  "\": random tokens have no documents; use data.source = \"files\" or data.packing = \"none\"");
      FORGE_CHECK(!d.eos_token.empty(), "data.packing = \"documents\" with data.eos_token = \"\": documents are found "
                  "by the end-of-text token that ends each; set data.eos_token (e.g. \"auto\") or data.packing = \"none\"");
    }
    FORGE_CHECK(d.format == "text" || d.format == "chat", "data.format = '", d.format,
                "' is unknown; use \"text\" (documents) or \"chat\" (conversations: docs/chat.md)",
                suggest_choice(d.format, {"text", "chat"}));
    FORGE_CHECK(d.train_on == "assistant" || d.train_on == "all", "data.train_on = '", d.train_on,
                "' is unknown; use \"assistant\" (the loss on assistant turns only) or \"all\"",
                suggest_choice(d.train_on, {"assistant", "all"}));
    FORGE_CHECK(!d.chat_template.empty(), "data.chat_template is empty; use \"auto\", \"chatml\", \"llama3\" or a "
                "tokenizer_config.json / .jinja file");
    if (d.format == "chat") {
      FORGE_CHECK(d.source == "files", "data.format = \"chat\" with data.source = \"", d.source,
                  "\": random tokens hold no conversations; use data.source = \"files\" with .jsonl conversations");
      FORGE_CHECK(!d.tokenizer.empty(), "data.format = \"chat\" needs data.tokenizer (the model's tokenizer file, "
                  "e.g. a Hugging Face tokenizer.json): forge trains no tokenizer on conversations");
      FORGE_CHECK(c.dist.cp == 1, "data.format = \"chat\" with dist.cp = ", c.dist.cp,
                  ": conversation masks under context parallelism are not supported yet; use dist.cp = 1");
    }
    FORGE_CHECK(d.val_files.empty() || d.source == "files", "data.val_files is set with data.source = \"", d.source,
                "\" (random tokens have no validation); remove data.val_files or use data.source = \"files\"");
    FORGE_CHECK(!d.text_key.empty(), "data.text_key is empty; give the key of each .jsonl line's text, e.g. \"text\"");
    std::error_code ec;
    if (d.source == "random") {
      FORGE_CHECK(m.vocab_size > 0, "data.source = \"random\" needs model.vocab_size > 0 (there is no tokenizer to "
                  "take it from); set model.vocab_size, e.g. 50304");
    } else if (d.tokenizer.empty()) {
      FORGE_CHECK(d.vocab_size >= 256, "data.vocab_size = ", d.vocab_size,
                  " is smaller than 256 (a byte-level BPE vocabulary starts with the 256 bytes); set data.vocab_size "
                  ">= 256, e.g. 1024");
      FORGE_CHECK(m.vocab_size == 0 || m.vocab_size >= d.vocab_size, "model.vocab_size = ", m.vocab_size,
                  " is smaller than data.vocab_size = ", d.vocab_size,
                  " (the tokenizer's ids would not fit); set model.vocab_size = 0 or >= data.vocab_size");
    } else {
      FORGE_CHECK(fs::is_regular_file(d.tokenizer, ec), "data.tokenizer: '", d.tokenizer,
                  "' does not exist; give a tokenizer file (forge's, a Hugging Face tokenizer.json, tiktoken "
                  "ranks or a sentencepiece .model: docs/tokenizers.md), or \"\" to train one");
    }
    if (d.source == "files") {
      resolve_data_files(d);
      resolve_val_files(d);
    }
  } else {
    FORGE_CHECK(d.max_train_samples >= 0, "data.max_train_samples must be >= 0 (0 = all), got ", d.max_train_samples);
    FORGE_CHECK(d.max_test_samples >= 0, "data.max_test_samples must be >= 0 (0 = all), got ", d.max_test_samples);
    FORGE_CHECK(!d.dir.empty(), "data.dir is empty; set it to the Fashion-MNIST directory (", data::kFashionMnistDir,
                ", from the Debian package dataset-fashion-mnist)");
    const std::string missing = data::missing_fashion_mnist_file(d.dir);
    FORGE_CHECK(missing.empty(), "data.dir: Fashion-MNIST file '", missing, "' (or the same without .gz) not found; "
                "install the Debian package dataset-fashion-mnist (apt-get install dataset-fashion-mnist) or point "
                "data.dir at a directory holding {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]");
  }
}

}  // namespace forge::train
