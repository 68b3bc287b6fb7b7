// forge launch (parallel/launch.h): the plan and its bad-input errors, the ranks' environment,
// output relaying, rank failure, the grace period, signal forwarding, and the mpirun path.
// Ranks are small shell commands, started with --device cpu --spawn direct (no GPU, no MPI),
// except the mpirun tests.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "forge/core/error.h"
#include "forge/ops/creation.h"
#include "forge/parallel/launch.h"
#include "testing/cli_testing.h"

namespace forge::parallel {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

LaunchOptions cpu_ranks(int n, const std::string& script) {
  LaunchOptions o;
  o.nproc_per_node = std::to_string(n);
  o.device = LaunchDevice::cpu;
  o.spawn = SpawnMode::direct;
  o.visible_gpus = 0;
  o.command = {"sh", "-c", script};
  return o;
}

std::string plan_error(const LaunchOptions& o) {
  try {
    plan_launch(o, /*make_nccl_id=*/false);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The launcher's line on the first rank to fail under mpirun: `named` when Open MPI's report names
// the rank, which it does not always do (about 1 job in 20 here); then the line says so, with
// mpirun's exit code (the failing rank's).
bool says_first_failure(const std::string& log, const std::string& named, int code) {
  return contains(log, named) ||
         contains(log, "a rank exited with a non-zero code first (Open MPI's report did not name it; the ranks' last "
                       "lines above may); mpirun stopped the job and exited with code " + std::to_string(code));
}

struct Ran {
  int status = -1;
  std::string output;  // the ranks' lines
  std::string log;     // the launcher's messages
  double seconds = 0;
};

Ran run(LaunchOptions o) {
  std::ostringstream out, log;
  o.output = &out;
  Ran r;
  const auto t0 = Clock::now();
  r.status = launch(o, log);
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  r.output = out.str();
  r.log = log.str();
  return r;
}

// ---- the plan -----------------------------------------------------------------------------

TEST(LaunchPlan, BadInputIsAnErrorWithTheFix) {
  LaunchOptions o = cpu_ranks(2, "true");
  o.nproc_per_node = "0";
  EXPECT_TRUE(contains(plan_error(o), "--nproc-per-node 0 must be at least 1")) << plan_error(o);
  o.nproc_per_node = "two";
  EXPECT_TRUE(contains(plan_error(o), "'two' is neither a number nor 'gpu'")) << plan_error(o);
  o.nproc_per_node = "2x";
  EXPECT_TRUE(contains(plan_error(o), "neither a number")) << plan_error(o);
  o.nproc_per_node = "gpu";
  EXPECT_TRUE(contains(plan_error(o), "no GPU is visible")) << plan_error(o);

  o = cpu_ranks(2, "true");
  o.command.clear();
  EXPECT_TRUE(contains(plan_error(o), "no command to run")) << plan_error(o);
  o.command = {"forge-no-such-command-xyz"};
  EXPECT_TRUE(contains(plan_error(o), "'forge-no-such-command-xyz' is not found on PATH")) << plan_error(o);
  o.command = {"/nonexistent/dir/prog"};
  EXPECT_TRUE(contains(plan_error(o), "no such file")) << plan_error(o);
  const fs::path not_exec = fs::temp_directory_path() / ("forge_launch_noexec_" + std::to_string(::getpid()));
  std::ofstream(not_exec) << "#!/bin/sh\n";
  fs::permissions(not_exec, fs::perms::owner_read | fs::perms::owner_write);
  o.command = {not_exec.string()};
  EXPECT_TRUE(contains(plan_error(o), "is not an executable file (chmod +x it?)")) << plan_error(o);
  fs::remove(not_exec);

  o = cpu_ranks(2, "true");
  o.grace_seconds = -1;
  EXPECT_TRUE(contains(plan_error(o), "--grace-seconds")) << plan_error(o);
}

TEST(LaunchPlan, GpuRanksNeedGpus) {
  LaunchOptions o = cpu_ranks(2, "true");
  o.device = LaunchDevice::cuda;
  o.visible_gpus = 0;
  EXPECT_TRUE(contains(plan_error(o), "--device cuda, but no GPU is visible")) << plan_error(o);
  o.visible_gpus = 2;
  o.nproc_per_node = "3";
  EXPECT_TRUE(contains(plan_error(o), "3 GPU ranks, but 2 GPUs are visible")) << plan_error(o);
  EXPECT_TRUE(contains(plan_error(o), "--nproc-per-node 2")) << plan_error(o);
  o.device = LaunchDevice::cpu;
  o.nproc_per_node = "gpu";
  EXPECT_TRUE(contains(plan_error(o), "the ranks are CPU ranks")) << plan_error(o);
}

TEST(LaunchPlan, GpuRanks) {
  LaunchOptions o;
  o.nproc_per_node = "gpu";
  o.visible_gpus = 4;  // device auto -> cuda
  o.command = {"forge", "train", "configs/tiny.toml", "--train.steps=5"};
  o.forge_executable = "/bin/true";
  const LaunchPlan p = plan_launch(o, /*make_nccl_id=*/false);
  EXPECT_EQ(p.nproc, 4);
  EXPECT_EQ(p.device, LaunchDevice::cuda);
  EXPECT_EQ(p.spawn, SpawnMode::direct);
  EXPECT_EQ(p.executable, "/bin/true");
  EXPECT_EQ(p.argv, (std::vector<std::string>{"/bin/true", "train", "configs/tiny.toml", "--train.steps=5"}));
  EXPECT_EQ(p.env.at("FORGE_LAUNCHER"), "forge");
  EXPECT_EQ(p.env.at("WORLD_SIZE"), "4");
  EXPECT_EQ(p.env.at("LOCAL_WORLD_SIZE"), "4");
  EXPECT_EQ(p.env.at("CUDA_DEVICE_ORDER"), "PCI_BUS_ID");
  EXPECT_EQ(p.env.at("FORGE_BIND"), "auto");
  EXPECT_EQ(p.env.count("FORGE_NCCL_ID"), 0u);  // not asked for
  ASSERT_EQ(p.rank_env.size(), 4u);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(p.rank_env[r].at("RANK"), std::to_string(r));
    EXPECT_EQ(p.rank_env[r].at("LOCAL_RANK"), std::to_string(r));
  }
  EXPECT_TRUE(contains(p.summary, "4 GPU ranks (direct spawn)")) << p.summary;
  // A command that is not `forge` is found on PATH.
  o.command = {"sh", "-c", "true"};
  const LaunchPlan q = plan_launch(o, false);
  EXPECT_TRUE(fs::path(q.executable).is_absolute()) << q.executable;
  EXPECT_EQ(fs::path(q.executable).filename(), "sh");
}

TEST(LaunchPlan, CpuRanksGoThroughMpirun) {
  LaunchOptions o = cpu_ranks(3, "true");
  o.spawn = SpawnMode::auto_;
  o.bind = BindMode::none;
  std::string mpirun;
  try {
    mpirun = find_executable("mpirun", "mpirun");
  } catch (const Error&) {
    EXPECT_TRUE(contains(plan_error(o), "openmpi-bin")) << plan_error(o);
    GTEST_SKIP() << "no mpirun on PATH";
  }
  const LaunchPlan p = plan_launch(o, false);
  EXPECT_EQ(p.spawn, SpawnMode::mpirun);
  EXPECT_EQ(p.executable, mpirun);
  const auto& a = p.argv;
  const auto has = [&](const std::string& s) { return std::find(a.begin(), a.end(), s) != a.end(); };
  EXPECT_EQ(a.front(), mpirun);
  EXPECT_EQ(a[a.size() - 3].substr(a[a.size() - 3].size() - 2), "sh");
  EXPECT_EQ(a[a.size() - 2], "-c");
  EXPECT_EQ(a.back(), "true");
  EXPECT_TRUE(has("3"));
  EXPECT_TRUE(p.rank_env.empty());
  EXPECT_EQ(p.env.at("FORGE_BIND"), "none");
  EXPECT_EQ(p.env.count("FORGE_LAUNCHER"), 0u);  // the ranks are MPI ranks
  if (has("--oversubscribe")) {                   // Open MPI
    EXPECT_TRUE(has("-np"));
    EXPECT_TRUE(has("--bind-to"));
    EXPECT_TRUE(has("FORGE_BIND"));  // -x FORGE_BIND
    EXPECT_EQ(has("--allow-run-as-root"), ::getuid() == 0);
  }
  // One CPU rank needs no MPI.
  o.nproc_per_node = "1";
  EXPECT_EQ(plan_launch(o, false).spawn, SpawnMode::direct);
}

TEST(LaunchPlan, ThreadsPerRank) {
  LaunchOptions o = cpu_ranks(2, "true");
  const LaunchPlan p = plan_launch(o, false);
  if (std::getenv("OMP_NUM_THREADS") != nullptr) {
    EXPECT_EQ(p.env.count("OMP_NUM_THREADS"), 0u);  // the user's setting is kept
  } else {
    ASSERT_EQ(p.env.count("OMP_NUM_THREADS"), 1u);
    EXPECT_GE(std::stoi(p.env.at("OMP_NUM_THREADS")), 1);
  }
}

TEST(LaunchPlan, Parsing) {
  EXPECT_EQ(parse_launch_device("auto"), LaunchDevice::auto_);
  EXPECT_EQ(parse_launch_device("cpu"), LaunchDevice::cpu);
  EXPECT_EQ(parse_launch_device("cuda"), LaunchDevice::cuda);
  EXPECT_THROW(parse_launch_device("gpu"), Error);
  EXPECT_EQ(parse_spawn_mode("auto"), SpawnMode::auto_);
  EXPECT_EQ(parse_spawn_mode("direct"), SpawnMode::direct);
  EXPECT_EQ(parse_spawn_mode("mpirun"), SpawnMode::mpirun);
  EXPECT_THROW(parse_spawn_mode("srun"), Error);
}

// ---- running ranks ------------------------------------------------------------------------

TEST(Launch, EachRankGetsItsEnvironment) {
  const Ran r = run(cpu_ranks(
      3, "echo \"$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $FORGE_LAUNCHER $FORGE_BIND $CUDA_DEVICE_ORDER\""));
  EXPECT_EQ(r.status, 0) << r.log << r.output;
  for (int k = 0; k < 3; ++k) {
    const std::string line =
        "[rank " + std::to_string(k) + "] " + std::to_string(k) + " 3 " + std::to_string(k) + " 3 forge auto PCI_BUS_ID\n";
    EXPECT_TRUE(contains(r.output, line)) << "missing: " << line << "in:\n" << r.output;
  }
  EXPECT_TRUE(contains(r.log, "3 CPU ranks (direct spawn)")) << r.log;
}

TEST(Launch, MpiVariablesOfAnOuterJobAreNotPassedOn) {
  ::setenv("OMPI_COMM_WORLD_RANK", "5", 1);
  const Ran r = run(cpu_ranks(1, "echo \"[${OMPI_COMM_WORLD_RANK}]\""));
  ::unsetenv("OMPI_COMM_WORLD_RANK");
  EXPECT_EQ(r.status, 0);
  EXPECT_TRUE(contains(r.output, "[rank 0] []\n")) << r.output;
}

TEST(Launch, OutputLinesArePrefixedOnBothStreams) {
  const Ran r = run(cpu_ranks(2, "echo out $RANK; echo err $RANK >&2; printf 'partial'"));
  EXPECT_EQ(r.status, 0);
  for (const char* line : {"[rank 0] out 0\n", "[rank 1] out 1\n", "[rank 0] err 0\n", "[rank 1] err 1\n",
                           "[rank 0] partial\n", "[rank 1] partial\n"})
    EXPECT_TRUE(contains(r.output, line)) << "missing: " << line << "in:\n" << r.output;
  LaunchOptions o = cpu_ranks(1, "echo plain");
  o.prefix_output = false;
  EXPECT_EQ(run(o).output, "plain\n");
}

TEST(Launch, StdinIsEmpty) {
  const Ran r = run(cpu_ranks(1, "if read line; then echo got \"$line\"; else echo eof; fi"));
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.output, "[rank 0] eof\n");
}

TEST(Launch, ARankThatFailsStopsTheOthers) {
  // Rank 1 exits 3 at once; ranks 0 and 2 would sleep 30 s.
  const Ran r = run(cpu_ranks(3, "if [ \"$RANK\" = 1 ]; then exit 3; fi; sleep 30"));
  EXPECT_EQ(r.status, 3);
  EXPECT_LT(r.seconds, 10.0);
  EXPECT_TRUE(contains(r.log, "forge launch: rank 1 (pid ")) << r.log;
  EXPECT_TRUE(contains(r.log, "exited with code 3; stopping the other 2 ranks")) << r.log;
}

TEST(Launch, AnErrorEveryRankPrintsComesOutOnceNamingTheRanks) {
  const Ran r = run(cpu_ranks(3, "echo 'forge: error: run.device = gpu0 is not a device' >&2; sleep 0.3; exit 1"));
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.output, "[ranks 0-2] forge: error: run.device = gpu0 is not a device\n") << r.output;
}

