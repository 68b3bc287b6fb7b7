// Optimizer: parameter groups, the step loop, zero_grad, state_dict / load_state_dict, and
// the nanoGPT weight-decay split. See optimizer.h for the contract and the state_dict
// names; the update rules live in sgd.cpp and adamw.cpp.
#include "forge/optim/optimizer.h"

#include "forge/core/memory_owner.h"
#include "forge/core/trace_range.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <unordered_set>

#include "forge/autograd/grad_mode.h"
#include "forge/ops/copy.h"
#include "forge/ops/creation.h"
#include "forge/optim/clip.h"

namespace forge::optim {
namespace {

std::string group_key(size_t g, const std::string& field) { return "group." + std::to_string(g) + "." + field; }
std::string state_key(size_t k, const std::string& field) { return "state." + std::to_string(k) + "." + field; }

// "state.<k>.<field>" -> (k, field); false for any other shape of key.
bool parse_state_key(const std::string& key, size_t& k, std::string& field) {
  static const std::string prefix = "state.";
  if (key.compare(0, prefix.size(), prefix) != 0) return false;
  size_t pos = prefix.size(), end = pos;
  while (end < key.size() && key[end] >= '0' && key[end] <= '9') ++end;
  if (end == pos || end >= key.size() || key[end] != '.' || end + 1 >= key.size()) return false;
  if (end - pos > 18) return false;  // no index that large
  k = static_cast<size_t>(std::stoull(key.substr(pos, end - pos)));
  field = key.substr(end + 1);
  return true;
}

bool is_count(double v) { return std::isfinite(v) && v >= 0 && v == std::floor(v) && v < 9.007199254740992e15; }

bool is_embedding_name(const std::string& name) {
  for (const char* marker : {"embed", "wte", "wpe", "tok_embeddings"})
    if (name.find(marker) != std::string::npos) return true;
  return false;
}

}  // namespace

StateDict StateDict::clone() const {
  NoGradGuard no_grad;
  StateDict out;
  out.scalars = scalars;
  for (const auto& [name, t] : tensors) out.tensors[name] = t.defined() ? ops::clone(t) : t;
  return out;
}

double Optimizer::require(const std::optional<double>& v, const char* field, size_t index) const {
  FORGE_CHECK(v.has_value(), name_, ": param group ", index, " has no ", field,
              " (set it in the group or in the optimizer's options)");
  return *v;
}

void Optimizer::throw_invalid(const char* field, double value, size_t index, const char* rule) const {
  FORGE_THROW(name_, ": invalid ", field, " ", value, " in param group ", index, " (", rule, ")");
}

void Optimizer::init(std::vector<ParamGroup> groups) {
  FORGE_CHECK(!groups.empty(), name_, ": got no parameter groups");
  for (size_t i = 0; i < groups.size(); ++i) resolve(groups[i], i);
  check_groups(groups);
  groups_ = std::move(groups);
}

void Optimizer::check_groups(const std::vector<ParamGroup>& groups) const {
  std::unordered_set<const TensorImpl*> seen;
  for (size_t i = 0; i < groups.size(); ++i) {
    const ParamGroup& g = groups[i];
    const double lr = require(g.lr, "lr", i);
    if (!(std::isfinite(lr) && lr >= 0)) throw_invalid("lr", lr, i, "must be finite and >= 0");
    const double wd = require(g.weight_decay, "weight_decay", i);
    if (!(std::isfinite(wd) && wd >= 0)) throw_invalid("weight_decay", wd, i, "must be finite and >= 0");
    validate(g, i);
    for (size_t j = 0; j < g.params.size(); ++j) {
      const Tensor& p = g.params[j];
      FORGE_CHECK(p.defined(), name_, ": parameter ", j, " of param group ", i, " is an undefined tensor");
      FORGE_CHECK(is_floating(p.dtype()), name_, ": parameter ", j, " of param group ", i, " (shape ", p.shape(),
                  ") has dtype ", dtype_name(p.dtype()), "; only floating-point tensors can be optimized");
      FORGE_CHECK(p.is_leaf(), name_, ": parameter ", j, " of param group ", i, " (shape ", p.shape(),
                  ") is not a leaf (it was computed by an op); optimize the leaf it came from, or detach() it");
      FORGE_CHECK(seen.insert(p.impl()).second, name_, ": parameter ", j, " of param group ", i, " (shape ",
                  p.shape(), ") appears more than once across the param groups");
    }
  }
  FORGE_CHECK(!seen.empty(), name_, ": got no parameters to optimize (every param group is empty)");
}

void Optimizer::step() { step(Tensor()); }

void Optimizer::clip_next_step(double max_norm, const Tensor& norm) {
  FORGE_CHECK(max_norm >= 0, name_, ": clip_next_step: max_norm must be >= 0, got ", max_norm);
  FORGE_CHECK(norm.defined() && norm.numel() == 1 && is_floating(norm.dtype()), name_,
              ": clip_next_step: the norm must be a one-element floating-point tensor, got ",
              norm.defined() ? shape_str(norm.shape()) + " " + dtype_name(norm.dtype()) : std::string("an undefined tensor"));
  pending_clip_ = {max_norm, norm.detach()};  // a later call before step() replaces it
}

void Optimizer::step(const Tensor& skip_if) {
  static const char* label = intern_memory_owner("optimizer");  // Note [memory owners]
  const MemoryOwner owner(label);
  const trace::Range traced(label);
  // Note [clipping inside the update]: the pending clip belongs to this call, whatever happens below.
  const std::pair<double, Tensor> clip = std::exchange(pending_clip_, {});
  check_groups(groups_);
  // Every check before the first parameter changes, so a bad step leaves all of them as they were.
  bool cpu_grads = false;
  bool on_clip_device = clip.second.defined() && clip.second.is_cuda();  // every parameter with a gradient
  for (size_t i = 0; i < groups_.size(); ++i) {
    for (const Tensor& p : groups_[i].params) {
      const Tensor& g = p.grad();
      if (!g.defined()) continue;
      FORGE_CHECK(g.shape() == p.shape() && g.dtype() == p.dtype() && g.device() == p.device(), name_,
                  ": the gradient of a parameter in param group ", i, " is ", g.shape(), " ", dtype_name(g.dtype()),
                  " on ", g.device().str(), " but the parameter is ", p.shape(), " ", dtype_name(p.dtype()), " on ",
                  p.device().str());
      check_param(p);
      cpu_grads = cpu_grads || p.is_cpu();
      on_clip_device = on_clip_device && p.device() == clip.second.device();
    }
  }
  // The update kernels apply the clip where the optimizer fuses it and every parameter is on the
  // norm's GPU; otherwise the gradients are clipped first (below, once the step is known to run).
  const bool fuse_clip = clip.second.defined() && fuses_clip() && on_clip_device;
  if (skip_if.defined())
    FORGE_CHECK(skip_if.numel() == 1, name_, ": skip_if must be a one-element tensor, got shape ", skip_if.shape());
  NoGradGuard no_grad;
  // The skip decision is made on the host unless the flag is on a GPU and every parameter
  // that takes part is on a GPU too (then each kernel reads it).
  bool skip = false;
  bool flag_on_device = skip_if.defined() && skip_if.is_cuda();
  if (skip_if.defined() && (!flag_on_device || cpu_grads)) {
    skip = skip_if.item<double>() != 0;  // for a flag on a GPU: one synchronisation
    flag_on_device = false;
  }
  if (graph_capturing_) {
    FORGE_CHECK(!graph_step_.recorded, name_, ": step() was called twice during one CUDA graph capture; capture one step");
    graph_step_ = {};
    graph_step_.recorded = true;
    graph_step_.skipped_on_host = skip;
    graph_step_.flag_on_device = flag_on_device;
  }
  if (skip) {
    ++step_count_;
    return;
  }
  if (clip.second.defined() && !fuse_clip) {
    std::vector<Tensor> params;
    for (const ParamGroup& group : groups_)
      for (const Tensor& p : group.params)
        if (p.grad().defined()) params.push_back(p);
    clip_grads_with_norm_(params, clip.first, clip.second);
  }
  const size_t n_params = num_params();
  if (maybe_skipped_.size() != n_params) maybe_skipped_.resize(n_params, 0);
  int64_t slot = 0;
  for (const ParamGroup& group : groups_) {
    std::map<int, std::vector<DeviceUpdate>> on_device;  // CUDA parameters by device
    for (const Tensor& param : group.params) {
      const int64_t k = slot++;
      const Tensor grad = param.grad();
      if (!grad.defined()) continue;
      // The state a first update creates (zeros) would be created again by every replay (a
      // seeded state, seed_state, is not yet complete either).
      FORGE_CHECK(!graph_capturing_ || (state_.count(param.impl()) != 0 && state_.at(param.impl()).step > 0), name_,
                  ": a parameter's first update cannot be captured in a CUDA graph (its state would be made anew "
                  "at every replay); run one step before capturing");
      ParamState& s = state_[param.impl()];
      if (!s.param.defined()) s.param = param;
      ++s.step;
      if (graph_capturing_) {
        FORGE_CHECK(param.is_cuda() && param.device() == graph_inputs_.device(), name_,
                    ": a CUDA graph captures the update of parameters on ", graph_inputs_.device().str(), " only, not on ",
                    param.device().str());
        graph_step_.updated.emplace_back(k, param);
      }
      if (param.is_cpu()) {
        Tensor p = param;
        update(group, p, grad, s);
      } else {
        on_device[param.device().index].push_back({param, grad, &s, k});
      }
    }
    for (auto& [device, items] : on_device) {
      DeviceSkip ds;
      if (flag_on_device) {
        ds.flag = skip_if.to(Device::cuda(device), DType::f32).contiguous();  // no copy when it is already so
        ds.skipped = skip_counters(device);
      } else if (auto it = skip_counters_.find(device); it != skip_counters_.end()) {
        ds.skipped = it->second;  // earlier flags: the kernels need the counts for t
      }
      if (graph_capturing_) {
        ds.graph_inputs = graph_inputs_;
        ds.graph_lr_index = static_cast<int64_t>(&group - groups_.data());
        ds.graph_steps_offset = static_cast<int64_t>(groups_.size());
      }
      if (fuse_clip) {
        ds.clip_norm = clip.second.to(DType::f32).contiguous().reshape({});  // no copy when it is already so
        ds.clip_max_norm = clip.first;
      }
      update_cuda(group, items, ds);
      if (flag_on_device) {
        for (const DeviceUpdate& u : items) maybe_skipped_[static_cast<size_t>(u.slot)] = 1;
        skips_pending_ = true;
      }
    }
  }
  ++step_count_;
}

void Optimizer::begin_graph_capture(Device device) {
  FORGE_CHECK(device.is_cuda(), name_, ": CUDA graphs capture updates of GPU parameters, not on ", device.str());
  FORGE_CHECK(!graph_capturing_, name_, ": begin_graph_capture twice without end_graph_capture");
  check_groups(groups_);
  const auto n = static_cast<int64_t>(groups_.size() + num_params());
  if (!graph_inputs_.defined() || graph_inputs_.numel() != n || graph_inputs_.device() != device)
    graph_inputs_ = zeros({n}, {.dtype = DType::f64, .device = device});
  // The skip counters must exist before the capture when a device flag may come: a tensor the
  // capture made would live in the graph's pool. Made here for the device (zeros, unused without a flag).
  (void)skip_counters(device.index);
  graph_step_ = {};
  graph_capturing_ = true;
}

void Optimizer::end_graph_capture() { graph_capturing_ = false; }

void Optimizer::count_replayed_step() {
  FORGE_CHECK(graph_step_.recorded, name_, ": count_replayed_step without a captured step()");
  ++step_count_;
  if (graph_step_.skipped_on_host) return;
  for (const auto& [slot, param] : graph_step_.updated) {
    ParamState& s = state_[param.impl()];
    if (!s.param.defined()) s.param = param;
    ++s.step;
    if (graph_step_.flag_on_device) {
      maybe_skipped_[static_cast<size_t>(slot)] = 1;
      skips_pending_ = true;
    }
  }
}

void Optimizer::stage_graph_inputs() {
  FORGE_CHECK(graph_inputs_.defined(), name_, ": stage_graph_inputs before begin_graph_capture");
  std::vector<double> v(static_cast<size_t>(graph_inputs_.numel()), 0.0);
  for (size_t g = 0; g < groups_.size(); ++g) v[g] = require(groups_[g].lr, "lr", g);
  for (const auto& [slot, param] : graph_step_.updated) {
    auto it = state_.find(param.impl());
    v[groups_.size() + static_cast<size_t>(slot)] = it == state_.end() ? 0.0 : static_cast<double>(it->second.step);
  }
  // Pinned, so the copy is only queued (the pinned allocator keeps the block until it has run).
  const Tensor host = from_vector(v, {graph_inputs_.numel()}).pin_memory();
  ops::copy_(graph_inputs_, host, /*non_blocking=*/true);
}

void Optimizer::update_cuda(const ParamGroup&, std::vector<DeviceUpdate>& items, const DeviceSkip&) {
  FORGE_CHECK(items.empty(), name_, ": updating parameters on ", items[0].param.device().str(),
              " is not supported by this optimizer");
}

size_t Optimizer::num_params() const {
  size_t n = 0;
  for (const ParamGroup& g : groups_) n += g.params.size();
  return n;
}

Tensor& Optimizer::skip_counters(int device) {
  Tensor& t = skip_counters_[device];
  if (!t.defined()) t = zeros({static_cast<int64_t>(num_params())}, {.dtype = DType::i64, .device = Device::cuda(device)});
  return t;
}

bool Optimizer::may_have_skipped_steps(int64_t slot) const {
  return slot >= 0 && static_cast<size_t>(slot) < maybe_skipped_.size() && maybe_skipped_[static_cast<size_t>(slot)];
}

void Optimizer::fold_skipped_steps() const {
  if (!skips_pending_) return;
  NoGradGuard no_grad;
  std::vector<const TensorImpl*> by_slot;
  for (const ParamGroup& g : groups_)
    for (const Tensor& p : g.params) by_slot.push_back(p.impl());
  for (auto& [device, counters] : skip_counters_) {
    const std::vector<int64_t> skipped = counters.to_vector<int64_t>();  // waits for the device
    for (size_t k = 0; k < skipped.size() && k < by_slot.size(); ++k) {
      if (skipped[k] == 0) continue;
      auto it = state_.find(by_slot[k]);
      if (it == state_.end()) continue;
      ParamState& s = it->second;
      s.step -= skipped[k];
      if (has_graph_step()) continue;  // a captured step's kernels hold its tensors: keep them
      if (s.step <= 0) {  // every update of this parameter was skipped: as if it never had one
        state_.erase(it);
        continue;
      }
      // A tensor whose first use lies beyond the updates applied was made for an update that
      // was skipped: drop it (it is made again when needed). (During a step, s.step already
      // counts the update under way, so a tensor made for that one is kept.)
      for (auto f = s.first_use.begin(); f != s.first_use.end();) {
        if (f->second > s.step) {
          s.tensors.erase(f->first);
          f = s.first_use.erase(f);
        } else {
          ++f;
        }
      }
    }
    counters.zero_();
  }
  std::fill(maybe_skipped_.begin(), maybe_skipped_.end(), 0);
  skips_pending_ = false;
}

void Optimizer::zero_grad() {
  for (const ParamGroup& g : groups_)
    for (const Tensor& p : g.params) p.zero_grad();
}

bool Optimizer::seed_state(const Tensor& p, const std::string& name, const Tensor& value) {
  const ParamGroup* group = nullptr;
  for (const ParamGroup& g : groups_)
    for (const Tensor& t : g.params)
      if (t.is_same(p)) group = &g;
  FORGE_CHECK(group != nullptr, name_, ": seed_state: the tensor of shape ", p.shape(), " is not a parameter of this optimizer");
  bool kept = false;
  for (const StateSpec& spec : state_specs(*group, p)) kept = kept || spec.name == name;
  if (!kept) return false;
  FORGE_CHECK(value.defined() && value.numel() == p.numel() && is_floating(value.dtype()), name_, ": seed_state: '",
              name, "' needs ", p.numel(), " floating-point elements, got ", value.defined() ? value.numel() : 0);
  ParamState& s = state_[p.impl()];
  FORGE_CHECK(s.step == 0, name_, ": seed_state: the parameter was updated already (", s.step, " step(s))");
  if (!s.param.defined()) s.param = p;
  NoGradGuard no_grad;
  static const char* label = intern_memory_owner("optimizer");  // Note [memory owners]: as step()'s state
  const MemoryOwner owner(label);
  const DType dt = state_dtype(p, name);
  const Tensor v = value.detach().reshape(p.shape());
  // A copy of its own (to() returns its input when nothing changes).
  s.tensors[name] = (v.device() == p.device() && v.dtype() == dt) ? ops::clone(v) : ops::contiguous(ops::to(v, p.device(), dt));
  return true;
}

const ParamState* Optimizer::state(const Tensor& p) const {
  if (!p.defined()) return nullptr;
  fold_skipped_steps();
  auto it = state_.find(p.impl());
  return it == state_.end() ? nullptr : &it->second;
}

StateDict Optimizer::state_dict() const {
  fold_skipped_steps();
  StateDict sd;
  sd.scalars["step"] = static_cast<double>(step_count_);
  size_t k = 0;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const ParamGroup& g = groups_[gi];
    sd.scalars[group_key(gi, "num_params")] = static_cast<double>(g.params.size());
    sd.scalars[group_key(gi, "lr")] = require(g.lr, "lr", gi);
    sd.scalars[group_key(gi, "weight_decay")] = require(g.weight_decay, "weight_decay", gi);
    for (const auto& [name, value] : hyper_params(g)) sd.scalars[group_key(gi, name)] = value;
    for (const Tensor& p : g.params) {
      // (A state with no update yet, a seeded master alone (seed_state), is not state to restore.)
      if (const ParamState* s = state(p); s != nullptr && s->step > 0) {
        sd.scalars[state_key(k, "step")] = static_cast<double>(s->step);
        for (const auto& [name, t] : s->tensors) sd.tensors[state_key(k, name)] = t;
      }
      ++k;
    }
  }
  return sd;
}

