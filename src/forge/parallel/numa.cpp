// NUMA binding of a rank (numa.h): sysfs for the topology, sched_setaffinity and
// set_mempolicy for the binding.
#include "forge/parallel/numa.h"

#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string_view>

#include "forge/core/env.h"
#include "forge/core/error.h"

#ifdef FORGE_WITH_CUDA
#include "forge/backends/cuda/device_info.h"
#endif

namespace forge::parallel {

namespace fs = std::filesystem;

BindMode parse_bind_mode(const std::string& s) {
  if (s == "auto") return BindMode::auto_;
  if (s == "numa") return BindMode::numa;
  if (s == "none") return BindMode::none;
  FORGE_THROW("unknown NUMA binding '", s, "'; expected auto, numa or none");
}

const char* bind_mode_name(BindMode m) {
  switch (m) {
    case BindMode::auto_: return "auto";
    case BindMode::numa: return "numa";
    case BindMode::none: return "none";
  }
  return "?";
}

// The switch's choices (core/env.cpp) are parse_bind_mode's names.
BindMode bind_mode_from_env() { return parse_bind_mode(env::string("FORGE_BIND")); }

namespace {

int parse_nonneg(std::string_view s, const std::string& whole) {
  int v = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  FORGE_CHECK(ec == std::errc() && p == s.data() + s.size() && v >= 0, "'", whole,
              "' is not a CPU/node list such as 0-3,8");
  return v;
}

// The first line of a file, trailing whitespace removed; nullopt when it cannot be read.
std::optional<std::string> read_line(const fs::path& p) {
  std::ifstream f(p);
  if (!f) return std::nullopt;
  std::string line;
  std::getline(f, line);
  while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
  return line;
}

fs::path node_dir(const std::string& sysfs_root) { return fs::path(sysfs_root) / "devices/system/node"; }

// The CPUs this process may run on (its affinity mask).
std::vector<int> allowed_cpus() {
  constexpr int kMaxCpus = 8192;
  cpu_set_t* set = CPU_ALLOC(kMaxCpus);
  const size_t size = CPU_ALLOC_SIZE(kMaxCpus);
  std::vector<int> cpus;
  if (sched_getaffinity(0, size, set) == 0) {
    for (int c = 0; c < kMaxCpus; ++c)
      if (CPU_ISSET_S(c, size, set)) cpus.push_back(c);
  }
  CPU_FREE(set);
  return cpus;
}

int online_cpu_count() {
  const long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

// Sets the affinity of every thread of the process; returns the errno of the calling thread's
// call (0 on success). Threads that exit meanwhile are skipped.
int set_affinity_all_threads(const std::vector<int>& cpus) {
  const int max_cpu = cpus.empty() ? 0 : cpus.back();
  cpu_set_t* set = CPU_ALLOC(max_cpu + 1);
  const size_t size = CPU_ALLOC_SIZE(max_cpu + 1);
  CPU_ZERO_S(size, set);
  for (int c : cpus) CPU_SET_S(c, size, set);
  int err = 0;
  if (sched_setaffinity(0, size, set) != 0) err = errno;
  if (err == 0) {
    std::error_code ec;
    for (const auto& task : fs::directory_iterator("/proc/self/task", ec)) {
      const std::string name = task.path().filename().string();
      const pid_t tid = static_cast<pid_t>(std::atoi(name.c_str()));
      if (tid > 0) (void)sched_setaffinity(tid, size, set);
    }
  }
  CPU_FREE(set);
  return err;
}

// set_mempolicy(MPOL_PREFERRED, {node}) for the calling thread; returns errno (0 on success).
int set_preferred_node(int node) {
  constexpr int kMpolPreferred = 1;  // linux/mempolicy.h
  constexpr int kBitsPerWord = 8 * sizeof(unsigned long);
  constexpr int kWords = 16;  // up to 1024 nodes
  if (node < 0 || node >= kWords * kBitsPerWord) return EINVAL;
  unsigned long mask[kWords] = {};
  mask[node / kBitsPerWord] = 1UL << (node % kBitsPerWord);
  // maxnode counts one more than the bits the kernel reads (it decrements it first).
  if (syscall(SYS_set_mempolicy, kMpolPreferred, mask, static_cast<unsigned long>(kWords * kBitsPerWord + 1)) != 0)
    return errno;
  return 0;
}

std::string rank_prefix(const LaunchEnv& env) { return "rank " + std::to_string(env.rank) + ": "; }

}  // namespace

std::vector<int> parse_cpu_list(const std::string& s) {
  std::vector<int> out;
  std::string_view rest(s);
  while (!rest.empty() && std::isspace(static_cast<unsigned char>(rest.back()))) rest.remove_suffix(1);
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    const size_t dash = item.find('-');
    if (dash == std::string_view::npos) {
      out.push_back(parse_nonneg(item, s));
    } else {
      const int a = parse_nonneg(item.substr(0, dash), s);
      const int b = parse_nonneg(item.substr(dash + 1), s);
      FORGE_CHECK(a <= b, "'", s, "' is not a CPU/node list such as 0-3,8 (range ", a, "-", b, ")");
      for (int i = a; i <= b; ++i) out.push_back(i);
    }
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
    FORGE_CHECK(!rest.empty(), "'", s, "' is not a CPU/node list such as 0-3,8 (trailing comma)");
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<int> numa_nodes(const std::string& sysfs_root) {
  const auto line = read_line(node_dir(sysfs_root) / "online");
  if (!line || line->empty()) return {0};
  try {
    auto nodes = parse_cpu_list(*line);
    return nodes.empty() ? std::vector<int>{0} : nodes;
  } catch (const Error&) {
    return {0};
  }
}

int numa_node_count(const std::string& sysfs_root) { return static_cast<int>(numa_nodes(sysfs_root).size()); }

std::vector<int> numa_node_cpus(int node, const std::string& sysfs_root) {
  const auto line = read_line(node_dir(sysfs_root) / ("node" + std::to_string(node)) / "cpulist");
  if (!line) return {};
  try {
    return parse_cpu_list(*line);
  } catch (const Error&) {
    return {};
  }
}

std::string normalize_pci_bus_id(const std::string& bus_id) {
  // domain:bus:device.function, all hex.
  unsigned domain = 0, bus = 0, dev = 0, fn = 0;
  const size_t c1 = bus_id.find(':');
  const size_t c2 = c1 == std::string::npos ? std::string::npos : bus_id.find(':', c1 + 1);
  const size_t dot = c2 == std::string::npos ? std::string::npos : bus_id.find('.', c2 + 1);
  auto hex = [&](size_t b, size_t e, unsigned& v) {
    if (b >= e || e > bus_id.size()) return false;
    const auto [p, ec] = std::from_chars(bus_id.data() + b, bus_id.data() + e, v, 16);
    return ec == std::errc() && p == bus_id.data() + e;
  };
  const bool ok = dot != std::string::npos && hex(0, c1, domain) && hex(c1 + 1, c2, bus) && hex(c2 + 1, dot, dev) &&
                  hex(dot + 1, bus_id.size(), fn) && bus <= 0xff && dev <= 0x1f && fn <= 7;
  FORGE_CHECK(ok, "'", bus_id, "' is not a PCI bus id such as 0000:3b:00.0");
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%04x:%02x:%02x.%x", domain, bus, dev, fn);
  return buf;
}

int pci_numa_node(const std::string& bus_id, const std::string& sysfs_root) {
  const auto line = read_line(fs::path(sysfs_root) / "bus/pci/devices" / normalize_pci_bus_id(bus_id) / "numa_node");
  if (!line) return -1;
  int v = -1;
  const auto [p, ec] = std::from_chars(line->data(), line->data() + line->size(), v);
  if (ec != std::errc() || p != line->data() + line->size() || v < 0) return -1;
  return v;
}

int gpu_numa_node(int cuda_index) {
#ifdef FORGE_WITH_CUDA
  return pci_numa_node(cuda::device_properties(cuda_index).pci_bus_id);
#else
  FORGE_THROW("gpu_numa_node(", cuda_index, "): forge was built without CUDA");
#endif
}

BindResult bind_to_numa_node(int node, const std::string& sysfs_root) {
  BindResult r;
  r.node = node;
  const std::vector<int> node_cpus = numa_node_cpus(node, sysfs_root);
  const std::vector<int> allowed = allowed_cpus();
  std::vector<int> cpus;
  std::set_intersection(node_cpus.begin(), node_cpus.end(), allowed.begin(), allowed.end(), std::back_inserter(cpus));
  if (cpus.empty()) {
    r.node = -1;
    r.cpus = static_cast<int>(allowed.size());
    r.message = "not bound: NUMA node " + std::to_string(node) +
                (node_cpus.empty() ? " has no CPUs" : " has none of the CPUs this process may use");
    return r;
  }
  if (const int err = set_affinity_all_threads(cpus); err != 0) {
    r.node = -1;
    r.cpus = static_cast<int>(allowed.size());
    r.message = "not bound: sched_setaffinity to NUMA node " + std::to_string(node) + " failed: " + std::strerror(err);
    return r;
  }
  r.bound = true;
  r.cpus = static_cast<int>(cpus.size());
  const int err = set_preferred_node(node);
  r.memory_policy = err == 0;
  r.message = "bound to NUMA node " + std::to_string(node) + " (" + std::to_string(r.cpus) + " CPUs; " +
              (err == 0 ? std::string("memory preferred there)")
                        : "memory policy not set: set_mempolicy failed: " + std::string(std::strerror(err)) + ")");
  return r;
}

BindResult bind_current_rank(const LaunchEnv& env, Device device, BindMode mode, const std::string& sysfs_root) {
  BindResult r;
  const std::string who = rank_prefix(env);
  if (mode == BindMode::none) {
    r.message = who + "NUMA binding off (FORGE_BIND=none)";
    return r;
  }
  const std::vector<int> nodes = numa_nodes(sysfs_root);
  if (nodes.size() < 2) {
    r.message = who + "not bound: one NUMA node";
    return r;
  }
  if (mode == BindMode::auto_ && env.uses_mpi() && static_cast<int>(allowed_cpus().size()) < online_cpu_count()) {
    r.message = who + "not bound: " + launcher_name(env.launcher) +
                " already bound the process (FORGE_BIND=numa binds anyway)";
    return r;
  }
  int node = -1;
  if (device.is_cuda()) {
    node = gpu_numa_node(device.index);
    if (node < 0) {
      r.message = who + "not bound: the kernel does not know the NUMA node of " + device.str();
      return r;
    }
  } else {
    std::vector<int> cpu_nodes;
    for (int n : nodes)
      if (!numa_node_cpus(n, sysfs_root).empty()) cpu_nodes.push_back(n);
    if (cpu_nodes.empty()) {
      r.message = who + "not bound: no NUMA node lists its CPUs";
      return r;
    }
    node = cpu_nodes[static_cast<size_t>(env.local_rank) % cpu_nodes.size()];
  }
  r = bind_to_numa_node(node, sysfs_root);
  r.message = who + r.message;
  return r;
}

}  // namespace forge::parallel