TEST(Launch, ARankKilledByASignal) {
  const Ran r = run(cpu_ranks(2, "if [ \"$RANK\" = 0 ]; then kill -SEGV $$; fi; sleep 30"));
  EXPECT_EQ(r.status, 128 + SIGSEGV);
  EXPECT_LT(r.seconds, 10.0);
  EXPECT_TRUE(contains(r.log, "rank 0 (pid ")) << r.log;
  EXPECT_TRUE(contains(r.log, "was killed by signal 11 (SIGSEGV); stopping the other 1 rank")) << r.log;
}

TEST(Launch, RanksThatIgnoreSigtermAreKilledAfterTheGracePeriod) {
  // Rank 2 fails only after the others have had time to install their trap (under load a rank
  // could otherwise be ended by the SIGTERM before ignoring it, leaving one rank to SIGKILL).
  LaunchOptions o =
      cpu_ranks(3, "trap '' TERM; if [ \"$RANK\" = 2 ]; then sleep 0.5; exit 4; fi; while :; do sleep 0.1; done");
  o.grace_seconds = 0.5;
  const Ran r = run(o);
  EXPECT_EQ(r.status, 4);
  EXPECT_LT(r.seconds, 8.0);
  EXPECT_GE(r.seconds, 0.4);
  EXPECT_TRUE(contains(r.log, "rank 2 (pid")) << r.log;
  EXPECT_TRUE(contains(r.log, "2 ranks still running 0.5 s after SIGTERM; sending SIGKILL")) << r.log;
}

