#pragma once
// RunConfig: the typed configuration of one training run, loaded from a TOML file
// (configs/*.toml) with command-line overrides, and checked before any work is done.
//
//   auto cfg = forge::train::load_config("configs/tiny.toml", {"--train.steps=100"});
//   // cfg.train.steps == 100; every other key from the file or its default
//
// Sections and keys (docs/train.md documents each one with its default):
//   [run]        name, dir, seed, device, dtype, overwrite, allow_tf32, fp8, fp8_scaling, fp8_amax_history, fp8_select,
//                attention, deterministic,
//                gemm_tuning, cuda_graph, time_limit, preempt_signal
//   [model]      type ("gpt" | "llama" | "lenet"), vocab_size, block_size, n_layer, n_head,
//                n_embd, dropout, bias, checkpoint_activations, n_kv_head, dim, ffn_hidden,
//                rope_theta, rope_scaling, rope_factor, rope_low_freq_factor, rope_high_freq_factor,
//                rope_original_context, norm_eps, init_std (which type reads which:
//                nn/model_registry.cpp); init_from (a Hugging Face model directory: parse_config
//                resolves the shape from it before validate(), run/hf_model.h)
//   [data]       source, files, exclude, tokenizer, vocab_size, val_fraction, shards_dir (language
//                models); dir, max_train_samples, max_test_samples (lenet)
//   [optim]      name, lr, weight_decay, beta1, beta2, eps, momentum, nesterov, grad_clip
//   [schedule]   kind, warmup_steps, min_lr, decay_steps
//   [train]      steps, batch_size, seq_len, grad_accum, log_every, max_bad_steps; epochs,
//                eval_batch_size (lenet)
//   [eval]       every, batches, bigram_baseline
//   [checkpoint] every, interval_minutes, keep_last, at_end, async
//   [lora]       rank, alpha, dropout, targets (LoRA adapters on the base model: nn/lora.h, docs/lora.md)
//   [dist]       tp, sequence_parallel, pp, cp, cp_kind, pp_schedule, pp_virtual_stages, pp_layers, zero_stage, offload_optimizer, bucket_mb, dp_reduce, node_size, link_gbps, link_latency_us, grad_compression, fp8_error_feedback, powersgd_rank, powersgd_start_step (the layout; docs/dist.md)
//   [debug]      skip_reductions, abort_at, hang_at, masters_from_rounded (switches that change what a run computes,
//                recorded with the run's config: diagnostics and failure tests)
//
// The schema is one table (config_keys()): each key has a type (integer, float, boolean,
// string, list of strings), a default and a line of documentation. Loading is strict:
//   - a key or section that is not in the table is an error that suggests the nearest
//     valid one by edit distance ("unknown key 'train.stpes'; did you mean 'train.steps'?");
//   - a value of the wrong type is an error naming the key, the expected type and the
//     value found (an integer is accepted where a float is expected, nothing else converts);
//   - overrides "--section.key=value" are parsed to the key's declared type;
//   - validate() (config_checks.cpp) then checks values and their relations (heads dividing
//     the width, sizes > 0, data files present and non-empty, ...), each error naming the key
//     and the fix.
// Every error is a forge::Error; nothing is read but the config file and the metadata of
// the data files.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "forge/core/device.h"
#include "forge/core/dtype.h"
#include "forge/nn/lora.h"
#include "forge/nn/model_config.h"

