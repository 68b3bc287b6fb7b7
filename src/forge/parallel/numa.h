#pragma once
// NUMA binding of a rank: its threads run on, and its host memory comes from, the NUMA node
// of its GPU (GPU ranks) or one node per rank in turn (CPU ranks), so pinned staging buffers
// and the offloaded optimizer state sit in near memory.
//
//   const auto env = parallel::launch_env();
//   const auto r = parallel::bind_current_rank(env, device, parallel::bind_mode_from_env());
//   // r.message: "rank 1: bound to NUMA node 1 (32 CPUs; memory preferred there)"
//
// Call it early in the rank, before worker threads (OpenMP, data loaders) start and before
// large host allocations: the CPU affinity is applied to every thread that exists, the memory
// policy (preferred node, falling back to others when it is full) to the calling thread and
// every thread it starts later.
//
// Modes (forge launch --bind, passed to the ranks as FORGE_BIND):
//   auto  bind when the machine has 2 or more NUMA nodes, unless an MPI launcher (mpirun,
//         srun) has already restricted the process to part of the machine
//   numa  bind whenever there are 2 or more nodes
//   none  never
// With one node (or a GPU whose node the kernel does not know) there is nothing to do and the
// result says so. Binding never throws for lack of support: it reports what it did.
//
// Implementation: the node list and each node's CPUs from sysfs, sched_setaffinity on every
// thread of the process, set_mempolicy(MPOL_PREFERRED): the system calls libnuma wraps,
// without a build or run-time dependency on libnuma. A GPU's node is
// /sys/bus/pci/devices/<PCI bus id>/numa_node. Every sysfs reader takes the sysfs root so the
// tests can use a fake tree.
#include <string>
#include <vector>

#include "forge/core/device.h"
#include "forge/parallel/env.h"

namespace forge::parallel {

enum class BindMode { auto_, numa, none };
// "auto", "numa" or "none"; anything else is a forge::Error listing them.
BindMode parse_bind_mode(const std::string& s);
const char* bind_mode_name(BindMode m);
// FORGE_BIND from the environment (core/env.h: auto when unset or empty, read once per
// process); a bad value is an error naming it.
BindMode bind_mode_from_env();

// "0-3,8,10-11" -> {0, 1, 2, 3, 8, 10, 11} (the kernel's cpu/node list format; "" -> {}).
// Throws forge::Error on anything else.
std::vector<int> parse_cpu_list(const std::string& s);

// The online NUMA nodes (/sys/devices/system/node/online); {0} when sysfs does not say.
std::vector<int> numa_nodes(const std::string& sysfs_root = "/sys");
int numa_node_count(const std::string& sysfs_root = "/sys");
// The CPUs of `node` (/sys/devices/system/node/node<N>/cpulist); {} for a memory-only node.
std::vector<int> numa_node_cpus(int node, const std::string& sysfs_root = "/sys");

// "0000:3B:00.0" or "00000000:3b:00.0" -> "0000:3b:00.0" (the sysfs spelling). Throws
// forge::Error for anything that is not domain:bus:device.function in hex.
std::string normalize_pci_bus_id(const std::string& bus_id);
// The NUMA node of a PCI device, or -1 when the kernel does not know it (one-node machines
// report -1) or the device is not in sysfs.
int pci_numa_node(const std::string& bus_id, const std::string& sysfs_root = "/sys");
// The NUMA node of CUDA device `cuda_index` (its PCI bus id from the CUDA runtime), -1 when
// unknown. Throws forge::Error in a build without CUDA or for an index that is not visible.
int gpu_numa_node(int cuda_index);

struct BindResult {
  bool bound = false;          // the CPU affinity was set
  bool memory_policy = false;  // the preferred memory node was set too
  int node = -1;               // the node bound to (-1: none)
  int cpus = 0;                // CPUs the process may now run on
  std::string message;         // what happened, for the log
};

// Binds every thread of the process to the CPUs of `node` (those the process may use) and
// makes `node` the preferred memory node of the calling thread and its future threads.
BindResult bind_to_numa_node(int node, const std::string& sysfs_root = "/sys");

// The binding of a rank (see the modes above): a CUDA rank to its GPU's node, a CPU rank to
// node (local_rank % nodes with CPUs).
BindResult bind_current_rank(const LaunchEnv& env, Device device, BindMode mode,
                             const std::string& sysfs_root = "/sys");

}  // namespace forge::parallel
