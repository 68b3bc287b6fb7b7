#pragma once
// Helpers for the end-to-end tests of `forge train` on CPU ranks under mpirun
// (test_data_parallel.cpp, test_tensor_parallel_train.cpp): run forge in one process or on W
// ranks, read a run's per-step losses and final parameters, and compare two runs.
//
// Every directory these helpers create is named from a `tag` ("forge_dp_", "forge_tp_") and
// this process's id, so two test files (or two test processes under ctest -j) never share one.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "forge/io/checkpoint.h"
#include "forge/io/safetensors.h"
#include "testing/cli_testing.h"
#include "train/train_testing.h"

namespace forge::dist_train_testing {

namespace fs = std::filesystem;

struct ShellRun {
  int status = -1;
  std::string out;  // stdout and stderr together
  double seconds = 0;
};

inline ShellRun shell(const std::string& cmd) {
  const auto t0 = std::chrono::steady_clock::now();
  ShellRun r;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

// The environment every rank runs with: one thread per rank (2 cores, up to 4 ranks), Open MPI
// allowed to run as root (CI containers), shared memory without ptrace-based single copy, and a
// session directory of this test process's own: two mpiruns started at once (ctest -j) can
// otherwise race to create the shared /tmp/ompi.<host>.<uid> ("mkdir ... File exists",
// orte_init failed; seen once on a fresh clone).
inline std::string rank_env(const std::string& tag) {
  const fs::path tmp = fs::temp_directory_path() / (tag + "ompi_" + std::to_string(::getpid()));
  fs::create_directories(tmp);
  return "OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
         "OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1 "
         "OMPI_MCA_orte_tmpdir_base=" + forge::testing::shell_quote(tmp.string()) + " ";
}

// This test process's scratch directory (the fixtures remove it at the end of their suite).
inline fs::path test_root(const std::string& tag) {
  const fs::path d = fs::temp_directory_path() / (tag + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

// A small GPT on random tokens, f32 on the CPU; small buckets so that there are several.
inline std::vector<std::string> base_args(const fs::path& dir, const std::string& name, int64_t steps,
                                          const std::string& optim = "sgd") {
  return {"--optim.name=" + optim, "--run.dir=" + dir.string(), "--run.name=" + name, "--run.device=cpu",
          "--run.dtype=f32", "--run.overwrite=true", "--model.type=gpt", "--model.vocab_size=256",
          "--model.block_size=16", "--model.n_layer=2", "--model.n_head=2", "--model.n_embd=32", "--model.bias=false",
          "--data.source=random", "--train.steps=" + std::to_string(steps), "--train.batch_size=8",
          "--train.seq_len=16", "--train.log_every=1", "--optim.lr=3e-4", "--optim.momentum=0.9",
          "--optim.grad_clip=0.5", "--schedule.warmup_steps=3", "--schedule.decay_steps=20", "--eval.every=0",
          "--dist.bucket_mb=0.004"};
}

// Sets `--key=value` in `args`: replaces the argument of that key, or appends one.
inline void set_arg(std::vector<std::string>& args, const std::string& key, const std::string& value) {
  const std::string prefix = "--" + key + "=";
  auto it = std::find_if(args.begin(), args.end(), [&](const std::string& a) { return a.rfind(prefix, 0) == 0; });
  if (it == args.end()) args.push_back(prefix + value);
  else *it = prefix + value;
}

// The run of `args` on text instead of random tokens: train_testing's corpus written to `corpus`,
// a byte-level BPE of 300 tokens trained on it (the model's vocabulary), a tenth held out, and an
// evaluation of 2 batches every 5 steps (the layouts' "evaluates as one process" tests).
inline void use_text_with_evaluation(std::vector<std::string>& args, const fs::path& corpus) {
  forge::train_testing::write_corpus(corpus);
  set_arg(args, "model.vocab_size", "0");  // the tokenizer's: 300
  set_arg(args, "data.source", "files");
  set_arg(args, "data.files", "[\"" + corpus.string() + "\"]");
  set_arg(args, "data.vocab_size", "300");
  set_arg(args, "data.val_fraction", "0.1");
  set_arg(args, "eval.every", "5");
  set_arg(args, "eval.batches", "2");
}

// Every key is given on the command line; the config file itself is empty.
inline fs::path empty_config(const std::string& tag) {
  const fs::path p = test_root(tag) / "empty.toml";
  if (!fs::exists(p)) std::ofstream(p) << "# every key comes from the command line (train/dist_train_testing.h)\n";
  return p;
}

inline std::string forge_cmd(const std::string& tag, const std::vector<std::string>& args) {
  using forge::testing::shell_quote;
  std::string cmd = shell_quote(forge::testing::forge_binary().string()) + " train " +
                    shell_quote(empty_config(tag).string());
  for (const auto& a : args) cmd.append(" ").append(shell_quote(a));
  return cmd;
}

inline ShellRun run_single(const std::string& tag, const std::vector<std::string>& args) {
  return shell(rank_env(tag) + forge_cmd(tag, args));
}

inline ShellRun run_mpi(const std::string& tag, int ranks, const std::vector<std::string>& args) {
  return shell(rank_env(tag) + "mpirun --oversubscribe --bind-to none -np " + std::to_string(ranks) + " " +
               forge_cmd(tag, args));
}

// The helpers above bound to one test file's tag (its scratch and Open MPI directories):
//   const dist_train_testing::Runs runs{"forge_tp_"};  runs.run_mpi(2, args);
struct Runs {
  std::string tag;
  std::string rank_env() const { return dist_train_testing::rank_env(tag); }
  fs::path test_root() const { return dist_train_testing::test_root(tag); }
  std::string forge_cmd(const std::vector<std::string>& args) const { return dist_train_testing::forge_cmd(tag, args); }
  ShellRun run_single(const std::vector<std::string>& args) const { return dist_train_testing::run_single(tag, args); }
  ShellRun run_mpi(int ranks, const std::vector<std::string>& args) const {
    return dist_train_testing::run_mpi(tag, ranks, args);
  }
};

// The validation losses of a run's metrics.jsonl, in order.
inline std::vector<double> val_losses(const fs::path& run) {
  std::vector<double> v;
  std::ifstream in(run / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("val_loss")) v.push_back(j["val_loss"].get<double>());
  }
  return v;
}

// The validation losses of run `got` equal those of `want` (relative 1e-6), which evaluated
// `evaluations` times.
inline void expect_same_val_losses(const fs::path& got, const fs::path& want, size_t evaluations) {
  const std::vector<double> g = val_losses(got), w = val_losses(want);
  ASSERT_EQ(w.size(), evaluations) << want;
  ASSERT_EQ(g.size(), w.size()) << got;
  for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], w[i], 1e-6 * std::abs(w[i])) << got << ", evaluation " << i;
}

// Every "model: <type>, <count> parameters" in a run's output (each rank that logs one).
inline std::vector<std::string> parameter_lines(const std::string& out, const std::string& type) {
  std::vector<std::string> v;
  const std::string head = "model: " + type + ", ", tail = " parameters";
  for (size_t at = out.find(head); at != std::string::npos; at = out.find(head, at + 1)) {
    const size_t end = out.find(tail, at);
    if (end == std::string::npos) break;
    v.push_back(out.substr(at, end + tail.size() - at));
  }
  return v;
}

// A test suite's scratch directory and its Open MPI session directory (rank_env's), removed.
inline void remove_scratch(const Runs& runs, const fs::path& root) {
  std::error_code ec;
  fs::remove_all(root, ec);
  fs::remove_all(fs::temp_directory_path() / (runs.tag + "ompi_" + std::to_string(::getpid())), ec);
}

inline std::map<int64_t, double> losses(const fs::path& run_dir) {
  return forge::train_testing::metrics_losses(run_dir);
}

// The parameters of the run's latest checkpoint (empty when it has none).
inline forge::io::NamedTensors final_params(const fs::path& run_dir) {
  const auto latest = forge::io::find_latest_checkpoint(run_dir);
  if (!latest) return {};
  return forge::io::load_safetensors(*latest / "model.safetensors").tensors;
}

// max |a - b| / max |b|: relative to the reference tensor's largest entry, so that entries near
// zero do not dominate.
inline double max_rel(const forge::Tensor& a, const forge::Tensor& b) {
  const auto va = a.to_vector<double>(), vb = b.to_vector<double>();
  double diff = 0, scale = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    diff = std::max(diff, std::abs(va[i] - vb[i]));
    scale = std::max(scale, std::abs(vb[i]));
  }
  return scale == 0 ? diff : diff / scale;
}

