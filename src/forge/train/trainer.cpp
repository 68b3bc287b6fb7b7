// The trainer, sampling and file tokenisation (contracts in trainer.h).
#include "forge/train/trainer.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>

#include "forge/autograd/grad_mode.h"
#include "forge/core/allocator.h"
#include "forge/core/error.h"
#include "forge/core/generator.h"
#include "forge/data/shards.h"
#include "forge/dist/data_parallel.h"
#include "forge/dist/env.h"
#include "forge/dist/numa.h"
#include "forge/dist/sharded_state.h"
#include "forge/dist/world.h"
#include "forge/io/atomic_file.h"
#include "forge/io/checkpoint.h"
#include "forge/io/hf_names.h"
#include "forge/io/safetensors.h"
#include "forge/nn/gpt.h"
#include "forge/nn/llama.h"
#include "forge/ops/creation.h"
#include "forge/ops/join.h"
#include "forge/ops/loss.h"
#include "forge/optim/adamw.h"
#include "forge/optim/clip.h"
#include "forge/optim/loss_scale.h"
#include "forge/optim/schedule.h"
#include "forge/optim/sgd.h"
#include "forge/telemetry/metrics.h"
#include "forge/telemetry/mfu.h"
#ifdef FORGE_WITH_CUDA
#include "forge/backends/cuda/memory.h"
#include "forge/backends/cuda/stream.h"
#endif

