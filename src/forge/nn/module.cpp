#include "forge/nn/module.h"
#include "forge/nn/block_hooks.h"

#include <unordered_map>

#include "forge/autograd/grad_mode.h"
#include "forge/ops/copy.h"

namespace forge::nn {
namespace {
thread_local bool t_skip_init = false;
}

SkipInitGuard::SkipInitGuard() : prev_(t_skip_init) { t_skip_init = true; }
SkipInitGuard::~SkipInitGuard() { t_skip_init = prev_; }
bool default_init_enabled() { return !t_skip_init; }

void Module::check_new_name(const std::string& name) const {
  FORGE_CHECK(!name.empty() && name.find('.') == std::string::npos, "Module: invalid name '", name,
              "' (must be non-empty and contain no '.')");
  for (const auto& p : params_) FORGE_CHECK(p.first != name, "Module: '", name, "' is already a parameter");
  for (const auto& b : buffers_) FORGE_CHECK(b.first != name, "Module: '", name, "' is already a buffer");
  for (const auto& c : children_) FORGE_CHECK(c.first != name, "Module: '", name, "' is already a submodule");
}

Tensor Module::register_parameter(const std::string& name, Tensor t, bool requires_grad) {
  check_new_name(name);
  FORGE_CHECK(t.defined(), "Module: parameter '", name, "' is undefined");
  Tensor leaf = t.is_leaf() ? t : t.detach();
  if (requires_grad && !leaf.requires_grad()) leaf.requires_grad_(true);
  params_.emplace_back(name, leaf);
  return leaf;
}

Tensor Module::register_buffer(const std::string& name, Tensor t) {
  check_new_name(name);
  buffers_.emplace_back(name, t.detach());
  return buffers_.back().second;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> m) {
  check_new_name(name);
  FORGE_CHECK(m != nullptr, "Module: submodule '", name, "' is null");
  children_.emplace_back(name, std::move(m));
}

void Module::collect(const std::string& prefix, bool params, NamedTensors& out) const {
  for (const auto& [n, t] : params ? params_ : buffers_) out.emplace_back(prefix + n, t);
  for (const auto& [n, c] : children_) c->collect(prefix + n + ".", params, out);
}

NamedTensors Module::named_parameters() const {
  NamedTensors out;
  collect("", true, out);
  return out;
}

NamedTensors Module::named_buffers() const {
  NamedTensors out;
  collect("", false, out);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters()) out.push_back(t);
  return out;
}

NamedTensors Module::state_dict() const {
  NamedTensors out = named_parameters();
  NamedTensors b = named_buffers();
  out.insert(out.end(), b.begin(), b.end());
  return out;
}

void Module::load_state_dict(const NamedTensors& state, bool strict) {
  NamedTensors mine = state_dict();
  std::unordered_map<std::string, const Tensor*> given;
  for (const auto& [n, t] : state) {
    FORGE_CHECK(given.emplace(n, &t).second, "load_state_dict: key '", n, "' appears twice");
  }
  // Validate everything before writing anything.
  std::unordered_map<std::string, bool> known;
  for (const auto& [n, t] : mine) {
    known[n] = true;
    auto it = given.find(n);
    if (it == given.end()) {
      FORGE_CHECK(!strict, "load_state_dict: missing key '", n, "' (shape ", t.shape(), ")");
      continue;
    }
    FORGE_CHECK(it->second->shape() == t.shape(), "load_state_dict: '", n, "' has shape ", it->second->shape(),
                " in the state dict but ", t.shape(), " in the model (a checkpoint of another model shape?)");
  }
  if (strict) {
    for (const auto& [n, t] : state)
      FORGE_CHECK(known.count(n), "load_state_dict: unexpected key '", n, "' (shape ", t.shape(), ")");
  }
  NoGradGuard no_grad;
  for (auto& [n, t] : mine) {
    auto it = given.find(n);
    if (it == given.end()) continue;
    Tensor dst = t;
    ops::copy_(dst, *it->second);
  }
}

void Module::convert(const Device* device, const DType* dtype) {
  NoGradGuard no_grad;
  auto move = [&](Tensor& t) {
    const Device d = device ? *device : t.device();
    const DType dt = (dtype && is_floating(t.dtype())) ? *dtype : t.dtype();
    if (d == t.device() && dt == t.dtype()) return;
    t.set_data(ops::to(t.detach(), d, dt));
  };
  for (auto& [n, t] : params_) move(t);
  for (auto& [n, t] : buffers_) move(t);
  for (auto& [n, c] : children_) c->convert(device, dtype);
}

void Module::to(Device device) { convert(&device, nullptr); }
void Module::to(DType dtype) { convert(nullptr, &dtype); }
void Module::to(Device device, DType dtype) { convert(&device, &dtype); }

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, c] : children_) c->train(on);
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const auto& [name, t] : named_parameters()) n += t.numel();
  return n;
}

void Module::zero_grad() {
  for (auto& [n, t] : named_parameters()) t.zero_grad();
}

int block_of_parameter(const std::string& name, const std::string& prefix) {
  if (name.compare(0, prefix.size(), prefix) != 0) return -1;
  size_t i = prefix.size();
  int64_t v = 0;
  const size_t start = i;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9' && i - start < 9) v = v * 10 + (name[i++] - '0');
  if (i == start || i >= name.size() || name[i] != '.') return -1;
  return static_cast<int>(v);
}

}  // namespace forge::nn
