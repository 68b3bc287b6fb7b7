#pragma once
// Step time for one parallel layout: compute at the given utilisation, the communication the
// layout cannot hide, the pipeline bubble, and the optimizer step.
//
//   stage time per micro-batch = compute (model FLOPs / (peak * mfu)) + recomputation
//                                + tensor-parallel all-reduces + pipeline sends/receives
//   pipeline = (m + p - 1) * slowest stage time          bubble fraction (p-1)/(m+p-1)
//              (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
//               Clusters Using Megatron-LM", Section 2.2)
//   step = pipeline + exposed data-parallel communication + optimizer step (+ offload)
//
// Collectives are ring collectives (Patarasuk & Yuan 2009; NCCL's "bus bandwidth"): an
// all-reduce of S bytes over n ranks moves 2(n-1)/n * S per rank, reduce-scatter and
// all-gather (n-1)/n * S each; time = bytes / (link bandwidth * efficiency) + latency.
// Data-parallel communication overlaps the backward pass of the micro-batch it follows
// (DDP buckets, ZeRO prefetch); what does not fit under it is exposed.
#include <cstdint>
#include <string>

#include "forge/plan/gpu_catalog.h"
#include "forge/plan/gpu_profile.h"
#include "forge/plan/memory_model.h"
#include "forge/plan/model_spec.h"

