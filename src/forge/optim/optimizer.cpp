// Optimizer: parameter groups, the step loop, zero_grad, state_dict / load_state_dict, and
// the nanoGPT weight-decay split. See optimizer.h for the contract and the state_dict
// names; the update rules live in sgd.cpp and adamw.cpp.
#include "forge/optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <unordered_set>

#include "forge/autograd/grad_mode.h"
#include "forge/ops/copy.h"
#include "forge/ops/creation.h"

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

void Optimizer::step() {
  check_groups(groups_);
  // Every check before the first parameter changes, so a bad step leaves all of them as they were.
  for (size_t i = 0; i < groups_.size(); ++i) {
    for (const Tensor& p : groups_[i].params) {
      const Tensor& g = p.grad();
      if (!g.defined()) continue;
      FORGE_CHECK(g.shape() == p.shape() && g.dtype() == p.dtype() && g.device() == p.device(), name_,
                  ": the gradient of a parameter in param group ", i, " is ", g.shape(), " ", dtype_name(g.dtype()),
                  " on ", g.device().str(), " but the parameter is ", p.shape(), " ", dtype_name(p.dtype()), " on ",
                  p.device().str());
      check_param(p);
    }
  }
  NoGradGuard no_grad;
  for (const ParamGroup& group : groups_) {
    for (const Tensor& param : group.params) {
      const Tensor grad = param.grad();
      if (!grad.defined()) continue;
      ParamState& s = state_[param.impl()];
      if (!s.param.defined()) s.param = param;
      ++s.step;
      Tensor p = param;
      update(group, p, grad, s);
    }
  }
  ++step_count_;
}

void Optimizer::zero_grad() {
  for (const ParamGroup& g : groups_)
    for (const Tensor& p : g.params) p.zero_grad();
}

const ParamState* Optimizer::state(const Tensor& p) const {
  if (!p.defined()) return nullptr;
  auto it = state_.find(p.impl());
  return it == state_.end() ? nullptr : &it->second;
}

StateDict Optimizer::state_dict() const {
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
      if (const ParamState* s = state(p)) {
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