// Note [preemption]: a rank that exits 75 (stopped with its checkpoint) is no failure: the others
// finish theirs, nobody gets SIGTERM, and the job exits 75.
TEST(Launch, ARankStoppedWithItsCheckpointIsNoFailure) {
  const Ran r = run(cpu_ranks(3, "trap 'echo TERMED; exit 1' TERM; if [ \"$RANK\" = 0 ]; then exit 75; fi; "
                                 "sleep 1; echo done $RANK; exit 75"));
  EXPECT_EQ(r.status, 75) << r.log << r.output;
  EXPECT_TRUE(contains(r.output, "[rank 1] done 1")) << r.output;
  EXPECT_TRUE(contains(r.output, "[rank 2] done 2")) << r.output;
  EXPECT_FALSE(contains(r.output, "TERMED")) << r.output;
  EXPECT_FALSE(contains(r.log, "stopping the other")) << r.log;
}

// --max-restarts: a failed job is started again (FORGE_RESTART_COUNT 0, 1, ...) until it succeeds
// or the restarts run out; 0 and 75 end it.
TEST(Launch, MaxRestartsStartsAFailedJobAgain) {
  LaunchOptions o = cpu_ranks(2, "echo attempt $FORGE_RESTART_COUNT; "
                                 "if [ \"$FORGE_RESTART_COUNT\" -lt 2 ] && [ \"$RANK\" = 1 ]; then exit 5; fi; exit 0");
  o.max_restarts = 3;
  Ran r = run(o);
  EXPECT_EQ(r.status, 0) << r.log;
  EXPECT_TRUE(contains(r.output, "[rank 0] attempt 2")) << r.output;
  EXPECT_TRUE(contains(r.log, "restarting every rank (restart 1 of 3)")) << r.log;
  EXPECT_TRUE(contains(r.log, "restarting every rank (restart 2 of 3)")) << r.log;
  EXPECT_FALSE(contains(r.log, "restart 3 of 3")) << r.log;
  o.max_restarts = 1;
  r = run(o);
  EXPECT_EQ(r.status, 5) << r.log;
  EXPECT_TRUE(contains(r.log, "after 1 restart(s) (--max-restarts); giving up")) << r.log;
  o = cpu_ranks(1, "echo attempt $FORGE_RESTART_COUNT; exit 75");
  o.max_restarts = 3;
  r = run(o);
  EXPECT_EQ(r.status, 75);
  EXPECT_FALSE(contains(r.log, "restarting")) << r.log;
}

