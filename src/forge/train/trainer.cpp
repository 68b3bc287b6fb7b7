// The training loop of language models, whatever the layout (contracts in trainer.h): the run
// directory, data, model and strategy are prepared in order, then each step draws its
// micro-batches, lets the strategy train on them, and reads the step's figures one step later.
#include "forge/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <thread>

#include "forge/core/allocator.h"
#include "forge/core/env.h"
#include "forge/core/error.h"
#include "forge/data/shards.h"
#include "forge/dist/env.h"
#include "forge/dist/mesh.h"
#include "forge/dist/numa.h"
#include "forge/dist/world.h"
#include "forge/io/atomic_file.h"
#include "forge/io/checkpoint.h"
#include "forge/ops/matmul.h"
#include "forge/optim/schedule.h"
#include "forge/telemetry/metrics.h"
#include "forge/telemetry/mfu.h"
#include "forge/train/layout.h"
#include "forge/train/phase_marks.h"
#include "forge/train/run_checkpoint.h"
#include "forge/train/strategy.h"
#ifdef FORGE_WITH_CUDA
#include "forge/backends/cuda/memory.h"
#include "forge/backends/cuda/stream.h"
#endif

namespace forge::train {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

optim::ScheduleKind schedule_kind(const std::string& kind) {
  if (kind == "cosine") return optim::ScheduleKind::cosine;
  if (kind == "linear") return optim::ScheduleKind::linear;
  return optim::ScheduleKind::constant;
}

std::string fixed(double v, int digits = 4) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

int64_t peak_memory(Device d) {
#ifdef FORGE_WITH_CUDA
  if (d.is_cuda()) return cuda::memory_stats(d.index).peak_allocated;
#endif
  (void)d;
  return cpu_memory_stats().peak_allocated;
}

void reset_peak_memory(Device d) {
#ifdef FORGE_WITH_CUDA
  if (d.is_cuda()) return cuda::reset_peak_memory_stats(d.index);
#endif
  (void)d;
  reset_cpu_peak_memory();
}

// Note [deferred step read]: a step's loss, gradient norm and skip flag are read on the
// host one step late. The values are copied into pinned memory right after the update is
// queued, with an event behind the copy; the host then queues the next step (its batch, its
// forward, backward and update) and only then waits for that event, which completes while
// the GPU runs the next step. The GPU never idles while the host draws a batch, logs or
// launches the first kernels of a step, and with data parallelism one rank's host hiccup
// no longer stalls both GPUs. Everything the host decides from the values (logging, the
// non-finite guard's count, train.max_bad_steps) happens in step order, one step later; the
// update itself never waited for the host (the skip is decided on the device). Before an
// evaluation, a checkpoint or the end, the pending step is read first, so those see a
// state whose every step has been accounted for. On a CPU the read is immediate.
class StepReadback {
 public:
  explicit StepReadback(const Tensor& values) {
#ifdef FORGE_WITH_CUDA
    if (values.is_cuda()) {
      host_ = values.contiguous().to(Device::cpu(), /*non_blocking=*/true);
      ready_.record(cuda::Stream::current(static_cast<int>(values.device().index)));
      return;
    }
#endif
    host_ = values;
  }
  // Waits for this step's values only (not for the work queued after them).
  std::vector<double> get() const {
#ifdef FORGE_WITH_CUDA
    ready_.synchronize();
#endif
    return host_.to_vector<double>();
  }

