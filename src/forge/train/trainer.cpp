// The training loop, whatever the model and the layout (contracts in trainer.h): the run
// directory, the task's data and model (train/task.h) and the strategy (train/strategy.h) are
// prepared in order, then each step draws its micro-batches, lets the strategy train on them,
// and reads the step's figures one step later.
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
#include <unordered_map>

#include "forge/backends/device_runtime.h"
#include "forge/bench/gpu_sampler.h"
#include "forge/bench/top.h"
#include "forge/nn/lora.h"
#include "forge/core/allocator.h"
#include "forge/core/env.h"
#include "forge/core/error.h"
#include "forge/core/memory_owner.h"
#include "forge/io/atomic_file.h"
#include "forge/io/checkpoint.h"
#include "forge/io/run_lock.h"
#include "forge/ops/fp8.h"
#include "forge/train/fp8_state.h"
#include "forge/ops/attention.h"
#include "forge/ops/copy.h"
#include "forge/ops/creation.h"
#include "forge/ops/matmul.h"
#include "forge/optim/schedule.h"
#include "forge/parallel/env.h"
#include "forge/parallel/mesh.h"
#include "forge/parallel/numa.h"
#include "forge/parallel/self_group.h"
#include "forge/parallel/world.h"
#include "forge/telemetry/metrics.h"
#include "forge/telemetry/mfu.h"
#include "forge/telemetry/tensorboard.h"
#include "forge/train/checkpoint_writer.h"
#include "forge/train/graphed_step.h"
#include "forge/run/hf_model.h"
#include "forge/train/host_reservation.h"
#include "forge/run/layout.h"
#include "forge/train/oom_report.h"
#include "forge/train/phase_marks.h"
#include "forge/train/preemption.h"
#include "forge/run/run_checkpoint.h"
#include "forge/train/step_trace.h"
#include "forge/train/strategy.h"
#include "forge/train/task.h"
#include "forge/train/tensor_parallel_model.h"

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

int64_t peak_memory(Device d) { return runtime::memory_stats(d).peak_allocated; }

void reset_peak_memory(Device d) { runtime::reset_peak_memory(d); }

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
// state whose every step has been accounted for. On a CPU, where train_step has done all its
// work when it returns, each step is read at once: deferring it would save nothing and would
// count a step's time in the next one's.
class StepReadback {
 public:
  explicit StepReadback(const Tensor& values) {
    if (values.is_cuda()) {
      host_ = values.contiguous().to(Device::cpu(), /*non_blocking=*/true);
      ready_.record(values.device());
      return;
    }
    host_ = values;
  }
  // Waits for this step's values only (not for the work queued after them).
  std::vector<double> get() const {
    ready_.synchronize();
    return host_.to_vector<double>();
  }

 private:
  Tensor host_;
  runtime::Event ready_;  // never recorded (complete) on the CPU
};

// Note [preemption]: every step each rank proposes a StepVerdict and the ranks act on the
// largest, agreed by one all-reduce (max) of one number over the world. On a GPU the agreed value
// is read one step later, as the step's figures are (Note [deferred step read]): the all-reduce
// is queued after the step's work and waited for behind the next step, so it costs the device
// one tiny collective a step and the host no wait. Every rank reads the same value at the same
// step, so they checkpoint or stop at the same step.
class StepAgreement {
 public:
  StepAgreement(parallel::ProcessGroupPtr pg, bool deferred) : pg_(std::move(pg)), deferred_(deferred) {}

  // This rank's proposal for the step just queued; returns the verdict to act on now (deferred:
  // the previous step's agreement; go_on before there is one).
  StepVerdict propose(StepVerdict mine) {
    if (!pg_ || pg_->size() == 1) return mine;  // nothing to agree on
    Tensor t = full({1}, static_cast<double>(mine), {.dtype = DType::f32, .device = pg_->device()});
    pg_->all_reduce(t, parallel::ReduceOp::max)->wait();
    StepReadback agreed(t);
    if (!deferred_) return verdict_of(agreed);
    std::optional<StepReadback> previous = std::move(pending_);
    pending_.emplace(std::move(agreed));
    return previous ? verdict_of(*previous) : StepVerdict::go_on;
  }

 private:
  static StepVerdict verdict_of(const StepReadback& r) {
    const double v = r.get()[0];
    return v >= 2 ? StepVerdict::stop : v >= 1 ? StepVerdict::checkpoint : StepVerdict::go_on;
  }
  parallel::ProcessGroupPtr pg_;
  bool deferred_;
  std::optional<StepReadback> pending_;
};

