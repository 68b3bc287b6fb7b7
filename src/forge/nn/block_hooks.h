#pragma once
// BlockHooks: what a model calls around each of its transformer blocks, so that a wrapper can
// act per block without the model knowing about it. ZeRO-3 (parallel::DataParallel,
// Note [ZeRO-3]) gathers a block's sharded parameters in before_block and releases them in
// after_block, which also wraps the block's outputs so that backward reaching them gathers the
// parameters again before any of the block's backward runs.
//
//   CausalLM::blocks (and so forward and loss; Note [the block loop]), for each block i of the range:
//     if (hooks) hooks->before_block(i);
//     outputs = block_i(inputs);                  // one tensor, or GPT's (x, pending) Stream
//     if (hooks) outputs = hooks->after_block(i, outputs);
//
// With activation checkpointing the hooks surround the checkpointed region, so its
// recomputation in backward runs between the backward gather and the block's gradients.
#include "forge/core/tensor.h"

namespace forge::nn {

class BlockHooks {
 public:
  virtual ~BlockHooks() = default;
  virtual void before_block(int block) = 0;
  // Returns the outputs to use in their place (the same tensors, possibly recorded anew).
  virtual TensorList after_block(int block, const TensorList& outputs) = 0;
};

// The block index of a parameter named "<prefix><i>.<rest>" (prefix "transformer.h." for GPT,
// "model.layers." for LLaMA), or -1 for a parameter outside the blocks.
int block_of_parameter(const std::string& name, const std::string& prefix);

}  // namespace forge::nn
