// Hugging Face models in: config.json, the precedence over [model], the weights (contracts in
// hf_model.h).
#include "forge/run/hf_model.h"

#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <variant>

#include "forge/autograd/grad_mode.h"
#include "forge/core/error.h"
#include "forge/io/hf_checkpoint.h"
#include "forge/io/hf_names.h"
#include "forge/io/json_input.h"
#include "forge/ops/join.h"
#include "forge/ops/reduce.h"
#include "forge/ops/view.h"

namespace forge::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kGpt2 = "GPT2LMHeadModel";
constexpr const char* kLlama = "LlamaForCausalLM";

// Typed fields of a config.json object, each error naming the file and the field.
class Fields {
 public:
  Fields(const json& j, std::string origin) : j_(j), origin_(std::move(origin)) {}
  bool has(const char* k) const { return j_.contains(k) && !j_[k].is_null(); }
  int64_t integer(const char* k, std::optional<int64_t> dflt = std::nullopt) const {
    if (!has(k)) return required(k, dflt);
    FORGE_CHECK(j_[k].is_number_integer(), origin_, ": \"", k, "\" must be an integer, got ", j_[k].dump());
    return j_[k].get<int64_t>();
  }
  double number(const char* k, std::optional<double> dflt = std::nullopt) const {
    if (!has(k)) return required(k, dflt);
    FORGE_CHECK(j_[k].is_number(), origin_, ": \"", k, "\" must be a number, got ", j_[k].dump());
    return j_[k].get<double>();
  }
  std::string string(const char* k, std::optional<std::string> dflt = std::nullopt) const {
    if (!has(k)) return required(k, dflt);
    FORGE_CHECK(j_[k].is_string(), origin_, ": \"", k, "\" must be a string, got ", j_[k].dump());
    return j_[k].get<std::string>();
  }
  bool boolean(const char* k, bool dflt) const {
    if (!has(k)) return dflt;
    FORGE_CHECK(j_[k].is_boolean(), origin_, ": \"", k, "\" must be true or false, got ", j_[k].dump());
    return j_[k].get<bool>();
  }
  std::optional<int64_t> optional_id(const char* k) const {
    if (!has(k) || !j_[k].is_number_integer()) return std::nullopt;  // lists of eos ids: not a single id
    return j_[k].get<int64_t>();
  }

 private:
  template <class T> T required(const char* k, const std::optional<T>& dflt) const {
    FORGE_CHECK(dflt.has_value(), origin_, ": \"", k, "\" is missing; a Hugging Face config.json of this "
                "architecture needs it");
    return *dflt;
  }
  const json& j_;
  std::string origin_;
};

std::string architecture_of(const json& j, const std::string& origin) {
  std::vector<std::string> names;
  if (j.contains("architectures") && j["architectures"].is_array())
    for (const auto& a : j["architectures"])
      if (a.is_string()) names.push_back(a.get<std::string>());
  for (const auto& a : names)
    if (a == kGpt2 || a == kLlama) return a;
  const std::string type =
      j.contains("model_type") && j["model_type"].is_string() ? j["model_type"].get<std::string>() : "";
  if (names.empty() && type == "gpt2") return kGpt2;
  if (names.empty() && type == "llama") return kLlama;
  std::string found = names.empty() ? "no \"architectures\"" : "architectures [" + [&] {
    std::string s;
    for (const auto& a : names) s += (s.empty() ? "\"" : ", \"") + a + "\"";
    return s;
  }() + "]";
  FORGE_THROW(origin, ": ", found, " and model_type \"", type, "\" name no architecture forge builds; forge reads ",
              supported_hf_architectures());
}

void parse_gpt2(const Fields& f, HfModel& h, const std::string& origin) {
  auto& m = h.model;
  m.type = "gpt";
  m.vocab_size = f.integer("vocab_size");
  m.block_size = f.integer("n_positions", 1024);
  m.n_layer = f.integer("n_layer");
  m.n_head = f.integer("n_head");
  m.n_embd = f.integer("n_embd");
  m.bias = true;
  h.keys = {{"type", "the architecture GPT2LMHeadModel, model.type"}, {"vocab_size", "vocab_size"},
            {"block_size", "n_positions"}, {"n_layer", "n_layer"}, {"n_head", "n_head"}, {"n_embd", "n_embd"},
            {"bias", "the architecture GPT2LMHeadModel, model.bias"}};
  h.tied_head = f.boolean("tie_word_embeddings", true);
  FORGE_CHECK(h.tied_head, origin, ": tie_word_embeddings = false, but forge's GPT ties its head to the token "
              "embedding (GPT2LMHeadModel's layout); untie it in transformers and save a LLaMA-style model instead");
  if (f.has("n_inner"))
    FORGE_CHECK(f.integer("n_inner") == 4 * m.n_embd, origin, ": n_inner = ", f.integer("n_inner"),
                ", but forge's GPT MLP is 4 x n_embd = ", 4 * m.n_embd, " wide");
  const std::string act = f.string("activation_function", "gelu_new");
  FORGE_CHECK(act == "gelu_new" || act == "gelu_pytorch_tanh", origin, ": activation_function = \"", act,
              "\", but forge's GPT uses the tanh GELU (\"gelu_new\")");
  const double eps = f.number("layer_norm_epsilon", 1e-5);
  FORGE_CHECK(std::abs(eps - 1e-5) <= 1e-12, origin, ": layer_norm_epsilon = ", eps,
              ", but forge's GPT LayerNorm uses 1e-5");
}

