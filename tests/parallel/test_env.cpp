// parallel::launch_env_from: every launcher's variables, their precedence, and malformed values.
#include <gtest/gtest.h>

#include <string>

#include "forge/core/error.h"
#include "forge/parallel/env.h"

namespace forge::parallel {
namespace {

using Env = std::map<std::string, std::string>;

// The message of the forge::Error `env` raises ("" when it raises none).
std::string error_of(const Env& env) {
  try {
    launch_env_from(env);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(LaunchEnv, NothingIsRankZeroOfOne) {
  const LaunchEnv e = launch_env_from({{"PATH", "/bin"}, {"HOME", "/root"}});
  EXPECT_EQ(e.launcher, Launcher::none);
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.world_size, 1);
  EXPECT_EQ(e.local_rank, 0);
  EXPECT_EQ(e.local_world_size, 1);
  EXPECT_FALSE(e.uses_mpi());
  EXPECT_FALSE(e.distributed());
  EXPECT_TRUE(e.nccl_id_hex.empty());
}

TEST(LaunchEnv, ForgeLaunch) {
  const std::string id(256, 'a');
  const LaunchEnv e = launch_env_from({{"FORGE_LAUNCHER", "forge"},
                                       {"RANK", "3"},
                                       {"WORLD_SIZE", "8"},
                                       {"LOCAL_RANK", "3"},
                                       {"LOCAL_WORLD_SIZE", "8"},
                                       {"FORGE_NCCL_ID", id}});
  EXPECT_EQ(e.launcher, Launcher::forge);
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 3);
  EXPECT_EQ(e.local_world_size, 8);
  EXPECT_EQ(e.nccl_id_hex, id);
  EXPECT_FALSE(e.uses_mpi());
  EXPECT_TRUE(e.distributed());
}

TEST(LaunchEnv, ForgeLaunchCpuRanksHaveNoNcclId) {
  const LaunchEnv e = launch_env_from({{"FORGE_LAUNCHER", "forge"}, {"RANK", "1"}, {"WORLD_SIZE", "2"}});
  EXPECT_EQ(e.launcher, Launcher::forge);
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.local_rank, 1);         // LOCAL_RANK defaults to RANK
  EXPECT_EQ(e.local_world_size, 2);   // LOCAL_WORLD_SIZE to WORLD_SIZE
  EXPECT_TRUE(e.nccl_id_hex.empty());
}

TEST(LaunchEnv, Torchrun) {
  const LaunchEnv e = launch_env_from({{"RANK", "5"},
                                       {"WORLD_SIZE", "16"},
                                       {"LOCAL_RANK", "1"},
                                       {"LOCAL_WORLD_SIZE", "4"},
                                       {"MASTER_ADDR", "node0"},
                                       {"MASTER_PORT", "29500"}});
  EXPECT_EQ(e.launcher, Launcher::torchrun);
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world_size, 16);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_EQ(e.master_addr, "node0");
  EXPECT_EQ(e.master_port, 29500);
  EXPECT_FALSE(e.uses_mpi());
}

TEST(LaunchEnv, TorchrunOfOneNeedsNoMaster) {
  const LaunchEnv e = launch_env_from({{"RANK", "0"}, {"WORLD_SIZE", "1"}});
  EXPECT_EQ(e.launcher, Launcher::torchrun);
  EXPECT_FALSE(e.distributed());
}

TEST(LaunchEnv, TorchrunWithoutMasterAddrIsAnError) {
  const std::string msg = error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "29500"}});
  EXPECT_NE(msg.find("MASTER_ADDR"), std::string::npos) << msg;
  const std::string msg2 = error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "localhost"}});
  EXPECT_NE(msg2.find("MASTER_PORT"), std::string::npos) << msg2;
}

TEST(LaunchEnv, OpenMpi) {
  const LaunchEnv e = launch_env_from({{"OMPI_COMM_WORLD_RANK", "6"},
                                       {"OMPI_COMM_WORLD_SIZE", "8"},
                                       {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                                       {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}});
  EXPECT_EQ(e.launcher, Launcher::mpi);
  EXPECT_EQ(e.rank, 6);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 2);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_TRUE(e.uses_mpi());
}

