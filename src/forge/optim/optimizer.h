#pragma once
// Optimizer: what every forge optimizer shares (torch.optim.Optimizer's model).
//
// An optimizer owns parameter groups; each group is a list of parameters with its own
// hyper-parameters. One step() maps, for every parameter p whose gradient g = dL/dp is
// defined,
//   (p, g, state_p, hyper-parameters of p's group)  ->  (p', state_p')
// by the subclass's rule (sgd.h, adamw.h), under NoGradGuard. A parameter whose gradient
// is undefined is skipped entirely: p, its state and its step count stay as they are (as
// torch.optim does). State is created lazily at a parameter's first update; each
// parameter counts its own updates (`ParamState::step`), which is what bias corrections use.
//
//   auto groups = optim::decay_groups(model.named_parameters(), /*weight_decay=*/0.1);
//   optim::AdamW opt(groups, {.lr = 6e-4, .beta2 = 0.95});
//   for (int64_t step = 0; step < steps; ++step) {
//     schedule.apply(opt, step);          // schedule.h: sets every group's lr
//     loss.backward();                    // (or accumulate over micro-batches, below)
//     optim::clip_grad_norm(params, 1.0); // clip.h
//     opt.step();
//     opt.zero_grad();
//   }
//
// Hyper-parameters. A ParamGroup's hyper-parameters are optional: an unset one takes the
// value of the optimizer's options (torch's per-group dict with the optimizer's defaults).
// The optimizer fills them in at construction, so its param_groups() always have every
// field it uses set; a field that belongs to another optimizer (beta1 given to SGD) is an
// error. Every step() re-checks them (a schedule may have written a bad lr), before any
// parameter is touched; a bad value throws forge::Error naming the optimizer, the group
// and the value.
//
// Gradient accumulation over micro-batches. Backward adds into .grad, so
//   for each of the K micro-batches:  (loss_k / K).backward();
//   opt.step(); opt.zero_grad();
// gives the gradient of the mean loss over the K micro-batches, which for equal-sized
// micro-batches of a mean-reduced loss is the gradient of the whole batch: the update is
// the same as one step on the big batch (up to rounding; tests/optim checks 1e-12 in f64).
// Divide each micro-batch's loss by K (without it the gradient is K times too large:
// clipping and SGD see that, AdamW mostly hides it), and zero_grad only after the step.
//
// state_dict(): a flat map, names as below (k is the index of a parameter counted over
// all groups in order, as torch does), and load_state_dict() its inverse:
//   scalars  "step"                     the number of step() calls so far
//            "group.<g>.num_params"     checked on load against this optimizer's groups
//            "group.<g>.<hyper>"        lr, weight_decay and the optimizer's own ones
//            "state.<k>.step"           updates of parameter k (present once it has state)
//   tensors  "state.<k>.<name>"         the optimizer's per-parameter state (momentum_buffer;
//                                       exp_avg, exp_avg_sq, master)
// The tensors of state_dict() alias the live state (no copy, so saving a checkpoint costs
// no memory); serialize them, or take StateDict::clone(), before the next step().
// load_state_dict() copies what it reads (converted to each parameter's device and the
// state dtype), restores the groups' hyper-parameters and step counts, and replaces the
// state as a whole: on any mismatch it throws and leaves the optimizer unchanged.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "forge/core/tensor.h"

namespace forge::optim {

struct ParamGroup {
  std::vector<Tensor> params = {};
  std::optional<double> lr = std::nullopt;            // every optimizer
  std::optional<double> weight_decay = std::nullopt;  // SGD: L2 added to the gradient; AdamW: decoupled
  // SGD
  std::optional<double> momentum = std::nullopt;
  std::optional<double> dampening = std::nullopt;
  std::optional<bool> nesterov = std::nullopt;
  // AdamW
  std::optional<double> beta1 = std::nullopt;
  std::optional<double> beta2 = std::nullopt;
  std::optional<double> eps = std::nullopt;
};

// One parameter's optimizer state.
struct ParamState {
  Tensor param;      // the parameter itself (keeps the identity this state is keyed by alive)
  int64_t step = 0;  // updates applied to this parameter
  std::map<std::string, Tensor> tensors;
};

struct StateDict {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, double> scalars;
  // A deep copy: the tensors are cloned.
  StateDict clone() const;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter that has a gradient.
  void step();
  // Drops every parameter's .grad (sets it to undefined, like set_to_none=True).
  void zero_grad();