void parse_llama(const Fields& f, const json& j, HfModel& h, const std::string& origin) {
  auto& m = h.model;
  m.type = "llama";
  m.vocab_size = f.integer("vocab_size");
  m.block_size = f.integer("max_position_embeddings", 2048);
  m.n_layer = f.integer("num_hidden_layers");
  m.n_head = f.integer("num_attention_heads");
  m.n_kv_head = f.integer("num_key_value_heads", m.n_head);
  m.dim = f.integer("hidden_size");
  m.ffn_hidden = f.integer("intermediate_size");
  m.rope_theta = f.number("rope_theta", 10000.0);
  m.norm_eps = f.number("rms_norm_eps", 1e-6);
  h.keys = {{"type", "the architecture LlamaForCausalLM, model.type"}, {"vocab_size", "vocab_size"},
            {"block_size", "max_position_embeddings"}, {"n_layer", "num_hidden_layers"},
            {"n_head", "num_attention_heads"},     {"n_kv_head", "num_key_value_heads"},
            {"dim", "hidden_size"},                {"ffn_hidden", "intermediate_size"},
            {"rope_theta", "rope_theta"},          {"norm_eps", "rms_norm_eps"},
            {"rope_scaling", f.has("rope_parameters") ? "rope_parameters.rope_type" : "rope_scaling"}};
  h.tied_head = f.boolean("tie_word_embeddings", false);
  FORGE_CHECK(!f.boolean("attention_bias", false) && !f.boolean("mlp_bias", false), origin,
              ": attention_bias / mlp_bias = true, but forge's LLaMA has no biases");
  const std::string act = f.string("hidden_act", "silu");
  FORGE_CHECK(act == "silu", origin, ": hidden_act = \"", act, "\", but forge's LLaMA MLP is SwiGLU (\"silu\")");
  FORGE_CHECK(m.n_head > 0 && m.dim % m.n_head == 0, origin, ": num_attention_heads = ", m.n_head,
              " does not divide hidden_size = ", m.dim);
  if (f.has("head_dim"))
    FORGE_CHECK(f.integer("head_dim") == m.dim / m.n_head, origin, ": head_dim = ", f.integer("head_dim"),
                ", but forge's LLaMA heads are hidden_size / num_attention_heads = ", m.dim / m.n_head, " wide");
  // transformers >= 5 writes "rope_parameters" (rope_theta, rope_type and the scaling's fields in
  // one object) where earlier versions wrote "rope_theta" and "rope_scaling": both are read, the
  // newer first.
  const char* rope = f.has("rope_parameters") ? "rope_parameters" : "rope_scaling";
  if (f.has(rope)) {
    const json& rs = j[rope];
    FORGE_CHECK(rs.is_object(), origin, ": \"", rope, "\" must be an object or null, got ", rs.dump());
    const Fields r(rs, origin + " " + rope);
    if (r.has("rope_theta")) {
      m.rope_theta = r.number("rope_theta");
      for (auto& [key, field] : h.keys)
        if (key == "rope_theta") field = std::string(rope) + ".rope_theta";
    }
    const std::string type = r.has("rope_type") ? r.string("rope_type") : r.string("type", "default");
    if (type != "default") {
      FORGE_CHECK(type == "llama3", origin, ": ", rope, " type \"", type,
                  "\" is not one forge implements; forge reads \"llama3\" (LLaMA-3.1 and later) or none");
      m.rope_scaling = "llama3";
      m.rope_factor = r.number("factor");
      m.rope_low_freq_factor = r.number("low_freq_factor");
      m.rope_high_freq_factor = r.number("high_freq_factor");
      m.rope_original_context = r.integer("original_max_position_embeddings");
      const std::string at = std::string(rope) + ".";
      h.keys.insert(h.keys.end(), {{"rope_factor", at + "factor"},
                                   {"rope_low_freq_factor", at + "low_freq_factor"},
                                   {"rope_high_freq_factor", at + "high_freq_factor"},
                                   {"rope_original_context", at + "original_max_position_embeddings"}});
    }
  }
}

