#pragma once
// SplitModel: how each tensor of a model built with tp::layer_spec (tensor_parallel.h) relates
// to the same tensor of the whole model, and what follows from it: loading a whole state into
// the split model, gathering a split tensor back into the whole one (checkpoints), the
// reductions its gradients need after backward, and each parameter's share of the global
// gradient norm.
//
//   tp::SplitModel split(*module, mesh.tp_group(), sequence_parallel);
//   split.load_whole(*module, whole_state);                   // every rank: its shards
//   ... backward ...
//   split.reduce_grads({{"h.0.ln_1.weight", grad}, ...});     // collective over the group
//   Tensor w = split.whole_of("h.0.attn.c_attn.weight", t);   // collective: the whole tensor
//
// Note [split tensors]
// --------------------
// Every tensor of the split model is the concatenation, along one dim, of some of the `chunks`
// equal chunks of the whole tensor along that dim (ParamSplit):
//   column-parallel weight / bias   dim 0, parts x W chunks, rank r holds chunks p W + r of
//                                   each part p (GPT's fused [q | k | v]: three parts)
//   row-parallel weight             dim 1, W chunks, rank r holds chunk r (its bias is whole)
//   vocabulary-parallel embedding   dim 0, W chunks, rank r holds chunk r
//   replicated key-value projection dim 0, n_kv chunks (one per head), rank r holds head
//                                   r / (W / n_kv); W / n_kv ranks hold each
//   LoRA's factors (tensor_parallel_lora.h) B of a column-parallel linear as its weight, A of a
//                                   row-parallel one as its weight; the other factor one chunk
//   everything else (norms, position embeddings, buffers): one chunk, every rank holds it.
// So local_of (whole -> this rank's tensor) is slicing, and whole_of (the inverse) is one
// all-gather and a concatenation of the chunks in order, each taken from the first rank that
// holds it.
//
// Note [split gradients]
// ----------------------
// After backward, before the optimizer (and the gradient norm) reads them, two kinds of
// gradients need a sum over ranks of the group:
//   - a replicated key-value head's projection: each of the W / n_kv ranks that share it
//     computed the part of its gradient that flows through its own query heads;
//   - a LoRA adapter's replicated factor (A of a column-parallel linear, B of a row-parallel
//     one): each rank's gradient comes through its own slice of the base (Note [tensor-parallel
//     LoRA], tensor_parallel_lora.h);
//   - with sequence parallelism, every tensor kept whole (norms, row-parallel biases, position
//     embeddings): each rank's gradient comes from its own slice of the sequence.
// reduce_grads sums them, batched into one collective per kind (the ranks of a group hold the
// same tensors in the same order, so their batches line up). A tensor kept whole without
// sequence parallelism gets the same gradient on every rank (every rank ran the same
// computation on the same input): nothing to do. The items may be whole gradients or matching
// pieces of them (ZeRO-2's owned slices): the sums are elementwise.
//
// Note [split gradient norm]
// --------------------------
// The global gradient norm of the whole model, from the ranks' tensors: each rank's squared
// norms are weighted by 1 / copies (the ranks that hold the same chunks: W for a whole tensor,
// W / n_kv for a replicated key-value head, 1 for a shard), then summed over the group. Every
// element of the whole model is then counted exactly once.
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "forge/core/tensor.h"
#include "forge/nn/module.h"
#include "forge/parallel/process_group.h"

namespace forge::parallel::tp {

struct ParamSplit {
  Shape whole_shape;
  int64_t dim = 0;                         // the dim the chunks are cut along
  int64_t chunks = 1;                      // equal chunks of the whole tensor along dim
  std::vector<std::vector<int64_t>> held;  // held[r]: the chunks rank r holds, in its order
  int copies = 1;                          // ranks that hold each chunk
  bool kv_replica = false;                 // a replicated key-value head (Note [split gradients])
  bool partial_grad = false;               // whole on every rank, each holding a part of its gradient
                                           // (LoRA's replicated factor: Note [tensor-parallel LoRA])
  int64_t whole_numel() const;
};

class SplitModel {
 public:
  // The splits of `model`'s state (parameters and buffers), found from its parallel modules.
  SplitModel(const nn::Module& model, ProcessGroupPtr group, bool sequence_parallel);

  const ParamSplit& at(const std::string& name) const;
  const std::map<std::string, ParamSplit>& tensors() const { return splits_; }
  const ProcessGroupPtr& group() const { return group_; }
  bool sequence_parallel() const { return sequence_parallel_; }
  // The whole model's shapes and element count (parameters only for the count).
  std::map<std::string, Shape> whole_shapes() const;
  int64_t whole_parameters(const nn::Module& model) const;

  // This rank's tensor of `name` from the whole one (a new contiguous tensor; no communication).
  Tensor local_of(const std::string& name, const Tensor& whole) const;
  // The whole tensor of `name` from every rank's `local` (collective over the group; `local` on
  // the group's device; the result on the same device).
  Tensor whole_of(const std::string& name, const Tensor& local) const;
  // Copies a whole state (the whole model's state_dict, by name, any device and dtype) into
  // `model` (this split model): each tensor its shard. Throws naming a missing name or a shape
  // that does not fit.
  void load_whole(nn::Module& model, const std::map<std::string, Tensor>& whole) const;

  // Note [split gradients]: (name, gradient or a piece of it) of every parameter this rank
  // updates, in the same order on every rank of the group. Collective.
  void reduce_grads(const std::vector<std::pair<std::string, Tensor>>& grads) const;
  // Note [split gradient norm]: the weight of `name`'s squared norm.
  double norm_weight(const std::string& name) const { return 1.0 / at(name).copies; }

 private:
  std::map<std::string, ParamSplit> splits_;
  ProcessGroupPtr group_;
  bool sequence_parallel_ = false;
};

}  // namespace forge::parallel::tp