  StateDict state_dict() const;
  void load_state_dict(const StateDict& sd);

  // The groups, with every hyper-parameter set. Change hyper-parameters (lr) freely;
  // do not add or remove parameters after the first step.
  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  // The state of parameter `p`, or null before its first update.
  const ParamState* state(const Tensor& p) const;
  // Number of step() calls so far (restored by load_state_dict).
  int64_t step_count() const { return step_count_; }
  const std::string& name() const { return name_; }

 protected:
  // Subclasses call init() from their constructor (after their options are set), which
  // resolves and checks the groups through the virtual hooks below.
  explicit Optimizer(std::string name) : name_(std::move(name)) {}
  void init(std::vector<ParamGroup> groups);

  // Fills g's unset hyper-parameters (lr and weight_decay included) from the options and
  // throws if g sets one this optimizer does not use.
  virtual void resolve(ParamGroup& g, size_t index) const = 0;
  // Checks the optimizer's own hyper-parameters (lr and weight_decay are checked by the base).
  virtual void validate(const ParamGroup& g, size_t index) const = 0;
  // Throws if this optimizer cannot update `p` (e.g. no kernel for its device yet).
  virtual void check_param(const Tensor& p) const { (void)p; }
  // The optimizer's own hyper-parameters by name (lr and weight_decay excluded), for state_dict.
  virtual std::vector<std::pair<std::string, double>> hyper_params(const ParamGroup& g) const = 0;
  virtual void set_hyper_param(ParamGroup& g, const std::string& name, double value) const = 0;
  // The state tensors parameter p of group g may hold after its first update (those marked
  // required it always holds), and their dtype.
  struct StateSpec {
    std::string name;
    bool required = true;
  };
  virtual std::vector<StateSpec> state_specs(const ParamGroup& g, const Tensor& p) const = 0;
  virtual DType state_dtype(const Tensor& p, const std::string& name) const = 0;
  // Updates p (and s.tensors) from grad; s.step already counts this update. Runs under
  // NoGradGuard; grad has p's shape, dtype and device.
  virtual void update(const ParamGroup& g, Tensor& p, const Tensor& grad, ParamState& s) = 0;

  // A hyper-parameter that must be set (throws naming the optimizer, group and field).
  double require(const std::optional<double>& v, const char* field, size_t index) const;
  // "<name>: invalid <field> <value> in param group <index> (<rule>)"
  [[noreturn]] void throw_invalid(const char* field, double value, size_t index, const char* rule) const;

 private:
  void check_groups(const std::vector<ParamGroup>& groups) const;

  std::string name_;
  std::vector<ParamGroup> groups_;
  std::unordered_map<const TensorImpl*, ParamState> state_;
  int64_t step_count_ = 0;
};

// The GPT-2 / nanoGPT weight-decay split: decay the weights of matmuls (tensors with
// dim >= 2) except embeddings; do not decay biases, norm weights (dim < 2) and embedding
// tables (a name containing "embed", "wte", "wpe" or "tok_embeddings"). Returns two groups,
// {decay (weight_decay), no decay (0)} in that order (either may be empty), lr unset.
// Parameters that do not require grad are left out; a tensor listed under several names
// (tied weights) appears once, undecayed if any of its names is an embedding's.
std::vector<ParamGroup> decay_groups(const std::vector<std::pair<std::string, Tensor>>& named_params,
                                     double weight_decay);

}  // namespace forge::optim