// ---- precedence ----------------------------------------------------------------------------

using Member = std::variant<int64_t nn::ModelConfig::*, double nn::ModelConfig::*, std::string nn::ModelConfig::*,
                            bool nn::ModelConfig::*>;

const std::map<std::string, Member>& members() {
  using M = nn::ModelConfig;
  static const std::map<std::string, Member> table = {
      {"type", &M::type},           {"vocab_size", &M::vocab_size},
      {"block_size", &M::block_size}, {"n_layer", &M::n_layer},
      {"n_head", &M::n_head},       {"n_embd", &M::n_embd},
      {"bias", &M::bias},           {"n_kv_head", &M::n_kv_head},
      {"dim", &M::dim},             {"ffn_hidden", &M::ffn_hidden},
      {"rope_theta", &M::rope_theta}, {"norm_eps", &M::norm_eps},
      {"rope_scaling", &M::rope_scaling}, {"rope_factor", &M::rope_factor},
      {"rope_low_freq_factor", &M::rope_low_freq_factor}, {"rope_high_freq_factor", &M::rope_high_freq_factor},
      {"rope_original_context", &M::rope_original_context}};
  return table;
}

template <class T> std::string text(const T& v) {
  if constexpr (std::is_same_v<T, std::string>) return "\"" + v + "\"";
  else if constexpr (std::is_same_v<T, bool>) return v ? "true" : "false";
  else {
    std::ostringstream os;
    os << v;
    return os.str();
  }
}

}  // namespace

std::string supported_hf_architectures() {
  return std::string(kGpt2) + " (model_type \"gpt2\") and " + kLlama + " (model_type \"llama\")";
}

HfModel parse_hf_config(const json& j, const std::string& origin) {
  FORGE_CHECK(j.is_object(), origin, ": a Hugging Face config.json is a JSON object");
  HfModel h;
  h.architecture = architecture_of(j, origin);
  const Fields f(j, origin);
  if (h.architecture == kGpt2) parse_gpt2(f, h, origin);
  else parse_llama(f, j, h, origin);
  h.bos_token_id = f.optional_id("bos_token_id");
  h.eos_token_id = f.optional_id("eos_token_id");
  return h;
}

HfModel read_hf_config(const fs::path& dir) {
  std::error_code ec;
  FORGE_CHECK(fs::is_directory(dir, ec), "model.init_from = '", dir.string(), "' is not a directory; give a Hugging "
              "Face model directory (config.json, model.safetensors or its index and shards, tokenizer.json)");
  const fs::path path = dir / "config.json";
  FORGE_CHECK(fs::is_regular_file(path, ec), "model.init_from: '", dir.string(), "' has no config.json; give a "
              "Hugging Face model directory (as save_pretrained or forge export write it)");
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  json j;
  j = io::parse_json(ss.str(), path.string());  // Note [untrusted JSON]
  return parse_hf_config(j, path.string());
}

void apply_init_from(RunConfig& cfg) {
  if (cfg.model.init_from.empty()) return;
  const fs::path dir = cfg.model.init_from;
  const HfModel h = read_hf_config(dir);
  const std::string where = (dir / "config.json").string();
  static const nn::ModelConfig defaults;
  for (const auto& [key, field] : h.keys) {
    std::visit(
        [&, key = key, field = field](auto member) {
          auto& mine = cfg.model.*member;
          const auto& theirs = h.model.*member;
          if (mine == defaults.*member || mine == theirs) {
            mine = theirs;
            return;
          }
          if constexpr (std::is_same_v<std::decay_t<decltype(mine)>, int64_t>) {
            if (key == "block_size" && h.model.type == "llama" && mine > 0 && mine < theirs) return;
          }
          FORGE_THROW("model.", key, " = ", text(mine), " contradicts ", field, " = ", text(theirs), " in ", where,
                      " (model.init_from); remove model.", key, " from the config (the model's shape comes from "
                      "config.json) or set it to ", text(theirs));
        },
        members().at(key));
  }
  std::error_code ec;
  for (const char* file : {"forge_tokenizer.json", "tokenizer.json"})
    if (cfg.data.tokenizer.empty() && fs::is_regular_file(dir / file, ec)) cfg.data.tokenizer = (dir / file).string();
}