TEST(Launch, AllRanksSucceeding) {
  const Ran r = run(cpu_ranks(4, "sleep 0.$RANK; exit 0"));
  EXPECT_EQ(r.status, 0);
  EXPECT_FALSE(contains(r.log, "exited")) << r.log;
}

TEST(Launch, ALaterFailureAfterOthersFinished) {
  const Ran r = run(cpu_ranks(2, "if [ \"$RANK\" = 1 ]; then sleep 0.3; exit 9; fi; exit 0"));
  EXPECT_EQ(r.status, 9);
  EXPECT_TRUE(contains(r.log, "rank 1 (pid")) << r.log;
}

TEST(LaunchGpu, GpuRanksGetAnNcclId) {
  // Runs on a GPU machine (skipped here): one rank per GPU, each with the job's NCCL id.
  const int gpus = cuda_device_count();
  if (gpus == 0) GTEST_SKIP() << "no GPU visible";
  LaunchOptions o;
  o.nproc_per_node = "gpu";
  o.command = {"sh", "-c", "echo \"${#FORGE_NCCL_ID} $RANK $LOCAL_RANK $WORLD_SIZE $CUDA_DEVICE_ORDER\""};
  const Ran r = run(o);
  EXPECT_EQ(r.status, 0) << r.log << r.output;
  EXPECT_TRUE(contains(r.log, std::to_string(gpus) + " GPU rank")) << r.log;
  EXPECT_TRUE(contains(r.log, "NCCL id made here")) << r.log;
  for (int k = 0; k < gpus; ++k) {
    const std::string line = "[rank " + std::to_string(k) + "] 256 " + std::to_string(k) + " " + std::to_string(k) +
                             " " + std::to_string(gpus) + " PCI_BUS_ID\n";
    EXPECT_TRUE(contains(r.output, line)) << "missing: " << line << "in:\n" << r.output;
  }
}

