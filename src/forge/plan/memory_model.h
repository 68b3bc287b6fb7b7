#pragma once
// Memory per GPU for one parallel layout: parameters, gradients and optimizer state (with
// ZeRO sharding and CPU offload), activations (activations.h, per pipeline stage and
// micro-batches in flight), communication buffers, an allocator margin and a runtime reserve.
//
// Bytes per parameter (Rajbhandari et al. 2020, "ZeRO", Section 3.1: "2 + 2 + 12" for mixed
// precision Adam):
//   precision        params  grads  AdamW state                 SGD (momentum) state
//   bf16/fp16/fp8       2      2    12 (f32 master, m, v)       8 (f32 master, momentum)
//   fp32/tf32           4      4     8 (m, v)                   4 (momentum)
// ZeRO stage z over the data-parallel degree d divides optimizer state (z >= 1), gradients
// (z >= 2) and parameters (z = 3) by d. Offload moves the optimizer state to host memory.
#include <cstdint>
#include <string>
#include <vector>

#include "forge/parallel/layout.h"
#include "forge/plan/activations.h"
#include "forge/plan/gpu_catalog.h"
#include "forge/plan/model_spec.h"

namespace forge::plan {

enum class Optimizer { adamw, sgd };
// The layout `forge plan` prices is the one `forge train` runs (parallel/layout.h).
using parallel::Layout;
using parallel::Checkpointing;
using Schedule = parallel::PipelineSchedule;
using parallel::checkpointing_name;
using parallel::schedule_name;
const char* optimizer_name(Optimizer o);
Optimizer parse_optimizer(const std::string& s);
Checkpointing parse_checkpointing(const std::string& s);
Schedule parse_schedule(const std::string& s);

struct TrainingSetup {
  Precision precision = Precision::bf16;
  Optimizer optimizer = Optimizer::adamw;
  ActivationOptions activations;   // act_bytes is set from the precision by bytes_per_param()
  double margin = 0.10;            // allocator fragmentation, a fraction of the subtotal
  double reserve_bytes = 1e9;      // outside the allocator: CUDA context, cuBLAS/NCCL workspaces
  double bucket_bytes = 25e6;      // data-parallel gradient bucket (PyTorch DDP's default)
};

struct BytesPerParam {
  double param = 2, grad = 2, optimizer = 12, activation = 2;
};
BytesPerParam bytes_per_param(Precision p, Optimizer o);

struct MemoryBreakdown {
  int64_t stage = 0;                // the stage with the largest total (what must fit)
  int64_t params_on_gpu = 0;        // parameters of that stage on one GPU, before ZeRO sharding
  int64_t layers_on_stage = 0;
  int64_t in_flight = 1;            // micro-batches whose activations the stage holds at once
  int64_t weights_owed = 0;         // ZB-H1: micro-batches whose weight gradients wait (beyond the one in hand)
  double weights_owed_bytes = 0;    // what they keep (linears' inputs and output gradients), in activations
  double params = 0, grads = 0, optimizer = 0;
  double activations = 0;           // stored activations at the peak
  double transient = 0;             // at the peak on top of them: dlogits or one recomputed layer
  double comm_buffers = 0;
  double subtotal = 0, margin = 0, reserve = 0, total = 0;
  double capacity = 0, headroom = 0;  // headroom = capacity - total (negative: does not fit)
  bool fits = false;
  double host_bytes = 0;            // host memory per GPU for offloaded optimizer state
  // Activations per layer per micro-batch, and the stage's totals, both ways.
  double layer_full = 0, layer_checkpointed = 0, layer_selective = 0;
  double stage_no_checkpointing = 0, stage_full_checkpointing = 0;
  std::string peak_phase;           // which moment of the step the total describes
  // Every pipeline stage's figures (one entry without a pipeline); the fields above are the
  // largest one's.
  struct Stage {
    int64_t stage = 0, layers = 0, params_on_gpu = 0, in_flight = 1;
    double subtotal = 0, total = 0;
  };
  std::vector<Stage> per_stage;
};

// Memory per GPU (the worst pipeline stage) for model m under layout l. `capacity_bytes` is
// the device memory. Layout divisibility is checked by the caller (plan.h).
MemoryBreakdown memory_per_gpu(const ModelSpec& m, const TrainingSetup& setup, const Layout& l, double capacity_bytes);

}  // namespace forge::plan
