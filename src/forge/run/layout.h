#pragma once
// The parallel layout of a run: the config's [dist] and [train] keys and the size of the world
// it was started in, as the one parallel::Layout type that `forge plan` also prices, checked before
// any work.
//
//   const parallel::Layout l = train::run_layout(cfg, /*world_size=*/8);   // throws on a bad layout
//   // l.dp * l.tp * l.pp == 8; l.micro_batch * l.dp * l.grad_accum == cfg.train.batch_size
//
// Checks, in order, each error naming the key and the fix:
//   1. the world splits into dist.tp x dist.pp model replicas (parallel::Mesh::carve);
//   2. the model splits over the layout: model.n_head, the kv-heads, the FFN width and the
//      vocabulary (when known: model.vocab_size > 0) divisible by dist.tp; model.n_layer >= dist.pp;
//   3. the batch splits: train.batch_size divisible by dp x train.grad_accum (Note [global batch];
//      an image run's last batch of an epoch may not: Note [uneven rows]);
//   4. what is not built yet: dist.offload_optimizer with dist.tp > 1 is refused, never ignored
//      (the other combinations not built yet are refused by the config's checks).
#include "forge/parallel/layout.h"
#include "forge/run/config.h"

namespace forge::train {

parallel::Layout run_layout(const RunConfig& cfg, int world_size);
// The data-parallel reductions' keys of cfg.dist into `l` (dp_reduce, node_size, link_gbps,
// link_latency_us, grad_compression, powersgd_rank, fp8_error_feedback): run_layout's, and forge
// plan's reading of a config.
void set_reduction_keys(const RunConfig& cfg, parallel::Layout& l);

// Check 2 alone, for a vocabulary resolved after the start (a tokenizer trained on the fly).
void check_vocab_splits(const RunConfig& cfg, int64_t vocab_size);

}  // namespace forge::train
