#pragma once
// forge::nn::Module: named parameters, buffers and child modules, like torch.nn.Module.
//
//   class MLP : public Module {
//    public:
//     MLP(int64_t c) {
//       fc = register_module("fc", std::make_shared<Linear>(c, 4 * c));
//       proj = register_module("proj", std::make_shared<Linear>(4 * c, c));
//     }
//     Tensor forward(const Tensor& x) { return proj->forward(ops::gelu(fc->forward(x))); }
//     std::shared_ptr<Linear> fc, proj;
//   };
//
// Names are dotted paths ("h.0.attn.c_attn.weight"), in registration order, so state
// dicts line up with PyTorch's for the same layout. Parameters are leaf tensors that
// require grad; Module::to() and load_state_dict() re-point them in place
// (Tensor::set_data), so handles held in member variables stay valid.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "forge/core/tensor.h"

namespace forge::nn {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// While one is alive (on this thread), layers allocate their parameters without their
// default random initialisation. Models that initialise every parameter themselves (GPT,
// LLaMA) build their layers under it, so a large model is not filled twice.
class SkipInitGuard {
 public:
  SkipInitGuard();
  ~SkipInitGuard();
  SkipInitGuard(const SkipInitGuard&) = delete;
  SkipInitGuard& operator=(const SkipInitGuard&) = delete;

 private:
  bool prev_;
};
bool default_init_enabled();

class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Recursively, in registration order, with dotted names.
  NamedTensors named_parameters() const;
  NamedTensors named_buffers() const;
  std::vector<Tensor> parameters() const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const { return children_; }
  // Parameters then buffers, as torch's state_dict (which interleaves per module; forge
  // keeps each module's parameters before its buffers, which is the same for every
  // module forge defines).
  NamedTensors state_dict() const;
  // Copies values into the existing tensors (converting dtype/device). strict: every key
  // must match both ways. Shape mismatches and missing/unexpected keys are errors that
  // name the key and both shapes, before anything is written.
  void load_state_dict(const NamedTensors& state, bool strict = true);

  // Moves/converts every parameter and buffer. dtype applies to floating tensors only.
  void to(Device device);
  void to(DType dtype);
  void to(Device device, DType dtype);

  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  int64_t num_parameters() const;
  void zero_grad();

 protected:
  // Registers a parameter (made a leaf that requires grad) and returns the handle to keep.
  Tensor register_parameter(const std::string& name, Tensor t, bool requires_grad = true);
  Tensor register_buffer(const std::string& name, Tensor t);
  template <class M> std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    add_child(name, m);
    return m;
  }

 private:
  void add_child(const std::string& name, std::shared_ptr<Module> m);
  void check_new_name(const std::string& name) const;
  void collect(const std::string& prefix, bool params, NamedTensors& out) const;
  void convert(const Device* device, const DType* dtype);

  NamedTensors params_;
  NamedTensors buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

}  // namespace forge::nn
