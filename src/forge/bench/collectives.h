#pragma once
// `forge bench collectives` (docs/bench.md): what forge's own parallel::ProcessGroup reaches — NCCL
// between GPUs, MPI between CPU ranks — for all_reduce, all_gather, reduce_scatter, broadcast
// and send/recv, over message sizes (8 B .. 1 GiB on GPUs), following nccl-tests' conventions:
//
//   size      bytes of the whole buffer: all_reduce / broadcast its tensor; all_gather its
//             output (W x the per-rank input); reduce_scatter its input (W x the per-rank
//             output); send/recv the message. Rounded down to a multiple of W elements.
//   time      per operation: the slowest rank's mean over `iters` back-to-back operations
//             (from a barrier until the host sees the last one complete), after `warmup`
//             untimed ones; in place (send/recv: one iteration is a message each way, and the
//             time is that of one one-way message)
//   algbw     size / time
//   busbw     algbw x the factor that makes it comparable with the link bandwidth:
//             all_reduce 2(W-1)/W, all_gather and reduce_scatter (W-1)/W, broadcast 1,
//             send/recv 1
// Run it under a launcher (`forge launch --nproc-per-node N forge bench collectives`, or
// mpirun): every rank measures, rank 0 prints. On one rank the collectives are local copies
// (reported, labelled W=1) and send/recv is skipped.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "forge/core/device.h"
#include "forge/core/dtype.h"

namespace forge::bench {

// The operations, in the order measured.
const std::vector<std::string>& collective_ops();
// nccl-tests' bus-bandwidth factor of `op` at world size W (throws for an unknown op).
double busbw_factor(const std::string& op, int world);
// The elements of the buffer for `size_bytes` bytes of `element_size`-byte elements, rounded
// down to a multiple of `world` (at least `world`).
int64_t collective_elements(int64_t size_bytes, int element_size, int world);
// Powers of two from lo to hi bytes (x2 steps).
std::vector<int64_t> collective_sizes(int64_t lo, int64_t hi);

struct CollectivesOptions {
  Device device = Device::cpu();     // cpu: MPI; cuda: NCCL (on cuda:LOCAL_RANK)
  std::vector<int64_t> sizes;        // bytes
  std::vector<std::string> ops;      // empty: all
  DType dtype = DType::f32;
  int warmup = 5;
  int iters = 20;
  // Simulated nodes (docs/dist.md "Several machines"): the world seen as nodes of node_size ranks
  // (0: the launch's ranks per host), reduced within each node first (hierarchical) and/or over a
  // paced link of link_gbps between nodes, exactly as forge train's dist.node_size, dist.dp_reduce
  // and dist.link_gbps shape the data-parallel group (parallel::node_aware_group).
  int node_size = 0;
  bool hierarchical = false;
  double link_gbps = 0;
  double link_latency_us = 25;
  // all_reduce and reduce_scatter as dist.grad_compression = "fp8" sends gradients (averaged,
  // coded in FP8 blocks with error feedback: parallel/fp8_reduce.h); their sizes are the
  // uncompressed tensors', so the bandwidth columns say what the compression delivers.
  bool fp8 = false;
};

struct CollectiveResult {
  std::string op;
  int64_t bytes = 0;                 // nccl-tests' size
  int64_t elements = 0;              // of that buffer
  double time_us = 0;                // the slowest rank's mean per operation
  double algbw_gbs = 0, busbw_gbs = 0;
  double sent_fraction = 1;          // --grad-compression fp8: bytes sent / the uncompressed op's
};

struct CollectivesReport {
  std::string backend, device, device_name, launcher;
  int world = 1, rank = 0;
  std::string transport_env;         // NCCL_* variables that change the transport, as set
  std::string nodes;                 // "2 nodes of 2 ranks, hierarchical, link 10 Gb/s" ("" = the plain world)
  CollectivesOptions options;
  std::vector<CollectiveResult> results;
  std::vector<std::string> notes;
};

// Collective over the world (parallel::init_world from the launch environment, once).
CollectivesReport run_collectives(const CollectivesOptions& opt);
nlohmann::json to_json(const CollectivesReport& r);

}  // namespace forge::bench
