#pragma once
// LoRA adapters (nn/lora.h) on tensor-parallel linears (tensor_parallel.h), split the way the
// base is, so that a LoRA model trains under dist.tp to one process's numbers.
//
// Note [tensor-parallel LoRA]
// ---------------------------
// y = base(x) + scale B (A x), A (r, in), B (out, r).
// - Column-parallel base (weight rows split: this rank computes out / W outputs from the whole
//   input): A replicated, B split along out like the base (by part, for GPT's fused [q | k | v]).
//   The adapter takes the whole input through the base's region entry (the same collective: Note
//   [one collective per input]), so its input gradient, partial on each rank, is summed there with
//   the base's. A's gradient is partial too (each rank's B slice sees its outputs only): it is
//   summed over the group after backward (ParamSplit::partial_grad, Note [split gradients]).
// - Row-parallel base (weight columns split: this rank's partial sum over in / W inputs): A split
//   along in like the base, B replicated. B (A_r x_r) summed over the ranks is B A x, so each
//   rank adds its adapter's partial output to its partial product before the one all-reduce (or
//   reduce-scatter) of the base (RowParallelLinear::forward_partial). B's gradient is partial on
//   each rank (it sees A_r x_r only): summed over the group after backward.
// - A replicated key-value projection (ReplicatedKVLinear) is a column-parallel one whose rows
//   are one head: B holds that head's rows (shared like the weight, kv_replica), A replicated.
// The factors load and gather like the base's tensors (SplitModel), so a checkpoint holds the
// whole model's adapters whatever the layout. Dropout on the adapter's input draws its mask on
// each rank: under tp it is not the one process's mask (the comparisons run with lora.dropout = 0).
#include <memory>

#include "forge/nn/lora.h"
#include "forge/parallel/process_group.h"
#include "forge/parallel/tensor_parallel.h"

namespace forge::parallel::tp {

// The adapter of a ColumnParallelLinear (not gathering its output) or a ReplicatedKVLinear.
class ColumnParallelLora : public nn::LoraLinear {
 public:
  ColumnParallelLora(std::shared_ptr<nn::Linear> base, const nn::LoraOptions& o);
  Tensor forward(const Tensor& x) const override;
  ProcessGroupPtr group;
  bool sequence_parallel;
};

// The adapter of a RowParallelLinear.
class RowParallelLora : public nn::LoraLinear {
 public:
  RowParallelLora(std::shared_ptr<RowParallelLinear> base, const nn::LoraOptions& o);
  Tensor forward(const Tensor& x) const override;
};

// nn::LoraWrap for any linear a layer spec builds: the adapter that fits its kind (a plain
// nn::LoraLinear for a plain Linear). Throws naming the kind for a linear it cannot adapt.
std::shared_ptr<nn::LoraLinear> lora_wrap(std::shared_ptr<nn::Linear> base, const nn::LoraOptions& o);

}  // namespace forge::parallel::tp
