#pragma once
// Context parallelism (dist.cp; docs/dist.md "Context parallelism"): the ranks of a
// context-parallel group each hold a part of every sequence, so a sequence too long for one
// GPU's activation memory trains on several. Everything outside attention is per token and
// runs on the local part as it is; attention needs every earlier position's keys and values,
// which the group exchanges:
//
//   ring     (dist.cp_kind = "ring") K and V travel around the ring of ranks, one neighbour's
//            block per step, while the rank attends its queries to the block it holds (the
//            send/recv of the next block overlaps the attention of this one). The pieces are
//            combined by their row logsumexp (Note [attention blocks] in ops/attention.h).
//            Grouped-query attention: only the key/value heads travel. Backward passes K and V
//            around again, with their gradient accumulators travelling beside them, which come
//            home after the last step.
//   ulysses  (dist.cp_kind = "ulysses") an all-to-all turns "every head, my part of the
//            sequence" into "my 1/N of the heads, the whole sequence", attention runs as on one
//            rank, and a second all-to-all turns it back. The query heads and the key/value
//            heads (of this tensor-parallel rank) must both divide by N.
//
// Note [context-parallel sequence layout]: the sequence of T tokens is cut into 2N chunks of
// T / 2N; rank r holds chunks r and 2N-1-r, in that order ("zigzag"). Under causal attention a
// chunk's work grows with its position, so each rank gets one early and one late chunk and the
// ranks' work is equal. In the ring each step is then exactly half a block of work:
//   step 0 (own keys)          causal attention of the local 2 chunks (their order is the
//                              sequence's, so bottom-right causal on the pair is exact)
//   keys of rank j < r         all local queries against j's FIRST chunk (chunk j < r), in full
//   keys of rank j > r         the local SECOND chunk's queries (2N-1-r) against both of j's
//                              chunks, in full (both precede it; chunk r precedes neither)
// Positions: GPT's position embedding and LLaMA's rotary embedding take the chunks' positions in
// the whole sequence (nn::LayerSpec::positions). The data layer hands every rank of a
// context-parallel group the same rows; local_sequence cuts the rank's chunks from them (inputs
// and targets alike), so the loss of a rank is its tokens' mean, and the mean of the group's
// losses is the sequence's (equal chunks).
//
// Gradients: a rank's backward yields the gradient of the SUM of the group's losses through its
// tokens (its keys' and values' gradients come back from every rank's queries), so the mean over
// the group is the gradient of the mean loss: the data-parallel reduction runs over data x
// context-parallel ranks (parallel::Mesh::dp_cp_group), as Megatron's does.
#include <string>
#include <vector>

#include "forge/core/tensor.h"
#include "forge/nn/layer_spec.h"
#include "forge/parallel/process_group.h"

namespace forge::parallel::cp {

enum class Kind { ring, ulysses };
// "ring" | "ulysses"; anything else throws naming dist.cp_kind and the two values.
Kind kind_from_name(const std::string& name);
const char* kind_name(Kind kind);

// The whole-sequence positions of rank `rank`'s tokens in a group of `size` ranks, for a local
// part of `local_length` tokens (Note [context-parallel sequence layout]).
std::vector<nn::PositionRange> local_ranges(int64_t local_length, int rank, int size);

// Rank `rank`'s part (B, T / size, ...) of a whole (B, T, ...) tensor (no history: data).
// Throws naming train.seq_len and dist.cp when T does not divide into 2 x size chunks.
Tensor local_sequence(const Tensor& whole, int rank, int size);

// Causal attention of this rank's part of the sequence against the whole, across `group`:
//   q (B, H, t, D), k and v (B, Hkv, t, D) of the local positions -> (B, H, t, D)
// Differentiable in q, k and v (collective in backward too). A group of one (or none) is the
// fused local attention. `ids` (B, t) i32: the local positions' document ids of a packed batch
// (Note [context-parallel documents] in context_parallel.cpp), attention within each document;
// undefined: one sequence.
Tensor ring_attention(const Tensor& q, const Tensor& k, const Tensor& v, const ProcessGroupPtr& group,
                      const Tensor& ids = {});
Tensor ulysses_attention(const Tensor& q, const Tensor& k, const Tensor& v, const ProcessGroupPtr& group,
                         const Tensor& ids = {});

// `base` with context parallelism's positions and attention over `group` (base's linears,
// embeddings and loss are kept: it composes with tensor parallelism's spec).
nn::LayerSpec layer_spec(nn::LayerSpec base, const ProcessGroupPtr& group, Kind kind);

}  // namespace forge::parallel::cp