// ---- through the forge executable ----------------------------------------------------------

class LaunchCli : public testing::ForgeCliTest {};

TEST_F(LaunchCli, RunsRanks) {
  const auto r = testing::run_forge({"launch", "--nproc-per-node", "2", "--device", "cpu", "--spawn", "direct", "--",
                                     "sh", "-c", "echo r$RANK of $WORLD_SIZE"});
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "[rank 0] r0 of 2\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "[rank 1] r1 of 2\n")) << r.out;
}

TEST_F(LaunchCli, TheCommandKeepsItsOptionsWithoutDashDash) {
  // Options after the command (even config-override look-alikes) belong to the command.
  const auto r = testing::run_forge({"launch", "--nproc-per-node", "1", "--device", "cpu", "sh", "-c",
                                     "echo \"$0 $1 $2 $3\"", "--device", "--train.steps=3", "--", "x"},
                                    testing::Stderr::dropped);
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out, "[rank 0] --device --train.steps=3 -- x\n");
}

TEST_F(LaunchCli, ForgeIsThisForge) {
  const auto r = testing::run_forge({"launch", "--device", "cpu", "--", "forge", "version"}, testing::Stderr::dropped);
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out, "[rank 0] forge " FORGE_VERSION "\n");
}

TEST_F(LaunchCli, FailureStatusAndMessage) {
  const auto r = testing::run_forge({"launch", "--nproc-per-node", "2", "--device", "cpu", "--spawn", "direct", "--",
                                     "sh", "-c", "if [ $RANK = 1 ]; then exit 3; fi; sleep 30"});
  EXPECT_EQ(r.status, 3) << r.out;
  EXPECT_TRUE(contains(r.out, "forge launch: rank 1 (pid")) << r.out;
}

