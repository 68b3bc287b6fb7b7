#pragma once
// The host CPU as Linux describes it (sysfs and procfs), for `forge info` (docs/bench.md).
//
//   auto h = forge::bench::host_info();   // h.sockets == 2, h.cores == 64, h.threads == 128, ...
//
// Every reader takes the file-system root ("/" on a real machine) so that tests can point it
// at a fake tree: <root>/proc/cpuinfo, <root>/proc/meminfo, <root>/sys/devices/system/{cpu,node}.
// Missing files leave their fields at zero / empty; nothing here throws for an odd machine.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace forge::bench {

struct CacheInfo {
  int level = 0;             // 1, 2, 3
  std::string type;          // "Data", "Instruction" or "Unified" (sysfs cache/index*/type)
  int64_t size_bytes = 0;    // one instance (cache/index*/size of cpu0)
  int cpus_per_instance = 0; // CPUs in cpu0's shared_cpu_list
  int instances = 0;         // distinct shared_cpu_lists over the online CPUs
};

struct HostInfo {
  std::string cpu_model;     // /proc/cpuinfo "model name" (or "Model"/"cpu model"; "" if none)
  int sockets = 0;           // distinct topology/physical_package_id of the online CPUs
  int cores = 0;             // distinct (physical_package_id, core_id) pairs
  int threads = 0;           // online CPUs (/sys/devices/system/cpu/online)
  int numa_nodes = 0;        // /sys/devices/system/node/node<N> directories
  std::vector<CacheInfo> caches;  // in sysfs index order (L1d, L1i, L2, L3 on x86)
  int64_t memory_bytes = 0;  // /proc/meminfo MemTotal
};

HostInfo host_info(const std::string& root = "/");

// "0-3,8,10-11" -> {0,1,2,3,8,10,11}; throws forge::Error for a malformed list.
std::vector<int> parse_cpu_list(const std::string& list);
// sysfs cache sizes: "32K" -> 32768, "1024K", "32M", "512" (bytes); 0 if unreadable.
int64_t parse_size(const std::string& s);

// "L1d", "L1i", "L2", "L3" (the type letter only for split caches).
std::string cache_name(const CacheInfo& c);

nlohmann::json to_json(const HostInfo& h);

}  // namespace forge::bench
