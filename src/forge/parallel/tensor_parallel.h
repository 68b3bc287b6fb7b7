#pragma once
// Tensor parallelism's building blocks (issue 16; DESIGN.md "Parallelism"): the autograd-aware
// collectives over a tensor-parallel group and the column- and row-parallel linears, as
// Megatron-LM's tensor_parallel layers define them. The models take the linears through their
// LayerSpec seam (nn/layer_spec.h); `dist.tp` in `forge train` splits a run's model with them
// (train/tensor_parallel_model.h; docs/dist.md).
//
//   auto g = mesh.tp_group();                                   // W ranks, one shard each
//   auto up = std::make_shared<tp::ColumnParallelLinear>(C, 4 * C, true, g);    // weight (4C / W, C)
//   auto down = std::make_shared<tp::RowParallelLinear>(4 * C, C, true, g);     // weight (C, 4C / W)
//   Tensor y = down->forward(ops::gelu(up->forward(x), true));   // x and y whole on every rank
//
// Note [tensor-parallel collectives]
// ----------------------------------
// A column-parallel linear computes its slice of the output features from the whole input; a
// row-parallel one its partial sum over its slice of the input features. Between them nothing is
// communicated; around them, one collective each way, inverse to each other in the backward:
//   copy_to_region       forward: identity        backward: all-reduce (sum) of the gradient
//   reduce_from_region   forward: all-reduce(sum) backward: identity
//   gather_last_dim      forward: all-gather of the ranks' slices along the last dim
//                        backward: this rank's slice of the gradient (every rank uses the
//                        gathered output alike, so their gradients of it are equal)
//   scatter_last_dim     forward: this rank's slice   backward: all-gather of the gradient slices
// With sequence parallelism (Korthikanti et al.) the activations between the blocks are split
// over the tokens (Note [sequence-parallel shards]), and the all-reduce becomes a reduce-scatter
// after the row-parallel linear and an all-gather before the column-parallel one:
//   gather_sequence(x)            forward: all-gather of the shards   backward: reduce-scatter
//   reduce_scatter_sequence(x)    forward: reduce-scatter (sum)       backward: all-gather
// and, along any dim (a copy each way where the dims before it are not all of size 1):
//   gather_along(x, dim)          forward: all-gather along dim   backward: reduce-scatter along dim
//   reduce_scatter_along(x, dim)  forward: reduce-scatter (sum)   backward: all-gather along dim
// Every rank of the group must call them in the same order (they are collectives). A group of
// one (or none) makes each of them the identity (and its slice the whole tensor). The tensors
// must be on the group's device (CPU tensors through MPI, CUDA through NCCL); they are made
// contiguous for the collective.
//
// Note [sequence-parallel shards]
// -------------------------------
// Under sequence parallelism every rank holds 1/W of the (B, T, C) activations between the
// tensor-parallel regions. Megatron keeps its activations as (T, B, C) and splits T, which is
// then one contiguous block per rank. forge's are (B, T, C); splitting T itself would make each
// rank's part B strided pieces, so every all-gather would need a copy to assemble (B, T, C) and
// every reduce-scatter a permuted copy of its input: measured on 2 x H200 (LLaMA 0.85B, tp 2,
// batch 8 x 2048), 500 such copies a step, 56 ms of a 182 ms step. Instead rank r holds part r of
// W equal parts of the *flattened* tokens, elements [r n / W, (r + 1) n / W) of the contiguous
// whole, shaped (B, T / W, C): the collectives read and write the activations in place, with no
// copy. What runs on a shard works token by token (norms, residual adds, dropout, the bias of a
// row-parallel linear), so which tokens a rank holds does not matter to it; what mixes tokens
// (attention) runs on the gathered whole. The one thing that depends on a token's position is
// GPT's learned position table: SequenceShardEmbedding::add_to looks up the positions of the
// tokens a shard holds. Row b of rank r's shard holds the positions [s n, (s + 1) n), n = T / W,
// s = (r B + b) mod W. Needs T divisible by W (checked with the config).
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "forge/autograd/deferred.h"
#include "forge/core/tensor.h"
#include "forge/nn/layer_spec.h"
#include "forge/nn/layers.h"
#include "forge/nn/linear.h"
#include "forge/parallel/process_group.h"