// forge train's config error under forge launch's CPU ranks (mpirun): one error line naming
// both ranks, one line of the launcher naming the rank that failed first, none of mpirun's text.
TEST_F(LaunchCli, ATrainingErrorComesOutOnce) {
  try {
    find_executable("mpirun", "mpirun");
  } catch (const Error&) {
    GTEST_SKIP() << "no mpirun on PATH (apt install openmpi-bin)";
  }
  const fs::path dir = fs::temp_directory_path() / ("forge_launch_cli_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  {
    std::ofstream f(dir / "bad.toml");
    f << "[run]\ndir = \"" << (dir / "runs").string() << "\"\ndevice = \"cpu\"\n"
      << "[model]\ntype = \"gpt\"\nn_layer = 1\nn_head = 5\nn_embd = 128\nblock_size = 16\n"
      << "[data]\nsource = \"random\"\nvocab_size = 64\n[train]\nsteps = 1\nbatch_size = 1\nseq_len = 16\n";
  }
  const auto r = testing::run_forge({"launch", "--nproc-per-node", "2", "--device", "cpu", "--", "forge", "train",
                                     (dir / "bad.toml").string()},
                                    testing::Stderr::merged,
                                    {{"OMPI_ALLOW_RUN_AS_ROOT", "1"}, {"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"}});
  fs::remove_all(dir);
  EXPECT_EQ(r.status, 1) << r.out;
  size_t n = 0;
  for (size_t i = r.out.find("forge: error:"); i != std::string::npos; i = r.out.find("forge: error:", i + 1)) ++n;
  EXPECT_EQ(n, 1u) << r.out;
  EXPECT_TRUE(contains(r.out, "[ranks 0, 1] forge: error: model.n_head = 5 does not divide model.n_embd = 128"))
      << r.out;
  EXPECT_TRUE(says_first_failure(r.out, "exited with code 1 first; mpirun stopped the job and exited with code 1", 1))
      << r.out;
  EXPECT_FALSE(contains(r.out, "Primary job")) << r.out;
  EXPECT_FALSE(contains(r.out, "-----")) << r.out;
}

TEST_F(LaunchCli, BadInput) {
  auto r = testing::run_forge({"launch", "--nproc-per-node", "0", "--device", "cpu", "--", "true"});
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_TRUE(contains(r.out, "forge: error: forge launch: --nproc-per-node 0 must be at least 1")) << r.out;
  r = testing::run_forge({"launch", "--device", "cpu"});
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_TRUE(contains(r.out, "no command to run")) << r.out;
  r = testing::run_forge({"launch", "--device", "tpu", "--", "true"});
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "forge launch --help")) << r.out;
  r = testing::run_forge({"launch", "--help"});
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "--nproc-per-node")) << r.out;
}

// The launcher started as a process of its own, its stdout+stderr on a pipe.
struct Launcher {
  pid_t pid = -1;
  int fd = -1;
  std::string out;