namespace forge::train {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

// The data order is seeded apart from the model's initialisation (which uses run.seed
// itself), so changing one never shifts the other.
constexpr uint64_t kDataSeedSalt = 0x9e3779b97f4a7c15ULL;
constexpr const char* kTokenizerFile = "tokenizer.json";
constexpr const char* kTokenizerSourceFile = "tokenizer.source.json";
constexpr const char* kManifestFile = "manifest.json";

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// FNV-1a, 64 bits: a stable fingerprint of a tokenizer's JSON.
std::string fnv1a_hex(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// Path, size and modification time of each file: what decides whether cached tokens are stale.
json files_fingerprint(const std::vector<std::string>& files) {
  json out = json::array();
  for (const auto& f : files) {
    std::error_code ec;
    const auto size = fs::file_size(f, ec);
    const auto mtime = fs::last_write_time(f, ec).time_since_epoch().count();
    out.push_back({{"path", fs::absolute(f).lexically_normal().string()}, {"size", size}, {"mtime", mtime}});
  }
  return out;
}

std::optional<json> read_json_file(const fs::path& p) {
  std::error_code ec;
  if (!fs::is_regular_file(p, ec)) return std::nullopt;
  try {
    return json::parse(io::read_file(p));
  } catch (const std::exception&) {
    return std::nullopt;  // a damaged cache file is rebuilt
  }
}

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

// ---- tokenizer and shards --------------------------------------------------------------------

data::BpeTokenizer load_or_train_tokenizer(const RunConfig& cfg, const std::vector<std::string>& files,
                                           const std::optional<fs::path>& resume_tokenizer, std::ostream& log) {
  const fs::path run_dir = cfg.run_dir();
  const fs::path tok_path = run_dir / kTokenizerFile;
  const fs::path source_path = run_dir / kTokenizerSourceFile;
  std::error_code ec;
  if (resume_tokenizer) {
    FORGE_CHECK(fs::is_regular_file(*resume_tokenizer, ec), "--resume: '", resume_tokenizer->string(),
                "' is missing; a checkpoint is continued with the tokenizer of its run directory");
    auto tok = data::BpeTokenizer::load(resume_tokenizer->string());
    if (fs::absolute(*resume_tokenizer).lexically_normal() != fs::absolute(tok_path).lexically_normal()) {
      tok.save(tok_path.string());
      io::write_file_atomic(source_path, json{{"from", resume_tokenizer->string()}}.dump() + "\n");
    }
    log << "tokenizer: " << resume_tokenizer->string() << " (the checkpoint's run), vocabulary " << tok.vocab_size()
        << "\n";
    return tok;
  }
  if (!cfg.data.tokenizer.empty()) {
    auto tok = data::BpeTokenizer::load(cfg.data.tokenizer);
    tok.save(tok_path.string());
    io::write_file_atomic(source_path, json{{"from", cfg.data.tokenizer}}.dump() + "\n");
    log << "tokenizer: " << cfg.data.tokenizer << ", vocabulary " << tok.vocab_size() << "\n";
    return tok;
  }
  const json want = {{"trained_on", files_fingerprint(files)}, {"vocab_size", cfg.data.vocab_size}};
  if (fs::is_regular_file(tok_path, ec) && read_json_file(source_path) == want) {
    auto tok = data::BpeTokenizer::load(tok_path.string());
    log << "tokenizer: reusing " << tok_path.string() << ", vocabulary " << tok.vocab_size() << "\n";
    return tok;
  }
  const auto t0 = Clock::now();
  data::BpeTrainOptions topt;
  topt.vocab_size = cfg.data.vocab_size;
  auto tok = data::BpeTokenizer::train_files(files, topt);
  tok.save(tok_path.string());
  io::write_file_atomic(source_path, want.dump() + "\n");
  log << "tokenizer: trained a byte-level BPE of " << tok.vocab_size() << " tokens on " << files.size()
      << " file(s) in " << fixed(seconds_since(t0), 1) << " s -> " << tok_path.string() << "\n";
  return tok;
}

std::vector<std::string> prepare_shards(const RunConfig& cfg, const data::BpeTokenizer& tok,
                                        const std::vector<std::string>& files, std::ostream& log) {
  const fs::path dir = cfg.data.shards_dir.empty() ? fs::path(cfg.run_dir()) / "data" : fs::path(cfg.data.shards_dir);
  const json want = {{"format", "forge-shards"}, {"tokenizer", fnv1a_hex(tok.to_json())}, {"files", files_fingerprint(files)}};
  if (auto m = read_json_file(dir / kManifestFile)) {
    bool same = m->is_object() && m->value("format", json()) == want["format"] &&
                m->value("tokenizer", json()) == want["tokenizer"] && m->value("files", json()) == want["files"] &&
                m->contains("shards") && (*m)["shards"].is_array();
    std::vector<std::string> paths;
    if (same) {
      std::error_code ec;
      for (const auto& s : (*m)["shards"]) {
        const fs::path p = dir / s.get<std::string>();
        if (!fs::is_regular_file(p, ec)) same = false;
        paths.push_back(p.string());
      }
    }
    if (same) {
      log << "data: reusing " << paths.size() << " token shard(s) in " << dir.string() << "\n";
      return paths;
    }
  }
  const auto t0 = Clock::now();
  auto paths = encode_files_to_shards(tok, files, dir.string());
  json manifest = want;
  manifest["shards"] = json::array();
  for (const auto& p : paths) manifest["shards"].push_back(fs::path(p).filename().string());
  io::write_file_atomic(dir / kManifestFile, manifest.dump(2) + "\n");
  log << "data: tokenized " << files.size() << " file(s) into " << dir.string() << " in "
      << fixed(seconds_since(t0), 1) << " s\n";
  return paths;
}

// Parameters that take part in a matmul (Note [MFU]): all but the look-up-only embedding
// tables, GPT's positions (transformer.wpe) and LLaMA's input embedding (model.embed_tokens).
int64_t matmul_parameters(const nn::Module& m) {
  int64_t n = 0;
  for (const auto& [name, p] : m.named_parameters())
    if (name.find("wpe.") == std::string::npos && name.find("embed_tokens.") == std::string::npos) n += p.numel();
  return n;
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

// data.source = "random": uniform random tokens of model.vocab_size in one shard of the run
// directory, from the run's seed (a resumed run rewrites the same tokens). 8 Mi tokens: enough
// windows that a benchmark never sees the same batch twice in practice; 16-32 MB on disk.
std::string write_random_shard(const RunConfig& cfg, std::ostream& log, bool write = true) {
  constexpr int64_t kTokens = int64_t{1} << 23;
  const fs::path dir = cfg.data.shards_dir.empty() ? fs::path(cfg.run_dir()) / "data" : fs::path(cfg.data.shards_dir);
  if (!write) return (dir / "random_tokens.bin").string();  // another rank wrote it
  std::error_code ec;
  fs::create_directories(dir, ec);
  FORGE_CHECK(!ec, "cannot create the shard directory '", dir.string(), "': ", ec.message());
  Generator gen(static_cast<uint64_t>(cfg.run.seed) ^ kDataSeedSalt);
  const Tensor ids = randint(0, cfg.model.vocab_size, {kTokens}, {.dtype = DType::i32}, &gen);
  const std::string path = (dir / "random_tokens.bin").string();
  data::write_shard(path, std::span<const int32_t>(ids.data<int32_t>(), static_cast<size_t>(kTokens)), cfg.model.vocab_size);
  log << "data: " << telemetry::format_count(static_cast<double>(kTokens)) << " uniform random tokens in [0, "
      << cfg.model.vocab_size << ") -> " << path << "\n";
  return path;
}

// ---- evaluation ------------------------------------------------------------------------------

// Mean cross-entropy per target token over the first `max_batches` batches (0 = all).
double evaluate(const LanguageModel& model, data::SequentialWindows& windows, int64_t max_batches) {
  NoGradGuard no_grad;
  const bool was_training = model.module->is_training();
  model.module->eval();
  double sum = 0.0;
  int64_t count = 0;
  for (int64_t b = 0; max_batches == 0 || b < max_batches; ++b) {
    auto batch = windows.next();
    if (!batch) break;
    const Tensor loss = ops::cross_entropy(model.forward(batch->inputs.to(model.device())),
                                           batch->targets.to(model.device()), -100, ops::Reduction::sum);
    sum += loss.item();
    count += batch->targets.numel();
  }
  model.module->train(was_training);
  FORGE_CHECK(count > 0, "evaluate: no validation window");
  return sum / static_cast<double>(count);
}

// ---- checkpoints -----------------------------------------------------------------------------

struct CheckpointInputs {
  const LanguageModel* model;
  const optim::Optimizer* opt;
  data::SamplerState sampler;
  json config;
  json extra;
};

fs::path save_run_checkpoint(const fs::path& run_dir, int64_t step, const CheckpointInputs& in, int64_t keep_last) {
  io::CheckpointData d;
  d.step = step;
  d.model = io::NamedTensors(in.model->module->state_dict());
  const optim::StateDict sd = in.opt->state_dict();
  std::vector<std::pair<std::string, Tensor>> opt_tensors(sd.tensors.begin(), sd.tensors.end());
  d.optimizer = io::NamedTensors(std::move(opt_tensors));
  io::capture_rng(d);
  d.data_loader = json::parse(in.sampler.to_json());
  d.config = in.config;
  d.extra = in.extra;
  d.extra["optimizer"] = {{"name", in.opt->name()}, {"scalars", sd.scalars}};
  const fs::path dir = io::checkpoint_path(run_dir, step);
  io::save_checkpoint(dir, d);
  io::prune_checkpoints(run_dir, static_cast<size_t>(keep_last));
  return dir;
}

// Note [data-parallel checkpoints]. Collective: every rank calls it. The model is whole on
// every rank (ZeRO-1/2 shard only the optimizer; ZeRO-3's blocks are gathered one at a time
// and rank 0 keeps a CPU copy), so rank 0 writes model.safetensors, the same file whatever the
// stage; the
// optimizer is saved by parameter ranges (dist/sharded_state.h), one shard file per rank
// (DDP: rank 0's alone). Every rank writes its file into a staging directory next to the
// checkpoint (a name prune_checkpoints treats as a temporary); rank 0 then moves them into
// the checkpoint it publishes with replace_directory_atomic, so the checkpoint appears
// whole or not at all: a crash mid-save leaves the previous one intact. state.json's
// extra.dist names the files and the layout that wrote them; any other world size or stage
// reshards on load.
fs::path save_data_parallel_checkpoint(const fs::path& run_dir, int64_t step, const CheckpointInputs& in,
                                       dist::DataParallel& dp, const std::string& optimizer_name,
                                       int64_t keep_last) {
  dist::ProcessGroup& pg = *dp.group();
  const bool rank0 = pg.rank() == 0;
  const fs::path dir = io::checkpoint_path(run_dir, step);
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(step));
  const fs::path staging = dir.parent_path() / (dir.filename().string() + ".tmp.0." + hex);
  std::error_code ec;
  if (rank0) {
    fs::remove_all(staging, ec);
    fs::create_directories(staging, ec);
    FORGE_CHECK(!ec, "checkpoint: cannot create the staging directory '", staging.string(), "': ", ec.message());
  }
  pg.barrier()->synchronize();
  const bool sharded = dp.options().zero_stage > 0;
  auto file_of = [](int r) {
    char name[64];
    std::snprintf(name, sizeof(name), "optimizer.rank%05d.safetensors", r);
    return std::string(name);
  };
  if (sharded || rank0)
    dist::write_optimizer_shard(staging / file_of(pg.rank()), dp.pieces(), dp.piece_state(), dp.piece_steps());
  // ZeRO-3: the blocks' parameters gathered (collective), copied to rank 0's memory.
  std::unordered_map<std::string, Tensor> gathered;
  if (dp.options().zero_stage == 3)
    dp.for_each_full_parameter([&](const std::string& name, const Tensor& t) {
      if (rank0) gathered[name] = t.is_cpu() ? t.clone() : t.to(Device::cpu());
    });
  pg.barrier()->synchronize();
  if (rank0) {
    io::CheckpointData d;
    d.step = step;
    nn::NamedTensors model_state = in.model->module->state_dict();
    for (auto& [name, t] : model_state)
      if (auto it = gathered.find(name); it != gathered.end()) t = it->second;
    d.model = io::NamedTensors(std::move(model_state));
    io::capture_rng(d);
    d.data_loader = json::parse(in.sampler.to_json());
    d.config = in.config;
    d.extra = in.extra;
    d.extra["optimizer"] = {{"name", optimizer_name}, {"scalars", {{"step", dp.step_count()}}}};
    json files = json::array();
    for (int r = 0; r < (sharded ? pg.size() : 1); ++r) {
      files.push_back(file_of(r));
      d.move_in.push_back(staging / file_of(r));
    }
    d.extra["dist"] = {{"world_size", pg.size()},
                       {"zero_stage", dp.options().zero_stage},
                       {"offload_optimizer", dp.options().offload_optimizer},
                       {"files", files}};
    io::save_checkpoint(dir, d);
    fs::remove_all(staging, ec);
    io::prune_checkpoints(run_dir, static_cast<size_t>(keep_last));
  }
  pg.barrier()->synchronize();
  return dir;
}

// A checkpoint directory, or the latest checkpoint of a run directory.
fs::path resolve_checkpoint(const fs::path& p, const char* who) {
  std::error_code ec;
  if (fs::is_regular_file(p / "state.json", ec)) return p;
  if (auto latest = io::find_latest_checkpoint(p)) return *latest;
  FORGE_CHECK(fs::exists(p, ec), who, ": '", p.string(), "' does not exist");
  FORGE_THROW(who, ": '", p.string(),
              "' is neither a checkpoint directory (with state.json) nor a run directory with checkpoints");
}

std::unique_ptr<optim::Optimizer> make_optimizer_for(const RunConfig& cfg, std::vector<optim::ParamGroup> groups) {
  if (cfg.optim.name == "sgd") {
    optim::SGDOptions o;
    o.lr = cfg.optim.lr;
    o.momentum = cfg.optim.momentum;
    o.nesterov = cfg.optim.nesterov;
    o.weight_decay = cfg.optim.weight_decay;
    return std::make_unique<optim::SGD>(std::move(groups), o);
  }
  optim::AdamWOptions o;
  o.lr = cfg.optim.lr;
  o.beta1 = cfg.optim.beta1;
  o.beta2 = cfg.optim.beta2;
  o.eps = cfg.optim.eps;
  o.weight_decay = cfg.optim.weight_decay;
  return std::make_unique<optim::AdamW>(std::move(groups), o);
}

// The name optim.name's optimizer reports (Optimizer::name()), as checkpoints record it.
std::string optimizer_class_name(const RunConfig& cfg) { return cfg.optim.name == "sgd" ? "SGD" : "AdamW"; }

// LLaMA's SwiGLU width: model.ffn_hidden, or 8·dim/3 rounded up to a multiple of 32.
int64_t llama_ffn_hidden(const ModelSection& m) { return m.ffn_hidden > 0 ? m.ffn_hidden : (8 * m.dim / 3 + 31) / 32 * 32; }

std::unique_ptr<optim::Optimizer> make_optimizer(const RunConfig& cfg, const nn::Module& model) {
  return make_optimizer_for(cfg, optim::decay_groups(model.named_parameters(), cfg.optim.weight_decay));
}

// The optimizer's slots in order (slot k of its state_dict is the k-th parameter over its
// groups), by name: optim::decay_groups' order.
std::vector<std::pair<std::string, Tensor>> optimizer_slots(const RunConfig& cfg, const nn::Module& model) {
  const auto named = model.named_parameters();
  std::unordered_map<const TensorImpl*, std::string> name_of;
  for (const auto& [n, t] : named) name_of.emplace(t.impl(), n);
  std::vector<std::pair<std::string, Tensor>> slots;
  for (const auto& g : optim::decay_groups(named, cfg.optim.weight_decay))
    for (const Tensor& t : g.params) slots.emplace_back(name_of.at(t.impl()), t);
  return slots;
}

// The optimizer state of a checkpoint by parameter ranges (dist/sharded_state.h): the shard
// files of a data-parallel run (extra.dist.files), or a single process's optimizer.safetensors.
dist::RangedState ranged_optimizer_state(const io::CheckpointData& ck, const fs::path& ck_path,
                                         const std::vector<std::pair<std::string, Tensor>>& slots) {
  dist::RangedState rs;
  if (ck.extra.is_object() && ck.extra.contains("dist")) {
    for (const auto& f : ck.extra["dist"].value("files", json::array())) {
      const fs::path file = ck_path / f.get<std::string>();
      std::error_code ec;
      FORGE_CHECK(fs::is_regular_file(file, ec), "--resume: checkpoint '", ck_path.string(), "' lacks its shard file '",
                  file.filename().string(), "'");
      rs.add_shard_file(file);
    }
    return rs;
  }
  const json& o = ck.extra.is_object() && ck.extra.contains("optimizer") ? ck.extra["optimizer"] : json();
  std::map<std::string, double> scalars;
  if (o.is_object() && o.contains("scalars"))
    for (const auto& [k, v] : o["scalars"].items()) scalars[k] = v.get<double>();
  std::vector<std::string> names;
  for (const auto& [n, t] : slots) names.push_back(n);
  rs.add_full_state(ck.optimizer, scalars, names);
  return rs;
}

void restore_optimizer(optim::Optimizer& opt, const io::CheckpointData& ck, const fs::path& ck_path,
                       const std::vector<std::pair<std::string, Tensor>>& slots) {
  const std::string where = ck_path.string();
  const json& o = ck.extra.is_object() && ck.extra.contains("optimizer") ? ck.extra["optimizer"] : json();
  FORGE_CHECK(o.is_object() && o.contains("scalars"), "--resume: checkpoint '", where,
              "' has no optimizer scalars (extra.optimizer); it was not written by `forge train`");
  const std::string name = o.value("name", std::string());
  FORGE_CHECK(name == opt.name(), "--resume: checkpoint '", where, "' holds ", name, " state but optim.name makes a ",
              opt.name(), "; set optim.name to match the checkpoint");
  if (ck.extra.contains("dist")) {
    // Written by a data-parallel run: reassemble every parameter's state from the shards.
    const dist::RangedState rs = ranged_optimizer_state(ck, ck_path, slots);
    optim::StateDict sd = opt.state_dict();  // the group scalars of this optimizer
    for (auto it = sd.scalars.begin(); it != sd.scalars.end();)
      it = it->first.rfind("state.", 0) == 0 ? sd.scalars.erase(it) : std::next(it);
    sd.tensors.clear();
    sd.scalars["step"] = o["scalars"].value("step", 0.0);
    for (size_t k = 0; k < slots.size(); ++k) {
      const auto& [pname, p] = slots[k];
      const int64_t steps = rs.step(pname, 0, p.numel());
      if (steps <= 0) continue;
      const std::string pre = "state." + std::to_string(k) + ".";
      sd.scalars[pre + "step"] = static_cast<double>(steps);
      for (const auto& sname : rs.state_names()) {
        if (sname == "master" && p.dtype() == DType::f32) continue;
        const Tensor t = rs.get(pname, sname, 0, p.numel());
        if (t.defined()) sd.tensors[pre + sname] = t.reshape(p.shape());
      }
    }
    opt.load_state_dict(sd);
    return;
  }
  optim::StateDict sd;
  for (const auto& [k, v] : o["scalars"].items()) sd.scalars[k] = v.get<double>();
  for (const auto& [k, t] : ck.optimizer) sd.tensors[k] = t;
  opt.load_state_dict(sd);
}

// ---- the language-model loop -----------------------------------------------------------------

// FORGE_TRAIN_PHASES=1 (a diagnostic, docs/train.md): timing events on the compute stream at
// the phase boundaries of every step; at the end each rank prints the mean device time of each
// phase over the steps after the first ten. The marks are where the GPU reaches them, so a
// phase's time includes any wait for the host or for another stream (the gradient reductions)
// within it. A step's events are folded into running sums once the next step has begun (its
// figures have been read by then, so they are complete): a long run holds a few events only.
// CUDA only.
class PhaseMarks {
 public:
  static constexpr int kMarks = 6;  // forward | backward | reductions | loss, norm, clip | update | (next step)
  explicit PhaseMarks(Device device) : device_(device) {
    const char* v = std::getenv("FORGE_TRAIN_PHASES");
    on_ = device.is_cuda() && v != nullptr && std::string(v) == "1";
  }
  void mark(int i) {
#ifdef FORGE_WITH_CUDA
    if (!on_) return;
    if (i == 0) {
      ++started_;
      if (started_ == kFirst + 1) {  // the measured steps begin: allocator and host-wait baselines
        const MemoryStats m = cuda::memory_stats(static_cast<int>(device_.index));
        allocs0_ = m.num_device_allocs + m.num_device_frees;
        waited_ = 0.0;
      }
      steps_.emplace_back();
      fold(/*keep=*/3);
    }
    if (steps_.empty() || static_cast<int>(steps_.back().size()) != i) return;  // out of order: ignored
    steps_.back().emplace_back(true);
    steps_.back().back().record(cuda::Stream::current(static_cast<int>(device_.index)));
#else
    (void)i;
#endif
  }
  // Host seconds spent waiting for a step's figures (the host's slack: near 0, it is the bottleneck).
  void host_waited(double seconds) { waited_ += seconds; }
  // The report line (empty when off or too few steps).
  std::string report() {
#ifdef FORGE_WITH_CUDA
    if (!on_) return {};
    fold(/*keep=*/1);
    if (n_ == 0) return {};
    static const char* names[kMarks] = {"forward", "backward", "waiting for the reductions", "loss, norm and clip",
                                        "update", "between steps"};
    std::ostringstream os;
    double total = 0.0;
    for (double v : sum_) total += v;
    const double n = static_cast<double>(n_);
    os << "phases (FORGE_TRAIN_PHASES, mean ms per step over " << n_ << " steps): ";
    for (int i = 0; i < kMarks; ++i) os << (i ? ", " : "") << names[i] << " " << fixed(sum_[static_cast<size_t>(i)] / n, 3);
    os << "; total " << fixed(total / n, 3);
    const MemoryStats m = cuda::memory_stats(static_cast<int>(device_.index));
    os << "; host waited " << fixed(1e3 * waited_ / static_cast<double>(started_ - kFirst), 3)
       << " ms per step for the device; cudaMalloc/cudaFree calls during these steps: "
       << m.num_device_allocs + m.num_device_frees - allocs0_;
    return os.str();
#else
    return {};
#endif
  }

 private:
  static constexpr int64_t kFirst = 10;  // warm-up steps left out
#ifdef FORGE_WITH_CUDA
  // Adds every step but the last `keep` to the sums (a step needs the next one's first mark).
  void fold(size_t keep) {
    while (steps_.size() > keep && steps_.size() >= 2) {
      const auto& m = steps_[0];
      const cuda::Event& next = steps_[1].empty() ? m.front() : steps_[1].front();
      const int64_t index = started_ - static_cast<int64_t>(steps_.size()) + 1;  // 1-based step of steps_[0]
      if (index > kFirst && m.size() == kMarks && !steps_[1].empty()) {
        next.synchronize();
        for (int i = 0; i + 1 < kMarks; ++i)
          sum_[static_cast<size_t>(i)] += m[static_cast<size_t>(i)].elapsed_ms(m[static_cast<size_t>(i) + 1]);
        sum_[kMarks - 1] += m.back().elapsed_ms(next);
        ++n_;
      }
      steps_.pop_front();
    }
  }
  std::deque<std::vector<cuda::Event>> steps_;
#endif
  Device device_;
  bool on_ = false;
  int64_t started_ = 0;
  double waited_ = 0.0;
  int64_t allocs0_ = 0;
  std::array<double, kMarks> sum_{};
  int64_t n_ = 0;
};

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
  // 0. Data parallel (Note [data-parallel runs]): this process's place in the job, checked
  // before any work.
  const dist::LaunchEnv denv = dist::launch_env();
  const int world_size = denv.world_size;
  const bool rank0 = denv.rank == 0;
  const bool data_parallel = world_size > 1 || cfg.dist.zero_stage > 0;
  FORGE_CHECK(cfg.train.batch_size % world_size == 0, "train.batch_size = ", cfg.train.batch_size,
              " is not divisible by the world size ", world_size, " (", dist::launcher_name(denv.launcher),
              "); train.batch_size is the global batch: make it a multiple of ", world_size);
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
  if (data_parallel && device.is_cuda()) device = Device::cuda(denv.local_rank);  // one GPU per rank
  const DType dtype = resolve_run_dtype(cfg.run.dtype, device);
  FORGE_CHECK(!data_parallel || dtype != DType::f16, "run.dtype = \"f16\" is not supported with data parallelism or "
              "ZeRO yet (its loss scaler is per rank); use run.dtype = \"bf16\"");
  dist::ProcessGroupPtr pg;
  if (data_parallel) {
    // Threads and host memory of this rank near its GPU (or spread over the nodes for CPU
    // ranks), before the data loader's thread starts (dist/numa.h; FORGE_BIND=none|numa|auto).
    if (denv.distributed()) {
      const auto bound = dist::bind_current_rank(denv, device, dist::bind_mode_from_env());
      if (bound.bound) log << "numa: " << bound.message << "\n";
    }
    pg = dist::world() ? dist::world() : dist::init_world(denv, device);
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
  }
  manual_seed(static_cast<uint64_t>(cfg.run.seed));
  LanguageModel model = build_language_model(cfg);
  // Initialised on the CPU (the same weights whatever the device), then moved and cast once.
  model.module->to(device, dtype);
  // One process: the optimizer over the whole model. Data parallel: dist::DataParallel makes its
  // own (over the shards it owns, for ZeRO) once the weights are final (step 4).
  std::unique_ptr<optim::Optimizer> optimizer = data_parallel ? nullptr : make_optimizer(cfg, *model.module);
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
  const int64_t B = cfg.train.batch_size, T = cfg.train.seq_len, K = cfg.train.grad_accum;
  TrainResult result;
  result.run_dir = run_dir.string();
  int64_t train_starts = 0;
  for (const auto& r : split.train) result.train_tokens += r.size(), train_starts += std::max<int64_t>(0, r.size() - T);
  for (const auto& r : split.val) result.val_tokens += r.size();
  FORGE_CHECK(train_starts > 0, "data: no training file holds a window of train.seq_len + 1 = ", T + 1, " tokens (",
              result.train_tokens, " training tokens in ", shards.size(),
              " file(s)); lower train.seq_len or add text to data.files");
  const bool has_val = cfg.data.val_fraction > 0;
  data::SequentialWindows val_windows(split.val, B, T);
  FORGE_CHECK(!has_val || val_windows.num_windows() > 0, "data.val_fraction = ", cfg.data.val_fraction,
              " leaves no validation window of train.seq_len + 1 = ", T + 1, " tokens (", result.val_tokens,
              " validation tokens); raise data.val_fraction or lower train.seq_len");
  auto sampler = std::make_unique<data::RandomWindowSampler>(split.train, B, T,
                                                              static_cast<uint64_t>(cfg.run.seed) ^ kDataSeedSalt);

  // 4. Restore.
  int64_t step = 0;
  if (ck) {
    model.module->load_state_dict(ck->model.items());
    if (!data_parallel) restore_optimizer(*optimizer, *ck, ck_path, optimizer_slots(cfg, *model.module));
    io::restore_rng(*ck);
    sampler->set_state(data::SamplerState::from_json(ck->data_loader.dump()));
    step = ck->step;
    if (rank0) telemetry::truncate_jsonl_after_step(metrics_path, step);
  }
  std::unique_ptr<dist::DataParallel> dp;
  if (data_parallel) {
    // After the weights are final (DataParallel's shards are views of the parameters).
    const auto slots = optimizer_slots(cfg, *model.module);
    std::vector<std::pair<std::string, Tensor>> trainable;
    {
      std::unordered_map<const TensorImpl*, bool> seen;  // tied weights: once, under their first name
      for (const auto& [n, t] : model.module->named_parameters())
        if (t.requires_grad() && seen.emplace(t.impl(), true).second) trainable.emplace_back(n, t);
    }
    dp = std::make_unique<dist::DataParallel>(
        trainable, optim::decay_groups(model.module->named_parameters(), cfg.optim.weight_decay),
        [&](std::vector<optim::ParamGroup> groups) { return make_optimizer_for(cfg, std::move(groups)); }, pg,
        dist::DataParallelOptions{.zero_stage = static_cast<int>(cfg.dist.zero_stage),
                                  .offload_optimizer = cfg.dist.offload_optimizer,
                                  .bucket_mb = cfg.dist.bucket_mb,
                                  .block_of = model.block_of});
    if (dp->block_hooks()) model.set_block_hooks(dp->block_hooks());
    dp->broadcast_parameters();
    if (ck) {
      const json& o = ck->extra.is_object() && ck->extra.contains("optimizer") ? ck->extra["optimizer"] : json();
      FORGE_CHECK(o.is_object() && o.contains("scalars"), "--resume: checkpoint '", ck_path.string(),
                  "' has no optimizer scalars (extra.optimizer); it was not written by `forge train`");
      const std::string name = o.value("name", std::string());
      const std::string want = optimizer_class_name(cfg);
      FORGE_CHECK(name == want, "--resume: checkpoint '", ck_path.string(), "' holds ", name,
                  " state but optim.name makes ", want, "; set optim.name to match the checkpoint");
      const dist::RangedState rs = ranged_optimizer_state(*ck, ck_path, slots);
      dp->load_piece_state(
          [&](const dist::ShardPiece& p, const std::string& n) { return rs.get(p.param, n, p.lo, p.hi); },
          [&](const dist::ShardPiece& p) { return rs.step(p.param, p.lo, p.hi); });
      dp->set_step_count(static_cast<int64_t>(o["scalars"].value("step", 0.0)));
    }
    log << "data parallel: " << world_size << " rank(s) (" << dist::launcher_name(denv.launcher) << ", "
        << pg->backend() << "), " << (cfg.dist.zero_stage == 0 ? std::string("DDP") : "ZeRO-" + std::to_string(cfg.dist.zero_stage))
        << (cfg.dist.offload_optimizer ? " with the optimizer on the CPU" : "") << ", " << dp->num_buckets()
        << " gradient bucket(s) of <= " << cfg.dist.bucket_mb << " MB; " << B / world_size << " of the " << B
        << " sequences per micro-batch on each rank\n";
  }
  // Rank 0 evaluates for the job; under ZeRO-3 every rank runs the same evaluation (its
  // forward gathers the blocks: collectives), and rank 0 reports it.
  const bool evaluates = rank0 || cfg.dist.zero_stage == 3;
  result.start_step = step;
  result.num_parameters = model.module->num_parameters();
  const std::vector<Tensor> params = model.module->parameters();

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
      << T << (K > 1 ? " x " + std::to_string(K) + " micro-batches" : std::string()) << " = " << B * T * K
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
  const int64_t tokens_per_step = B * T * K;
  int64_t interval_steps = 0, steps_this_call = 0;
  // Training tokens seen by the run, across resumes.
  int64_t tokens_done = ck && ck->extra.is_object() ? ck->extra.value("tokens", int64_t{0}) : 0;
  // f16: dynamic loss scaling, its state carried in checkpoints (extra.loss_scaler).
  std::optional<optim::LossScaler> scaler;
  if (dtype == DType::f16) {
    scaler.emplace(device);
    if (ck && ck->extra.is_object() && ck->extra.contains("loss_scaler")) {
      optim::StateDict sd;
      for (const auto& [k, v] : ck->extra["loss_scaler"].items()) sd.scalars[k] = v.get<double>();
      scaler->load_state_dict(sd);
    }
  }
  auto checkpoint_now = [&](int64_t at) {
    json extra = extra_base;
    extra["tokens"] = tokens_done;
    if (scaler) extra["loss_scaler"] = scaler->state_dict().scalars;
    const fs::path dir =
        dp ? save_data_parallel_checkpoint(run_dir, at, {&model, nullptr, loader.state(), config_json, extra}, *dp,
                                           optimizer_class_name(cfg), cfg.checkpoint.keep_last)
           : save_run_checkpoint(run_dir, at, {&model, optimizer.get(), loader.state(), config_json, extra},
                                 cfg.checkpoint.keep_last);
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
  // FORGE_TEST_ABORT_AT=<rank>:<step>: that rank aborts at the start of that step (the
  // failure tests of data-parallel jobs: the launcher must end the job, never hang).
  // FORGE_TEST_HANG_AT=<rank>:<step>: that rank stops there without exiting (a stuck or
  // unreachable peer: the others' collectives must time out, Note [MPI timeout]).
  auto fault_at = [](const char* var) -> std::optional<std::pair<int, int64_t>> {
    const char* a = std::getenv(var);
    if (a == nullptr) return std::nullopt;
    int r = -1;
    long long s = -1;
    FORGE_CHECK(std::sscanf(a, "%d:%lld", &r, &s) == 2, var, "='", a, "' is not <rank>:<step>");
    return std::make_pair(r, static_cast<int64_t>(s));
  };
  const auto abort_at = fault_at("FORGE_TEST_ABORT_AT");
  const auto hang_at = fault_at("FORGE_TEST_HANG_AT");
  PhaseMarks phases(device);
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
  const bool sync_each_step = [] {
    const char* v = std::getenv("FORGE_TRAIN_SYNC_EACH_STEP");
    return v != nullptr && std::string(v) == "1";
  }();
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
    if (host[2] != 0.0 && !(scaler && std::isfinite(loss_value))) {
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
      if (scaler) rec["loss_scale"] = host[3];
      metrics.write(rec);
      interval_seconds = 0.0;
      interval_steps = 0;
    }
    return true;
  };
  while (step < cfg.train.steps) {
    if (abort_at && abort_at->first == denv.rank && abort_at->second == step + 1) {
      std::fprintf(stderr, "forge train: FORGE_TEST_ABORT_AT: rank %d aborts at step %lld\n", denv.rank,
                   static_cast<long long>(step + 1));
      std::abort();
    }
    if (hang_at && hang_at->first == denv.rank && hang_at->second == step + 1) {
      std::fprintf(stderr, "forge train: FORGE_TEST_HANG_AT: rank %d stops at step %lld\n", denv.rank,
                   static_cast<long long>(step + 1));
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    const double lr = schedule.lr_at(step);
    if (dp) dp->set_lr(lr);
    else schedule.apply(*optimizer, step);
    Tensor loss_sum;  // on the device: read once per step
    for (int64_t k = 0; k < K; ++k) {
      auto batch = loader.next();
      FORGE_CHECK(batch.has_value(), "train: the data loader ended unexpectedly");
      if (world_size > 1) {
        // Every rank draws the same global batch and trains on its own rows of it.
        const int64_t b = B / world_size;
        batch->inputs = batch->inputs.narrow(0, denv.rank * b, b).contiguous();
        batch->targets = batch->targets.narrow(0, denv.rank * b, b).contiguous();
      }
      // To a GPU through pinned host memory: the copy is queued on the stream, no host wait.
      const Tensor inputs = device.is_cuda() ? batch->inputs.pin_memory().to(device, true) : batch->inputs;
      const Tensor targets = device.is_cuda() ? batch->targets.pin_memory().to(device, true) : batch->targets;
      if (k == K - 1) phases.mark(0);
      const Tensor loss = ops::cross_entropy(model.forward(inputs), targets);
      const Tensor l = loss.detach().to(DType::f32);
      loss_sum = loss_sum.defined() ? loss_sum + l : l;
      Tensor scaled = K == 1 ? loss : loss / static_cast<double>(K);
      if (scaler) scaled = scaler->scale_loss(scaled);
      if (k == K - 1) phases.mark(1);
      if (dp) dp->begin_backward(/*sync=*/k == K - 1);
      scaled.backward();
      if (k == K - 1) phases.mark(2);
      if (dp) dp->end_backward();
    }
    phases.mark(3);
    Tensor mean_loss = K == 1 ? loss_sum : loss_sum / static_cast<double>(K);
    if (pg && world_size > 1 && !(dp && dp->skips_reductions())) {
      // The loss of the global batch, queued behind the last gradient bucket. Not before
      // backward: there its NCCL kernel waited for the slower rank's forward while this
      // rank's backward ran, and the spinning kernel's SMs cost backward ~0.6 ms a step on two
      // H200s (benchmarks/results/dist_NVIDIA_H200.md, section 2).
      mean_loss = mean_loss.contiguous();
      pg->all_reduce(mean_loss, dist::ReduceOp::avg)->wait();
    }
    // Note [one sync per step]: the gradient norm, the clip, the skip decision and the update
    // all run on the device; the loss and the norm come back to the host once per step
    // (Note [deferred step read]).
    Tensor norm = dp ? dp->grad_norm() : scaler ? scaler->unscale_(params) : optim::total_grad_norm(params);
    if (cfg.optim.grad_clip > 0) {
      if (dp) dp->clip_grads(cfg.optim.grad_clip, norm);
      else optim::clip_grads_with_norm_(params, cfg.optim.grad_clip, norm);
    }
    // A non-finite loss or norm skips the update (loss * 0 is NaN for an inf/NaN loss).
    const Tensor bad = optim::found_non_finite(norm.to(DType::f32) + mean_loss * 0.0);
    phases.mark(4);
    if (dp) {
      dp->step(bad);
    } else if (scaler) {
      scaler->step(*optimizer);  // skips on the scaler's own overflow flag
      scaler->update();
    } else {
      optimizer->step(bad);
    }
    phases.mark(5);
    std::vector<Tensor> figures = {mean_loss.reshape({}), norm.to(DType::f32).reshape({}), bad.reshape({})};
    if (scaler) figures.push_back(scaler->scale_tensor().to(DType::f32).reshape({}));
    QueuedStep queued{step + 1, lr, StepReadback(ops::stack(figures))};
    if (dp) dp->zero_grad();
    else optimizer->zero_grad();
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
      const double v = evaluate(model, eval_windows(), cfg.eval.batches);
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
    result.final_val_loss = evaluate(model, eval_windows(), cfg.eval.batches);
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

// ---- sampling helpers ----------------------------------------------------------------------

int32_t pick_token(std::vector<double> logits, double temperature, int64_t top_k, Generator& gen) {
  const auto V = static_cast<int64_t>(logits.size());
  if (temperature == 0.0) return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  double threshold = -INFINITY;
  if (top_k > 0 && top_k < V) {
    std::vector<double> sorted = logits;
    std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(), std::greater<double>());
    threshold = sorted[static_cast<size_t>(top_k - 1)];
  }
  const double mx = *std::max_element(logits.begin(), logits.end());
  double total = 0.0;
  for (auto& l : logits) {
    l = l < threshold ? 0.0 : std::exp((l - mx) / temperature);
    total += l;
  }
  const double u = rand({1}, {.dtype = DType::f64}, &gen).item() * total;
  double acc = 0.0;
  int32_t last_nonzero = 0;
  for (int64_t i = 0; i < V; ++i) {
    if (logits[static_cast<size_t>(i)] == 0.0) continue;
    acc += logits[static_cast<size_t>(i)];
    last_nonzero = static_cast<int32_t>(i);
    if (u < acc) return last_nonzero;
  }
  return last_nonzero;  // rounding at the top end
}

}  // namespace

// ---- public ----------------------------------------------------------------------------------

Device LanguageModel::device() const {
  const auto ps = module->parameters();
  return ps.empty() ? Device::cpu() : ps.front().device();
}

LanguageModel build_language_model(const RunConfig& cfg) {
  const auto& m = cfg.model;
  FORGE_CHECK(m.vocab_size > 0, "build_language_model: model.vocab_size is not resolved (0)");
  const auto seed = static_cast<uint64_t>(cfg.run.seed);
  LanguageModel out;
  out.vocab_size = m.vocab_size;
  out.block_size = m.block_size;
  if (m.type == "gpt") {
    nn::GPTConfig c;
    c.vocab_size = m.vocab_size;
    c.block_size = m.block_size;
    c.n_layer = m.n_layer;
    c.n_head = m.n_head;
    c.n_embd = m.n_embd;
    c.dropout = m.dropout;
    c.bias = m.bias;
    c.checkpoint_activations = m.checkpoint_activations;
    auto gpt = std::make_shared<nn::GPT>(c, seed);
    out.forward = [g = gpt.get()](const Tensor& idx) { return g->forward(idx); };
    out.set_block_hooks = [g = gpt.get()](std::shared_ptr<nn::BlockHooks> h) { g->block_hooks = std::move(h); };
    out.block_of = &nn::GPT::block_of;
    out.module = gpt;
  } else if (m.type == "llama") {
    nn::LlamaConfig c;
    c.vocab_size = m.vocab_size;
    c.block_size = m.block_size;
    c.n_layer = m.n_layer;
    c.n_head = m.n_head;
    c.n_kv_head = m.n_kv_head == 0 ? m.n_head : m.n_kv_head;
    c.dim = m.dim;
    c.ffn_hidden = llama_ffn_hidden(m);
    c.norm_eps = m.norm_eps;
    c.rope_theta = m.rope_theta;
    c.init_std = m.init_std;
    c.checkpoint_activations = m.checkpoint_activations;
    auto llama = std::make_shared<nn::Llama>(c, seed);
    out.forward = [l = llama.get()](const Tensor& idx) { return l->forward(idx); };
    out.set_block_hooks = [l = llama.get()](std::shared_ptr<nn::BlockHooks> h) { l->block_hooks = std::move(h); };
    out.block_of = &nn::Llama::block_of;
    out.module = llama;
  } else {
    FORGE_THROW("model.type = '", m.type, "' is not a language model; use \"gpt\" or \"llama\"");
  }
  return out;
}

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

std::vector<std::string> encode_files_to_shards(const data::BpeTokenizer& tok, const std::vector<std::string>& files,
                                                const std::string& out_dir, std::ostream* log) {
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  FORGE_CHECK(!ec, "cannot create the shard directory '", out_dir, "': ", ec.message());
  std::vector<std::string> paths;
  std::vector<int32_t> ids;
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string text = io::read_file(files[i]);
    ids.clear();
    tok.encode_ordinary_into(text, ids);
    char name[32];
    std::snprintf(name, sizeof(name), "shard_%05zu.bin", i);
    const std::string path = (fs::path(out_dir) / name).string();
    data::write_shard(path, ids, tok.vocab_size());
    if (log) *log << "  " << files[i] << ": " << text.size() << " bytes -> " << ids.size() << " tokens -> " << path << "\n";
    paths.push_back(path);
  }
  return paths;
}

double bigram_baseline(const std::vector<data::TokenRange>& train, data::SequentialWindows& windows,
                       int64_t max_batches, int64_t vocab) {
  FORGE_CHECK(vocab > 0, "bigram_baseline: vocab must be positive");
  // Sparse pair counts (a dense V x V table would not fit for large vocabularies).
  std::unordered_map<uint64_t, int64_t> pairs;
  std::vector<int64_t> firsts(static_cast<size_t>(vocab), 0);
  std::vector<int32_t> buf;
  for (const auto& r : train) {
    if (r.size() < 2) continue;
    buf.resize(static_cast<size_t>(r.size()));
    r.shard->copy(r.begin, r.size(), buf.data());
    for (size_t i = 0; i + 1 < buf.size(); ++i) {
      FORGE_CHECK(buf[i] >= 0 && buf[i] < vocab && buf[i + 1] >= 0 && buf[i + 1] < vocab, "bigram_baseline: token ",
                  std::max(buf[i], buf[i + 1]), " is outside the vocabulary of ", vocab);
      ++pairs[static_cast<uint64_t>(buf[i]) * static_cast<uint64_t>(vocab) + static_cast<uint64_t>(buf[i + 1])];
      ++firsts[static_cast<size_t>(buf[i])];
    }
  }
  double nll = 0.0;
  int64_t count = 0;
  for (int64_t b = 0; max_batches == 0 || b < max_batches; ++b) {
    auto batch = windows.next();
    if (!batch) break;
    const int64_t* in = batch->inputs.data<int64_t>();
    const int64_t* tg = batch->targets.data<int64_t>();
    for (int64_t i = 0; i < batch->targets.numel(); ++i) {
      const auto it = pairs.find(static_cast<uint64_t>(in[i]) * static_cast<uint64_t>(vocab) + static_cast<uint64_t>(tg[i]));
      const double c = it == pairs.end() ? 0.0 : static_cast<double>(it->second);
      nll -= std::log((c + 1.0) / (static_cast<double>(firsts[static_cast<size_t>(in[i])]) + static_cast<double>(vocab)));
      ++count;
    }
  }
  FORGE_CHECK(count > 0, "bigram_baseline: no validation window");
  return nll / static_cast<double>(count);
}

std::vector<int32_t> generate(const LanguageModel& model, std::vector<int32_t> ids, int64_t n, double temperature,
                              int64_t top_k, uint64_t seed) {
  FORGE_CHECK(!ids.empty(), "generate: the prompt has no tokens");
  FORGE_CHECK(temperature >= 0 && std::isfinite(temperature), "generate: temperature must be >= 0, got ", temperature);
  FORGE_CHECK(top_k >= 0, "generate: top_k must be >= 0 (0 = all tokens), got ", top_k);
  NoGradGuard no_grad;
  const bool was_training = model.module->is_training();
  model.module->eval();
  Generator gen(seed);
  for (int64_t i = 0; i < n; ++i) {
    const auto ctx = static_cast<int64_t>(std::min<size_t>(ids.size(), static_cast<size_t>(model.block_size)));
    std::vector<int64_t> window(ids.end() - ctx, ids.end());
    const Tensor logits = model.forward(from_vector(window, {1, ctx}).to(model.device()));  // (1, T, V)
    ids.push_back(pick_token(logits.select(0, 0).select(0, ctx - 1).to_vector<double>(), temperature, top_k, gen));
  }
  model.module->train(was_training);
  return ids;
}

ExportResult export_model(const ExportOptions& opt) {
  FORGE_CHECK(!opt.checkpoint.empty(), "export: --checkpoint is required (a checkpoint or a run directory)");
  FORGE_CHECK(!opt.out.empty(), "export: --out is required (the directory to write the model to)");
  std::optional<DType> dtype;
  if (!opt.dtype.empty()) {
    FORGE_CHECK(opt.dtype == "f32" || opt.dtype == "bf16" || opt.dtype == "f16", "export: --dtype '", opt.dtype,
                "' is not one of f32, bf16, f16 (or omit it to keep the trained dtype)");
    dtype = parse_dtype(opt.dtype);
  }
  const fs::path dir = resolve_checkpoint(opt.checkpoint, "export: --checkpoint");
  const io::CheckpointData ck = io::load_checkpoint(dir);
  const RunConfig cfg = config_from_json(ck.config, (dir / "state.json").string() + " (config)");
  FORGE_CHECK(cfg.is_language_model(), "export: checkpoint '", dir.string(), "' holds a ", cfg.model.type,
              " model; only language models (gpt, llama) have a Hugging Face layout");
  // Checked against the architecture before anything is written.
  LanguageModel model = build_language_model(cfg);
  io::check_compatible(io::named_shapes(io::NamedTensors(model.module->state_dict())), ck.model,
                       "checkpoint '" + dir.string() + "'");
  io::TensorItems state = ck.model.items();
  json hf;
  const auto& m = cfg.model;
  if (m.type == "gpt") {
    state = io::gpt2_to_hf(state);
    hf = {{"architectures", {"GPT2LMHeadModel"}}, {"model_type", "gpt2"}, {"vocab_size", m.vocab_size},
          {"n_positions", m.block_size}, {"n_ctx", m.block_size}, {"n_embd", m.n_embd}, {"n_layer", m.n_layer},
          {"n_head", m.n_head}, {"activation_function", "gelu_new"}, {"layer_norm_epsilon", 1e-5},
          {"resid_pdrop", m.dropout}, {"embd_pdrop", m.dropout}, {"attn_pdrop", m.dropout},
          {"tie_word_embeddings", true}};
    FORGE_CHECK(m.bias, "export: a GPT without biases (model.bias = false) has no GPT2LMHeadModel layout");
  } else {
    const int64_t ffn = llama_ffn_hidden(m);
    hf = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"vocab_size", m.vocab_size},
          {"hidden_size", m.dim}, {"intermediate_size", ffn}, {"num_hidden_layers", m.n_layer},
          {"num_attention_heads", m.n_head}, {"num_key_value_heads", m.n_kv_head == 0 ? m.n_head : m.n_kv_head},
          {"max_position_embeddings", m.block_size}, {"rms_norm_eps", m.norm_eps}, {"rope_theta", m.rope_theta},
          {"hidden_act", "silu"}, {"tie_word_embeddings", false}};
  }
  ExportResult r;
  r.checkpoint = dir.string();
  r.step = ck.step;
  for (auto& [name, t] : state) {
    if (dtype && is_floating(t.dtype())) t = t.to(*dtype);
    r.parameters += t.numel();
  }
  r.tensors = static_cast<int64_t>(state.size());
  hf["torch_dtype"] = dtype ? (*dtype == DType::bf16 ? "bfloat16" : *dtype == DType::f16 ? "float16" : "float32")
                            : (state.empty() || state.front().second.dtype() == DType::f32 ? "float32"
                               : state.front().second.dtype() == DType::bf16             ? "bfloat16"
                                                                                          : "float16");
  const fs::path tok = dir.parent_path().parent_path() / kTokenizerFile;
  io::replace_directory_atomic(opt.out, [&](const fs::path& tmp) {
    io::save_safetensors(tmp / "model.safetensors", state, {{"format", "pt"}, {"forge_step", std::to_string(ck.step)}});
    io::write_file_atomic(tmp / "config.json", hf.dump(2) + "\n");
    std::error_code ec;
    if (fs::is_regular_file(tok, ec)) fs::copy_file(tok, tmp / "forge_tokenizer.json", ec);
  });
  return r;
}

