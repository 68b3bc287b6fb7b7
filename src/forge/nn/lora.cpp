// LoRA adapters on linears: Note [LoRA] in lora.h.
#include "forge/nn/lora.h"

#include <algorithm>
#include <cmath>
#include <typeinfo>
#include <utility>

#include "forge/autograd/grad_mode.h"
#include "forge/core/error.h"
#include "forge/ops/binary.h"
#include "forge/ops/creation.h"
#include "forge/ops/dropout.h"
#include "forge/ops/fp8.h"
#include "forge/ops/matmul.h"

namespace forge::nn {

namespace {

struct TargetName {
  const char* name;
  std::vector<LinearRole> roles;
  const char* peft;  // PEFT's target_modules entry
};

const std::vector<TargetName>& gpt_targets() {
  static const std::vector<TargetName> t = {
      {"c_attn", {LinearRole::attention_qkv}, "c_attn"},
      {"attn.c_proj", {LinearRole::attention_out}, "attn.c_proj"},
      {"c_fc", {LinearRole::mlp_up}, "c_fc"},
      {"mlp.c_proj", {LinearRole::mlp_down}, "mlp.c_proj"},
      {"c_proj", {LinearRole::attention_out, LinearRole::mlp_down}, "c_proj"},
  };
  return t;
}

const std::vector<TargetName>& llama_targets() {
  static const std::vector<TargetName> t = {
      {"q", {LinearRole::attention_q}, "q_proj"},       {"k", {LinearRole::attention_k}, "k_proj"},
      {"v", {LinearRole::attention_v}, "v_proj"},       {"o", {LinearRole::attention_out}, "o_proj"},
      {"gate", {LinearRole::mlp_gate}, "gate_proj"},    {"up", {LinearRole::mlp_up}, "up_proj"},
      {"down", {LinearRole::mlp_down}, "down_proj"},    {"q_proj", {LinearRole::attention_q}, "q_proj"},
      {"k_proj", {LinearRole::attention_k}, "k_proj"},  {"v_proj", {LinearRole::attention_v}, "v_proj"},
      {"o_proj", {LinearRole::attention_out}, "o_proj"}, {"gate_proj", {LinearRole::mlp_gate}, "gate_proj"},
      {"up_proj", {LinearRole::mlp_up}, "up_proj"},     {"down_proj", {LinearRole::mlp_down}, "down_proj"},
  };
  return t;
}

const std::vector<TargetName>& targets_of(Arch arch) { return arch == Arch::gpt ? gpt_targets() : llama_targets(); }

const TargetName* find_target(Arch arch, const std::string& name) {
  for (const TargetName& t : targets_of(arch))
    if (name == t.name) return &t;
  return nullptr;
}

std::string joined(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

// The roles in the order the blocks build them, each once.
std::vector<LinearRole> in_role_order(std::vector<LinearRole> roles) {
  std::sort(roles.begin(), roles.end());
  roles.erase(std::unique(roles.begin(), roles.end()), roles.end());
  return roles;
}

constexpr uint64_t kLoraSeedSalt = 0x4c6f5241ULL;  // "LoRA": the factors' generator, apart from the model's

}  // namespace

std::vector<std::string> lora_target_names(Arch arch) {
  std::vector<std::string> names;
  for (const TargetName& t : targets_of(arch)) names.emplace_back(t.name);
  return names;
}

std::vector<LinearRole> lora_roles(Arch arch, const std::vector<std::string>& targets) {
  FORGE_CHECK(!targets.empty(), "lora.targets is empty; name the linears to adapt, e.g. ",
              arch == Arch::gpt ? "[\"c_attn\"]" : "[\"q\", \"v\"]", " (a ", arch_name(arch), "'s: ",
              joined(lora_target_names(arch)), ")");
  const Arch other = arch == Arch::gpt ? Arch::llama : Arch::gpt;
  std::vector<LinearRole> roles;
  for (const std::string& name : targets) {
    const TargetName* t = find_target(arch, name);
    if (t == nullptr) {
      FORGE_CHECK(find_target(other, name) == nullptr, "lora.targets: '", name, "' is a ", arch_name(other),
                  " linear and matches no linear of a ", arch_name(arch), "; a ", arch_name(arch),
                  "'s targets are ", joined(lora_target_names(arch)));
      FORGE_THROW("lora.targets: '", name, "' is not a linear LoRA can adapt; a ", arch_name(arch),
                  "'s targets are ", joined(lora_target_names(arch)));
    }
    roles.insert(roles.end(), t->roles.begin(), t->roles.end());
  }
  return in_role_order(roles);
}

std::vector<std::string> peft_target_modules(Arch arch, const std::vector<std::string>& targets) {
  const std::vector<LinearRole> roles = lora_roles(arch, targets);
  auto has = [&](LinearRole r) { return std::find(roles.begin(), roles.end(), r) != roles.end(); };
  std::vector<std::string> out;
  // Each selected role under its own name; GPT's two c_proj as the one suffix both answer to.
  const bool both_c_proj = arch == Arch::gpt && has(LinearRole::attention_out) && has(LinearRole::mlp_down);
  for (const TargetName& t : targets_of(arch)) {
    if (t.roles.size() != 1 || !has(t.roles.front())) continue;
    if (both_c_proj && (t.roles.front() == LinearRole::attention_out || t.roles.front() == LinearRole::mlp_down))
      continue;
    if (std::find(out.begin(), out.end(), t.peft) == out.end()) out.emplace_back(t.peft);
  }
  if (both_c_proj) out.emplace_back("c_proj");
  return out;
}

void validate_lora(const LoraOptions& o, Arch arch) {
  FORGE_CHECK(o.rank > 0, "lora.rank must be > 0 (the adapters' inner width r, e.g. 8), got ", o.rank);
  FORGE_CHECK(std::isfinite(o.alpha) && o.alpha > 0, "lora.alpha must be > 0 (the branch is scaled by "
              "lora.alpha / lora.rank; PEFT's default is lora.alpha = lora.rank), got ", o.alpha);
  FORGE_CHECK(o.dropout >= 0 && o.dropout < 1, "lora.dropout must be in [0, 1), got ", o.dropout);
  if (o.enabled()) lora_roles(arch, o.targets);
}

// ---- LoraLinear ------------------------------------------------------------------------------

LoraLinear::LoraLinear(std::shared_ptr<Linear> b, const LoraOptions& o)
    : Linear(*b, SharedParameters{}), base(std::move(b)), rank(o.rank), alpha(o.alpha), dropout(o.dropout),
      scale(o.scale()) {
  FORGE_CHECK(rank > 0, "LoraLinear: rank must be > 0, got ", rank);
}

Tensor LoraLinear::delta(const Tensor& x) const {
  const Tensor in = dropout > 0 ? ops::dropout(x, dropout, is_training()) : x;
  return ops::mul(ops::linear(ops::linear(in, lora_A->weight), lora_B->weight), scale);
}

Tensor LoraLinear::forward(const Tensor& x) const {
  if (!attached()) return base->forward(x);
  // Note [fused LoRA linear] (ops/matmul.cpp): one node, keeping (tokens, r) beyond the frozen
  // linear's own, where the base is a plain linear (not FP8's, not a subclass) and the adapter's
  // input is x itself (no dropout in training: its mask would be another input).
  const bool plain = typeid(*base) == typeid(Linear) && !(base->fp8 && fp8::training_recipe());
  if (plain && !(dropout > 0 && is_training()))
    return ops::lora_linear(x, base->weight, base->bias, lora_A->weight, lora_B->weight, scale);
  return ops::add(base->forward(x), delta(x));
}

void LoraLinear::attach(Generator& gen) {
  FORGE_CHECK(!attached(), "LoraLinear: the adapter of '", name, "' is attached already");
  NoGradGuard no_grad;
  const int64_t in = base->in_features, out = base->out_features;
  const TensorOptions opt{.dtype = weight.dtype(), .device = weight.device()};
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));  // Note [LoRA]: kaiming_uniform_(a = sqrt(5))
  lora_A = register_module("lora_A", std::make_shared<LoraFactor>(uniform({rank, in}, -bound, bound, opt, &gen)));
  lora_B = register_module("lora_B", std::make_shared<LoraFactor>(zeros({out, rank}, opt)));
}