  explicit Launcher(const std::vector<std::string>& args) {
    int p[2];
    EXPECT_EQ(::pipe(p), 0);
    std::vector<std::string> argv = {testing::forge_binary().string()};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    pid = ::fork();
    if (pid == 0) {
      ::dup2(p[1], 1);
      ::dup2(p[1], 2);
      ::close(p[0]);
      ::close(p[1]);
      ::execv(cargv[0], cargv.data());
      ::_exit(127);
    }
    ::close(p[1]);
    fd = p[0];
  }
  ~Launcher() {
    if (fd >= 0) ::close(fd);
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
  // Reads until `text` has appeared `times` times, or EOF, or `seconds` have passed.
  bool read_until(const std::string& text, int times, double seconds) {
    const auto end = Clock::now() + std::chrono::duration<double>(seconds);
    auto count = [&] {
      int n = 0;
      for (size_t pos = out.find(text); pos != std::string::npos; pos = out.find(text, pos + 1)) ++n;
      return n;
    };
    while (count() < times) {
      const int ms = static_cast<int>(std::chrono::duration<double, std::milli>(end - Clock::now()).count());
      if (ms <= 0) return false;
      pollfd pf{fd, POLLIN, 0};
      if (::poll(&pf, 1, ms) <= 0) continue;
      char buf[4096];
      const ssize_t n = ::read(fd, buf, sizeof(buf));
      if (n <= 0) return count() >= times;
      out.append(buf, static_cast<size_t>(n));
    }
    return true;
  }
  // The exit status after reading to EOF (-1 if it did not exit normally within `seconds`).
  int wait(double seconds) {
    read_until("\x01never\x01", 1, seconds);
    int st = 0;
    const auto end = Clock::now() + std::chrono::duration<double>(seconds);
    while (Clock::now() < end) {
      if (::waitpid(pid, &st, WNOHANG) == pid) {
        pid = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
      }
      ::usleep(10000);
    }
    return -1;
  }
};

TEST_F(LaunchCli, SignalsAreForwardedToEveryRank) {
  for (int sig : {SIGTERM, SIGINT}) {
    Launcher l({"launch", "--nproc-per-node", "2", "--device", "cpu", "--spawn", "direct", "--", "sh", "-c",
                "trap 'echo got TERM; exit 7' TERM; trap 'echo got INT; exit 8' INT; echo ready; "
                "while :; do sleep 0.1; done"});
    ASSERT_TRUE(l.read_until("] ready\n", 2, 10)) << l.out;  // the rank lines, not the launcher's summary
    const auto t0 = Clock::now();
    ASSERT_EQ(::kill(l.pid, sig), 0);
    const int status = l.wait(10);
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 5.0);
    EXPECT_EQ(status, 128 + sig) << l.out;
    const std::string got = sig == SIGTERM ? "got TERM" : "got INT";
    EXPECT_TRUE(contains(l.out, "[rank 0] " + got)) << l.out;
    EXPECT_TRUE(contains(l.out, "[rank 1] " + got)) << l.out;
    EXPECT_TRUE(contains(l.out, std::string("forge launch: got ") + (sig == SIGTERM ? "SIGTERM" : "SIGINT") +
                                    ", forwarding it to the 2 running ranks"))
        << l.out;
  }
}

// A stop signal gives the ranks --stop-timeout to checkpoint (here they take longer than the
// grace period, and are not killed); the job exits 75. A second signal, a second or more later,
// is forwarded too, and ends them after the grace period; one that follows at once counts once.
TEST_F(LaunchCli, AStopSignalWaitsForTheCheckpointAndASecondOneDoesNot) {
  Launcher l({"launch", "--nproc-per-node", "2", "--device", "cpu", "--spawn", "direct", "--grace-seconds", "0.2", "--",
              "sh", "-c", "trap 'sleep 1.5; echo saved; exit 75' TERM; echo ready; while :; do sleep 0.1; done"});
  ASSERT_TRUE(l.read_until("] ready\n", 2, 10)) << l.out;
  ASSERT_EQ(::kill(l.pid, SIGTERM), 0);
  ::usleep(100000);
  ASSERT_EQ(::kill(l.pid, SIGTERM), 0);  // the same event delivered twice: counted once
  EXPECT_EQ(l.wait(20), 75) << l.out;
  EXPECT_TRUE(contains(l.out, "[rank 0] saved")) << l.out;
  EXPECT_TRUE(contains(l.out, "[rank 1] saved")) << l.out;
  EXPECT_FALSE(contains(l.out, "SIGKILL")) << l.out;

  Launcher m({"launch", "--nproc-per-node", "1", "--device", "cpu", "--spawn", "direct", "--grace-seconds", "0.2", "--",
              "sh", "-c", "trap 'echo stopping' TERM; echo ready; while :; do sleep 0.1; done"});
  ASSERT_TRUE(m.read_until("] ready\n", 1, 10)) << m.out;
  ASSERT_EQ(::kill(m.pid, SIGTERM), 0);
  ASSERT_TRUE(m.read_until("] stopping\n", 1, 10)) << m.out;
  ::usleep(1200000);
  ASSERT_EQ(::kill(m.pid, SIGTERM), 0);
  EXPECT_EQ(m.wait(20), 128 + SIGTERM) << m.out;
  EXPECT_TRUE(contains(m.out, "still running 0.2 s after the second signal; sending SIGKILL")) << m.out;
}

