// dist NUMA binding (numa.h): sysfs parsing on a fake tree, the modes, the no-op on one node,
// and a real binding in a forked child (so the test process keeps its affinity).
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "forge/core/env.h"
#include "forge/core/error.h"
#include "forge/ops/creation.h"
#include "forge/parallel/numa.h"

namespace forge::parallel {
namespace {

namespace fs = std::filesystem;

// A fake sysfs root under the temporary directory, removed at the end of the test.
class FakeSysfs {
 public:
  FakeSysfs() {
    root_ = fs::temp_directory_path() /
            ("forge_numa_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_ / "devices/system/node");
  }
  ~FakeSysfs() { fs::remove_all(root_); }
  void write(const std::string& rel, const std::string& text) {
    fs::create_directories((root_ / rel).parent_path());
    std::ofstream(root_ / rel) << text;
  }
  // Nodes with their CPU lists, e.g. {"0-3", "4-7"}.
  void nodes(const std::vector<std::string>& cpulists, const std::string& online) {
    write("devices/system/node/online", online + "\n");
    for (size_t i = 0; i < cpulists.size(); ++i)
      write("devices/system/node/node" + std::to_string(i) + "/cpulist", cpulists[i] + "\n");
  }
  std::string root() const { return root_.string(); }

 private:
  fs::path root_;
};

std::vector<int> affinity() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> out;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return out;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) out.push_back(c);
  return out;
}

TEST(Numa, ParseCpuList) {
  EXPECT_EQ(parse_cpu_list("0"), (std::vector<int>{0}));
  EXPECT_EQ(parse_cpu_list("0-3,8,10-11\n"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(parse_cpu_list("5,1-2"), (std::vector<int>{1, 2, 5}));
  EXPECT_TRUE(parse_cpu_list("").empty());
  EXPECT_TRUE(parse_cpu_list("\n").empty());
  for (const char* bad : {"a", "1-", "-1", "3-1", "1,,2", "1,", "0x1", "1 2"})
    EXPECT_THROW(parse_cpu_list(bad), Error) << bad;
}

TEST(Numa, NodesFromSysfs) {
  FakeSysfs sys;
  sys.nodes({"0-3", "4-7"}, "0-1");
  EXPECT_EQ(numa_nodes(sys.root()), (std::vector<int>{0, 1}));
  EXPECT_EQ(numa_node_count(sys.root()), 2);
  EXPECT_EQ(numa_node_cpus(1, sys.root()), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_TRUE(numa_node_cpus(5, sys.root()).empty());  // no such node
}

TEST(Numa, SparseNodesAndMemoryOnlyNodes) {
  FakeSysfs sys;
  sys.write("devices/system/node/online", "0,2\n");
  sys.write("devices/system/node/node0/cpulist", "0-1\n");
  sys.write("devices/system/node/node2/cpulist", "\n");  // memory only (CXL, HBM)
  EXPECT_EQ(numa_nodes(sys.root()), (std::vector<int>{0, 2}));
  EXPECT_TRUE(numa_node_cpus(2, sys.root()).empty());
}

TEST(Numa, MissingOrBadSysfsMeansOneNode) {
  FakeSysfs sys;
  EXPECT_EQ(numa_nodes(sys.root()), (std::vector<int>{0}));
  sys.write("devices/system/node/online", "garbage\n");
  EXPECT_EQ(numa_node_count(sys.root()), 1);
  EXPECT_EQ(numa_node_count("/nonexistent/forge/sysfs"), 1);
}

TEST(Numa, ThisMachine) {
  const int n = numa_node_count();
  EXPECT_GE(n, 1);
  for (int node : numa_nodes()) EXPECT_GE(node, 0);
}

TEST(Numa, PciBusIds) {
  EXPECT_EQ(normalize_pci_bus_id("0000:3B:00.0"), "0000:3b:00.0");
  EXPECT_EQ(normalize_pci_bus_id("00000000:3b:00.0"), "0000:3b:00.0");
  EXPECT_EQ(normalize_pci_bus_id("0001:c1:1f.7"), "0001:c1:1f.7");
  for (const char* bad : {"", "3b:00.0", "0000:3b:00", "0000:3g:00.0", "0000:3b:00.8", "0000:3b:20.0", "0000:3b:00.0x"})
    EXPECT_THROW(normalize_pci_bus_id(bad), Error) << bad;
}

TEST(Numa, PciNumaNode) {
  FakeSysfs sys;
  sys.write("bus/pci/devices/0000:3b:00.0/numa_node", "1\n");
  sys.write("bus/pci/devices/0000:3c:00.0/numa_node", "-1\n");  // unknown (one-node machines)
  sys.write("bus/pci/devices/0000:3d:00.0/numa_node", "what\n");
  EXPECT_EQ(pci_numa_node("0000:3B:00.0", sys.root()), 1);
  EXPECT_EQ(pci_numa_node("00000000:3b:00.0", sys.root()), 1);
  EXPECT_EQ(pci_numa_node("0000:3c:00.0", sys.root()), -1);
  EXPECT_EQ(pci_numa_node("0000:3d:00.0", sys.root()), -1);
  EXPECT_EQ(pci_numa_node("0000:99:00.0", sys.root()), -1);  // not in sysfs
}

TEST(Numa, Modes) {
  EXPECT_EQ(parse_bind_mode("auto"), BindMode::auto_);
  EXPECT_EQ(parse_bind_mode("numa"), BindMode::numa);
  EXPECT_EQ(parse_bind_mode("none"), BindMode::none);
  for (auto m : {BindMode::auto_, BindMode::numa, BindMode::none}) EXPECT_EQ(parse_bind_mode(bind_mode_name(m)), m);
  try {
    parse_bind_mode("socket");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("auto, numa or none"), std::string::npos) << e.what();
  }
}

// FORGE_BIND is read once per process (core/env.h); env::Override stands in for the environment.
TEST(Numa, ModeFromEnvironment) {
  const auto mode_with = [](std::optional<std::string> raw) {
    env::Override o("FORGE_BIND", std::move(raw));
    return bind_mode_from_env();
  };
  EXPECT_EQ(mode_with(std::nullopt), BindMode::auto_);
  EXPECT_EQ(mode_with("none"), BindMode::none);
  EXPECT_EQ(mode_with("numa"), BindMode::numa);
  EXPECT_EQ(mode_with(""), BindMode::auto_);
  try {
    mode_with("yes");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("FORGE_BIND='yes'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("auto, numa, none"), std::string::npos) << e.what();
  }
}

TEST(Numa, NoOpOnOneNode) {
  FakeSysfs sys;
  sys.nodes({"0-1023"}, "0");
  const std::vector<int> before = affinity();
  LaunchEnv env;
  env.rank = 2;
  for (auto mode : {BindMode::auto_, BindMode::numa, BindMode::none}) {
    const BindResult r = bind_current_rank(env, Device::cpu(), mode, sys.root());
    EXPECT_FALSE(r.bound);
    EXPECT_EQ(r.node, -1);
    EXPECT_EQ(r.message.rfind("rank 2: ", 0), 0u) << r.message;
    EXPECT_NE(r.message.find(mode == BindMode::none ? "off" : "one NUMA node"), std::string::npos) << r.message;
  }
  EXPECT_EQ(affinity(), before);
  // And on this machine, whatever it has, mode none never binds.
  EXPECT_FALSE(bind_current_rank(env, Device::cpu(), BindMode::none).bound);
}

TEST(Numa, NodeWithoutUsableCpusIsNotBound) {
  FakeSysfs sys;
  sys.nodes({"0", "4000-4001"}, "0-1");  // CPUs this process cannot have
  const BindResult r = bind_to_numa_node(1, sys.root());
  EXPECT_FALSE(r.bound);
  EXPECT_NE(r.message.find("none of the CPUs"), std::string::npos) << r.message;
  sys.write("devices/system/node/node1/cpulist", "\n");
  EXPECT_NE(bind_to_numa_node(1, sys.root()).message.find("no CPUs"), std::string::npos);
}

// Runs `body` in a forked child (its affinity and memory policy changes stay there); the
// child's exit status is the number of failed checks.
int in_child(const std::function<int()>& body) {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(body());
  int st = 0;
  ::waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 100;
}

TEST(Numa, CpuRanksSpreadOverTwoFakeNodes) {
  // Two fake nodes made of the CPUs this process may use (the last one alone on node 1), so the
  // binding is real: the child's affinity must become node (local_rank % 2)'s CPUs.
  const std::vector<int> cpus = affinity();
  ASSERT_FALSE(cpus.empty());
  if (cpus.size() < 2) GTEST_SKIP() << "needs 2 usable CPUs";
  std::string node0;
  for (size_t i = 0; i + 1 < cpus.size(); ++i) {
    if (i > 0) node0.push_back(',');
    node0.append(std::to_string(cpus[i]));
  }
  const std::string node1 = std::to_string(cpus.back());
  FakeSysfs sys;
  sys.nodes({node0, node1}, "0-1");
  for (int local_rank : {0, 1, 2, 3}) {
    const int failures = in_child([&] {
      LaunchEnv env;
      env.launcher = Launcher::forge;
      env.rank = env.local_rank = local_rank;
      env.world_size = env.local_world_size = 4;
      const BindResult r = bind_current_rank(env, Device::cpu(), BindMode::auto_, sys.root());
      const int want = local_rank % 2;
      int bad = 0;
      bad += !r.bound;
      bad += r.node != want;
      const std::vector<int> now = affinity();
      bad += want == 1 ? now != std::vector<int>{cpus.back()} : now != std::vector<int>(cpus.begin(), cpus.end() - 1);
      bad += r.cpus != static_cast<int>(now.size());
      if (r.memory_policy) {
        int mode = -1;
        unsigned long mask[16] = {};
        if (syscall(SYS_get_mempolicy, &mode, mask, 16 * 64 + 1, nullptr, 0UL) == 0) {
          bad += mode != 1;                          // MPOL_PREFERRED
          bad += mask[0] != (1UL << want);
        }
      }
      bad += r.message.find("bound to NUMA node " + std::to_string(want)) == std::string::npos;
      return bad;
    });
    EXPECT_EQ(failures, 0) << "local rank " << local_rank;
  }
}

TEST(Numa, AutoLeavesAnMpiBindingAlone) {
  const std::vector<int> cpus = affinity();
  if (cpus.size() < 2) GTEST_SKIP() << "needs 2 usable CPUs";
  if (static_cast<long>(cpus.size()) < sysconf(_SC_NPROCESSORS_ONLN)) GTEST_SKIP() << "already restricted";
  FakeSysfs sys;
  sys.nodes({std::to_string(cpus.front()), std::to_string(cpus.back())}, "0-1");
  const int failures = in_child([&] {
    // mpirun bound us to the first CPU.
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpus.front(), &one);
    if (sched_setaffinity(0, sizeof(one), &one) != 0) return 50;
    LaunchEnv env;
    env.launcher = Launcher::mpi;
    env.rank = env.local_rank = 1;
    env.world_size = env.local_world_size = 2;
    int bad = 0;
    const BindResult a = bind_current_rank(env, Device::cpu(), BindMode::auto_, sys.root());
    bad += a.bound;
    bad += a.message.find("already bound") == std::string::npos;
    bad += affinity() != std::vector<int>{cpus.front()};
    // numa binds anyway: local rank 1 -> node 1 = the last CPU, not in the current mask -> not bound.
    const BindResult n = bind_current_rank(env, Device::cpu(), BindMode::numa, sys.root());
    bad += n.bound;
    return bad;
  });
  EXPECT_EQ(failures, 0);
}

#ifndef FORGE_WITH_CUDA
TEST(Numa, GpuNodeNeedsCuda) { EXPECT_THROW(gpu_numa_node(0), Error); }
#else
TEST(Numa, GpuNodesOfThisMachine) {
  // Runs on a GPU machine (skipped here): every visible GPU's node is a node of the machine,
  // or -1 where the kernel does not know it (one-node machines).
  const int gpus = cuda_device_count();
  if (gpus == 0) GTEST_SKIP() << "no GPU visible";
  const std::vector<int> nodes = numa_nodes();
  for (int i = 0; i < gpus; ++i) {
    const int node = gpu_numa_node(i);
    EXPECT_TRUE(node == -1 || std::find(nodes.begin(), nodes.end(), node) != nodes.end()) << "cuda:" << i << " " << node;
  }
  EXPECT_THROW(gpu_numa_node(gpus), Error);
}
#endif

}  // namespace
}  // namespace forge::parallel
