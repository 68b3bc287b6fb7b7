// A long run's life (docs/train.md, "Long runs"), through the forge executable on CPU ranks:
// a SIGTERM mid-run and the same command again give every step's loss of the uninterrupted run
// (one process, and under forge launch with dist.tp = 2 and dist.pp = 2); run.time_limit; NaN
// state never saved; one writer per run directory; a torn metrics line; forge launch
// --max-restarts after an injected failure; export never writes over what it did not write.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "forge/io/checkpoint.h"
#include "forge/io/run_lock.h"
#include "forge/telemetry/metrics.h"
#include "testing/tensor_testing.h"
#include "train/dist_train_testing.h"

namespace forge::testing {
namespace {

namespace fs = std::filesystem;
using dist_train_testing::base_args;
using dist_train_testing::set_arg;
using Clock = std::chrono::steady_clock;

const dist_train_testing::Runs runs{"forge_long_"};

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE((haystack).find(needle), std::string::npos) << "looked for: " << (needle) << "\n" << (haystack)

// A command started in the background (sh -c "exec ..."), its output in a file; the pid is the
// command's own (exec), so a signal reaches it and nothing else.
class Background {
 public:
  Background(const std::string& cmd, const fs::path& log) : log_(log) {
    pid_ = ::fork();
    if (pid_ == 0) {
      const std::string line = "exec " + cmd + " > " + shell_quote(log.string()) + " 2>&1";
      ::execl("/bin/sh", "sh", "-c", line.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  ~Background() {
    if (pid_ > 0 && !done_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  void signal(int sig) const { ::kill(pid_, sig); }
  // Whether it still runs (reaps it when it has ended).
  bool running() {
    if (done_) return false;
    int st = 0;
    if (::waitpid(pid_, &st, WNOHANG) != pid_) return true;
    done_ = true;
    status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return false;
  }
  // The exit status (128 + signal for a signal); -1 after `timeout_s`.
  int wait(double timeout_s = 300) {
    const auto t0 = Clock::now();
    while (std::chrono::duration<double>(Clock::now() - t0).count() < timeout_s) {
      if (!running()) return status_;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return -1;
  }
  std::string output() const { return forge::train_testing::read_text(log_); }

 private:
  pid_t pid_ = -1;
  bool done_ = false;
  int status_ = -1;
  fs::path log_;
};

// The largest step with a loss in a run's metrics so far (a line being written is skipped).
int64_t logged_step(const fs::path& run_dir) {
  int64_t step = 0;
  try {
    for (const auto& j : telemetry::read_jsonl(run_dir / "metrics.jsonl"))
      if (j.contains("loss") && j["step"].is_number_integer()) step = std::max(step, j["step"].get<int64_t>());
  } catch (const Error&) {
  }
  return step;
}

// Waits until the run of `b` has logged `step`; false when `b` ended first or after `timeout_s`.
bool wait_for_step(const fs::path& run_dir, int64_t step, Background& b, double timeout_s = 120) {
  const auto t0 = Clock::now();
  while (std::chrono::duration<double>(Clock::now() - t0).count() < timeout_s) {
    if (logged_step(run_dir) >= step) return true;
    if (!b.running()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

// A run slow enough to be signalled mid-way: AdamW (moments to restore), `steps` steps, the
// command a requeued job repeats unchanged (no run.overwrite).
std::vector<std::string> run_args(const fs::path& root, const std::string& name, int64_t steps) {
  auto a = base_args(root, name, steps, "adamw");
  set_arg(a, "run.overwrite", "false");
  set_arg(a, "model.n_embd", "64");
  set_arg(a, "model.n_head", "4");
  set_arg(a, "schedule.decay_steps", std::to_string(steps));
  return a;
}
std::string train_cmd(const std::vector<std::string>& a) { return "env " + runs.rank_env() + runs.forge_cmd(a); }
// forge launch over `ranks` CPU ranks (mpirun), the ranks running forge train with `a`.
std::string launch_cmd(int ranks, const std::vector<std::string>& a, const std::string& flags = "") {
  return "env " + runs.rank_env() + shell_quote(forge_binary().string()) + " launch --nproc-per-node " + std::to_string(ranks) +
         " --device cpu " + flags + " -- " + runs.forge_cmd(a);
}

class LongRuns : public ::testing::Test {
 protected:
  static void TearDownTestSuite() { dist_train_testing::remove_scratch(runs, runs.test_root()); }
  fs::path root_ = runs.test_root();
};

// Note [preemption]: SIGTERM mid-run checkpoints that step and exits 75; the same command then
// continues, and every step's loss is the uninterrupted run's, bit for bit (CPU, one thread).
TEST_F(LongRuns, SigtermMidRunThenTheSameCommandGivesEveryStepOfTheUninterruptedRun) {
  const int64_t steps = 300;
  ASSERT_EQ(runs.run_single(run_args(root_, "whole", steps)).status, 0);
  const fs::path run = root_ / "split";
  Background b(train_cmd(run_args(root_, "split", steps)), root_ / "split.log");
  ASSERT_TRUE(wait_for_step(run, 40, b)) << b.output();
  b.signal(SIGTERM);
  ASSERT_EQ(b.wait(), 75) << b.output();
  const std::string out = b.output();
  EXPECT_HAS(out, "got SIGTERM: stopping after this step with a checkpoint");
  EXPECT_HAS(out, "stopped: at step ");
  EXPECT_HAS(out, "(SIGTERM)");
  const auto stopped_at = io::find_latest_checkpoint(run);
  ASSERT_TRUE(stopped_at.has_value());
  const int64_t k = io::load_checkpoint(*stopped_at).step;
  EXPECT_GE(k, 40);
  EXPECT_LT(k, steps) << "the run ended before the signal";
  EXPECT_EQ(logged_step(run), k);  // nothing trained past the checkpoint

  const auto again = runs.run_single(run_args(root_, "split", steps));  // the same command
  ASSERT_EQ(again.status, 0) << again.out;
  EXPECT_HAS(again.out, "resume: from " + stopped_at->string());
  dist_train_testing::expect_same_run(run, root_ / "whole", 1, 0.0, 0.0, "SIGTERM at step " + std::to_string(k));

  // The same command once more: finished, exit 0, nothing trained.
  const auto done = runs.run_single(run_args(root_, "split", steps));
  EXPECT_EQ(done.status, 0) << done.out;
  EXPECT_HAS(done.out, "run: finished already");
}

// The configurable signal (Slurm's --signal=USR1@120) does the same, and one signal delivered
// twice at once (by Slurm and by forge launch) counts once; a second signal later stops at once.
TEST_F(LongRuns, ThePreemptSignalAndASecondSignal) {
  const fs::path run = root_ / "usr1";
  {
    Background b(train_cmd(run_args(root_, "usr1", 100000)), root_ / "usr1.log");
    ASSERT_TRUE(wait_for_step(run, 5, b)) << b.output();
    b.signal(SIGUSR1);
    b.signal(SIGUSR1);
    ASSERT_EQ(b.wait(), 75) << b.output();
    EXPECT_HAS(b.output(), "(SIGUSR1)");
  }
  const auto first = io::find_latest_checkpoint(run);
  ASSERT_TRUE(first.has_value());
  // run.preempt_signal = "" : SIGUSR1 keeps its default action (the process ends, no checkpoint).
  {
    auto a = run_args(root_, "usr1", 100000);
    set_arg(a, "run.preempt_signal", "");
    Background b(train_cmd(a), root_ / "usr1b.log");
    const int64_t k = io::load_checkpoint(*first).step;
    ASSERT_TRUE(wait_for_step(run, k + 5, b)) << b.output();
    b.signal(SIGUSR1);
    EXPECT_EQ(b.wait(), 128 + SIGUSR1) << b.output();
    EXPECT_EQ(io::find_latest_checkpoint(run), first);
  }
  // A second SIGINT well after the first ends the process at once (128 + SIGINT) unless the first
  // stop was already through; either way the latest checkpoint is a valid one.
  {
    Background b(train_cmd(run_args(root_, "usr1", 100000)), root_ / "usr1c.log");
    ASSERT_TRUE(wait_for_step(run, logged_step(run) + 5, b)) << b.output();
    b.signal(SIGINT);
    std::this_thread::sleep_for(std::chrono::milliseconds(1200));
    b.signal(SIGINT);
    const int rc = b.wait();
    EXPECT_TRUE(rc == 75 || rc == 128 + SIGINT) << rc << b.output();
    const io::ValidCheckpoint v = io::find_latest_valid_checkpoint(run);
    ASSERT_TRUE(v.dir.has_value());
    EXPECT_TRUE(v.skipped.empty()) << v.skipped.front();
  }
}

// run.time_limit: checkpoint and exit 75 before the limit; the same command continues.
TEST_F(LongRuns, TimeLimitCheckpointsAndStops) {
  auto a = run_args(root_, "limited", 100000);
  set_arg(a, "run.time_limit", "3s");
  const auto t0 = Clock::now();
  const auto r = runs.run_single(a);
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  ASSERT_EQ(r.status, 75) << r.out;
  EXPECT_HAS(r.out, "(run.time_limit (3s))");
  EXPECT_LT(took, 30.0);
  const auto ck = io::find_latest_checkpoint(root_ / "limited");
  ASSERT_TRUE(ck.has_value());
  const int64_t k = io::load_checkpoint(*ck).step;
  EXPECT_EQ(logged_step(root_ / "limited"), k);
  set_arg(a, "run.time_limit", "");
  set_arg(a, "train.steps", std::to_string(k + 3));
  const auto more = runs.run_single(a);
  ASSERT_EQ(more.status, 0) << more.out;
  EXPECT_HAS(more.out, "resume: from " + ck->string());
  EXPECT_EQ(logged_step(root_ / "limited"), k + 3);
}

// Under forge launch (mpirun), SIGTERM to the launcher reaches every rank once; all ranks
// checkpoint the same step; the same command continues; every loss is the uninterrupted run's.
void expect_launch_survives_sigterm(const fs::path& root, const std::string& name, int ranks,
                                    const std::vector<std::string>& layout) {
  const int64_t steps = 200;
  auto whole = run_args(root, name + "_whole", steps), split = run_args(root, name, steps);
  for (const auto& kv : layout) whole.push_back(kv), split.push_back(kv);
  ASSERT_EQ(runs.run_mpi(ranks, whole).status, 0);
  {
    Background b(launch_cmd(ranks, split), root / (name + ".log"));
    ASSERT_TRUE(wait_for_step(root / name, 30, b)) << b.output();
    b.signal(SIGTERM);
    const int rc = b.wait();
    const std::string out = b.output();
    ASSERT_EQ(rc, 75) << out;
    EXPECT_HAS(out, "forge launch: got SIGTERM, forwarding it");
  }
  const auto ck = io::find_latest_checkpoint(root / name);
  ASSERT_TRUE(ck.has_value());
  const int64_t k = io::load_checkpoint(*ck).step;
  EXPECT_LT(k, steps);
  EXPECT_TRUE(io::verify_checkpoint(*ck));
  EXPECT_EQ(logged_step(root / name), k);
  Background again(launch_cmd(ranks, split), root / (name + "_again.log"));  // the same command
  ASSERT_EQ(again.wait(), 0) << again.output();
  EXPECT_HAS(again.output(), "resume: from " + ck->string());
  dist_train_testing::expect_same_run(root / name, root / (name + "_whole"), 1, 0.0, 0.0,
                                      name + ": SIGTERM at step " + std::to_string(k));
}

TEST_F(LongRuns, SigtermUnderForgeLaunchWithTensorParallelism) {
  expect_launch_survives_sigterm(root_, "launch_tp", 2, {"--dist.tp=2"});
}

TEST_F(LongRuns, SigtermUnderForgeLaunchWithPipelineParallelism) {
  expect_launch_survives_sigterm(root_, "launch_pp", 2, {"--dist.pp=2", "--train.grad_accum=2"});
}

// forge launch --max-restarts: a rank that dies (debug.abort_at, first attempt only) gets the job
// restarted; it continues from the latest checkpoint and ends as the uninterrupted run does.
TEST_F(LongRuns, MaxRestartsResumesAfterAnInjectedFailure) {
  const int64_t steps = 30;
  auto whole = run_args(root_, "restart_whole", steps), a = run_args(root_, "restart", steps);
  for (auto* v : {&whole, &a}) set_arg(*v, "checkpoint.every", "4");
  ASSERT_EQ(runs.run_mpi(2, whole).status, 0);
  set_arg(a, "debug.abort_at", "1:11");
  Background b(launch_cmd(2, a, "--max-restarts 2"), root_ / "restart.log");
  ASSERT_EQ(b.wait(), 0) << b.output();
  const std::string out = b.output();
  EXPECT_HAS(out, "debug.abort_at: rank 1 aborts at step 11");
  EXPECT_HAS(out, "restarting every rank (restart 1 of 2)");
  EXPECT_HAS(out, "resume: from " + io::checkpoint_path(root_ / "restart", 8).string());
  dist_train_testing::expect_same_run(root_ / "restart", root_ / "restart_whole", 1, 0.0, 0.0, "restarted at step 8");

  // Without restarts the failure ends the job with the rank's code.
  auto c = run_args(root_, "no_restart", steps);
  set_arg(c, "debug.abort_at", "1:3");
  Background n(launch_cmd(2, c), root_ / "no_restart.log");
  const int rc = n.wait();
  EXPECT_NE(rc, 0) << n.output();
  EXPECT_NE(rc, 75) << n.output();
}

// The same when the job hangs: a rank stuck at step 11 (debug.hang_at) makes its peer's collective
// time out (FORGE_DIST_TIMEOUT); the job ends, is restarted, and finishes as the uninterrupted run.
TEST_F(LongRuns, MaxRestartsResumesAfterAHang) {
  const int64_t steps = 30;
  auto whole = run_args(root_, "hang_whole", steps), a = run_args(root_, "hang", steps);
  for (auto* v : {&whole, &a}) set_arg(*v, "checkpoint.every", "4");
  ASSERT_EQ(runs.run_mpi(2, whole).status, 0);
  set_arg(a, "debug.hang_at", "1:11");
  Background b("env FORGE_DIST_TIMEOUT=3 " + launch_cmd(2, a, "--max-restarts 1"), root_ / "hang.log");
  ASSERT_EQ(b.wait(120), 0) << b.output();
  const std::string out = b.output();
  EXPECT_HAS(out, "debug.hang_at: rank 1 stops at step 11");
  EXPECT_HAS(out, "did not complete within 3 s (FORGE_DIST_TIMEOUT)");
  EXPECT_HAS(out, "restarting every rank (restart 1 of 1)");
  dist_train_testing::expect_same_run(root_ / "hang", root_ / "hang_whole", 1, 0.0, 0.0, "restarted after a hang");
}

// Note [checkpoint integrity]: a state that became non-finite is never saved: the run stops
// with an error naming the tensor, and the last good checkpoint stays the latest.
TEST_F(LongRuns, NonFiniteStateIsNeverSaved) {
  auto a = run_args(root_, "nan", 4);
  set_arg(a, "checkpoint.every", "2");
  set_arg(a, "optim.name", "sgd");
  set_arg(a, "optim.grad_clip", "0");
  ASSERT_EQ(runs.run_single(a).status, 0);  // checkpoints at 2 and 4
  set_arg(a, "train.steps", "8");
  set_arg(a, "optim.lr", "1e300");          // step 5's update overflows every weight
  set_arg(a, "schedule.kind", "constant");
  set_arg(a, "train.max_bad_steps", "100");
  for (const char* async : {"true", "false"}) {
    set_arg(a, "checkpoint.async", async);
    const auto r = runs.run_single(a);
    EXPECT_NE(r.status, 0) << r.out;
    EXPECT_HAS(r.out, "not written");
    EXPECT_HAS(r.out, "holds ");
    EXPECT_HAS(r.out, "the training state is not finite, so it is not saved");
    const io::ValidCheckpoint v = io::find_latest_valid_checkpoint(root_ / "nan");
    ASSERT_TRUE(v.dir.has_value());
    EXPECT_EQ(*v.dir, io::checkpoint_path(root_ / "nan", 4)) << async;
    EXPECT_EQ(io::list_checkpoints(root_ / "nan").back().first, 4) << async;
  }
}

// Note [run directory lock]: a second writer is refused at once, naming the holder; the lock of a
// process killed with SIGKILL is free again, and the run continues from its checkpoint.
TEST_F(LongRuns, ARunDirectoryHasOneWriter) {
  const fs::path run = root_ / "locked";
  auto a = run_args(root_, "locked", 100000);
  set_arg(a, "checkpoint.every", "10");
  Background first(train_cmd(a), root_ / "locked1.log");
  ASSERT_TRUE(wait_for_step(run, 12, first)) << first.output();
  const auto second = runs.run_single(a);
  EXPECT_EQ(second.status, 1) << second.out;
  EXPECT_HAS(second.out, "is in use: forge.lock is held by pid ");
  EXPECT_HAS(second.out, "on host ");
  EXPECT_HAS(second.out, "choose another run.name");
  // A fresh start over it is refused too, and removes nothing.
  auto fresh = a;
  set_arg(fresh, "run.overwrite", "true");
  EXPECT_EQ(runs.run_single(fresh).status, 1);
  ASSERT_FALSE(io::list_checkpoints(run).empty());
  first.signal(SIGKILL);
  EXPECT_EQ(first.wait(), 128 + SIGKILL);
  const auto latest = io::find_latest_valid_checkpoint(run);
  ASSERT_TRUE(latest.dir.has_value());
  set_arg(a, "train.steps", std::to_string(io::load_checkpoint(*latest.dir).step + 2));
  const auto after = runs.run_single(a);
  EXPECT_EQ(after.status, 0) << after.out;
  EXPECT_HAS(after.out, "resume: from " + latest.dir->string());
  EXPECT_EQ(io::describe_lock_holder(run / io::RunLock::kFileName), "");  // released
}

TEST(RunLock, ASecondHolderIsRefusedAndTheFirstReleases) {
  const fs::path dir = runs.test_root() / "lock_unit";
  fs::create_directories(dir);
  {
    io::RunLock a(dir, "forge train a.toml");
    EXPECT_TRUE(a.kernel_lock());
    EXPECT_HAS(io::describe_lock_holder(dir / "forge.lock"), "pid " + std::to_string(::getpid()));
    EXPECT_HAS(io::describe_lock_holder(dir / "forge.lock"), "(forge train a.toml)");
    const std::string e = error_of([&] { io::RunLock b(dir, "forge train b.toml"); });
    EXPECT_HAS(e, "is in use: forge.lock is held by pid " + std::to_string(::getpid()));
    EXPECT_HAS(e, "(forge train a.toml)");
  }
  io::RunLock c(dir, "forge train c.toml");  // released by a's end
  EXPECT_HAS(io::describe_lock_holder(dir / "forge.lock"), "(forge train c.toml)");
}

// A torn last line of metrics.jsonl (a crash or a full disk mid-write) is cut on resume, with a
// warning; the checkpoint is fine, so the run continues.
TEST_F(LongRuns, ATornMetricsLineIsCutOnResume) {
  auto a = run_args(root_, "torn", 6);
  set_arg(a, "checkpoint.every", "3");
  ASSERT_EQ(runs.run_single(a).status, 0);
  const fs::path m = root_ / "torn" / "metrics.jsonl";
  std::ofstream(m, std::ios::app) << "{\"step\": 7, \"loss\": 4.12";  // no newline: a torn write
  bool torn = false;
  (void)telemetry::read_jsonl(m, &torn);
  EXPECT_TRUE(torn);
  set_arg(a, "train.steps", "8");
  const auto r = runs.run_single(a);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_HAS(r.out, "was cut short (a crash or a full disk while it was written); it is removed");
  const auto l = dist_train_testing::losses(root_ / "torn");  // every line parses
  EXPECT_EQ(l.size(), 8u);
  EXPECT_EQ(l.rbegin()->first, 8);
}

// Note [nothing deletes what it did not write]: export refuses a non-empty --out that is not an
// earlier export (its files intact), replaces an earlier export, writes beside others with
// --force, and never writes into a run directory.
TEST_F(LongRuns, ExportNeverWritesOverWhatItDidNotWrite) {
  auto a = run_args(root_, "exported", 2);
  set_arg(a, "model.bias", "true");
  ASSERT_EQ(runs.run_single(a).status, 0);
  const fs::path out = root_ / "hf", notes = out / "notes.txt";
  fs::create_directories(out);
  std::ofstream(notes) << "my notes\n";
  auto r = run_forge({"export", "--checkpoint", (root_ / "exported").string(), "--out", out.string()});
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_HAS(r.out, "is not empty and holds files this command did not write (notes.txt)");
  EXPECT_EQ(forge::train_testing::read_text(notes), "my notes\n");
  EXPECT_EQ(fs::directory_iterator(out)->path(), notes);  // nothing else written

  // An empty or new --out, then the same again (an earlier export's files only): fine.
  const fs::path fresh = root_ / "hf2";
  for (int i = 0; i < 2; ++i) {
    r = run_forge({"export", "--checkpoint", (root_ / "exported").string(), "--out", fresh.string()});
    ASSERT_EQ(r.status, 0) << r.out;
  }
  EXPECT_TRUE(fs::is_regular_file(fresh / "forge_export.json"));
  EXPECT_TRUE(fs::is_regular_file(fresh / "model.safetensors"));
  // Something of the user's beside an export: refused again, until --force, which keeps it.
  std::ofstream(fresh / "README.md") << "model card\n";
  r = run_forge({"export", "--checkpoint", (root_ / "exported").string(), "--out", fresh.string()});
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_HAS(r.out, "(README.md)");
  r = run_forge({"export", "--checkpoint", (root_ / "exported").string(), "--out", fresh.string(), "--force"});
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(forge::train_testing::read_text(fresh / "README.md"), "model card\n");
  r = run_forge({"export", "--checkpoint", (root_ / "exported").string(), "--out", out.string(), "--force"});
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(forge::train_testing::read_text(notes), "my notes\n");
  // A run directory or a checkpoint, even with --force: never.
  for (const fs::path& target : {root_ / "exported", *io::find_latest_checkpoint(root_ / "exported")}) {
    r = run_forge({"export", "--checkpoint", (root_ / "exported").string(), "--out", target.string(), "--force"});
    EXPECT_EQ(r.status, 1) << r.out;
    EXPECT_HAS(r.out, "forge never writes another command's output into one");
  }
  EXPECT_TRUE(io::verify_checkpoint(*io::find_latest_checkpoint(root_ / "exported")));
  EXPECT_FALSE(fs::exists(root_ / "exported" / "config.json"));
}

// The same rule for the other commands that write: plot, tokenize train and encode.
TEST_F(LongRuns, OtherWritersKeepWhatTheyDidNotWrite) {
  const fs::path svg = root_ / "mine.svg", tok = root_ / "mine.json", corpus = root_ / "c.txt";
  std::ofstream(svg) << "<svg>a drawing of mine</svg>\n";
  std::ofstream(tok) << "{\"not\": \"a tokenizer\"}\n";
  std::ofstream(corpus) << "some text to train a tokenizer on, and some more text\n";
  ASSERT_EQ(runs.run_single(run_args(root_, "plotted", 2)).status, 0);
  auto r = run_forge({"plot", (root_ / "plotted").string(), "--out", svg.string()});
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_HAS(r.out, "not a file this command wrote");
  EXPECT_EQ(forge::train_testing::read_text(svg), "<svg>a drawing of mine</svg>\n");
  const fs::path ours = root_ / "curves.svg";
  for (int i = 0; i < 2; ++i) EXPECT_EQ(run_forge({"plot", (root_ / "plotted").string(), "--out", ours.string()}).status, 0);
  EXPECT_EQ(run_forge({"plot", (root_ / "plotted").string(), "--out", svg.string(), "--force"}).status, 0);

  r = run_forge({"tokenize", "train", "--vocab-size", "260", "--out", tok.string(), corpus.string()});
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_EQ(forge::train_testing::read_text(tok), "{\"not\": \"a tokenizer\"}\n");
  const fs::path bpe = root_ / "bpe.json";
  for (int i = 0; i < 2; ++i)
    EXPECT_EQ(run_forge({"tokenize", "train", "--vocab-size", "260", "--out", bpe.string(), corpus.string()}).status, 0);

  const fs::path shards = root_ / "shards";
  fs::create_directories(shards);
  std::ofstream(shards / "keep.txt") << "x\n";
  r = run_forge({"tokenize", "encode", "--tokenizer", bpe.string(), "--out", shards.string(), corpus.string()});
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_HAS(r.out, "(keep.txt)");
  EXPECT_FALSE(fs::exists(shards / "shard_00000.bin"));
  r = run_forge({"tokenize", "encode", "--tokenizer", bpe.string(), "--out", shards.string(), corpus.string(), "--force"});
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(fs::exists(shards / "keep.txt"));
  const fs::path clean = root_ / "shards2";
  for (int i = 0; i < 2; ++i)
    EXPECT_EQ(run_forge({"tokenize", "encode", "--tokenizer", bpe.string(), "--out", clean.string(), corpus.string()}).status,
              0);
}

}  // namespace
}  // namespace forge::testing
