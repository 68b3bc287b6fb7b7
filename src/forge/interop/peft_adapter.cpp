// PEFT's LoRA layout out and in (contracts in peft_adapter.h).
#include "forge/interop/peft_adapter.h"

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "forge/autograd/grad_mode.h"
#include "forge/core/error.h"
#include "forge/io/json_input.h"
#include "forge/io/safetensors.h"
#include "forge/nn/model_registry.h"
#include "forge/ops/binary.h"
#include "forge/ops/matmul.h"

namespace forge::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {
bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}
constexpr const char* kA = ".lora_A.weight";
constexpr const char* kB = ".lora_B.weight";
}  // namespace

json peft_adapter_config(const RunConfig& cfg) {
  FORGE_CHECK(cfg.lora.enabled(), "export: the run has no LoRA adapters (lora.targets is empty)");
  const nn::Arch arch = nn::transformer_shape(cfg.model).arch;
  return {{"peft_type", "LORA"},
          {"task_type", "CAUSAL_LM"},
          {"base_model_name_or_path", cfg.model.init_from},
          {"r", cfg.lora.rank},
          {"lora_alpha", cfg.lora.alpha},
          {"lora_dropout", cfg.lora.dropout},
          {"target_modules", nn::peft_target_modules(arch, cfg.lora.targets)},
          {"bias", "none"},
          // GPT-2's linears are transformers' Conv1D (weight (in, out)): PEFT's fan_in_fan_out.
          {"fan_in_fan_out", arch == nn::Arch::gpt},
          {"inference_mode", true},
          {"init_lora_weights", true},
          {"use_rslora", false},
          {"use_dora", false},
          {"modules_to_save", nullptr},
          {"layers_to_transform", nullptr},
          {"rank_pattern", json::object()},
          {"alpha_pattern", json::object()},
          {"revision", nullptr}};
}

io::TensorItems peft_adapter_tensors(const io::TensorItems& state) {
  io::TensorItems out;
  for (const auto& [name, t] : state)
    if (nn::is_lora_parameter(name)) out.emplace_back(kPeftPrefix + name, t);
  FORGE_CHECK(!out.empty(), "export: the checkpoint holds no LoRA factors (*.lora_A.weight / *.lora_B.weight)");
  return out;
}

io::TensorItems merge_lora_state(const io::TensorItems& state, const nn::LoraOptions& o) {
  std::map<std::string, Tensor> by_name(state.begin(), state.end());
  NoGradGuard no_grad;
  io::TensorItems out;
  for (const auto& [name, t] : state) {
    if (nn::is_lora_parameter(name)) continue;
    if (!ends_with(name, ".weight")) {
      out.emplace_back(name, t);
      continue;
    }
    const std::string linear = name.substr(0, name.size() - 7);
    const auto a = by_name.find(linear + kA), b = by_name.find(linear + kB);
    if (a == by_name.end() || b == by_name.end()) {
      out.emplace_back(name, t);
      continue;
    }
    const DType acc = t.dtype() == DType::f64 ? DType::f64 : DType::f32;
    const Tensor ba = ops::matmul(b->second.to(acc), a->second.to(acc));
    FORGE_CHECK(ba.shape() == t.shape(), "merge: '", linear, "': B A has shape ", ba.shape(), ", the weight ",
                t.shape());
    out.emplace_back(name, ops::add(t.to(acc), ops::mul(ba, o.scale())).to(t.dtype()));
  }
  return out;
}

PeftAdapter load_peft_adapter(const std::string& dir) {
  const fs::path d = dir;
  std::error_code ec;
  FORGE_CHECK(fs::is_regular_file(d / kPeftConfigFile, ec) && fs::is_regular_file(d / kPeftWeightsFile, ec),
              "--adapter: '", dir, "' is not a PEFT LoRA directory (it needs ", kPeftConfigFile, " and ",
              kPeftWeightsFile, "; forge export of a LoRA run writes them)");
  const json c = io::read_json_file((d / kPeftConfigFile).string());
  auto text = [&](const char* key, const std::string& def) {
    return c.contains(key) && c[key].is_string() ? c[key].get<std::string>() : def;
  };
  const std::string where = (d / kPeftConfigFile).string();
  FORGE_CHECK(text("peft_type", "") == "LORA", where, ": peft_type '", text("peft_type", ""),
              "' is not \"LORA\"; forge reads LoRA adapters only");
  FORGE_CHECK(text("bias", "none") == "none", where, ": bias '", text("bias", ""), "' is not \"none\"; forge's "
              "adapters train no biases");
  for (const char* flag : {"use_rslora", "use_dora"})
    FORGE_CHECK(!c.contains(flag) || !c[flag].is_boolean() || !c[flag].get<bool>(), where, ": ", flag,
                " = true is not what forge computes (y = base(x) + B A x alpha / r)");
  for (const char* pattern : {"rank_pattern", "alpha_pattern"})
    FORGE_CHECK(!c.contains(pattern) || c[pattern].is_null() || c[pattern].empty(), where, ": ", pattern,
                " (ranks or alphas per module) is not supported; forge's adapters share one r and lora_alpha");
  FORGE_CHECK(c.contains("r") && c["r"].is_number_integer() && c.contains("target_modules") &&
                  c["target_modules"].is_array(),
              where, ": needs an integer \"r\" and a list \"target_modules\"");
  PeftAdapter a;
  a.options.rank = c["r"].get<int64_t>();
  a.options.alpha = c.contains("lora_alpha") && c["lora_alpha"].is_number() ? c["lora_alpha"].get<double>() : 8.0;
  a.options.dropout = c.contains("lora_dropout") && c["lora_dropout"].is_number() ? c["lora_dropout"].get<double>() : 0.0;
  for (const auto& t : c["target_modules"]) {
    FORGE_CHECK(t.is_string(), where, ": target_modules holds a non-string entry");
    a.options.targets.push_back(t.get<std::string>());
  }
  a.base_model = text("base_model_name_or_path", "");
  const io::SafetensorsFile f = io::load_safetensors(d / kPeftWeightsFile);
  const std::string prefix = kPeftPrefix;
  for (const auto& [name, t] : f.tensors) {
    FORGE_CHECK(name.rfind(prefix, 0) == 0 && nn::is_lora_parameter(name), (d / kPeftWeightsFile).string(), ": '",
                name, "' is not a LoRA factor under ", prefix, " (<module>.lora_A.weight / .lora_B.weight)");
    a.tensors.emplace_back(name.substr(prefix.size()), t);
  }
  return a;
}

}  // namespace forge::train
