#pragma once
// train::Model: what the training loop and its strategies need of any model they train, whatever
// its kind (a GPT or a LLaMA: run/language_model.h; LeNet: train/image_task.cpp).
//
//   Model m = ...;                          // module initialised from run.seed on the CPU
//   m.module->to(device, dtype);            // moved and cast once
//   Tensor logits = m.forward(inputs);      // inputs on m.device()
//
// forward maps a batch's inputs to logits whose last dimension is the classes, so that
// cross_entropy(logits, targets) is the training loss: (B, T) token ids -> (B, T, vocab) for
// language models, (B, 1, 28, 28) images -> (B, classes) for LeNet.
#include <functional>
#include <map>
#include <utility>
#include <vector>
#include <memory>
#include <string>

#include "forge/core/tensor.h"
#include "forge/data/loader.h"
#include "forge/io/checkpoint.h"
#include "forge/nn/block_hooks.h"
#include "forge/nn/module.h"
#include "forge/ops/loss.h"
#include "forge/parallel/tensor_parallel_state.h"

namespace forge::train {

struct Model {
  std::shared_ptr<nn::Module> module;
  std::function<Tensor(const Tensor&)> forward;
  // The mean training loss of a batch (over its targets != -100). Unset: cross_entropy(forward(
  // inputs), targets). A language model's is nn::CausalLM::loss, whose head computes the loss
  // itself (Note [model seams]): the seam a vocabulary-parallel head needs, which never gathers
  // the full logits; it reads a packed batch's documents too (Note [packed documents]).
  std::function<Tensor(const data::Batch& batch)> loss;
  Tensor training_loss(const data::Batch& batch) const;
  // ZeRO-3: installs the hooks the model calls around each block (nn/block_hooks.h), and the
  // block a parameter name belongs to (-1 outside the blocks; a model without blocks answers -1
  // for every parameter and ignores the hooks; the config refuses ZeRO-3 for it).
  std::function<void(std::shared_ptr<nn::BlockHooks>)> set_block_hooks;
  std::function<int(const std::string&)> block_of;
  // Tensor parallelism (train/tensor_parallel_model.h): how the module's tensors split the whole
  // model's (parallel/tensor_parallel_state.h); null when the module is the whole model. forward
  // then returns this rank's slice of the logits; loss is the whole batch's.
  std::shared_ptr<const parallel::tp::SplitModel> split;
  // Pipeline parallelism (train/pipeline_model.h): the stage this rank runs; null when it runs the
  // whole model. The module then holds only the stage's tensors (the others are empty).
  struct Stage {
    int index = 0, stages = 1;
    int64_t begin = 0, end = 0;  // its blocks (its first chunk's under the interleaved schedule)
    // Interleaved: chunk c = virtual stage c * stages + index, blocks [first, second); else one.
    std::vector<std::pair<int64_t, int64_t>> chunks;
    bool first() const { return index == 0; }
    bool last() const { return index == stages - 1; }
    std::map<std::string, Shape> whole_shapes;  // every tensor of the whole model's state
    std::map<std::string, int> owner;           // the first stage that holds each tensor
    std::map<std::string, bool> held;           // the tensors this stage holds
    std::string tied;                           // a tensor the first and last stage both hold (GPT's wte), or ""
  };
  std::shared_ptr<const Stage> stage;
  // The whole model's state names and shapes in order, and its parameter count, whatever the split.
  io::NamedShapes whole_shapes() const;
  Shape whole_shape(const std::string& name) const;
  int64_t whole_parameters() const;
  // Loads a whole state (a checkpoint's model) into the module: each tensor, or its shard.
  // `only_present`: the tensors `state` lacks are left as they are (a LoRA model's adapters, when
  // model.init_from gives the base: nn/lora.h); otherwise each is an error.
  void load_whole_state(const io::NamedTensors& state, bool only_present = false);
  // Where its parameters are.
  Device device() const {
    const auto ps = module->parameters();
    return ps.empty() ? Device::cpu() : ps.front().device();
  }
};

inline Tensor Model::training_loss(const data::Batch& batch) const {
  return loss ? loss(batch) : ops::cross_entropy(forward(batch.inputs), batch.targets);
}

}  // namespace forge::train