namespace forge::parallel::tp {

Tensor copy_to_region(const Tensor& x, const ProcessGroupPtr& group);
Tensor reduce_from_region(const Tensor& x, const ProcessGroupPtr& group);
Tensor gather_last_dim(const Tensor& x, const ProcessGroupPtr& group);
Tensor scatter_last_dim(const Tensor& x, const ProcessGroupPtr& group);
Tensor gather_along(const Tensor& x, int64_t dim, const ProcessGroupPtr& group);
Tensor reduce_scatter_along(const Tensor& x, int64_t dim, const ProcessGroupPtr& group);
// Note [sequence-parallel shards]: shard (B, T / W, ...) -> whole (B, T, ...), and back (summed).
Tensor gather_sequence(const Tensor& x, const ProcessGroupPtr& group);
Tensor reduce_scatter_sequence(const Tensor& x, const ProcessGroupPtr& group);
// How a column-parallel linear's input enters its region: as copy_to_region(x, group), or with
// sequence parallelism gather_sequence(x, group), and the same entry again for the same x (Note
// [one collective per input]), so linears sharing an input share one collective. `defer` (null
// when nothing will be queued): the queue of the region's weight gradients, run by the entry's
// backward while its collective is in flight (Note [weight gradients behind the collective],
// autograd/deferred.h); FORGE_TP_OVERLAP=0 turns it off.
struct RegionEntry {
  Tensor input;
  std::shared_ptr<autograd::DeferredGrads> defer;
};
RegionEntry enter_column_region(const Tensor& x, const ProcessGroupPtr& group, bool sequence_parallel);

// Part `rank` of `parts` equal parts of `full` along `dim`, as a new contiguous tensor (throws
// naming the sizes when `parts` does not divide it): a rank's shard of a whole weight.
Tensor shard(const Tensor& full, int64_t dim, int rank, int parts);

// weight (out / W, in), bias (out / W): this rank's rows of the whole linear's. forward(x) takes
// the whole input (B.., in) and returns this rank's slice of the output features (B.., out / W),
// or, with gather_output, the whole output on every rank. With parts > 1 the whole output is
// `parts` blocks side by side (GPT's fused [q | k | v]: 3) and each rank keeps its slice of every
// block, in block order ([q_r | k_r | v_r]: its heads of each), as the layers expect.
class ColumnParallelLinear : public nn::Linear {
 public:
  // sequence_parallel: the input is this rank's sequence shard, gathered first (gather_sequence;
  // its backward reduce-scatters) instead of copy_to_region.
  ColumnParallelLinear(int64_t in, int64_t out, bool bias, ProcessGroupPtr group, bool gather_output = false,
                       int64_t parts = 1, bool sequence_parallel = false);
  Tensor forward(const Tensor& x) const override;
  // This rank's rows of the whole linear's weight (out, in) and bias (out), copied in.
  void load_whole(const Tensor& weight, const Tensor& bias);

  int64_t whole_out_features;
  bool gather_output;
  int64_t parts;
  bool sequence_parallel;
  ProcessGroupPtr group;
};

// weight (out, in / W), bias (out), the bias whole on every rank. forward(x) takes this rank's
// slice of the input features (B.., in / W) (or, with !input_is_parallel, the whole input, of
// which it keeps its slice) and returns the whole output on every rank: the partial products
// all-reduced, then the bias added once.
class RowParallelLinear : public nn::Linear {
 public:
  // sequence_parallel: the partial products are reduce-scattered (reduce_scatter_sequence)
  // instead of all-reduced: the output is this rank's sequence shard.
  RowParallelLinear(int64_t in, int64_t out, bool bias, ProcessGroupPtr group, bool input_is_parallel = true,
                    bool sequence_parallel = false);
  Tensor forward(const Tensor& x) const override;
  // forward with this rank's partial product computed by partial(xs) instead of
  // linear(xs, weight) (xs: this rank's slice of the input), before the ranks' partial products
  // are summed: a row-parallel LoRA adapter's partial output rides the base's one reduction, the
  // base's product and the adapter's in one node (parallel/tensor_parallel_lora.h).
  Tensor forward_partial(const Tensor& x, const std::function<Tensor(const Tensor& xs)>& partial) const;
  // This rank's partial product of its input shard xs: what forward_partial reduces when no
  // `partial` is given (through the FP8 recipe under run.fp8, Note [FP8 under tensor parallelism]).
  Tensor partial_product(const Tensor& xs) const;
  // This rank's columns of the whole linear's weight (out, in), and its whole bias.
  void load_whole(const Tensor& weight, const Tensor& bias);

  int64_t whole_in_features;
  bool input_is_parallel;
  bool sequence_parallel;
  ProcessGroupPtr group;
};

// Rows [r V / W, (r + 1) V / W) of the (V, dim) table on rank r (a vocabulary-parallel embedding,
// Megatron's VocabParallelEmbedding). forward(ids): each rank looks up the ids in its rows (zero
// for the others) and the ranks' results are all-reduced, so every rank gets the whole (*, dim)
// embedding; a row's gradient lands on the rank that holds it. attend(x) (a head tied to the
// table): this rank's slice of the logits, (*, V / W), for vocab_parallel_cross_entropy, with x
// whole on every rank (its gradient all-reduced).
// With sequence_parallel the lookup is reduce-scattered (each rank gets its sequence shard) and
// attend gathers the sequence first.
class VocabParallelEmbedding : public nn::Embedding {
 public:
  VocabParallelEmbedding(int64_t num, int64_t dim, ProcessGroupPtr group, bool sequence_parallel = false);
  Tensor forward(const Tensor& ids) const override;
  Tensor attend(const Tensor& x) const override;
  void load_whole(const Tensor& weight);