io::NamedTensors load_init_from(const RunConfig& cfg, const io::NamedShapes& expected) {
  const fs::path dir = cfg.model.init_from;
  const HfModel h = read_hf_config(dir);
  const io::NamedTensors raw = io::load_hf_weights(dir);
  auto ends_with = [](const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  // forge name -> (tensor, the file's name)
  io::TensorItems state;
  std::map<std::string, std::string> file_name;
  for (const auto& [name, t] : raw) {
    if (ends_with(name, ".inv_freq") || ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias")) continue;
    FORGE_CHECK(is_floating(t.dtype()), "model.init_from: tensor '", name, "' in '", dir.string(), "' is ",
                dtype_name(t.dtype()), "; forge loads floating-point weights (f32, bf16, f16)");
    if (h.architecture == kGpt2) {
      if (name == "lm_head.weight") continue;  // tied to transformer.wte.weight
      // A Conv1D weight of the wrong rank fails in the transpose: report it as a shape mismatch below.
      if (t.dim() != 2 && (ends_with(name, "c_attn.weight") || ends_with(name, "c_proj.weight") ||
                           ends_with(name, "c_fc.weight"))) {
        const std::string fname = name.rfind("transformer.", 0) == 0 ? name : "transformer." + name;
        state.emplace_back(fname, t);
        file_name[fname] = name;
        continue;
      }
      for (auto& item : io::gpt2_from_hf({{name, t}})) {
        file_name[item.first] = name;
        state.push_back(std::move(item));
      }
    } else {
      state.emplace_back(name, t);
      file_name[name] = name;
    }
  }
  io::NamedTensors out(std::move(state));
  // Note [tied LLaMA heads].
  if (h.architecture == kLlama && h.tied_head && !out.contains("lm_head.weight") &&
      out.contains("model.embed_tokens.weight")) {
    out.insert("lm_head.weight", out.at("model.embed_tokens.weight"));
    file_name["lm_head.weight"] = "model.embed_tokens.weight (tie_word_embeddings)";
  }
  // Note [grown vocabulary] (hf_model.h): the token embedding and the head of a model whose
  // vocabulary the run grew (a chat template's special tokens) get their new rows at the mean of
  // the file's rows; every other row, and every other tensor, is the file's.
  {
    const std::map<std::string, Shape> want(expected.begin(), expected.end());
    std::vector<io::NamedTensors::value_type> items;
    bool grew = false;
    for (const auto& [name, t] : out) {
      const auto it = want.find(name);
      const bool table = name == "model.embed_tokens.weight" || name == "lm_head.weight" || name == "transformer.wte.weight";
      if (table && it != want.end() && t.dim() == 2 && it->second.size() == 2 && it->second[1] == t.size(1) &&
          it->second[0] > t.size(0) && t.size(0) > 0) {
        NoGradGuard no_grad;
        const Tensor mean = ops::mean(t.to(DType::f32), {0}, /*keepdim=*/true);
        const Tensor extra = ops::expand(mean, {it->second[0] - t.size(0), t.size(1)}).to(t.dtype());
        items.emplace_back(name, ops::cat({t, extra}, 0));
        grew = true;
      } else {
        items.emplace_back(name, t);
      }
    }
    if (grew) out = io::NamedTensors(std::move(items));
  }
  std::vector<std::string> missing, mismatched, unexpected;
  std::set<std::string> known;
  for (const auto& [name, shape] : expected) {
    known.insert(name);
    const Tensor* t = out.find(name);
    if (t == nullptr) {
      missing.push_back("'" + name + "' " + shape_str(shape));
    } else if (t->shape() != shape) {
      const bool conv = file_name[name] != name && h.architecture == kGpt2 && t->dim() == 2;
      mismatched.push_back("'" + file_name[name] + "': " + shape_str(t->shape()) + " in the file, " +
                           shape_str(shape) + " in the model" +
                           (conv ? " (as (out, in); the file holds (in, out))" : ""));
    }
  }
  for (const auto& [name, t] : out)
    if (!known.count(name)) unexpected.push_back("'" + file_name[name] + "' " + shape_str(t.shape()));
  auto list = [](const std::vector<std::string>& items) {
    std::string s;
    for (size_t i = 0; i < items.size() && i < 20; ++i) s += (i ? "; " : "") + items[i];
    if (items.size() > 20) s += "; ... and " + std::to_string(items.size() - 20) + " more";
    return s;
  };
  std::string problems;
  if (!mismatched.empty()) problems += "\n  shape mismatches: " + list(mismatched);
  if (!missing.empty()) problems += "\n  missing tensors: " + list(missing);
  if (!unexpected.empty()) problems += "\n  unexpected tensors: " + list(unexpected);
  FORGE_CHECK(problems.empty(), "model.init_from: the weights in '", dir.string(), "' do not fit the ",
              h.architecture, " its config.json describes:", problems,
              "\n  (config.json and the weights must come from the same model; the [model] keys follow config.json)");
  // Note [checkpoint integrity]: weights with a NaN or an infinity would train to NaN; refused,
  // naming the tensor as the file names it.
  for (const auto& [name, t] : out)
    io::check_finite({{file_name[name], t}}, "model.init_from: the weights in '" + dir.string() + "'",
                     "; a model with non-finite weights cannot be trained (take another checkpoint of it)");
  return out;
}

}  // namespace forge::train