void Optimizer::load_state_dict(const StateDict& sd) {
  const std::string ctx = name_ + ": load_state_dict: ";
  std::set<std::string> used;  // scalar keys read
  auto scalar = [&](const std::string& key) {
    auto it = sd.scalars.find(key);
    FORGE_CHECK(it != sd.scalars.end(), ctx, "missing scalar '", key,
                "' (was this state saved by another optimizer or for other parameters?)");
    used.insert(key);
    return it->second;
  };

  const double step = scalar("step");
  FORGE_CHECK(is_count(step), ctx, "'step' must be a non-negative integer, got ", step);

  // Groups: same sizes, hyper-parameters restored.
  std::vector<ParamGroup> groups = groups_;
  std::vector<std::pair<size_t, Tensor>> flat;  // (group, parameter) by flat index
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    ParamGroup& g = groups[gi];
    const double n = scalar(group_key(gi, "num_params"));
    FORGE_CHECK(n == static_cast<double>(g.params.size()), ctx, "param group ", gi, " was saved with ", n,
                " parameters but has ", g.params.size());
    g.lr = scalar(group_key(gi, "lr"));
    g.weight_decay = scalar(group_key(gi, "weight_decay"));
    for (const auto& [name, value] : hyper_params(g)) {
      (void)value;
      set_hyper_param(g, name, scalar(group_key(gi, name)));
    }
    for (const Tensor& p : g.params) flat.emplace_back(gi, p);
  }
  check_groups(groups);

  // Per-parameter state: a "state.<k>.step" creates the entry, the tensors fill it.
  std::unordered_map<const TensorImpl*, ParamState> state;
  std::vector<ParamState*> by_index(flat.size(), nullptr);
  for (const auto& [key, value] : sd.scalars) {
    if (used.count(key)) continue;
    FORGE_CHECK(key.compare(0, 6, "group.") != 0, ctx, "unexpected '", key, "': the optimizer has ", groups.size(),
                " param group(s), and '", key, "' is none of their hyper-parameters (saved by another optimizer?)");
    size_t k = 0;
    std::string field;
    FORGE_CHECK(parse_state_key(key, k, field) && field == "step", ctx, "unknown scalar '", key, "'");
    FORGE_CHECK(k < flat.size(), ctx, "'", key, "' names parameter ", k, " but the optimizer has ", flat.size());
    FORGE_CHECK(is_count(value) && value >= 1, ctx, "'", key, "' must be a positive integer, got ", value);
    const Tensor& p = flat[k].second;
    ParamState& s = state[p.impl()];
    s.param = p;
    s.step = static_cast<int64_t>(value);
    by_index[k] = &s;
  }
  NoGradGuard no_grad;
  for (const auto& [key, src] : sd.tensors) {
    size_t k = 0;
    std::string field;
    FORGE_CHECK(parse_state_key(key, k, field), ctx, "unknown tensor '", key, "'");
    FORGE_CHECK(k < flat.size(), ctx, "'", key, "' names parameter ", k, " but the optimizer has ", flat.size());
    FORGE_CHECK(by_index[k] != nullptr, ctx, "'", key, "' has no '", state_key(k, "step"), "'");
    const auto& [gi, p] = flat[k];
    const std::vector<StateSpec> specs = state_specs(groups[gi], p);
    FORGE_CHECK(std::any_of(specs.begin(), specs.end(), [&](const StateSpec& sp) { return sp.name == field; }), ctx, "'", key,
                "' is not state this optimizer keeps for a ", dtype_name(p.dtype()), " parameter of param group ", gi);
    FORGE_CHECK(src.defined() && src.shape() == p.shape(), ctx, "'", key, "' has shape ",
                src.defined() ? src.shape() : Shape{}, " but parameter ", k, " has shape ", p.shape());
    Tensor t = empty(p.shape(), {.dtype = state_dtype(p, field), .device = p.device()});
    ops::copy_(t, src);
    by_index[k]->tensors[field] = t;
  }
  for (size_t k = 0; k < flat.size(); ++k) {
    if (!by_index[k]) continue;
    for (const StateSpec& sp : state_specs(groups[flat[k].first], flat[k].second))
      FORGE_CHECK(!sp.required || by_index[k]->tensors.count(sp.name), ctx, "missing tensor '", state_key(k, sp.name),
                  "'");
  }

  groups_ = std::move(groups);
  state_ = std::move(state);
  step_count_ = static_cast<int64_t>(step);
  // The skip counts belonged to the replaced state.
  skip_counters_.clear();
  maybe_skipped_.assign(maybe_skipped_.size(), 0);
  skips_pending_ = false;
}

std::vector<ParamGroup> decay_groups(const std::vector<std::pair<std::string, Tensor>>& named_params,
                                     double weight_decay) {
  FORGE_CHECK(std::isfinite(weight_decay) && weight_decay >= 0,
              "decay_groups: weight_decay must be finite and >= 0, got ", weight_decay);
  std::unordered_map<const TensorImpl*, bool> embedding;  // any of the tensor's names is an embedding's
  for (const auto& [name, t] : named_params) {
    FORGE_CHECK(t.defined(), "decay_groups: parameter '", name, "' is an undefined tensor");
    bool& e = embedding[t.impl()];
    e = e || is_embedding_name(name);
  }
  ParamGroup decay, no_decay;
  decay.weight_decay = weight_decay;
  no_decay.weight_decay = 0.0;
  std::unordered_set<const TensorImpl*> seen;
  for (const auto& [name, t] : named_params) {
    if (!t.requires_grad() || !seen.insert(t.impl()).second) continue;
    (t.dim() >= 2 && !embedding[t.impl()] ? decay : no_decay).params.push_back(t);
  }
  return {std::move(decay), std::move(no_decay)};
}

}  // namespace forge::optim
