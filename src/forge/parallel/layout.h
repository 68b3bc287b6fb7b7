#pragma once
// Layout: how a training job is laid out over its GPUs (or CPU ranks): the data-, tensor- and
// pipeline-parallel degrees, the micro-batching, the ZeRO stage, offload, activation
// checkpointing and the pipeline schedule. One type for both sides:
//   - `forge plan` prices a Layout (plan/memory_model.h, plan/time_model.h, plan/plan.h);
//   - `forge train` derives the Layout of its run from the config (run/layout.h) and
//     carves the world into a parallel::Mesh from it (parallel/mesh.h).
//
// Degrees: gpus() = dp * tp * pp * cp ranks; the mesh orders them tp innermost, then cp, pp, dp
// outermost (Megatron's order: a tensor-parallel group shares a host's NVLink; parallel/mesh.h).
// The cp ranks of a replica train the same rows, each on its part of every sequence.
// Batch: global_batch() = dp * micro_batch * grad_accum sequences per optimizer step
// (micro_batch is per data-parallel rank).
#include <cstdint>
#include <string>

#include "forge/parallel/sharding.h"

namespace forge::parallel {

enum class Checkpointing { none, selective, full };
enum class PipelineSchedule { one_f_one_b, gpipe, zb_h1, interleaved };
// Context parallelism's attention (parallel/context_parallel.h): K/V around a ring, or all-to-all over heads.
enum class ContextKind { ring, ulysses };
// The data-parallel reductions: one ring over the group, or within each node first (Note
// [hierarchical data-parallel reduction] in parallel/hierarchical_group.h).
enum class DpReduce { flat, hierarchical };
// How the data-parallel gradient reductions travel (dist.grad_compression): in the gradients'
// dtype, in FP8 (parallel/fp8_reduce.h), or as PowerSGD's low-rank factors (parallel/powersgd.h).
enum class GradCompression { none, fp8, powersgd };
const char* grad_compression_name(GradCompression g);  // "none" | "fp8" | "powersgd"
// Its inverse; anything else throws naming dist.grad_compression and the values.
GradCompression grad_compression_from_name(const std::string& name);
const char* checkpointing_name(Checkpointing c);   // "none" | "selective" | "full"
const char* schedule_name(PipelineSchedule s);      // "1f1b" | "gpipe" | "zb-h1" | "interleaved"

struct Layout {
  int64_t dp = 1, tp = 1, pp = 1;
  int64_t cp = 1;            // context parallelism: ranks that each hold 1/cp of every sequence
  ContextKind cp_kind = ContextKind::ring;
  int64_t micro_batch = 1;   // sequences per micro-batch on one data-parallel rank
  int64_t grad_accum = 1;    // micro-batches per optimizer step per data-parallel rank
  int zero = 0;              // ZeRO stage 0..3 over the data-parallel group (as forge plan enumerates them)
  bool offload = false;      // optimizer state and step on the host (ZeRO-Offload)
  Checkpointing checkpointing = Checkpointing::none;
  bool sequence_parallel = false;
  PipelineSchedule schedule = PipelineSchedule::one_f_one_b;
  int64_t virtual_stages = 1;  // interleaved: model chunks per pipeline rank
  DpReduce dp_reduce = DpReduce::flat;
  int64_t node_size = 0;       // ranks per node for dp_reduce (0: the launch's ranks per host)
  double link_gbps = 0;        // simulated network between nodes (Note [paced link]); 0: none
  double link_latency_us = 0;
  GradCompression grad_compression = GradCompression::none;
  int64_t powersgd_rank = 4;
  // fp8: which reductions keep an error feedback, the gradients' size in f32 (dist.fp8_error_feedback)
  bool fp8_feedback_all_reduce = true, fp8_feedback_reduce_scatter = false;
  int64_t gpus() const { return dp * tp * pp * cp; }
  // What the data-parallel group shards: ask this, not the stage's number.
  Sharding sharding() const { return Sharding::from_stage(zero, "the layout's ZeRO stage"); }
  // Model chunks per pipeline rank: virtual_stages under the interleaved schedule, else 1.
  int64_t chunks() const { return schedule == PipelineSchedule::interleaved && virtual_stages > 1 ? virtual_stages : 1; }
  int64_t global_batch() const { return dp * micro_batch * grad_accum; }
  // "dp 8, tp 1, pp 1, micro-batch 4 x 32, ZeRO-1, checkpointing full"
  std::string describe() const;
};

}  // namespace forge::parallel