namespace forge::train {

struct RunSection {
  std::string name = "run";        // the run's name: its directory is <dir>/<name>
  std::string dir = "runs";        // parent directory of run directories
  int64_t seed = 1337;             // model initialisation, data order, dropout
  std::string device = "auto";     // "auto" (cuda:0 when a GPU is visible, else cpu) | "cpu" | "cuda" | "cuda:N"
  std::string dtype = "auto";      // compute dtype: "auto" (bf16 on a GPU, f32 on the CPU) | "f32" | "bf16" | "f16"
  bool overwrite = false;          // start afresh, replacing the checkpoints and metrics an earlier run left
                                   // (Note [one command starts or continues]; never the default)
  bool allow_tf32 = false;         // f32 GEMMs on CUDA in TF32 (faster; changes results: relative error ~1e-3)
  std::string fp8 = "off";         // the linear layers' GEMMs in FP8: "off" | "tensorwise" | "rowwise" | "blockwise" (ops/fp8.h)
  std::string fp8_scaling = "current";  // "current" | "delayed" (tensorwise: Note [FP8 delayed scaling])
  int64_t fp8_amax_history = 16;   // delayed scaling: casts remembered per layer and operand
  std::string fp8_select = "measured";  // GPU: which linear shapes run in FP8: "measured" | "all" (Note [FP8 GEMM choice])
  std::string attention = "auto";  // CUDA attention kernels: "auto" (cuDNN, then forge's flash) | "flash" | "composed"
  bool deterministic = false;      // CUDA attention backward without atomics (bit-identical reruns)
  std::string gemm_tuning = "cached";  // "cached" (time each GEMM shape's cuBLASLt algorithms once) | "off" (heuristic)
  bool cuda_graph = true;          // CUDA: capture the training step once, replay it (train/graphed_step.h)
  std::string time_limit;          // "23h50m": checkpoint and stop (exit 75) before this much wall time ("" = none)
  std::string preempt_signal = "USR1";  // besides SIGTERM and SIGINT: a signal that checkpoints and stops ("" = none)
};

// [model]: nn::ModelConfig (nn/model_config.h), the struct the model-family registry
// (nn/model_registry.h) checks, shapes and builds from; each model.type reads its own keys.
using ModelSection = nn::ModelConfig;

struct DataSection {
  std::vector<std::string> files;  // text files, glob patterns or directories (their files, not recursive)
  std::vector<std::string> exclude;  // glob patterns of file names to skip in globs/directories
  std::string tokenizer;           // any tokenizer file (docs/tokenizers.md); "" trains one on the data
  int64_t vocab_size = 1024;       // the vocabulary of a tokenizer trained on the fly
  double val_fraction = 0.1;       // the last part of each file held out for validation
  std::vector<std::string> val_files;  // validation data of their own (as data.files: text or token shards);
                                   // data.files then train whole and val_fraction is not used
  std::string order = "random";    // training windows: "random" (seeded, with replacement) | "sequential"
                                   // (in order, non-overlapping, epoch after epoch: data::SequentialTrainWindows)
  std::string packing = "none";    // "none" | "documents": attention and positions restart at each end-of-text
                                   // token (Note [packed documents], data/packing.h)
  std::string shards_dir;          // where token shards go ("" : <run dir>/data)
  std::string text_key = "text";   // .jsonl corpora: the key of each line's text (Note [documents])
  std::string eos_token = "auto";  // appended after every document: "auto" = the tokenizer's, "" = none
                                   // (Note [end-of-text token], run_data.h)
  std::string source = "files";    // "files" (data.files, tokenized) | "random" (uniform random tokens: benchmarks)
  std::string format = "text";     // "text" (documents) | "chat" (JSON Lines conversations: run/run_chat_data.h)
  std::string chat_template = "auto";  // chat: "auto" (the tokenizer_config.json beside the tokenizer or model.init_from),
                                   // a built-in name ("chatml", "llama3"), or a tokenizer_config.json / .jinja file
  std::string train_on = "assistant";  // chat: "assistant" (the loss on assistant turns only, Note [chat masks]) | "all"
  std::string dir = "/usr/share/datasets/fashion-mnist";  // lenet: the IDX files
  int64_t max_train_samples = 0;   // lenet: first N training images (0: all)
  int64_t max_test_samples = 0;    // lenet: first N test images (0: all)
};

struct OptimSection {
  std::string name = "adamw";      // "adamw" | "sgd"
  double lr = 6e-4;                // the peak learning rate
  double weight_decay = 0.1;       // on matmul weights only (optim::decay_groups)
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double momentum = 0.9;           // sgd
  bool nesterov = false;           // sgd
  double grad_clip = 1.0;          // max global gradient norm (0: no clipping)
};

struct ScheduleSection {
  std::string kind = "cosine";     // "cosine" | "linear" | "constant"
  int64_t warmup_steps = 0;
  double min_lr = 0.0;             // the floor of the decay
  int64_t decay_steps = 0;         // the step the decay reaches min_lr (0: train.steps)
};

struct TrainSection {
  int64_t steps = 1000;            // optimizer steps
  // Note [global batch]: the sequences of one optimizer step over every data-parallel rank
  // and micro-batch; each rank's micro-batch is batch_size / (dp * grad_accum).
  int64_t batch_size = 16;
  int64_t seq_len = 256;           // tokens per sequence (<= model.block_size)
  int64_t grad_accum = 1;          // micro-batches per optimizer step
  int64_t log_every = 10;          // steps between progress lines and metrics records
  int64_t max_bad_steps = 5;       // consecutive skipped (non-finite) steps before the run stops
  int64_t epochs = 3;              // lenet
  int64_t eval_batch_size = 1000;  // lenet
};

struct EvalSection {
  int64_t every = 100;             // steps between evaluations (0: only at the end)
  int64_t batches = 20;            // validation batches per evaluation (0: all windows)
  bool bigram_baseline = false;    // at the end, also the loss of an add-one bigram model
  std::vector<std::string> tasks;  // multiple-choice files (HellaSwag layout) scored at every evaluation
  int64_t task_examples = 0;       // the first N examples of each task (0 = all)
};

struct CheckpointSection {
  int64_t every = 0;               // steps between checkpoints (0: none by steps)
  double interval_minutes = 30.0;  // wall-clock minutes between checkpoints (0: none by time)
  int64_t keep_last = 3;           // checkpoints kept in <run dir>/checkpoints
  bool at_end = true;              // write a checkpoint when the run ends (false: benchmarks)
  bool async = true;               // write checkpoints on a thread while training goes on (Note [async checkpoints])
};

// [lora]: nn::LoraOptions (nn/lora.h). LoRA is on when lora.targets names linears.
using LoraSection = nn::LoraOptions;

struct DistSection {
  int64_t tp = 1;                  // tensor-parallel degree (ranks that split each layer's weights)
  bool sequence_parallel = false;  // tp > 1: norms and residuals on sequence shards (all-gather / reduce-scatter)
  int64_t pp = 1;                  // pipeline-parallel degree (stages of consecutive blocks); dp = world / (tp * pp * cp)
  int64_t cp = 1;                  // context-parallel degree (ranks that each hold a part of every sequence)
  std::string cp_kind = "ring";    // cp > 1: "ring" (K/V passed around the ranks) or "ulysses" (all-to-all over heads)
  std::string pp_schedule = "1f1b";  // pp > 1: "1f1b", "gpipe", "zb-h1" or "interleaved" (Note [pipeline schedules])
  int64_t pp_virtual_stages = 1;   // interleaved: model chunks per pipeline rank (>= 2)
  std::vector<int64_t> pp_layers;  // blocks per pipeline stage (empty: balanced by plan::stage_layers)
  int64_t zero_stage = 0;          // 0: DDP (every rank the whole optimizer), 1: + sharded optimizer state, 2: + sharded gradients, 3: + sharded block parameters
  bool offload_optimizer = false;  // ZeRO-1/2: master weights, moments and the update on the CPU
  double bucket_mb = 25.0;         // gradient bucket size (MB) for the overlapped reductions
  std::string dp_reduce = "flat";  // "flat" (one ring) or "hierarchical" (within each node first, then across nodes)
  int64_t node_size = 0;           // ranks per node for dp_reduce (0: the launcher's ranks per host; smaller simulates nodes)
  double link_gbps = 0;            // simulated nodes: the data-parallel traffic between them held to this rate (Gb/s; 0: off)
  double link_latency_us = 25;     // simulated nodes: latency per ring step of that link
  std::string grad_compression = "none";  // "none", "fp8" (FP8 blocks, error feedback) or "powersgd" (DDP: low-rank gradients)
  std::string fp8_error_feedback = "auto";  // grad_compression = "fp8": "auto" (DDP, ZeRO-1), "on" or "off"
  int64_t powersgd_rank = 4;       // grad_compression = "powersgd": the approximation's rank r
  int64_t powersgd_start_step = 0; // grad_compression = "powersgd": uncompressed reductions before this step
};

struct TelemetrySection {
  bool tensorboard = true;         // <run dir>/tb: TensorBoard event files of the metrics (rank 0)
  bool gpu_sampling = true;        // NVML samples of the GPU in every progress record (bench/gpu_sampler.h)
  double idle_warn_pct = 10.0;     // warn when the GPU ran no kernel for more than this % of an interval
  std::string profile_steps;       // "A:B": a Chrome/Perfetto trace of steps A..B per rank (train/step_trace.h)
  bool fp8_amax = false;           // run.fp8: each layer's largest amax per operand in every progress record
};

// Switches that change what a run computes: never hidden environment variables, always recorded
// in the run's config.toml and checkpoints.
struct DebugSection {
  bool skip_reductions = false;    // data parallel: no gradient or loss reduction at all (the run is WRONG; measures what the rest costs)
  std::string abort_at;            // "<rank>:<step>": that rank aborts at the start of that step (failure tests)
  std::string hang_at;             // "<rank>:<step>": that rank stops there without exiting (stuck-peer tests)
  bool masters_from_rounded = false;  // 16-bit runs: masters from the rounded parameters, not the f32 initial weights
                                      // (Note [masters from the f32 initial weights]; A/B measurements)
};

struct RunConfig {
  RunSection run;
  ModelSection model;
  DataSection data;
  OptimSection optim;
  ScheduleSection schedule;
  TrainSection train;
  EvalSection eval;
  CheckpointSection checkpoint;
  LoraSection lora;
  DistSection dist;
  TelemetrySection telemetry;
  DebugSection debug;
  std::string source;  // the file it came from ("" when built in code)