 private:
  Tensor host_;
#ifdef FORGE_WITH_CUDA
  cuda::Event ready_;
#endif
};

TrainResult train_language_model(const RunConfig& cfg_in, const TrainOptions& opt, std::ostream& rank_log) {
  const auto t_start = Clock::now();
  RunConfig cfg = cfg_in;
  const fs::path run_dir = cfg.run_dir();
  // 0. This process's place in the job and the layout (train/layout.h), checked before any work.
  const dist::LaunchEnv denv = dist::launch_env();
  const int world_size = denv.world_size;
  const bool rank0 = denv.rank == 0;
  const dist::Layout layout = run_layout(cfg, world_size);
  // Note [data-parallel runs]: several ranks, or ZeRO on one, train through a process group.
  const bool distributed = layout.gpus() > 1 || layout.zero > 0;
  std::ostream null_log(nullptr);
  std::ostream& log = rank0 ? rank_log : null_log;  // rank 0 speaks for the job
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  FORGE_CHECK(!ec, "run.dir: cannot create the run directory '", run_dir.string(), "': ", ec.message());
  const fs::path metrics_path = run_dir / "metrics.jsonl";

  // 1. Fresh or resumed.
  std::optional<io::CheckpointData> ck;
  fs::path ck_path;
  if (opt.resume) {
    if (opt.resume_from.empty()) {
      const auto latest = io::find_latest_checkpoint(run_dir);
      FORGE_CHECK(latest.has_value(), "--resume: no checkpoint in '", (run_dir / "checkpoints").string(),
                  "'; start the run without --resume, or give a checkpoint: --resume PATH");
      ck_path = *latest;
    } else {
      ck_path = resolve_checkpoint(opt.resume_from, "--resume");
    }
    ck = io::load_checkpoint(ck_path);
    FORGE_CHECK(ck->step < cfg.train.steps, "--resume: checkpoint '", ck_path.string(), "' is at step ", ck->step,
                ", and train.steps = ", cfg.train.steps, "; raise train.steps (e.g. --train.steps=", 2 * ck->step,
                ") to train further");
  } else if (rank0) {
    const auto existing = io::list_checkpoints(run_dir);
    if (!existing.empty() || fs::exists(metrics_path, ec)) {
      FORGE_CHECK(cfg.run.overwrite, "run directory '", run_dir.string(), "' already holds a run",
                  existing.empty() ? std::string() : " (checkpoints up to step " + std::to_string(existing.back().first) + ")",
                  "; continue it with --resume, choose another run.name, or set run.overwrite = true to start afresh");
      fs::remove_all(run_dir / "checkpoints", ec);
      fs::remove(metrics_path, ec);
      log << "run: starting afresh in " << run_dir.string() << " (run.overwrite: earlier checkpoints and metrics removed)\n";
    }
  }

  // 2. Device, tokenizer, model (checked against the checkpoint before any data work), shards.
  Device device = resolve_run_device(cfg.run.device);
  if (distributed && device.is_cuda()) device = Device::cuda(denv.local_rank);  // one GPU per rank
  const DType dtype = resolve_run_dtype(cfg.run.dtype, device);
  ops::set_allow_tf32(cfg.run.allow_tf32);  // a result-changing switch: the config's, never the environment's
  dist::ProcessGroupPtr pg;
  dist::Mesh mesh = dist::Mesh::carve(world_size, denv.rank, static_cast<int>(layout.tp), static_cast<int>(layout.pp));
  if (distributed) {
    // Threads and host memory of this rank near its GPU (or spread over the nodes for CPU
    // ranks), before the data loader's thread starts (dist/numa.h; FORGE_BIND=none|numa|auto).
    if (denv.distributed()) {
      const auto bound = dist::bind_current_rank(denv, device, dist::bind_mode_from_env());
      if (bound.bound) log << "numa: " << bound.message << "\n";
    }
    pg = dist::world() ? dist::world() : dist::init_world(denv, device);
    mesh.attach(pg);
  }
  // Rank 0 prepares the run directory, tokenizer and shards; the other ranks then reuse them.
  auto barrier = [&] {
    if (pg) pg->barrier()->synchronize();
  };
  if (!rank0) barrier();
  const bool random_data = cfg.data.source == "random";
  std::optional<data::BpeTokenizer> tok;
  std::optional<fs::path> resume_tok;
  std::vector<std::string> shard_paths;
  if (!random_data) {
    const auto files = resolve_data_files(cfg.data);
    if (ck) resume_tok = ck_path.parent_path().parent_path() / kTokenizerFile;
    tok = load_or_train_tokenizer(cfg, files, resume_tok, log);
    if (cfg.model.vocab_size == 0) cfg.model.vocab_size = tok->vocab_size();
    FORGE_CHECK(cfg.model.vocab_size >= tok->vocab_size(), "model.vocab_size = ", cfg.model.vocab_size,
                " is smaller than the tokenizer's vocabulary (", tok->vocab_size(),
                " tokens); set model.vocab_size = 0 or >= ", tok->vocab_size());
    check_vocab_splits(cfg, cfg.model.vocab_size);
  }
  manual_seed(static_cast<uint64_t>(cfg.run.seed));
  LanguageModel model = build_language_model(cfg);
  // Initialised on the CPU (the same weights whatever the device), then moved and cast once.
  model.module->to(device, dtype);
  if (ck) {
    try {
      io::check_compatible(io::named_shapes(io::NamedTensors(model.module->state_dict())), ck->model,
                           "checkpoint '" + ck_path.string() + "'");
    } catch (const Error& e) {
      FORGE_THROW(e.what(), "; --resume needs the [model] keys the checkpoint was trained with (see \"config\" in ",
                  (ck_path / "state.json").string(), ")");
    }
    if (tok) {
      const std::string tok_hash = fnv1a_hex(tok->to_json());
      FORGE_CHECK(!ck->extra.is_object() || ck->extra.value("tokenizer", tok_hash) == tok_hash, "--resume: checkpoint '",
                  ck_path.string(), "' was trained with another tokenizer than '", resume_tok->string(), "'");
    }
  }
  if (random_data) {
    shard_paths = {write_random_shard(cfg, log, rank0)};
    cfg.data.val_fraction = 0.0;  // random tokens have nothing to validate
  } else {
    shard_paths = prepare_shards(cfg, *tok, resolve_data_files(cfg.data), log);
  }
  if (rank0) barrier();

  // 3. Train/val split and batches.
  const auto shards = data::open_shards(shard_paths);
  const auto split = data::split_train_val(shards, cfg.data.val_fraction);
  // Note [global batch]: B sequences per optimizer step over every rank, drawn as K global
  // micro-batches of B / K; each data-parallel rank trains on its B / (K * dp) rows of each.
  const int64_t B = cfg.train.batch_size, T = cfg.train.seq_len, K = cfg.train.grad_accum, micro = B / K;
  TrainResult result;
  result.run_dir = run_dir.string();
  int64_t train_starts = 0;
  for (const auto& r : split.train) result.train_tokens += r.size(), train_starts += std::max<int64_t>(0, r.size() - T);
  for (const auto& r : split.val) result.val_tokens += r.size();
  FORGE_CHECK(train_starts > 0, "data: no training file holds a window of train.seq_len + 1 = ", T + 1, " tokens (",
              result.train_tokens, " training tokens in ", shards.size(),
              " file(s)); lower train.seq_len or add text to data.files");
  const bool has_val = cfg.data.val_fraction > 0;
  data::SequentialWindows val_windows(split.val, micro, T);
  FORGE_CHECK(!has_val || val_windows.num_windows() > 0, "data.val_fraction = ", cfg.data.val_fraction,
              " leaves no validation window of train.seq_len + 1 = ", T + 1, " tokens (", result.val_tokens,
              " validation tokens); raise data.val_fraction or lower train.seq_len");
  auto sampler = std::make_unique<data::RandomWindowSampler>(split.train, micro, T,
                                                              static_cast<uint64_t>(cfg.run.seed) ^ kDataSeedSalt);

  // 4. Restore the model, RNG and data position; then the layout's strategy wraps the model (its
  // shards, ZeRO-3's included, are views of the final weights) and restores the optimizer.
  int64_t step = 0;
  if (ck) {
    model.module->load_state_dict(ck->model.items());
    io::restore_rng(*ck);
    sampler->set_state(data::SamplerState::from_json(ck->data_loader.dump()));
    step = ck->step;
    if (rank0) telemetry::truncate_jsonl_after_step(metrics_path, step);
  }
  const std::unique_ptr<Strategy> strategy = make_strategy(cfg, layout, mesh, model, dtype, log);
  if (ck) strategy->load_checkpoint(*ck, ck_path);
  log << strategy->describe() << "\n";
  const bool evaluates = strategy->evaluates();
  result.start_step = step;
  result.num_parameters = model.module->num_parameters();

  optim::LRSchedule schedule{.kind = schedule_kind(cfg.schedule.kind), .lr = cfg.optim.lr, .min_lr = cfg.schedule.min_lr,
                             .warmup_steps = cfg.schedule.warmup_steps,
                             .total_steps = cfg.schedule.decay_steps == 0 ? cfg.train.steps : cfg.schedule.decay_steps};
  // A run shorter than its warmup never leaves it (the decay cannot end before warmup does).
  schedule.total_steps = std::max(schedule.total_steps, schedule.warmup_steps);
  schedule.validate();

  const json config_json = config_to_json(cfg);
  if (rank0)
    io::write_file_atomic(run_dir / "config.toml", "# the resolved config of this run (forge train)\n" + config_to_toml(cfg));
  const json extra_base = tok ? json{{"tokenizer", fnv1a_hex(tok->to_json())}} : json{{"data", "random"}};
  // Rank 0 writes the metrics; the other ranks' writer goes to /dev/null.
  telemetry::JsonlWriter metrics(rank0 ? metrics_path : fs::path("/dev/null"));

  log << "model: " << cfg.model.type << ", " << telemetry::format_count(static_cast<double>(result.num_parameters))
      << " parameters (" << cfg.model.n_layer << " layers, " << cfg.model.n_head << " heads, width "
      << (cfg.model.type == "gpt" ? cfg.model.n_embd : cfg.model.dim) << ", vocabulary " << cfg.model.vocab_size
      << ", context " << cfg.model.block_size << ")\n"
      << "data: " << telemetry::format_count(static_cast<double>(result.train_tokens)) << " training tokens, "
      << telemetry::format_count(static_cast<double>(result.val_tokens)) << " validation tokens; batch " << B << " x "
      << T << (K > 1 ? " (" + std::to_string(K) + " micro-batches of " + std::to_string(micro) + ")" : std::string())
      << " = " << B * T
      << " tokens per step\n";
  if (ck) log << "resume: from " << ck_path.string() << " at step " << step << "\n";
  log << "train: " << cfg.train.steps - step << " steps (" << cfg.optim.name << ", lr " << cfg.optim.lr << ", "
      << cfg.schedule.kind << " schedule) -> " << run_dir.string() << "\n";

  auto eval_windows = [&]() -> data::SequentialWindows& {
    val_windows.reset();
    return val_windows;
  };

  // 5. Steps.
  data::DataLoader loader(std::move(sampler), 4);
  double train_seconds = 0.0, interval_seconds = 0.0;
  const int64_t tokens_per_step = B * T;
  int64_t interval_steps = 0, steps_this_call = 0;
  // Training tokens seen by the run, across resumes.
  int64_t tokens_done = ck && ck->extra.is_object() ? ck->extra.value("tokens", int64_t{0}) : 0;
  auto checkpoint_now = [&](int64_t at) {
    json extra = extra_base;
    extra["tokens"] = tokens_done;
    const fs::path dir = strategy->save_checkpoint(run_dir, at, {loader.state(), config_json, extra}, cfg.checkpoint.keep_last);
    result.last_checkpoint = dir.string();
    return dir;
  };
  // Throughput figures: model FLOPs per token (telemetry/mfu.h) over the device's dense peak
  // for the compute dtype (unknown for CPUs and unlisted GPUs: no MFU then).
  const double flops_per_token = telemetry::transformer_flops_per_token(
      static_cast<double>(matmul_parameters(*model.module)), cfg.model.n_layer, T,
      cfg.model.type == "gpt" ? cfg.model.n_embd : cfg.model.dim);
  const std::optional<double> peak_flops = telemetry::device_peak_flops(device, dtype);
  if (device.is_cuda())
    log << "device: " << device.str() << " (" << telemetry::device_name(device) << "), " << dtype_name(dtype)
        << (dtype == DType::f32 ? "" : " parameters and activations, f32 master weights and moments")
        << (peak_flops ? ", dense peak " + fixed(*peak_flops / 1e12, 1) + " TFLOP/s" : std::string(", peak unknown: no MFU"))
        << "\n";
  int64_t bad_in_a_row = 0;
  reset_peak_memory(device);
  model.module->train();
  // debug.abort_at / debug.hang_at = "<rank>:<step>": that rank aborts, or stops without exiting,
  // at the start of that step (the failure tests of data-parallel jobs: the launcher must end the
  // job, never hang; the others' collectives must time out, Note [MPI timeout]).
  const auto abort_at = parse_rank_step(cfg.debug.abort_at, "debug.abort_at");
  const auto hang_at = parse_rank_step(cfg.debug.hang_at, "debug.hang_at");
  PhaseMarks phases(device, env::flag("FORGE_TRAIN_PHASES"));
  // A queued step whose figures the host has not read yet (Note [deferred step read]).
  struct QueuedStep {
    int64_t step;
    double lr;
    StepReadback values;  // loss, gradient norm, skip flag (and the loss scale under f16)
  };
  std::optional<QueuedStep> pending;
  auto t_mark = Clock::now();  // when the previous step's figures were read (or the loop began)
  // FORGE_TRAIN_SYNC_EACH_STEP=1 (a diagnostic, docs/train.md): read every step's figures as
  // soon as it is queued, so the device drains at every step (what the deferred read saves).
  const bool sync_each_step = env::flag("FORGE_TRAIN_SYNC_EACH_STEP");
  const bool loss_scaled = dtype == DType::f16;
  // Reads a queued step's figures and does the host's share of it: the non-finite guard's
  // count, the losses, the progress line and metrics. Returns false for a skipped step.
  auto finish = [&](const QueuedStep& q) -> bool {
    const auto t_wait = Clock::now();
    const std::vector<double> host = q.values.get();
    phases.host_waited(seconds_since(t_wait));
    const double loss_value = host[0], gnorm = host[1];
    const double dt = seconds_since(t_mark);
    t_mark = Clock::now();
    tokens_done += tokens_per_step;
    // Note [non-finite guard]: a step whose loss or gradient norm is inf/NaN is skipped (the
    // update did nothing), logged and counted; max_bad_steps of them in a row stop the run
    // without writing a checkpoint, so the last good one stays the latest. With f16 the loss
    // scaler's overflow skips (finite loss, inf gradients) are how it finds its scale and do
    // not count.
    if (host[2] != 0.0 && !(loss_scaled && std::isfinite(loss_value))) {
      ++result.skipped_steps;
      ++bad_in_a_row;
      log << "step " << q.step << ": skipped (loss " << loss_value << ", gradient norm " << gnorm << "), "
          << bad_in_a_row << " in a row of train.max_bad_steps = " << cfg.train.max_bad_steps << std::endl;
      metrics.write({{"step", q.step}, {"skipped", true}, {"loss", loss_value}, {"grad_norm", gnorm}});
      result.losses.push_back(loss_value);
      FORGE_CHECK(bad_in_a_row < cfg.train.max_bad_steps, "train: ", bad_in_a_row,
                  " steps in a row had a non-finite loss or gradient norm (last at step ", q.step,
                  "); stopping. The last good checkpoint is untouched",
                  result.last_checkpoint.empty() ? std::string() : " (" + result.last_checkpoint + ")",
                  ". Lower optim.lr, raise schedule.warmup_steps, set optim.grad_clip, or use run.dtype = \"bf16\"");
      return false;
    }
    bad_in_a_row = 0;
    result.losses.push_back(loss_value);
    train_seconds += dt;
    interval_seconds += dt;
    ++interval_steps;
    ++steps_this_call;
    if (q.step % cfg.train.log_every == 0 || q.step == cfg.train.steps || q.step == result.start_step + 1) {
      const double tps = static_cast<double>(interval_steps * tokens_per_step) / std::max(interval_seconds, 1e-9);
      const double elapsed = seconds_since(t_start);
      const double eta =
          static_cast<double>(cfg.train.steps - q.step) * interval_seconds / static_cast<double>(interval_steps);
      const int64_t mem = peak_memory(device);
      // tps counts the whole job's tokens: MFU is over the peak of all its GPUs (Note [MFU]).
      const double mfu = peak_flops ? tps * flops_per_token / (*peak_flops * world_size) : -1.0;
      log << telemetry::progress_line({.step = q.step, .total_steps = cfg.train.steps, .loss = loss_value,
                                       .lr = q.lr, .tokens_per_s = tps, .elapsed_s = elapsed, .eta_s = eta,
                                       .memory_bytes = mem, .mfu = mfu})
          << std::endl;
      json rec = {{"step", q.step}, {"loss", loss_value}, {"lr", q.lr}, {"grad_norm", gnorm}, {"tokens_per_s", tps},
                  {"ms_per_step", 1e3 * interval_seconds / static_cast<double>(interval_steps)},
                  {"tokens", tokens_done}, {"elapsed_s", elapsed}, {"mem_bytes", mem}};
      if (mfu >= 0) rec["mfu"] = mfu;
      if (host.size() > 3) rec["loss_scale"] = host[3];
      metrics.write(rec);
      interval_seconds = 0.0;
      interval_steps = 0;
    }
    return true;
  };
  while (step < cfg.train.steps) {
    if (abort_at && abort_at->rank == denv.rank && abort_at->step == step + 1) {
      std::fprintf(stderr, "forge train: debug.abort_at: rank %d aborts at step %lld\n", denv.rank,
                   static_cast<long long>(step + 1));
      std::abort();
    }
    if (hang_at && hang_at->rank == denv.rank && hang_at->step == step + 1) {
      std::fprintf(stderr, "forge train: debug.hang_at: rank %d stops at step %lld\n", denv.rank,
                   static_cast<long long>(step + 1));
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    const double lr = schedule.lr_at(step);
    std::vector<data::Batch> micro_batches;
    for (int64_t k = 0; k < K; ++k) {
      auto batch = loader.next();
      FORGE_CHECK(batch.has_value(), "train: the data loader ended unexpectedly");
      micro_batches.push_back(std::move(*batch));
    }
    QueuedStep queued{step + 1, lr, StepReadback(strategy->train_step(micro_batches, lr, phases))};
    ++step;
    if (pending) finish(*pending);  // the previous step: its update ran while this one was queued
    pending.emplace(std::move(queued));

    const bool last = step == cfg.train.steps;
    const bool eval_now = has_val && evaluates && cfg.eval.every > 0 && step % cfg.eval.every == 0 && !last;
    const bool checkpoint_due = cfg.checkpoint.every > 0 && step % cfg.checkpoint.every == 0 && !last;
    if (!(eval_now || checkpoint_due || last || sync_each_step)) continue;
    // Evaluations and checkpoints see a state whose every step has been read.
    const bool ok = finish(*pending);
    pending.reset();
    if (!ok) continue;  // a skipped step neither evaluates nor checkpoints
    if (eval_now) {
      const double v = strategy->evaluate(eval_windows(), cfg.eval.batches);
      result.evals.push_back({step, v});
      log << "eval step " << step << ": val loss " << fixed(v) << std::endl;
      metrics.write({{"step", step}, {"val_loss", v}, {"elapsed_s", seconds_since(t_start)}});
    }
    if (checkpoint_due) {
      const fs::path dir = checkpoint_now(step);
      log << "checkpoint: " << dir.string() << std::endl;
    }
    t_mark = Clock::now();  // the evaluation and the checkpoint are not training time
  }
  if (const std::string p = phases.report(); !p.empty()) rank_log << p << std::endl;  // every rank
  result.final_step = step;
  result.tokens_per_s = static_cast<double>(steps_this_call * tokens_per_step) / std::max(train_seconds, 1e-9);

  // 6. The end: validation, the bigram baseline, the final checkpoint.
  json final_record = {{"step", step}, {"final", true}};
  if (!result.losses.empty()) final_record["train_loss"] = result.losses.back();
  if (has_val && evaluates) {
    result.final_val_loss = strategy->evaluate(eval_windows(), cfg.eval.batches);
    result.evals.push_back({step, result.final_val_loss});
    final_record["val_loss"] = result.final_val_loss;
    if (cfg.eval.bigram_baseline && rank0) {
      result.bigram_val_loss = bigram_baseline(split.train, eval_windows(), cfg.eval.batches, tok->vocab_size());
      final_record["bigram_val_loss"] = result.bigram_val_loss;
      log << "val loss " << fixed(result.final_val_loss, 2) << " vs bigram " << fixed(result.bigram_val_loss, 2)
          << " (step " << step << ")" << std::endl;
    } else {
      log << "val loss " << fixed(result.final_val_loss, 2) << " (step " << step << ")" << std::endl;
    }
  }
  const fs::path final_dir = cfg.checkpoint.at_end ? checkpoint_now(step) : fs::path();
  result.seconds = seconds_since(t_start);
  final_record["elapsed_s"] = result.seconds;
  final_record["tokens_per_s"] = result.tokens_per_s;
  metrics.write(final_record);
  log << "done: " << step << " steps in " << telemetry::format_duration(result.seconds) << " ("
      << telemetry::format_count(result.tokens_per_s) << " tok/s); "
      << (cfg.checkpoint.at_end ? "checkpoint " + final_dir.string() : std::string("no final checkpoint (checkpoint.at_end = false)"))
      << std::endl;
  return result;
}

}  // namespace

ImageTrainOptions image_options(const RunConfig& cfg) {
  ImageTrainOptions o;
  o.data_dir = cfg.data.dir;
  o.max_train_samples = cfg.data.max_train_samples;
  o.max_test_samples = cfg.data.max_test_samples;
  o.model = cfg.model.type;
  o.optimizer = cfg.optim.name;
  o.lr = cfg.optim.lr;
  o.momentum = cfg.optim.momentum;
  o.nesterov = cfg.optim.nesterov;
  o.beta1 = cfg.optim.beta1;
  o.beta2 = cfg.optim.beta2;
  o.eps = cfg.optim.eps;
  o.weight_decay = cfg.optim.weight_decay;
  o.grad_clip = cfg.optim.grad_clip;
  o.schedule = cfg.schedule.kind;
  o.warmup_steps = cfg.schedule.warmup_steps;
  o.min_lr = cfg.schedule.min_lr;
  o.epochs = cfg.train.epochs;
  o.batch_size = cfg.train.batch_size;
  o.eval_batch_size = cfg.train.eval_batch_size;
  o.log_every = cfg.train.log_every;
  o.seed = static_cast<uint64_t>(cfg.run.seed);
  o.run_dir = cfg.run_dir();
  o.device = resolve_run_device(cfg.run.device);
  return o;
}

TrainResult run_training(const RunConfig& cfg, const TrainOptions& opt, std::ostream& log) {
  validate(cfg);
  if (cfg.is_language_model()) return train_language_model(cfg, opt, log);
  FORGE_CHECK(!opt.resume, "--resume is not supported for model.type = \"", cfg.model.type,
              "\" (its runs are short and write one final checkpoint); start the run again without --resume");
  const ImageTrainOptions o = image_options(cfg);
  validate_image_train_options(o);
  TrainResult r;
  r.run_dir = o.run_dir;
  r.image = train_image_classifier(o, log);
  r.final_step = r.image->steps;
  r.losses = r.image->losses;
  r.seconds = r.image->seconds;
  r.last_checkpoint = r.image->checkpoint;
  return r;
}

}  // namespace forge::train