// Compares run `got` with `want`: every step's loss from `from_step` on within `tol` (relative)
// and every final parameter within `param_tol` (max_rel). FORGE_DP_DEBUG=1 prints each
// parameter's worst entry.
inline void expect_same_run(const fs::path& got, const fs::path& want, int64_t from_step, double tol,
                            double param_tol, const std::string& what) {
  const auto lg = losses(got), lw = losses(want);
  ASSERT_FALSE(lg.empty()) << what << ": no losses in " << got;
  int64_t compared = 0;
  for (const auto& [step, l] : lg) {
    if (step < from_step) continue;
    ASSERT_TRUE(lw.count(step)) << what << ": the reference has no loss at step " << step;
    EXPECT_LE(std::abs(l - lw.at(step)) / std::abs(lw.at(step)), tol)
        << what << ": loss at step " << step << " is " << l << ", the reference's " << lw.at(step);
    ++compared;
  }
  EXPECT_EQ(compared, static_cast<int64_t>(lw.size()) - (from_step - 1)) << what;
  const auto pg = final_params(got), pw = final_params(want);
  ASSERT_EQ(pg.size(), pw.size()) << what;
  double worst = 0;
  std::string worst_name;
  for (const auto& [name, t] : pw) {
    const forge::Tensor* o = pg.find(name);
    ASSERT_NE(o, nullptr) << what << ": no parameter " << name;
    ASSERT_EQ(o->shape(), t.shape()) << what << ": parameter " << name;
    const double e = max_rel(*o, t);
    if (std::getenv("FORGE_DP_DEBUG")) {
      const auto va = o->to_vector<double>(), vb = t.to_vector<double>();
      size_t wi = 0;
      for (size_t i = 0; i < va.size(); ++i)
        if (std::abs(va[i] - vb[i]) > std::abs(va[wi] - vb[wi])) wi = i;
      std::printf("%s %s: worst [%zu] %.9g vs %.9g\n", what.c_str(), name.c_str(), wi, va[wi], vb[wi]);
    }
    if (e > worst) worst = e, worst_name = name;
  }
  EXPECT_LE(worst, param_tol) << what << ": parameter " << worst_name << " differs by " << worst << " (relative)";
  std::printf("[ %s ] worst parameter difference %.3g (%s), %lld losses compared\n", what.c_str(), worst,
              worst_name.c_str(), static_cast<long long>(compared));
}

}  // namespace forge::dist_train_testing