  // <run.dir>/<run.name>
  std::string run_dir() const;
  // model.type names a transformer family of the registry (gpt, llama): trained on tokens.
  bool is_language_model() const;
};

// One key of the schema.
enum class KeyType { integer, floating, boolean, string, string_list, integer_list };
const char* key_type_name(KeyType t);

struct KeyInfo {
  std::string key;            // "train.steps"
  KeyType type;
  std::string default_value;  // as TOML ("1000", "\"cosine\"", "[]")
  std::string doc;
};
// Every key, in section order.
const std::vector<KeyInfo>& config_keys();

// Reads `path` (TOML), applies `overrides` ("--section.key=value" or "section.key=value",
// in order; later ones win), then validate(). Throws forge::Error on the first problem. A relative
// path that names no file here is looked for among the installed configs (installed_config).
RunConfig load_config(const std::string& path, const std::vector<std::string>& overrides = {});
// Note [installed configs]: for a relative `path` that is not a file from here, the file of that
// name under <the forge executable's prefix>/share/forge (`make install` puts configs/ there), if
// there is one; "" otherwise.
std::string installed_config(const std::string& path);
// The same from TOML text (`origin` names it in messages).
RunConfig parse_config(const std::string& toml_text, const std::string& origin,
                       const std::vector<std::string>& overrides = {});
// Applies one override ("--train.steps=100") without validating.
void apply_override(RunConfig& cfg, const std::string& override_arg);
// Checks every value and their relations (and that data files exist and are non-empty); the
// [model] keys through the registry's entry for model.type (nn::validate_model).
void validate(const RunConfig& cfg);
// The [model] keys set to something other than their default that model.type does not read
// (nn::ModelFamily::keys), as "model.dim = 256": a user who set them probably meant another type.
std::vector<std::string> ignored_model_keys(const RunConfig& cfg);

// Splits command-line arguments into overrides (each "--section.key=value", or
// "--section.key value" taken as one "--section.key=value") and the rest, keeping order.
struct SplitArgs {
  std::vector<std::string> overrides;
  std::vector<std::string> rest;
};
SplitArgs split_overrides(const std::vector<std::string>& args);

// {"run": {...}, "model": {...}, ...}: every key with its value; and back (strict, the
// same checks as a TOML file, but no validate()).
nlohmann::json config_to_json(const RunConfig& cfg);
RunConfig config_from_json(const nlohmann::json& j, const std::string& origin = "<json>");
// The config as a TOML document (every key).
std::string config_to_toml(const RunConfig& cfg);

// The data files data.files names: globs and directories expanded (sorted), `exclude`
// applied, empty files from globs/directories dropped. Throws naming data.files for a
// path that does not exist, a pattern that matches nothing, an explicitly listed empty
// file, or no non-empty file at all.
std::vector<std::string> resolve_data_files(const DataSection& data);
// data.val_files expanded as data.files are (empty when it is); throws naming data.val_files.
std::vector<std::string> resolve_val_files(const DataSection& data);

// run.device: "auto" is the first GPU when one is visible, else the CPU; "cpu", "cuda" and
// "cuda:N" name a device. parse_run_device checks the spelling only (an error names run.device
// and the accepted forms); resolve_run_device also checks that the GPU exists.
std::string check_run_device_syntax(const std::string& device);
Device resolve_run_device(const std::string& device);
// run.dtype for `device`: "auto" is bf16 on a GPU and f32 on the CPU.
DType resolve_run_dtype(const std::string& dtype, Device device);

// debug.abort_at / debug.hang_at: "<rank>:<step>", or nullopt for "". Throws naming `key`.
struct RankStep {
  int rank = 0;
  int64_t step = 0;
};
std::optional<RankStep> parse_rank_step(const std::string& spec, const std::string& key);

// Levenshtein distance (insertions, deletions, substitutions), for "did you mean".
size_t edit_distance(const std::string& a, const std::string& b);

}  // namespace forge::train
