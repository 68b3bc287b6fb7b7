#pragma once
// parallelize: what a layout does inside the model's blocks, as one layer spec composed from each
// dimension's (nn/layer_spec.h; docs/architecture.md "How to add a parallel dimension"):
//
//   nn::LayerSpec spec = parallel::layer_spec_of(mesh, layout, head_dim);
//   nn::Llama model(config, seed, spec);   // or any family through nn::ModelFamily::build
//
// in order: tensor parallelism's column-/row-parallel linears, vocabulary-parallel embedding and
// loss over mesh.tp_group() (tp > 1; with sequence parallelism when the layout says so), then
// context parallelism's positions and attention over mesh.cp_group() (cp > 1, ring or Ulysses).
// Around the blocks the model's one loop (Note [the block loop] in nn/causal_lm.h) applies the rest
// of the chain: activation checkpointing and ZeRO-3's hooks (parallel::DataParallel); the data
// and the gradient reduction follow the mesh (train/strategy.h). A layout of one process gives
// the default spec: the plain model.
#include <cstdint>

#include "forge/nn/layer_spec.h"
#include "forge/parallel/layout.h"
#include "forge/parallel/mesh.h"

namespace forge::parallel {

// The mesh must be attached (its groups exist) when tp or cp is > 1. head_dim: the model's head
// size (tensor parallelism replicates key/value heads by it).
nn::LayerSpec layer_spec_of(const Mesh& mesh, const Layout& layout, int64_t head_dim);

}  // namespace forge::parallel