TEST(LaunchEnv, MpichHydra) {
  const LaunchEnv e =
      launch_env_from({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}, {"MPI_LOCALRANKID", "1"}, {"MPI_LOCALNRANKS", "2"}});
  EXPECT_EQ(e.launcher, Launcher::mpi);
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.world_size, 2);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 2);
  // Without the local variables: one node.
  const LaunchEnv one = launch_env_from({{"PMI_RANK", "2"}, {"PMI_SIZE", "3"}});
  EXPECT_EQ(one.local_rank, 2);
  EXPECT_EQ(one.local_world_size, 3);
}

TEST(LaunchEnv, Slurm) {
  const LaunchEnv e = launch_env_from({{"SLURM_PROCID", "9"},
                                       {"SLURM_NTASKS", "16"},
                                       {"SLURM_LOCALID", "1"},
                                       {"SLURM_NTASKS_PER_NODE", "8"}});
  EXPECT_EQ(e.launcher, Launcher::slurm);
  EXPECT_EQ(e.rank, 9);
  EXPECT_EQ(e.world_size, 16);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 8);
  EXPECT_TRUE(e.uses_mpi());
}

TEST(LaunchEnv, SlurmTasksPerNodeList) {
  // 7 tasks on 3 nodes: 3, 3, 1. Task 6 is the only one on node 2.
  const Env base = {{"SLURM_PROCID", "6"}, {"SLURM_NTASKS", "7"}, {"SLURM_LOCALID", "0"},
                    {"SLURM_NODEID", "2"}, {"SLURM_STEP_TASKS_PER_NODE", "3(x2),1"}};
  EXPECT_EQ(launch_env_from(base).local_world_size, 1);
  Env node1 = base;
  node1["SLURM_PROCID"] = "4";
  node1["SLURM_LOCALID"] = "1";
  node1["SLURM_NODEID"] = "1";
  EXPECT_EQ(launch_env_from(node1).local_world_size, 3);
  Env bad = base;
  bad["SLURM_STEP_TASKS_PER_NODE"] = "3(y2),1";
  EXPECT_NE(error_of(bad).find("SLURM_STEP_TASKS_PER_NODE"), std::string::npos) << error_of(bad);
}

TEST(LaunchEnv, MpiWinsOverRankVariables) {
  const LaunchEnv e = launch_env_from({{"RANK", "0"},
                                       {"WORLD_SIZE", "1"},
                                       {"OMPI_COMM_WORLD_RANK", "1"},
                                       {"OMPI_COMM_WORLD_SIZE", "2"},
                                       {"SLURM_PROCID", "0"},
                                       {"SLURM_NTASKS", "1"}});
  EXPECT_EQ(e.launcher, Launcher::mpi);
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.world_size, 2);
}

TEST(LaunchEnv, OpenMpiWinsOverMpich) {
  const LaunchEnv e = launch_env_from(
      {{"PMI_RANK", "0"}, {"PMI_SIZE", "1"}, {"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"}});
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 4);
}

TEST(LaunchEnv, RankVariablesWinOverSlurm) {
  // srun starting one forge launch per node: the ranks see the node's SLURM_PROCID too.
  const LaunchEnv e = launch_env_from({{"SLURM_PROCID", "1"},
                                       {"SLURM_NTASKS", "2"},
                                       {"FORGE_LAUNCHER", "forge"},
                                       {"RANK", "3"},
                                       {"WORLD_SIZE", "4"},
                                       {"LOCAL_RANK", "3"},
                                       {"LOCAL_WORLD_SIZE", "4"}});
  EXPECT_EQ(e.launcher, Launcher::forge);
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 4);
}

TEST(LaunchEnv, EmptyVariablesAreUnset) {
  const LaunchEnv e = launch_env_from({{"RANK", ""}, {"OMPI_COMM_WORLD_RANK", ""}, {"SLURM_PROCID", ""}});
  EXPECT_EQ(e.launcher, Launcher::none);
}