TEST_F(LaunchCli, RanksDieWithTheLauncher) {
  // SIGKILL cannot be forwarded: the ranks get SIGTERM from the kernel (PR_SET_PDEATHSIG).
  const fs::path marker = fs::temp_directory_path() / ("forge_launch_pdeath_" + std::to_string(::getpid()));
  fs::remove(marker);
  Launcher l({"launch", "--nproc-per-node", "1", "--device", "cpu", "--", "sh", "-c",
              "trap 'echo bye > " + marker.string() + "; exit 0' TERM; echo ready; while :; do sleep 0.1; done"});
  ASSERT_TRUE(l.read_until("] ready\n", 1, 10)) << l.out;
  ::kill(l.pid, SIGKILL);
  ::waitpid(l.pid, nullptr, 0);
  l.pid = -1;
  bool seen = false;
  for (int i = 0; i < 500 && !seen; ++i) {
    seen = fs::exists(marker) && fs::file_size(marker) > 0;
    if (!seen) ::usleep(10000);
  }
  EXPECT_TRUE(seen) << "the rank did not get SIGTERM when the launcher died";
  fs::remove(marker);
}

// ---- through mpirun -----------------------------------------------------------------------

class LaunchMpi : public ::testing::Test {
 protected:
  void SetUp() override {
    try {
      find_executable("mpirun", "mpirun");
    } catch (const Error&) {
      GTEST_SKIP() << "no mpirun on PATH (apt install openmpi-bin)";
    }
    ::setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    ::setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  }
};

TEST_F(LaunchMpi, TwoRanks) {
  LaunchOptions o = cpu_ranks(2, "echo \"mpi $OMPI_COMM_WORLD_RANK of $OMPI_COMM_WORLD_SIZE bind $FORGE_BIND\"");
  o.spawn = SpawnMode::mpirun;
  o.bind = BindMode::none;
  const Ran r = run(o);
  EXPECT_EQ(r.status, 0) << r.log << r.output;
  // Open MPI's --tag-output names each line's rank (Note [launch output])
  EXPECT_TRUE(contains(r.output, "[rank 0] mpi 0 of 2 bind none\n")) << r.output;
  EXPECT_TRUE(contains(r.output, "[rank 1] mpi 1 of 2 bind none\n")) << r.output;
  EXPECT_TRUE(contains(r.log, "2 CPU ranks (mpirun spawn)")) << r.log;
}

TEST_F(LaunchMpi, ARankThatFails) {
  LaunchOptions o = cpu_ranks(2, "if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then exit 3; fi; sleep 30");
  o.spawn = SpawnMode::mpirun;
  const Ran r = run(o);
  EXPECT_NE(r.status, 0) << r.log << r.output;
  EXPECT_LT(r.seconds, 15.0);
  // One line of the launcher names the rank; mpirun's framed blocks saying the same are dropped.
  EXPECT_TRUE(says_first_failure(r.log, "forge launch: rank 1 exited with code 3 first; mpirun stopped the job", 3))
      << r.log;
  EXPECT_FALSE(contains(r.output, "Primary job")) << r.output;
  EXPECT_FALSE(contains(r.output, "mpirun detected")) << r.output;
  EXPECT_FALSE(contains(r.output, "------")) << r.output;
}

// Each rank writes its error in two pieces (as a program writing to an unbuffered stream does):
// one line comes out, naming both ranks.
TEST_F(LaunchMpi, AnErrorEveryRankPrintsComesOutOnce) {
  LaunchOptions o = cpu_ranks(2, "printf 'forge: error: ' >&2; sleep 0.1; printf 'the same mistake\\n' >&2; exit 1");
  o.spawn = SpawnMode::mpirun;
  const Ran r = run(o);
  EXPECT_EQ(r.status, 1) << r.log << r.output;
  EXPECT_TRUE(contains(r.output, "[ranks 0, 1] forge: error: the same mistake\n")) << r.output;
  size_t n = 0;
  for (size_t i = r.output.find("forge: error"); i != std::string::npos; i = r.output.find("forge: error", i + 1)) ++n;
  EXPECT_EQ(n, 1u) << r.output;
  EXPECT_TRUE(says_first_failure(r.log, "exited with code 1 first; mpirun stopped the job", 1)) << r.log;
}

}  // namespace
}  // namespace forge::parallel
