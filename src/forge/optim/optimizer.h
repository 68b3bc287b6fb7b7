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
// Skipping a step. step(skip_if) takes a one-element flag tensor: where it is non-zero the
// step changes nothing (no parameter, no state, no per-parameter step count; step_count()
// still counts the call). The guard of mixed-precision training passes the non-finite flag
// of the gradient norm (clip.h: found_non_finite) or of the loss scaler (loss_scale.h).
// A flag on the CPU is read on the host. A flag on a GPU is read by the update kernels
// themselves, so the step never waits for the device (Note [skipped steps on the device],
// backends/cuda/optim.h): the host counts every attempted update of a parameter, the GPU
// counts the skipped ones, and the two are folded together (one device-to-host copy) when
// the counts are asked for: state(), state_dict(). Parameters on the CPU with a flag on a
// GPU make step() read the flag on the host (one synchronisation).
//
// Clipping. clip_next_step(max_norm, norm) makes the next step() update as if
// clip_grads_with_norm_(params, max_norm, norm) (clip.h) had run just before it, without
// writing the gradients where the optimizer can (Note [clipping inside the update]).
//
// Devices. CPU parameters are updated one at a time by update(); CUDA parameters are
// updated by update_cuda(), once per param group and device, which launches multi-tensor
// kernels (AdamW: one launch per ~48 tensors of a dtype; SGD likewise).
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
  int64_t step = 0;  // updates applied to this parameter (attempts, until the optimizer folds in
                     // the updates a device flag skipped: state() and state_dict() always do)
  std::map<std::string, Tensor> tensors;
  // State tensors made for an update of a CUDA parameter that a device flag may skip: name
  // -> the step count at which the tensor is first used (SGD's momentum buffer starts as
  // d then; the kernel compares the parameter's true step with it). If that update was
  // skipped, folding the skip counts drops the tensor again. Not part of state_dict.
  std::map<std::string, int64_t> first_use;
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
  // The same, unless `skip_if` (a one-element tensor of any dtype, on any device) is
  // non-zero: then nothing changes. See "Skipping a step" above.
  void step(const Tensor& skip_if);
  // Drops every parameter's .grad (sets it to undefined, like set_to_none=True).
  void zero_grad();

  // Note [clipping inside the update]: the next step() updates as if
  //   clip_grads_with_norm_(<every parameter of every group>, max_norm, norm)   (clip.h)
  // had run just before it: with c = max_norm / (norm + 1e-6) in double, every gradient
  // element g is read as T(double(g) * c) (T its dtype) when `norm` (a one-element floating
  // tensor; read as f32) is finite and > max_norm, and as g otherwise: the same bits. Where
  // the optimizer can, the gradients are scaled as they are loaded, not written: AdamW on
  // CUDA applies c inside its update kernel to the value in registers, so the separate clip
  // pass (one read and one write of every gradient) disappears and the .grad tensors are
  // left unclipped. Everywhere else (SGD, CPU parameters, a norm on another device than the
  // parameters) step() runs clip_grads_with_norm_ itself before the first update, which
  // does rewrite .grad. Nothing waits for the device either way: the clip decision is read
  // by the kernels. The pending clip is consumed by the next step() call, whether or not
  // that step is skipped (a step skipped on the host clips nothing); one clip_next_step
  // per step. Throws for max_norm < 0 (or NaN) or a `norm` that is not a one-element
  // floating-point tensor. A step captured in a CUDA graph keeps reading `norm` from the
  // same address at every replay, like the skip flag.
  void clip_next_step(double max_norm, const Tensor& norm);

  StateDict state_dict() const;
  void load_state_dict(const StateDict& sd);

  // The groups, with every hyper-parameter set. Change hyper-parameters (lr) freely;
  // do not add or remove parameters after the first step.
  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  // The state of parameter `p`, or null before its first update (or its seeded state alone:
  // seed_state, step 0). Folds in the updates a device flag skipped (a device-to-host copy
  // when there are any). state_dict() leaves out the states of step 0.
  const ParamState* state(const Tensor& p) const;
  // Before p's first update: its state tensor `name` starts as `value` (any device and
  // floating dtype, p's number of elements) instead of what the first update would make,
  // copied to p's device in the optimizer's state dtype. What it is for: AdamW's f32 master
  // of a 16-bit parameter from the f32 weights the parameter was rounded from (Note [bf16
  // master weights], adamw.h). False (nothing done) when the optimizer keeps no state `name`
  // for p (SGD has no master); throws for a p not in the groups or a p already updated.
  bool seed_state(const Tensor& p, const std::string& name, const Tensor& value);
  // Number of step() calls so far, skipped ones included (restored by load_state_dict).
  int64_t step_count() const { return step_count_; }

  // ---- CUDA graphs (Note [optimizer steps in a CUDA graph], backends/cuda/optim.h) ----------
  // Between begin_graph_capture(device) and end_graph_capture(), step() makes its CUDA updates
  // read each group's lr and each parameter's step count from a device tensor of this optimizer
  // (made by begin_graph_capture on `device`, before the capture) instead of kernel arguments,
  // and remembers what it did (which parameters it updated, under which skip flag), so that a
  // replay of the captured step can be accounted for: count_replayed_step() advances the host's
  // counts as that step() did, and stage_graph_inputs() queues every group's lr and every
  // parameter's step count into the device tensor on the current stream (call both before
  // each replay, stage_graph_inputs also once after the capture, before its first launch).
  // While a captured step exists, a parameter whose every update was skipped keeps its state
  // (the graph's kernels hold its tensors' addresses). Throws for parameters on a CPU.
  void begin_graph_capture(Device device);
  void end_graph_capture();
  void count_replayed_step();
  void stage_graph_inputs();
  bool has_graph_step() const { return graph_inputs_.defined(); }
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
  // Whether update_cuda applies a pending clip itself (DeviceSkip::clip_norm) instead of the
  // base running clip_grads_with_norm_ first (Note [clipping inside the update]).
  virtual bool fuses_clip() const { return false; }
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
  // NoGradGuard; grad has p's shape, dtype and device. CPU parameters only.
  virtual void update(const ParamGroup& g, Tensor& p, const Tensor& grad, ParamState& s) = 0;

  // One parameter of a CUDA update: slot is its index over all groups (state_dict's k).
  struct DeviceUpdate {
    Tensor param;
    Tensor grad;
    ParamState* state;  // state->step already counts this update (an attempt, when skip.flag is set)
    int64_t slot;
  };
  // The skip flag of a CUDA update and the device's skip counters (i64, one per slot), on
  // the parameters' GPU; either may be undefined (no flag this step / never a flag on this
  // device). Note [skipped steps on the device] in backends/cuda/optim.h.
  // Also the device-held lr and step counts of a step being captured in a CUDA graph (undefined
  // otherwise): lr = graph_inputs[graph_lr_index], the step of slot k = graph_inputs[graph_steps_offset + k].
  // And the clip of this step (only for an optimizer that fuses_clip(); undefined clip_norm:
  // none): the norm as a contiguous 0-d f32 tensor on the parameters' GPU, and max_norm.
  struct DeviceSkip {
    Tensor flag;
    Tensor skipped;
    Tensor graph_inputs;
    int64_t graph_lr_index = 0;
    int64_t graph_steps_offset = 0;
    Tensor clip_norm;
    double clip_max_norm = 0;
  };
  // Updates every parameter of `items` (all of group g, all on one GPU, each with a
  // gradient) in as few kernel launches as possible, under NoGradGuard. The default throws.
  virtual void update_cuda(const ParamGroup& g, std::vector<DeviceUpdate>& items, const DeviceSkip& skip);

  // Whether the parameter of `slot` may have skipped device updates not yet folded into its
  // ParamState::step, and the fold itself (a device-to-host copy of the skip counters; a
  // no-op when nothing is pending). After the fold every ParamState::step is exact; a state
  // whose every update was skipped is dropped, and so is every tensor of `first_use` whose
  // first use was skipped.
  bool may_have_skipped_steps(int64_t slot) const;
  void fold_skipped_steps() const;

  // A hyper-parameter that must be set (throws naming the optimizer, group and field).
  double require(const std::optional<double>& v, const char* field, size_t index) const;
  // "<name>: invalid <field> <value> in param group <index> (<rule>)"
  [[noreturn]] void throw_invalid(const char* field, double value, size_t index, const char* rule) const;

 private:
  void check_groups(const std::vector<ParamGroup>& groups) const;
  size_t num_params() const;
  // The skip counters of CUDA device `device` (created zeroed at the first flag there).
  Tensor& skip_counters(int device);

  std::string name_;
  std::vector<ParamGroup> groups_;
  // Mutable: folding skipped device updates into the step counts is logically const.
  mutable std::unordered_map<const TensorImpl*, ParamState> state_;
  mutable std::map<int, Tensor> skip_counters_;  // by CUDA device index
  mutable std::vector<char> maybe_skipped_;      // by slot: was in a step with a device flag since the last fold
  mutable bool skips_pending_ = false;           // any maybe_skipped_
  int64_t step_count_ = 0;
  // clip_next_step's (max_norm, norm), consumed by the next step(); undefined norm: none.
  std::pair<double, Tensor> pending_clip_;
  // CUDA graphs: [lr of each group, step of each slot] in f64 on the GPU; whether a capture is
  // under way; what the captured step() did (Note [optimizer steps in a CUDA graph]).
  Tensor graph_inputs_;
  bool graph_capturing_ = false;
  struct GraphStep {
    bool recorded = false;      // step() ran during the capture
    bool skipped_on_host = false;
    bool flag_on_device = false;
    std::vector<std::pair<int64_t, Tensor>> updated;  // (slot, parameter)
  } graph_step_;
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