  int64_t whole_num, vocab_start;
  bool sequence_parallel;
  ProcessGroupPtr group;
};

// Grouped-query attention with fewer key-value heads than ranks (Megatron replicates them): the
// k or v projection of the one key-value head this rank's query heads use, head
// j = rank / (W / n_kv): weight (head_dim, in), rows [j head_dim, (j + 1) head_dim) of the whole
// (n_kv head_dim, in). The W / n_kv ranks that share a head each get part of its gradient;
// reduce_grads sums them.
class ReplicatedKVLinear : public nn::Linear {
 public:
  ReplicatedKVLinear(int64_t in, int64_t out, int64_t head_dim, ProcessGroupPtr group, bool sequence_parallel = false);
  Tensor forward(const Tensor& x) const override;
  void load_whole(const Tensor& weight);

  int64_t whole_out_features, head_dim, head;
  bool sequence_parallel;
  ProcessGroupPtr group;
};

// Sequence parallelism's position embedding (GPT's wpe): the whole table on every rank;
// add_to(x, positions (T)) adds to the token embeddings' shard x (B, T / W, C) the embeddings of
// the positions its tokens have (Note [sequence-parallel shards]). Its gradient is partial on
// each rank (reduce_grads). forward(positions) is the plain lookup.
class SequenceShardEmbedding : public nn::Embedding {
 public:
  SequenceShardEmbedding(int64_t num, int64_t dim, ProcessGroupPtr group);
  Tensor add_to(const Tensor& x, const Tensor& positions) const override;
  ProcessGroupPtr group;
};

// The mean cross-entropy over the targets != ignore_index, from this rank's slice of the logits
// (..., V / W) holding the classes [vocab_start, vocab_start + V / W): the whole logits are never
// gathered. The row maximum is all-reduced (max, outside the history: softmax does not depend
// on it), the sums of exponentials and the target logits (each found on one rank) all-reduced
// (sum). The same value on every rank; each rank's backward fills its slice's gradient. 16-bit
// logits are computed in f32 (Note [loss dtype]). Composed of ops: it materialises a few
// (N, V / W) temporaries.
Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                    const ProcessGroupPtr& group, int64_t ignore_index = -100);

// The layer spec (nn/layer_spec.h) of a model split over `group`, Megatron's layout: attention
// q / k / v (and GPT's fused qkv, by part) and the MLP's up / gate column-parallel, the attention
// output and the MLP's down row-parallel, the token embedding vocabulary-parallel (GPT's tied
// head through it), LLaMA's lm_head column-parallel over the vocabulary, and the loss
// vocab_parallel_cross_entropy over the slices. Position embeddings and norms stay whole on every
// rank. Sizes tp does not divide (heads, key-value heads, FFN width, vocabulary) are refused by
// the layers when the model is built, naming the size.
// With sequence_parallel (Korthikanti et al.) the residual stream between the tensor-parallel
// regions is split over the tokens (Note [sequence-parallel shards]): norms and residual adds run
// on B T / W tokens per rank, the column-parallel linears gather the sequence and the
// row-parallel ones reduce-scatter it, the embeddings return their shard and the head gathers it. The parameters kept whole
// then get partial gradients on each rank: reduce_grads after backward.
// head_dim (LLaMA: dim / n_head) lets the spec see the key-value heads: where tp does not divide
// them but they divide tp, k and v are ReplicatedKVLinear; without it (0) such a model is refused
// when built, naming the attention_k linear.
nn::LayerSpec layer_spec(const ProcessGroupPtr& group, bool sequence_parallel = false, int64_t head_dim = 0);

// What a split model's gradients need after backward, before the optimizer reads them: the
// replicated key-value projections' gradients summed over the ranks that share each head, and,
// with sequence parallelism, the gradients of the parameters kept whole (norms, row-parallel
// biases, position embeddings), each rank's share of which comes from its positions, summed over
// the group. Without sequence parallelism those are equal on every rank and left alone.
void reduce_grads(nn::Module& model, const ProcessGroupPtr& group, bool sequence_parallel);

// Copies a whole model's state (by name: the tp = 1 model's state_dict) into a model built with
// layer_spec: each parallel module takes its rank's shard, every other parameter and buffer the
// whole tensor. Throws naming a missing name or a shape that does not fit.
void load_whole_state(nn::Module& model, const std::map<std::string, Tensor>& whole);

}  // namespace forge::parallel::tp
