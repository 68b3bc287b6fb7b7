// forge info's readers: the host CPU on a fake sysfs/procfs tree, the bandwidth formula, and
// `forge info --json` run on this machine (a CPU box: no GPU; runs <build>/forge).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "forge/bench/gpu_info.h"
#include "forge/bench/host_info.h"
#include "forge/core/error.h"
#include "testing/cli_testing.h"

namespace forge::bench {
namespace {

namespace fs = std::filesystem;
using testing::CliRun;
using testing::run_forge;
using testing::Stderr;

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text << "\n";
}

// 2 sockets x 2 cores x 2 threads = 8 CPUs, one NUMA node per socket; per core L1d 32K,
// L1i 32K, L2 1M (shared by the 2 threads of a core), per socket L3 16M (4 threads).
struct FakeRoot {
  fs::path root;
  FakeRoot() {
    root = fs::temp_directory_path() / ("forge_host_info_" + std::to_string(::getpid()));
    fs::remove_all(root);
    std::string cpuinfo;
    for (int cpu = 0; cpu < 8; ++cpu)
      cpuinfo += "processor\t: " + std::to_string(cpu) + "\nmodel name\t: Fake CPU 9000 @ 3.00GHz\n\n";
    write(root / "proc/cpuinfo", cpuinfo);
    write(root / "proc/meminfo", "MemTotal:       16384000 kB\nMemFree:         1000 kB");
    const fs::path cpu_dir = root / "sys/devices/system/cpu";
    write(cpu_dir / "online", "0-7");
    for (int cpu = 0; cpu < 8; ++cpu) {
      // Linux numbering: cpu 0-3 socket 0, 4-7 socket 1; threads of a core are cpu and cpu^1.
      const int socket = cpu / 4, core = (cpu % 4) / 2, first = cpu & ~1, sock_first = socket * 4;
      const fs::path d = cpu_dir / ("cpu" + std::to_string(cpu));
      write(d / "topology/physical_package_id", std::to_string(socket));
      write(d / "topology/core_id", std::to_string(core));
      const std::string core_list = std::to_string(first) + "-" + std::to_string(first + 1);
      const std::string sock_list = std::to_string(sock_first) + "-" + std::to_string(sock_first + 3);
      const struct {
        const char* level;
        const char* type;
        const char* size;
        std::string shared;
      } caches[] = {{"1", "Data", "32K", core_list},
                    {"1", "Instruction", "32K", core_list},
                    {"2", "Unified", "1024K", core_list},
                    {"3", "Unified", "16384K", sock_list}};
      for (int i = 0; i < 4; ++i) {
        const fs::path idx = d / "cache" / ("index" + std::to_string(i));
        write(idx / "level", caches[i].level);
        write(idx / "type", caches[i].type);
        write(idx / "size", caches[i].size);
        write(idx / "shared_cpu_list", caches[i].shared);
      }
    }
    write(root / "sys/devices/system/node/node0/cpulist", "0-3");
    write(root / "sys/devices/system/node/node1/cpulist", "4-7");
    write(root / "sys/devices/system/node/possible", "0-1");  // not a node directory
  }
  ~FakeRoot() {
    std::error_code ec;
    fs::remove_all(root, ec);
  }
};

TEST(HostInfoTest, ParsesFakeSysfsTree) {
  FakeRoot fake;
  const HostInfo h = host_info(fake.root.string());
  EXPECT_EQ(h.cpu_model, "Fake CPU 9000 @ 3.00GHz");
  EXPECT_EQ(h.sockets, 2);
  EXPECT_EQ(h.cores, 4);
  EXPECT_EQ(h.threads, 8);
  EXPECT_EQ(h.numa_nodes, 2);
  EXPECT_EQ(h.memory_bytes, int64_t{16384000} * 1024);
  ASSERT_EQ(h.caches.size(), 4u);
  EXPECT_EQ(cache_name(h.caches[0]), "L1d");
  EXPECT_EQ(cache_name(h.caches[1]), "L1i");
  EXPECT_EQ(cache_name(h.caches[2]), "L2");
  EXPECT_EQ(cache_name(h.caches[3]), "L3");
  EXPECT_EQ(h.caches[0].size_bytes, 32 * 1024);
  EXPECT_EQ(h.caches[2].size_bytes, 1024 * 1024);
  EXPECT_EQ(h.caches[3].size_bytes, 16 * 1024 * 1024);
  EXPECT_EQ(h.caches[0].cpus_per_instance, 2);
  EXPECT_EQ(h.caches[0].instances, 4);  // one per core
  EXPECT_EQ(h.caches[3].cpus_per_instance, 4);
  EXPECT_EQ(h.caches[3].instances, 2);  // one per socket

  const nlohmann::json j = to_json(h);
  for (const char* k : {"cpu_model", "sockets", "cores", "threads", "numa_nodes", "caches", "memory_bytes"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_EQ(j["caches"][3]["name"], "L3");
}

TEST(HostInfoTest, MissingTreeGivesZerosNotErrors) {
  const HostInfo h = host_info((fs::temp_directory_path() / "forge_no_such_root").string());
  EXPECT_EQ(h.threads, 0);
  EXPECT_EQ(h.sockets, 0);
  EXPECT_TRUE(h.caches.empty());
  EXPECT_EQ(h.memory_bytes, 0);
}

TEST(HostInfoTest, CpuListsAndSizes) {
  EXPECT_EQ(parse_cpu_list("0-3,8,10-11"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(parse_cpu_list("5\n"), (std::vector<int>{5}));
  EXPECT_TRUE(parse_cpu_list("").empty());
  EXPECT_THROW(parse_cpu_list("3-1"), Error);
  EXPECT_THROW(parse_cpu_list("a-b"), Error);
  EXPECT_EQ(parse_size("32K"), 32768);
  EXPECT_EQ(parse_size("32M"), 32 << 20);
  EXPECT_EQ(parse_size("512"), 512);
  EXPECT_EQ(parse_size(""), 0);
}

TEST(HostInfoTest, RealMachineIsConsistent) {
  const HostInfo h = host_info();
  EXPECT_GE(h.threads, 1);
  EXPECT_GE(h.threads, h.cores);
  EXPECT_GE(h.cores, h.sockets);
  EXPECT_GT(h.memory_bytes, 0);
}

TEST(GpuInfoTest, TheoreticalBandwidthMatchesDatasheets) {
  // H100 SXM (HBM3): 2619 MHz, 5120-bit -> 3.35 TB/s.
  EXPECT_NEAR(theoretical_bandwidth_gbs(2619000, 5120), 3352.3, 0.1);
  // A100 SXM 40GB (HBM2): 1215 MHz, 5120-bit -> 1555 GB/s; A100 80GB (HBM2e) 1593 MHz -> 2039 GB/s.
  EXPECT_NEAR(theoretical_bandwidth_gbs(1215000, 5120), 1555.2, 0.1);
  EXPECT_NEAR(theoretical_bandwidth_gbs(1593000, 5120), 2039.0, 0.1);
  EXPECT_EQ(theoretical_bandwidth_gbs(0, 5120), 0.0);
  EXPECT_EQ(cuda_version_string(12040), "12.4");
  EXPECT_EQ(cuda_version_string(13000), "13.0");
  EXPECT_EQ(cuda_version_string(0), "-");
}

// ---- the forge binary ---------------------------------------------------------------------

using InfoCliTest = testing::ForgeCliTest;

TEST_F(InfoCliTest, JsonHasEveryKey) {
  const CliRun r = run_forge({"info", "--json"}, Stderr::dropped);
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  for (const char* k :
       {"host", "gpus", "driver", "cuda_runtime", "cudnn", "nvml", "note", "cuda_build", "forge_version"})
    EXPECT_TRUE(j.contains(k)) << k;
  for (const char* k : {"cpu_model", "sockets", "cores", "threads", "numa_nodes", "caches", "memory_bytes"})
    EXPECT_TRUE(j["host"].contains(k)) << k;
  EXPECT_GE(j["host"]["threads"].get<int>(), 1);
  EXPECT_TRUE(j["nvml"].contains("available"));
  ASSERT_TRUE(j["gpus"].is_array());
  if (j["gpus"].empty()) {
    EXPECT_EQ(j["note"], "no CUDA device");  // this CPU machine
  } else {
    for (const char* k : {"name", "compute_capability", "sm_count", "clock_mhz", "memory_bytes", "memory_bus_bits",
                          "bandwidth_gbs", "dense_peak_tflops", "source", "nvlinks_active", "pcie_gen"})
      EXPECT_TRUE(j["gpus"][0].contains(k)) << k;
  }
}

TEST_F(InfoCliTest, TableAndUsageErrors) {
  const CliRun r = run_forge({"info"}, Stderr::dropped);
  ASSERT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("sockets/cores/threads"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("runtime"), std::string::npos) << r.out;
  EXPECT_EQ(run_forge({"info", "--bogus"}, Stderr::dropped).status, 2);
  EXPECT_EQ(run_forge({"info", "extra-arg"}, Stderr::dropped).status, 2);
  EXPECT_EQ(run_forge({"info", "--help"}, Stderr::dropped).status, 0);
}

}  // namespace
}  // namespace forge::bench