Tensor LoraLinear::merged_weight() const {
  FORGE_CHECK(attached(), "LoraLinear::merged_weight: '", name, "' has no adapter attached");
  NoGradGuard no_grad;
  const DType acc = weight.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const Tensor ba = ops::matmul(lora_B->weight.detach().to(acc), lora_A->weight.detach().to(acc));
  return ops::add(weight.detach().to(acc), ops::mul(ba, scale)).to(weight.dtype());
}

// ---- the model ---------------------------------------------------------------------------------

LayerSpec lora_layer_spec(LayerSpec base, Arch arch, const LoraOptions& o, LoraWrap wrap) {
  const std::vector<LinearRole> roles = lora_roles(arch, o.targets);
  LayerSpec spec = base;
  spec.linear = [inner = std::move(base), roles, o, wrap = std::move(wrap)](
                    int64_t in, int64_t out, bool bias, LinearRole role) -> std::shared_ptr<Linear> {
    std::shared_ptr<Linear> m = inner.make_linear(in, out, bias, role);
    if (std::find(roles.begin(), roles.end(), role) == roles.end()) return m;
    return wrap ? wrap(std::move(m), o) : std::make_shared<LoraLinear>(std::move(m), o);
  };
  return spec;
}

namespace {
void collect_lora(const Module& m, const std::string& prefix, std::vector<std::pair<std::string, const LoraLinear*>>& out) {
  for (const auto& [child, module] : m.named_children()) {
    const std::string path = prefix.empty() ? child : prefix + "." + child;
    if (const auto* l = dynamic_cast<const LoraLinear*>(module.get())) out.emplace_back(path, l);
    collect_lora(*module, path, out);
  }
}
}  // namespace

std::vector<std::pair<std::string, const LoraLinear*>> lora_linears(const Module& model) {
  std::vector<std::pair<std::string, const LoraLinear*>> out;
  collect_lora(model, "", out);
  return out;
}

bool is_lora_parameter(const std::string& name) {
  auto ends_with = [&](const std::string& s) {
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  return ends_with(".lora_A.weight") || ends_with(".lora_B.weight") || name == "lora_A.weight" ||
         name == "lora_B.weight";
}

LoraCounts attach_lora(Module& model, uint64_t seed) {
  Generator gen(seed ^ kLoraSeedSalt);
  LoraCounts n;
  for (const auto& [path, l] : lora_linears(model)) {
    auto* lora = const_cast<LoraLinear*>(l);  // (found through the model, which we hold mutably)
    lora->base->name = path;                  // (FP8's guardrail events name the layer)
    lora->attach(gen);
    ++n.adapters;
  }
  FORGE_CHECK(n.adapters > 0, "LoRA: the model has no linear its lora.targets select; name some of its linears in "
              "lora.targets");
  for (auto& [name, p] : model.named_parameters()) {
    n.total += p.numel();
    if (is_lora_parameter(name)) n.trainable += p.numel();
    else p.requires_grad_(false);
  }
  return n;
}

}  // namespace forge::nn