TEST(LaunchEnv, MalformedValuesNameTheVariable) {
  struct Case {
    Env env;
    const char* variable;
  };
  const std::vector<Case> cases = {
      {{{"RANK", "one"}, {"WORLD_SIZE", "2"}}, "RANK"},
      {{{"RANK", "1"}, {"WORLD_SIZE", "2x"}}, "WORLD_SIZE"},
      {{{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}}, "RANK"},  // outside [0, 2)
      {{{"RANK", "-1"}, {"WORLD_SIZE", "2"}}, "RANK"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "0"}}, "WORLD_SIZE"},
      {{{"RANK", "0"}}, "WORLD_SIZE"},  // missing
      {{{"FORGE_LAUNCHER", "forge"}, {"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "x"}}, "LOCAL_RANK"},
      {{{"FORGE_LAUNCHER", "forge"}, {"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}},
       "LOCAL_RANK"},
      {{{"FORGE_LAUNCHER", "forge"}, {"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "3"}},
       "LOCAL_WORLD_SIZE"},
      {{{"FORGE_LAUNCHER", "forge"}, {"RANK", "0"}, {"WORLD_SIZE", "2"}, {"FORGE_NCCL_ID", "xyz"}}, "FORGE_NCCL_ID"},
      {{{"FORGE_LAUNCHER", "forge"}, {"RANK", "0"}, {"WORLD_SIZE", "2"}, {"FORGE_NCCL_ID", "abc"}}, "FORGE_NCCL_ID"},
      {{{"FORGE_LAUNCHER", "torchrun"}, {"RANK", "0"}, {"WORLD_SIZE", "1"}}, "FORGE_LAUNCHER"},
      {{{"FORGE_LAUNCHER", "forge"}, {"WORLD_SIZE", "1"}}, "RANK"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "http"}}, "MASTER_PORT"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}}, "MASTER_PORT"},
      {{{"OMPI_COMM_WORLD_RANK", "0 "}, {"OMPI_COMM_WORLD_SIZE", "2"}}, "OMPI_COMM_WORLD_RANK"},
      {{{"OMPI_COMM_WORLD_RANK", "0"}}, "OMPI_COMM_WORLD_SIZE"},
      {{{"OMPI_COMM_WORLD_RANK", "4"}, {"OMPI_COMM_WORLD_SIZE", "4"}}, "OMPI_COMM_WORLD_RANK"},
      {{{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1.5"}},
       "OMPI_COMM_WORLD_LOCAL_RANK"},
      {{{"PMI_RANK", "0"}, {"PMI_SIZE", "99999999999"}}, "PMI_SIZE"},
      {{{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}, {"MPI_LOCALNRANKS", "-2"}}, "MPI_LOCALNRANKS"},
      {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "four"}}, "SLURM_NTASKS"},
      {{{"SLURM_PROCID", "0"}}, "SLURM_NTASKS"},
      {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "3"}, {"SLURM_NTASKS_PER_NODE", "2"}},
       "SLURM_LOCALID"},
  };
  for (const auto& c : cases) {
    std::string desc;
    for (const auto& [k, v] : c.env) desc += k + "=" + v + " ";
    const std::string msg = error_of(c.env);
    ASSERT_FALSE(msg.empty()) << "no error for " << desc;
    EXPECT_NE(msg.find(c.variable), std::string::npos) << desc << "-> " << msg;
  }
}

TEST(LaunchEnv, LauncherNames) {
  EXPECT_STREQ(launcher_name(Launcher::none), "none");
  EXPECT_STREQ(launcher_name(Launcher::forge), "forge launch");
  EXPECT_STREQ(launcher_name(Launcher::torchrun), "torchrun");
  EXPECT_STREQ(launcher_name(Launcher::mpi), "mpirun");
  EXPECT_STREQ(launcher_name(Launcher::slurm), "srun");
}

TEST(LaunchEnv, FromTheProcessEnvironment) {
  // The test binary runs without a launcher (ctest / a shell), unless under mpirun or srun.
  const LaunchEnv e = launch_env();
  EXPECT_GE(e.rank, 0);
  EXPECT_LT(e.rank, e.world_size);
}

}  // namespace
}  // namespace forge::parallel