SampleResult sample(const SampleOptions& opt) {
  FORGE_CHECK(opt.tokens >= 0, "sample: --tokens must be >= 0, got ", opt.tokens);
  FORGE_CHECK(opt.temperature >= 0, "sample: --temperature must be >= 0 (0 = greedy), got ", opt.temperature);
  FORGE_CHECK(opt.top_k >= 0, "sample: --top-k must be >= 0 (0 = all tokens), got ", opt.top_k);
  FORGE_CHECK(!opt.checkpoint.empty(), "sample: --checkpoint is required (a checkpoint or a run directory)");
  const fs::path dir = resolve_checkpoint(opt.checkpoint, "sample: --checkpoint");
  const io::CheckpointData ck = io::load_checkpoint(dir);
  const RunConfig cfg = config_from_json(ck.config, (dir / "state.json").string() + " (config)");
  FORGE_CHECK(cfg.is_language_model(), "sample: checkpoint '", dir.string(), "' holds a ", cfg.model.type,
              " model, not a language model");
  const fs::path tok_path = dir.parent_path().parent_path() / kTokenizerFile;
  std::error_code ec;
  FORGE_CHECK(fs::is_regular_file(tok_path, ec), "sample: the run's tokenizer '", tok_path.string(),
              "' is missing (a checkpoint is read with the tokenizer.json of its run directory)");
  const auto tok = data::BpeTokenizer::load(tok_path.string());
  LanguageModel model = build_language_model(cfg);
  io::check_compatible(io::named_shapes(io::NamedTensors(model.module->state_dict())), ck.model,
                       "checkpoint '" + dir.string() + "'");
  model.module->load_state_dict(ck.model.items());

  std::vector<int32_t> prompt = tok.encode_ordinary(opt.prompt.empty() ? std::string("\n") : opt.prompt);
  const auto n_prompt = prompt.size();
  const auto ids = generate(model, std::move(prompt), opt.tokens, opt.temperature, opt.top_k, opt.seed);
  SampleResult r;
  r.checkpoint = dir.string();
  r.step = ck.step;
  r.text = tok.decode(ids);
  r.completion = tok.decode(std::vector<int32_t>(ids.begin() + static_cast<std::ptrdiff_t>(n_prompt), ids.end()));
  if (opt.prompt.empty()) r.text = r.completion;
  return r;
}

}  // namespace forge::train