namespace forge::plan {

// ZB-H1's fill and drain as a share of 1F1B's (Qi et al.): (f + b - w) / (f + b + w) for a stage's
// forward f, input-gradient backward b and weight-gradient pass w (a third when the three cost
// the same). forge's W pass is only the linears' weight GEMMs; attention's backward and the
// memory-bound kernels' stay in B. Priced from the profile's kernels (StageKernels) when there is
// one, else from FLOPs (forward = the block's, w = its linears' forward FLOPs again, b the rest of
// three forwards' worth).
double zb_h1_share(double f, double b, double w);

struct Cluster {
  GpuSpec gpu;
  int64_t gpus = 1;
  int64_t gpus_per_node = 8;
  double intra_gbs = 0;         // GPU-GPU within a node, per GPU per direction (NVLink or PCIe)
  std::string intra_name;       // "NVLink", "PCIe", "HCCS"
  double inter_gbs = 25;        // per-GPU network bandwidth across nodes (InfiniBand/RoCE NIC per GPU)
  double pcie_gbs = 32;         // host link (offload)
  double host_gbs = 25;         // host memory bandwidth available per GPU (CPU optimizer step)
  double link_efficiency = 0.8; // achievable fraction of a link's peak in collectives
  double hbm_efficiency = 0.8;  // achievable fraction of device memory bandwidth (optimizer step)
  double latency_intra_s = 10e-6;
  double latency_inter_s = 30e-6;
};

// Bytes each rank sends in a ring all-reduce / reduce-scatter / all-gather of `bytes`.
double ring_allreduce_bytes(double bytes, int64_t n);
double ring_reduce_scatter_bytes(double bytes, int64_t n);
// The pipeline bubble's share of the pipeline time: (p - 1) / (m + p - 1).
double bubble_fraction(int64_t p, int64_t m);

// The bandwidth (bytes/s, after efficiency) and latency a communication group sees: n ranks
// whose global ranks are `stride` apart (tp: 1, dp: tp, pp: tp*dp; Megatron's rank order).
// Within one node: the intra-node link. Across nodes: k of the group's ranks share each
// node, so a hierarchical ring gets k NICs' worth, capped by the intra-node link.
struct Link {
  double bandwidth = 0;  // bytes/s
  double latency = 0;    // s per collective step
  std::string name;      // "NVLink", "InfiniBand x1", ...
  bool crosses_nodes = false;
};
Link group_link(const Cluster& c, int64_t n, int64_t stride);

struct TimeBreakdown {
  int64_t stage = 0;             // the slowest stage
  double stage_time = 0;         // its time per micro-batch (compute + recompute + tp + p2p)
  double compute = 0;            // per step: m micro-batches of model FLOPs on the slowest stage
  double gemm = 0, attention = 0, memory_bound = 0;  // with a profile: compute's parts (Note [profiled step])
  double zb_h1_share = 1;        // ZB-H1's fill and drain as a share of 1F1B's (zb_h1_share())
  double recompute = 0;
  double tp_comm = 0;
  double pp_p2p = 0;
  double cp_comm = 0;            // context parallelism: the K/V ring's time not hidden under attention, or Ulysses' all-to-alls
  double bubble = 0;
  double dp_comm = 0;            // all data-parallel traffic per step (hidden or not)
  double dp_exposed = 0;
  double optimizer = 0;          // the optimizer step (memory-bound)
  double offload = 0;            // host transfers and the CPU optimizer step
  double step = 0;
  double tokens_per_step = 0;
  double tokens_per_s = 0;
  double mfu = 0;                // effective: model FLOPs / (step * gpus * peak)
  double peak_flops = 0;         // per GPU, the precision's dense peak
  int64_t steps = 0;
  double time_to_train_s = 0;
  double gpu_hours = 0;
  double ideal_time_s = 0;       // model FLOPs at the given MFU only: no comm, bubble or recompute
  double ideal_gpu_hours = 0;
  Link tp_link, dp_link, pp_link, cp_link;
};

// `profile` null: the compute at `mfu` of the peak (model FLOPs / (peak x mfu)). Otherwise each
// kernel of the step priced from the profile (Note [profiled step]) and `mfu` unused.
TimeBreakdown step_time(const ModelSpec& m, const TrainingSetup& setup, const Layout& l, const Cluster& c, double mfu,
                        double tokens, const GpuProfile* profile = nullptr);

// Note [profiled step]: one micro-batch's forward and backward on one pipeline stage (`layers`
// blocks; the embedding on the first, the head and the loss on the last), kernel by kernel: each
// linear's three GEMMs (forward, input gradient, weight gradient: none for LoRA's frozen base) at
// gemm_seconds of its shape (m = the micro-batch's tokens on this GPU, the widths split by tensor
// parallelism); the attention core's forward and backward FLOPs (causal: half the square) at the
// profile's attention rate for the sequence and head size; and the memory-bound kernels' bytes at
// the profile's bandwidth. Those bytes follow forge's kernels per token and block, in elements of
// the activations' dtype: the two fused residual-add + norms, 4h forward and 6h backward each (GPT:
// + the GELU epilogue's pre-activation written, f, and read back, f; LLaMA: SwiGLU, 3f forward and
// 5f backward, its two input-gradient products summed, 2h; rotary positions fused into attention);
// under sequence parallelism the h terms are 1/tp. The first stage's embedding (5h; GPT's positions
// 2h more), the last stage's final norm (10h) and fused cross-entropy (the logits read and the
// gradient written over them, 2 V/tp). FP8 linears (Note [FP8 in the plan]) at the profile's fp8
// rate, each with its casts: 6 bytes per element of x, w and dy (amax read, cast read, plain and
// transposed codes written). Full recomputation adds the forward's GEMMs, attention and bytes
// again. LoRA's adapters: 6 FLOPs per adapter parameter and token at the sustained rate.
struct StageKernels {
  double gemm = 0, attention = 0, memory = 0;  // seconds, forward + backward
  double recompute = 0;                         // seconds (full checkpointing)
  double forward = 0, weight_grad = 0;          // of the total: the forward's and the weight GEMMs' (ZB-H1's W)
  double total() const { return gemm + attention + memory; }
};
StageKernels profiled_stage(const ModelSpec& m, const TrainingSetup& setup, const Layout& l, const GpuProfile& prof,
                            int64_t layers, bool first, bool last);

}  // namespace forge::plan