TrainResult train(const RunConfig& cfg_in, const TrainOptions& opt, std::ostream& rank_log) {
  const auto t_start = Clock::now();
  RunConfig cfg = cfg_in;
  const fs::path run_dir = cfg.run_dir();
  // 0. This process's place in the job and the layout (run/layout.h), checked before any work.
  const parallel::LaunchEnv denv = parallel::launch_env();
  const int world_size = denv.world_size;
  const bool rank0 = denv.rank == 0;
  const parallel::Layout layout = run_layout(cfg, world_size);
  // Note [data-parallel runs]: several ranks, or ZeRO on one, train through a process group.
  const bool distributed = needs_process_group(layout);
  std::ostream null_log(nullptr);
  std::ostream& log = rank0 ? rank_log : null_log;  // rank 0 speaks for the job
  // What differs between language models and image classifiers (train/task.h).
  const std::unique_ptr<Task> task = make_task(cfg, layout, rank0);
  const Units units = task->units();
  std::error_code ec;
  FORGE_CHECK(!fs::exists(run_dir, ec) || fs::is_directory(run_dir, ec), "run.dir: the run directory '",
              run_dir.string(), "' exists and is not a directory; choose another run.name or run.dir");
  CreatedRunDir created_dir(run_dir);  // removed again if this start is refused (before the lock goes)
  if (fs::create_directories(run_dir, ec) && rank0) created_dir.created();
  FORGE_CHECK(!ec, "run.dir: cannot create the run directory '", run_dir.string(), "': ", ec.message());
  const fs::path metrics_path = run_dir / "metrics.jsonl";
  // Note [preemption]: from here on SIGTERM, SIGINT and run.preempt_signal stop the run after a
  // step, with a checkpoint.
  const char* relayed = std::getenv("FORGE_LAUNCH_STOP_SIGNAL");  // forge launch over mpirun (parallel/launch.h)
  const StopSignals stop_signals({parse_stop_signal(cfg.run.preempt_signal, "run.preempt_signal"),
                                  relayed ? parse_stop_signal(relayed, "FORGE_LAUNCH_STOP_SIGNAL") : 0});
  const double time_limit_s = parse_duration(cfg.run.time_limit, "run.time_limit");

  // 1. One writer (Note [run directory lock]); then continue or start (Note [one command starts or
  // continues]).
  std::optional<io::RunLock> lock;
  if (rank0) {
    std::string warning;
    lock.emplace(run_dir, opt.command, &warning);
    if (!warning.empty()) log << "warning: " << warning << "\n";
  }
  const RunStart start = choose_run_start(cfg, opt.resume, opt.resume_from, run_dir, rank0);
  for (const auto& note : start.notes) log << note << "\n";
  std::optional<io::CheckpointData> ck;
  fs::path ck_path;
  if (start.checkpoint) {
    ck_path = *start.checkpoint;
    ck = io::load_checkpoint(ck_path, Device::cpu(), /*verify=*/!start.verified);  // Note [checkpoint integrity]
    if (!ck->verified)
      log << "warning: checkpoint " << ck_path.string() << " predates checkpoint manifests (format_version "
          << ck->format_version << "): its files cannot be verified\n";
  }

  // 2. Device, the task's data, the model (checked against the checkpoint before the batches'
  // data work: shards), the batches.
  Device device = resolve_run_device(cfg.run.device);
  if (distributed && device.is_cuda()) device = Device::cuda(denv.local_rank);  // one GPU per rank
  const DType dtype = task->compute_dtype(device);
  ops::set_allow_tf32(cfg.run.allow_tf32);  // a result-changing switch: the config's, never the environment's
  const bool fp8_delayed = configure_fp8(cfg, layout, device, ck ? &*ck : nullptr, ck_path, log);  // (train/fp8_state.h)
  ops::set_attention_backend(cfg.run.attention);
  ops::set_deterministic(cfg.run.deterministic);
  // Likewise (the algorithm decides the last bits). A deterministic run takes cuBLASLt's heuristic
  // choice, which depends on the shapes alone, never on a timing.
  ops::set_gemm_tuning(cfg.run.gemm_tuning == "cached" && !cfg.run.deterministic);
  parallel::ProcessGroupPtr pg;
  parallel::Mesh mesh = parallel::Mesh::carve(world_size, denv.rank, static_cast<int>(layout.tp), static_cast<int>(layout.pp),
                                              static_cast<int>(layout.cp));
  if (distributed) {
    // Threads and host memory of this rank near its GPU (or spread over the nodes for CPU
    // ranks), before the data loader's thread starts (parallel/numa.h; FORGE_BIND=none|numa|auto).
    if (denv.distributed()) {
      const auto bound = parallel::bind_current_rank(denv, device, parallel::bind_mode_from_env());
      if (bound.bound) log << "numa: " << bound.message << "\n";
    }
    pg = parallel::world() ? parallel::world() : parallel::init_world(denv, device);
    mesh.attach(pg);
  } else {
    mesh.attach(parallel::self_group(device));  // Note [one process is a data-parallel group of one]
  }
  set_fp8_amax_group(fp8_delayed ? pg : nullptr);  // Note [FP8 delayed scaling] under data parallelism
  // Rank 0 prepares the task's shared files (tokenizer, shards) first; the other ranks wait for it,
  // then reuse them. Rank 0 tells them whether it succeeded (one all-reduce of a flag), so that an
  // error there (bad data, a checkpoint that does not fit) stops every rank at once instead of
  // leaving the others waiting for it until FORGE_DIST_TIMEOUT.
  auto rank0_failed = [&](bool failed) {
    if (!pg) return failed;
    Tensor flag = full({1}, failed ? 1.0 : 0.0, {.dtype = DType::f32, .device = device});
    pg->all_reduce(flag, parallel::ReduceOp::max)->wait();
    return flag.item() != 0.0;
  };
  if (!rank0)
    FORGE_CHECK(!rank0_failed(false), "train: rank 0 failed to prepare the run (its error says why); rank ",
                denv.rank, " stops too");
  std::unique_ptr<data::BatchSource> source;
  size_t init_tensors = 0;                           // model.init_from's, loaded on a fresh run
  std::unordered_map<std::string, Tensor> f32_init;  // Note [masters from the f32 initial weights]
  bool finished = false;
  try {
    task->prepare_data(ck, ck_path, log);
    finished = ck && ck->step >= task->total_steps();
    if (!finished) {
      manual_seed(static_cast<uint64_t>(cfg.run.seed));
      // Initialised on the CPU (the same weights whatever the device; split over the
      // tensor-parallel group when dist.tp > 1), then moved and cast once.
      const MemoryOwner owner("parameters");  // Note [memory owners]
      Model& m = task->model();
      split_model_for_layout(cfg, layout, mesh, m, log);
      if (!ck && !cfg.model.init_from.empty()) {
        // In f32, before the cast: the same 16-bit weights as loading after it, and the f32
        // values stay for the masters (below).
        // A LoRA model's base comes from it; its adapters keep their initialisation (nn/lora.h).
        io::NamedShapes base_shapes;
        for (auto& [name, shape] : m.whole_shapes())
          if (!nn::is_lora_parameter(name)) base_shapes.emplace_back(name, shape);
        const io::NamedTensors w = load_init_from(cfg, base_shapes);  // checked against the model: hf_model.h
        m.load_whole_state(w, /*only_present=*/cfg.lora.enabled());
        init_tensors = w.size();
      }
      // Note [masters from the f32 initial weights] (strategy.h): the f32 weights a fresh 16-bit
      // run's parameters are rounded from, kept (the storage the cast leaves) until the strategy
      // has seeded its masters.
      if (!ck && dtype != DType::f32 && !cfg.debug.masters_from_rounded)
        for (const auto& [name, t] : m.module->named_parameters()) f32_init.emplace(name, t.detach());
      m.module->to(device, dtype);
      if (ck) {
        try {
          io::check_compatible(m.whole_shapes(), ck->model,
                               "checkpoint '" + ck_path.string() + "'");
        } catch (const Error& e) {
          FORGE_THROW(e.what(), "; --resume needs the [model] keys the checkpoint was trained with (see \"config\" in ",
                      (ck_path / "state.json").string(), ")");
        }
        task->check_resume(*ck, ck_path);
      }
      source = task->train_batches(log);
    }
  } catch (...) {
    if (rank0) rank0_failed(true);
    throw;
  }
  if (rank0) rank0_failed(false);
  TrainResult result;
  result.run_dir = run_dir.string();
  if (finished) {  // the same command after the run's end: nothing to do, and no error
    result.start_step = result.final_step = ck->step;
    result.already_finished = true;
    result.last_checkpoint = ck_path.string();
    log << "run: finished already: checkpoint " << ck_path.string() << " is at step " << ck->step << " of "
        << task->total_steps() << "; nothing to train (raise "
        << (cfg.is_language_model() ? "train.steps" : "train.epochs") << " to train further, or start afresh with "
        << "--run.overwrite=true)" << std::endl;
    return result;
  }
  Model& model = task->model();
  const int64_t total_steps = task->total_steps(), K = task->micro_batches_per_step();

  // 3. Restore the model, RNG, data position and the task's state; then the layout's strategy
  // wraps the model (its shards, ZeRO-3's included, are views of the final weights) and restores
  // the optimizer.
  int64_t step = 0;
  if (ck) {
    model.load_whole_state(ck->model);
    io::restore_rng(*ck);
    source->set_state(data::SamplerState::from_json(ck->data_loader.dump()));
    task->restore(*ck);
    step = ck->step;
    if (rank0)
      if (const std::string w = telemetry::truncate_jsonl_after_step(metrics_path, step); !w.empty()) log << w << "\n";
  } else if (init_tensors > 0) {
    log << "init_from: " << cfg.model.init_from << " (" << init_tensors << " tensors; step 0, a fresh optimizer)\n";
  }
  const std::unique_ptr<Strategy> strategy = [&] {
    const MemoryOwner owner("parameters: the strategy's copies and buffers");  // (master weights, ZeRO shards, buckets)
    return make_strategy(cfg, layout, mesh, model, dtype, log);
  }();
  if (ck) strategy->load_checkpoint(*ck, ck_path);
  if (!f32_init.empty()) {
    strategy->seed_master_weights([&](const std::string& name) {
      auto it = f32_init.find(name);
      return it == f32_init.end() ? Tensor() : it->second;
    });
    f32_init.clear();
    log << "master weights: f32, from the initial weights (" << (init_tensors > 0 ? "model.init_from" : "the seeded "
        "initialisation") << "), not from their " << dtype_name(dtype) << " rounding\n";
  } else if (!ck && dtype != DType::f32) {
    log << "master weights: from the " << dtype_name(dtype) << " parameters (debug.masters_from_rounded)\n";
  }
  log << strategy->describe() << "\n";
  const bool evaluates = strategy->evaluates();
  result.start_step = step;
  result.num_parameters = model.whole_parameters();

  optim::LRSchedule schedule{.kind = schedule_kind(cfg.schedule.kind), .lr = cfg.optim.lr, .min_lr = cfg.schedule.min_lr,
                             .warmup_steps = cfg.schedule.warmup_steps,
                             .total_steps = cfg.schedule.decay_steps == 0 ? total_steps : cfg.schedule.decay_steps};
  // A run shorter than its warmup never leaves it (the decay cannot end before warmup does).
  schedule.total_steps = std::max(schedule.total_steps, schedule.warmup_steps);
  schedule.validate();

  const json config_json = config_to_json(cfg);
  created_dir.keep();  // the run begins
  if (rank0)
    io::write_file_atomic(run_dir / "config.toml", "# the resolved config of this run (forge train)\n" + config_to_toml(cfg));
  // Rank 0 writes the metrics; the other ranks' writer goes to /dev/null.
  telemetry::JsonlWriter metrics(rank0 ? metrics_path : fs::path("/dev/null"));
  // telemetry.tensorboard: the same scalars in <run dir>/tb (Note [TensorBoard event files]).
  std::optional<telemetry::TensorBoardWriter> tensorboard;
  if (rank0 && cfg.telemetry.tensorboard) tensorboard.emplace(run_dir / "tb");
  auto write_metrics = [&](const json& record) {
    metrics.write(record);
    if (tensorboard && record.contains("step"))
      tensorboard->scalars(record["step"].get<int64_t>(),
                           std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(),
                           telemetry::record_scalars(record));
  };

  log << task->describe();
  if (ck) log << "resume: from " << ck_path.string() << " at step " << step << "\n";
  log << "train: " << total_steps - step << " steps (" << cfg.optim.name << ", lr " << cfg.optim.lr << ", "
      << cfg.schedule.kind << " schedule) -> " << run_dir.string() << "\n";

  // 4. Steps.
  data::DataLoader loader(std::move(source), 4);
  double train_seconds = 0.0, interval_seconds = 0.0;
  int64_t interval_steps = 0, interval_units = 0, units_this_call = 0;
  // The time the loop waited for the data loader's batches since the last record (data_wait_ms:
  // near 0 while the loader's prefetching thread keeps ahead of the steps).
  double interval_data_wait = 0.0;
  // Training units (tokens, images) seen by the run, across resumes.
  int64_t units_done = ck && ck->extra.is_object() ? ck->extra.value(units.name, int64_t{0}) : 0;
  // The run's training time before this start (its checkpoint's extra.elapsed_s): the records'
  // elapsed_s go on across resumes (the time between a stop and the next start is not counted).
  // run.time_limit counts from this start.
  double elapsed_before = 0.0;
  if (ck && ck->extra.is_object() && ck->extra.contains("elapsed_s") && ck->extra["elapsed_s"].is_number()) {
    const double e = ck->extra["elapsed_s"].get<double>();
    if (std::isfinite(e) && e >= 0) elapsed_before = e;
  }
  auto run_elapsed = [&] { return elapsed_before + seconds_since(t_start); };
  // The elapsed_s written into the last checkpoint, and its step. The record that ends a run (final,
  // stopped) reports this when its checkpoint is of the last step, so that a resumed start's
  // records (which go on from the checkpoint's value) never read earlier than the record before
  // them; the time spent writing that checkpoint is not counted.
  double checkpoint_elapsed = 0.0;
  int64_t checkpoint_elapsed_step = -1;
  auto ending_elapsed = [&](int64_t at) { return checkpoint_elapsed_step == at ? checkpoint_elapsed : run_elapsed(); };
  // Note [async checkpoints]: the snapshot at the step boundary (collective), its writing on the
  // writer's thread. FORGE_DIST_TIMEOUT bounds rank 0's wait for the other ranks' files from below.
  CheckpointWriter writer(cfg.checkpoint.async, std::max(3600.0, env::real("FORGE_DIST_TIMEOUT")));
  auto last_checkpoint_at = Clock::now();  // checkpoint.interval_minutes counts from here
  double checkpoint_cost_s = 0.0;          // the longest stall + write so far (run.time_limit's margin)
  HostReservation host_reservation;  // started after the first step (Note [reserving segments ahead])
  auto checkpoint_now = [&](int64_t at) {
    const auto t0 = Clock::now();
    // (the rest of the pinned reservation, if any, counts as snapshot time, not as the previous write)
    if (const std::string r = host_reservation.wait(); !r.empty()) log << r << std::endl;
    const auto t_writer = Clock::now();
    writer.wait();  // the previous checkpoint, if it is still being written on this rank
    const double waited = seconds_since(t_writer);
    json extra = task->checkpoint_extra();
    extra[units.name] = units_done;
    if (fp8_delayed) extra[kFp8HistoriesKey] = fp8_histories_json();  // Note [FP8 delayed scaling]
    checkpoint_elapsed = run_elapsed();
    checkpoint_elapsed_step = at;
    extra["elapsed_s"] = checkpoint_elapsed;
    CheckpointJob job = strategy->snapshot_checkpoint(run_dir, at, {loader.state(), config_json, extra},
                                                      cfg.checkpoint.keep_last);
    ops::wait_for_host_copies(device);
    const fs::path dir = job.dir;
    const uint64_t bytes = job.host_bytes;
    const double snapshot_s = seconds_since(t0) - waited;
    writer.submit(std::move(job));  // synchronous writers write it now
    const double stall = seconds_since(t0);
    checkpoint_cost_s = std::max(checkpoint_cost_s, stall);
    last_checkpoint_at = Clock::now();
    result.last_checkpoint = dir.string();
    log << "checkpoint: " << dir.string() << " (step " << at << "): training waited " << fixed(stall, 3) << " s ("
        << (waited > 0.001 ? "for the previous write " + fixed(waited, 3) + " s, " : std::string()) << "snapshot of "
        << telemetry::format_bytes(static_cast<double>(bytes)) << " on this rank " << fixed(snapshot_s, 3) << " s"
        << (writer.async() ? "), written in the background" : ", written") << std::endl;
    write_metrics({{"step", at}, {"checkpoint", dir.string()}, {"stall_s", stall}, {"snapshot_s", snapshot_s},
                   {"wait_previous_s", waited}, {"snapshot_bytes", bytes}, {"async", writer.async()}});
    return dir;
  };
  // Checkpoints finished on the writer since the last look: their time in the log and metrics.
  auto report_written = [&] {
    for (const CheckpointTiming& t : writer.take_finished()) {
      checkpoint_cost_s = std::max(checkpoint_cost_s, t.write_s);
      if (!writer.async()) continue;  // the synchronous writer's time is the stall, reported already
      log << "checkpoint: step " << t.step << " written in " << fixed(t.write_s, 3) << " s" << std::endl;
      write_metrics({{"step", t.step}, {"checkpoint_write_s", t.write_s}});
    }
  };
  // Throughput figures: model FLOPs per unit (telemetry/mfu.h) over the device's dense peak for
  // the compute dtype (unknown for CPUs and unlisted GPUs, and for tasks without a FLOP count:
  // no MFU then).
  const std::optional<double> flops_per_unit = task->flops_per_unit();
  const std::optional<double> peak_flops = telemetry::device_peak_flops(device, dtype);
  // telemetry.gpu_sampling: NVML read off this thread every 100 ms (bench/gpu_sampler.h), summed up
  // in each progress record; Note [idle share].
  std::unique_ptr<bench::GpuSampler> gpu_sampler;
  if (device.is_cuda() && cfg.telemetry.gpu_sampling) {
    gpu_sampler = std::make_unique<bench::GpuSampler>(runtime::pci_bus_id(device), device.index);
    if (!gpu_sampler->ok()) {
      rank_log << "telemetry: no NVML sample of the GPU (NVML or the device not found): device activity not recorded"
               << std::endl;
      gpu_sampler.reset();
    }
  }
  int64_t activity_records = 0;
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
  // job, never hang; the others' collectives must time out, Note [MPI timeout]). Only in a job's
  // first attempt: after `forge launch --max-restarts` restarts it, the run goes on.
  const bool first_attempt = parallel::restart_count() == 0;
  const auto abort_at = first_attempt ? parse_rank_step(cfg.debug.abort_at, "debug.abort_at") : std::nullopt;
  const auto hang_at = first_attempt ? parse_rank_step(cfg.debug.hang_at, "debug.hang_at") : std::nullopt;
  PhaseMarks phases(device, env::flag("FORGE_TRAIN_PHASES"));
  // telemetry.profile_steps: a Chrome / Perfetto trace of those steps per rank (Note [step trace]).
  StepTrace trace(device, cfg.telemetry.profile_steps, run_dir / ("trace.rank" + std::to_string(denv.rank) + ".json"),
                  denv.rank);
  phases.set_trace(&trace);
  // Note [the step as a CUDA graph]: from here on a GPU run's work may go to a stream of its own.
  GraphedStep graphed(*strategy, cfg, device, phases.on(), log);
  // A queued step whose figures the host has not read yet (Note [deferred step read]).
  struct QueuedStep {
    int64_t step;
    double lr;
    int64_t units;        // targets of its micro-batches: tokens, or images
    StepReadback values;  // loss, gradient norm, skip flag (and the loss scale under f16)
  };
  std::optional<QueuedStep> pending;
  auto t_mark = Clock::now();  // when the previous step's figures were read (or the loop began)
  // FORGE_TRAIN_SYNC_EACH_STEP=1 (a diagnostic, docs/train.md): read every step's figures as
  // soon as it is queued, so the device drains at every step (what the deferred read saves). CPU
  // steps are always read at once (Note [deferred step read]).
  const bool read_at_once = env::flag("FORGE_TRAIN_SYNC_EACH_STEP") || !device.is_cuda();
  const bool loss_scaled = dtype == DType::f16;
  // Reads a queued step's figures and does the host's share of it: the non-finite guard's
  // count, the losses, the progress line and metrics. Returns false for a skipped step.
  double last_step_s = 0.0;  // the latest step's wall time (run.time_limit's margin)
  auto finish = [&](const QueuedStep& q) -> bool {
    const auto t_wait = Clock::now();
    const std::vector<double> host = q.values.get();
    phases.host_waited(seconds_since(t_wait));
    const double loss_value = host[0], gnorm = host[1];
    const double dt = seconds_since(t_mark);
    last_step_s = dt;
    t_mark = Clock::now();
    units_done += q.units;
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
      write_metrics({{"step", q.step}, {"skipped", true}, {"loss", loss_value}, {"grad_norm", gnorm}});
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
    task->on_step(q.step, loss_value, q.units);
    train_seconds += dt;
    interval_seconds += dt;
    ++interval_steps;
    interval_units += q.units;
    units_this_call += q.units;
    const std::optional<EpochPlace> place = task->epoch_of(q.step);
    if (q.step % cfg.train.log_every == 0 || q.step == total_steps || q.step == result.start_step + 1 ||
        (place && place->ends_epoch)) {
      const double rate = static_cast<double>(interval_units) / std::max(interval_seconds, 1e-9);
      const double elapsed = run_elapsed();
      const double eta = static_cast<double>(total_steps - q.step) * interval_seconds / static_cast<double>(interval_steps);
      const int64_t mem = peak_memory(device);
      // rate counts the whole job's units: MFU is over the peak of all its GPUs (Note [MFU]).
      const double mfu = peak_flops && flops_per_unit ? rate * *flops_per_unit / (*peak_flops * world_size) : -1.0;
      const bench::GpuActivity activity = gpu_sampler ? gpu_sampler->take() : bench::GpuActivity{};
      log << telemetry::progress_line({.step = q.step, .total_steps = total_steps, .loss = loss_value, .lr = q.lr,
                                       .rate = rate, .unit = units.abbrev, .elapsed_s = elapsed, .eta_s = eta,
                                       .memory_bytes = mem, .mfu = mfu, .epoch = place ? place->epoch : 0,
                                       .epochs = place ? place->epochs : 0,
                                       .gpu = bench::activity_text(activity)})
          << std::endl;
      json rec = {{"step", q.step}, {"loss", loss_value}, {"lr", q.lr}, {"grad_norm", gnorm}, {units.name + "_per_s", rate},
                  {"ms_per_step", 1e3 * interval_seconds / static_cast<double>(interval_steps)},
                  {"data_wait_ms", 1e3 * interval_data_wait / static_cast<double>(interval_steps)},
                  {units.name, units_done}, {"elapsed_s", elapsed}, {"mem_bytes", mem}};
      if (place) rec["epoch"] = place->epoch;
      if (mfu >= 0) rec["mfu"] = mfu;
      if (cfg.telemetry.fp8_amax) rec["fp8_amax"] = fp8_amax_record_json();  // each layer's, since the last record
      if (gpu_sampler) {
        const bench::GpuActivity& a = activity;
        if (a.samples > 0) {
          rec.update(bench::activity_record(a));
          // The first interval holds the start (allocation, tuning, graph capture): no warning there.
          const double idle = 100.0 - a.utilization_pct;
          if (++activity_records > 1 && idle > cfg.telemetry.idle_warn_pct)
            log << "warning: GPU " << device.index << " ran no kernel for " << fixed(idle, 0) << "% of steps up to "
                << q.step << " (the data loader, the host or a synchronisation kept it waiting; Note [idle share])"
                << std::endl;
        }
      }
      if (host.size() > 3) rec["loss_scale"] = host[3];
      write_metrics(rec);
      interval_seconds = 0.0;
      interval_steps = 0;
      interval_units = 0;
      interval_data_wait = 0.0;
    }
    return true;
  };
  StepAgreement agreement(pg, /*deferred=*/!read_at_once);
  std::string stop_reason;    // what asked for a stop (Note [preemption])
  bool stopped = false;
  while (step < total_steps) {
    writer.check();  // a checkpoint that failed on the writer stops the run here, with its error
    report_written();
    if (lock) lock->heartbeat();
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
    int64_t step_units = 0;
    trace.begin_step(step + 1);
    for (int64_t k = 0; k < K; ++k) {
      static const char* data_label = intern_memory_owner("data");
      const MemoryOwner owner(data_label);
      const auto t_data = Clock::now();
      auto batch = loader.next();
      interval_data_wait += seconds_since(t_data);
      FORGE_CHECK(batch.has_value(), "train: the data loader ended unexpectedly at step ", step + 1);
      step_units += batch->targets.numel();
      micro_batches.push_back(std::move(*batch));
    }
    trace.data_done();
    QueuedStep queued{step + 1, lr, step_units, StepReadback(graphed.train_step(micro_batches, lr, phases, trace.tracing()))};
    trace.end_step();
    if (fp8::training_recipe()) {
      fp8::queue_step_records(step + 1);            // Note [FP8 guardrails one step late]
      report_fp8_guard_events(step + 1, rank_log);  // (the earlier steps')
      report_fp8_gemm_choices(log);                  // Note [FP8 GEMM choice]
    }
    ++step;
    if (device.is_cuda() && !host_reservation.started()) {  // the optimizer's state exists from here
      if (const uint64_t b = host_reservation.start(device, strategy->checkpoint_host_bytes()); b > 0)
        log << "checkpoint: reserving " << telemetry::format_bytes(static_cast<double>(b))
                 << " of pinned host memory for the snapshots in the background" << std::endl;
    }
    if (pending) finish(*pending);  // the previous step: its update ran while this one was queued
    pending.emplace(std::move(queued));

    // Note [preemption]: this rank's proposal, and the verdict every rank acts on at this step.
    StepVerdict mine = StepVerdict::go_on;
    const double elapsed = seconds_since(t_start);
    if (const int sig = StopSignals::received(); sig != 0) {
      mine = StepVerdict::stop;
      if (stop_reason.empty()) stop_reason = signal_name(sig);
    } else if (time_limit_s > 0 && elapsed + 2 * last_step_s + checkpoint_cost_s >= time_limit_s) {
      mine = StepVerdict::stop;  // the verdict lands one step later, then one checkpoint is written
      if (stop_reason.empty()) stop_reason = "run.time_limit (" + cfg.run.time_limit + ")";
    } else if (cfg.checkpoint.interval_minutes > 0 &&
               seconds_since(last_checkpoint_at) >= 60.0 * cfg.checkpoint.interval_minutes) {
      mine = StepVerdict::checkpoint;
    }
    const StepVerdict verdict = agreement.propose(mine);
    const bool last = step == total_steps;
    const bool stop_now = verdict == StepVerdict::stop && !last;
    const bool eval_now = evaluates && task->eval_due(step) && !stop_now;
    const bool checkpoint_due =
        ((cfg.checkpoint.every > 0 && step % cfg.checkpoint.every == 0) || verdict != StepVerdict::go_on) && !last;
    if (!(eval_now || checkpoint_due || last || read_at_once)) continue;
    // Evaluations and checkpoints see a state whose every step has been read.
    const bool ok = finish(*pending);
    pending.reset();
    if (fp8::training_recipe()) report_fp8_guard_events(step, rank_log, /*all=*/true);  // (every step's, read)
    if (stop_now) {  // the step's checkpoint on every rank (a skipped step's state is the one before it)
      checkpoint_now(step);
      if (stop_reason.empty()) stop_reason = "another rank's request";
      stopped = true;
      break;
    }
    if (!ok && !last) continue;  // a skipped step neither evaluates nor checkpoints (the end still evaluates)
    if (eval_now) {
      const auto t_eval = Clock::now();
      Evaluation e = task->evaluate(*strategy, step);
      e.record["eval_s"] = seconds_since(t_eval);
      result.evals.push_back({step, e.loss});
      log << e.line << std::endl;
      e.record["step"] = step;
      e.record["elapsed_s"] = run_elapsed();
      write_metrics(e.record);
    }
    if (checkpoint_due) checkpoint_now(step);  // it logs itself
    t_mark = Clock::now();  // the evaluation and the checkpoint are not training time
  }
  if (const std::string p = phases.report(); !p.empty()) rank_log << p << std::endl;  // every rank
  if (const std::string t = trace.write(); !t.empty()) log << "trace: " << t << " (telemetry.profile_steps)" << std::endl;
  if (const std::string g = graphed.summary(); !g.empty()) log << g << std::endl;
  // Note [GEMM algorithm tuning] (backends/cuda/blaslt.h): what the run's GEMM tuning did.
  if (const std::string g = runtime::gemm_tuning_report(device, cfg.run.gemm_tuning); !g.empty()) log << g << std::endl;
  result.final_step = step;
  const double units_per_s = static_cast<double>(units_this_call) / std::max(train_seconds, 1e-9);
  if (stopped) {  // Note [preemption]: the checkpoint of this step is on disk before any rank ends
    writer.wait();
    report_written();
    if (pg) pg->barrier()->synchronize();  // rank 0 has published it
    result.stopped = true;
    result.stop_reason = stop_reason;
    result.seconds = seconds_since(t_start);
    write_metrics({{"step", step}, {"stopped", stop_reason}, {"elapsed_s", ending_elapsed(step)}});
    log << "stopped: at step " << step << " of " << total_steps << " (" << stop_reason << "), checkpoint "
        << result.last_checkpoint << "; the same command continues the run (exit code " << kStoppedExitCode << ")"
        << std::endl;
    return result;
  }

  // 5. The end: the task's (validation and the bigram baseline; the test accuracy), the final
  // checkpoint.
  json final_record = {{"step", step}, {"final", true}};
  if (!result.losses.empty()) final_record["train_loss"] = result.losses.back();
  // The job's memory: every rank's peak, gathered (collective); the largest per GPU, and per
  // pipeline stage the largest of its ranks (the stages differ: embeddings, head, in-flight
  // micro-batches).
  if (pg && pg->size() > 1) {
    Tensor mine = full({1}, static_cast<double>(peak_memory(device)), {.dtype = DType::f64, .device = device});
    Tensor all = zeros({pg->size()}, {.dtype = DType::f64, .device = device});
    pg->all_gather(all, mine)->wait();
    const std::vector<double> peaks = all.to(Device::cpu()).to_vector<double>();
    std::vector<double> per_stage(static_cast<size_t>(layout.pp), 0.0);
    for (int r = 0; r < pg->size(); ++r) {
      const auto s = static_cast<size_t>((r / layout.tp) % layout.pp);
      per_stage[s] = std::max(per_stage[s], peaks[static_cast<size_t>(r)]);
    }
    const double most = *std::max_element(peaks.begin(), peaks.end());
    final_record["mem_bytes_max"] = most;
    log << "memory: peak per " << (device.is_cuda() ? "GPU " : "process ") << telemetry::format_bytes(most) << " (the largest of "
        << pg->size() << " ranks)";
    if (layout.pp > 1) {
      final_record["mem_bytes_per_stage"] = per_stage;
      log << "; per pipeline stage";
      for (size_t s = 0; s < per_stage.size(); ++s) log << " " << s << ": " << telemetry::format_bytes(per_stage[s]);
    }
    log << "\n";
  }
  const auto t_finish = Clock::now();
  task->finish(*strategy, evaluates, step, units_per_s, result, final_record, log);
  final_record["eval_s"] = seconds_since(t_finish);  // the last evaluation (and the bigram baseline)
  const fs::path final_dir = cfg.checkpoint.at_end ? checkpoint_now(step) : fs::path();
  writer.wait();  // the last checkpoint is on disk before the run reports done
  report_written();
  result.seconds = seconds_since(t_start);
  final_record["elapsed_s"] = ending_elapsed(step);
  final_record[units.name + "_per_s"] = units_per_s;
  write_metrics(final_record);
  log << "done: " << step << " steps in " << telemetry::format_duration(result.seconds) << " ("
      << telemetry::format_count(units_per_s) << " " << units.abbrev << "/s); "
      << (cfg.checkpoint.at_end ? "checkpoint " + final_dir.string() : std::string("no final checkpoint (checkpoint.at_end = false)"))
      << std::endl;
  return result;
}

}  // namespace

std::unique_ptr<Task> make_task(RunConfig& cfg, const parallel::Layout& layout, bool rank0) {
  if (cfg.is_language_model()) return make_language_task(cfg, layout, rank0);
  return make_image_task(cfg, layout, rank0);
}

TrainResult run_training(const RunConfig& cfg, const TrainOptions& opt, std::ostream& log) {
  validate(cfg);
  try {
    return train(cfg, opt, log);
  } catch (const OutOfMemoryError& e) {  // Note [memory owners]: what held the memory, and the plan
    const std::string path = write_oom_report(e, cfg);
    if (path.empty()) throw;
    throw Error(std::string(e.what()) + "\nThe device's memory at the failure, by owner, beside forge plan's "
                "prediction for this config: " + path);
  }
}

}  // namespace forge::train
