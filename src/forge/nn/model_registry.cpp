// The model-family registry: one entry per model.type (contract in model_registry.h). Each
// family's section holds its key list, its rules, its shape and its build, in that order; the
// table at the end registers them.
#include "forge/nn/model_registry.h"

#include <algorithm>
#include <cmath>

#include "forge/core/error.h"
#include "forge/nn/causal_lm.h"
#include "forge/nn/gpt.h"
#include "forge/nn/llama.h"

namespace forge::nn {

const char* arch_name(Arch a) { return a == Arch::gpt ? "GPT" : "LLaMA"; }

int64_t default_ffn_hidden(Arch arch, int64_t d_model) {
  if (arch == Arch::llama) return LlamaConfig::default_ffn_hidden(d_model);
  GPTConfig c;
  c.n_embd = d_model;
  return c.ffn_hidden();
}

bool ModelFamily::reads(const std::string& key) const {
  return key == "type" || std::find(keys.begin(), keys.end(), key) != keys.end();
}

namespace {

// ---- what every transformer family reads ---------------------------------------------------------

// Note [checked sizes] (core/shape.h): a shape key from a TOML file, a Hugging Face config.json or
// a checkpoint's state.json is bounded before anything is sized from it; the bounds are far above
// any model forge can train (a 10T-parameter model has width 32768).
constexpr int64_t kMaxWidth = int64_t{1} << 20, kMaxLayers = 65536, kMaxHeads = 65536,
                  kMaxVocab = int64_t{1} << 24, kMaxContext = int64_t{1} << 24;
void check_at_most(const char* key, int64_t v, int64_t max) {
  FORGE_CHECK(v <= max, "model.", key, " = ", v, " is above forge's limit of ", max,
              " (Note [checked sizes]: no model forge can train is that large; a value from a file is checked too)");
}

// vocab_size may be 0 here (the tokenizer's size, resolved later); the modules require it > 0.
void check_transformer_keys(const ModelConfig& m) {
  check_at_most("vocab_size", m.vocab_size, kMaxVocab);
  check_at_most("block_size", m.block_size, kMaxContext);
  check_at_most("n_layer", m.n_layer, kMaxLayers);
  check_at_most("n_head", m.n_head, kMaxHeads);
  FORGE_CHECK(m.vocab_size >= 0, "model.vocab_size must be >= 0, got ", m.vocab_size,
              "; set it to the vocabulary size, or 0 for the tokenizer's");
  FORGE_CHECK(m.block_size > 0, "model.block_size must be > 0, got ", m.block_size,
              "; set it to the longest context in tokens, e.g. 1024");
  FORGE_CHECK(m.n_layer > 0, "model.n_layer must be > 0, got ", m.n_layer, "; set the number of blocks, e.g. 12");
  FORGE_CHECK(m.n_head > 0, "model.n_head must be > 0, got ", m.n_head, "; set the number of heads, e.g. 12");
}

bool positive_finite(double v) { return std::isfinite(v) && v > 0; }

// ---- gpt ----------------------------------------------------------------------------------------

void validate_gpt(const ModelConfig& m) {
  check_transformer_keys(m);
  FORGE_CHECK(m.n_embd > 0, "model.n_embd must be > 0, got ", m.n_embd, "; set the width, e.g. 768");
  check_at_most("n_embd", m.n_embd, kMaxWidth);
  FORGE_CHECK(m.n_embd % m.n_head == 0, "model.n_head = ", m.n_head, " does not divide model.n_embd = ", m.n_embd,
              "; choose n_embd a multiple of n_head (each head gets n_embd / n_head channels)");
  FORGE_CHECK(m.dropout >= 0 && m.dropout < 1, "model.dropout must be in [0, 1), got ", m.dropout,
              "; set model.dropout = 0.0 for none");
}

GPTConfig gpt_config(const ModelConfig& m) {
  GPTConfig c;
  c.vocab_size = m.vocab_size;
  c.block_size = m.block_size;
  c.n_layer = m.n_layer;
  c.n_head = m.n_head;
  c.n_embd = m.n_embd;
  c.dropout = m.dropout;
  c.bias = m.bias;
  c.checkpoint_activations = m.checkpoint_activations;
  return c;
}

TransformerShape gpt_shape(const ModelConfig& m) {
  const GPTConfig c = gpt_config(m);
  TransformerShape s;
  s.arch = Arch::gpt;
  s.n_layer = c.n_layer;
  s.d_model = c.n_embd;
  s.n_head = c.n_head;
  s.n_kv_head = c.n_head;
  s.ffn_hidden = c.ffn_hidden();
  s.vocab_size = c.vocab_size;
  s.block_size = c.block_size;
  s.bias = c.bias;
  return s;
}

std::shared_ptr<CausalLM> build_gpt(const ModelConfig& m, uint64_t seed, const LayerSpec& spec) {
  return std::make_shared<GPT>(gpt_config(m), seed, spec);
}

// ---- llama --------------------------------------------------------------------------------------

void validate_llama(const ModelConfig& m) {
  check_transformer_keys(m);
  FORGE_CHECK(m.dim > 0, "model.dim must be > 0, got ", m.dim, "; set the width, e.g. 4096");
  check_at_most("dim", m.dim, kMaxWidth);
  check_at_most("n_kv_head", m.n_kv_head, kMaxHeads);
  check_at_most("ffn_hidden", m.ffn_hidden, 8 * kMaxWidth);
  FORGE_CHECK(m.dim % m.n_head == 0, "model.n_head = ", m.n_head, " does not divide model.dim = ", m.dim,
              "; choose dim a multiple of n_head");
  FORGE_CHECK((m.dim / m.n_head) % 2 == 0, "model.dim / model.n_head = ", m.dim / m.n_head,
              " must be even for rotary embeddings; change model.dim or model.n_head");
  FORGE_CHECK(m.n_kv_head >= 0, "model.n_kv_head must be >= 0, got ", m.n_kv_head,
              "; set a divisor of n_head, or 0 for n_head");
  const int64_t kv = m.n_kv_head == 0 ? m.n_head : m.n_kv_head;
  FORGE_CHECK(m.n_head % kv == 0, "model.n_kv_head = ", m.n_kv_head, " does not divide model.n_head = ", m.n_head,
              "; choose n_kv_head a divisor of n_head (0 = n_head)");
  FORGE_CHECK(m.ffn_hidden >= 0, "model.ffn_hidden must be >= 0 (0 = 8*dim/3), got ", m.ffn_hidden,
              "; set the SwiGLU width, or 0 for 8*dim/3 rounded up to a multiple of 32");
  FORGE_CHECK(positive_finite(m.rope_theta), "model.rope_theta must be > 0, got ", m.rope_theta,
              "; the usual base is 10000");
  FORGE_CHECK(positive_finite(m.norm_eps), "model.norm_eps must be > 0, got ", m.norm_eps, "; e.g. 1e-5");
  FORGE_CHECK(positive_finite(m.init_std), "model.init_std must be > 0, got ", m.init_std, "; e.g. 0.02");
  FORGE_CHECK(m.rope_scaling.empty() || m.rope_scaling == "llama3", "model.rope_scaling = \"", m.rope_scaling,
              "\" is not one forge knows; use \"llama3\" (LLaMA-3.1 and later) or \"\" for none");
  if (m.rope_scaling == "llama3") {
    FORGE_CHECK(positive_finite(m.rope_factor), "model.rope_factor must be > 0, got ", m.rope_factor, "; e.g. 8");
    FORGE_CHECK(positive_finite(m.rope_low_freq_factor) && positive_finite(m.rope_high_freq_factor) &&
                    m.rope_high_freq_factor > m.rope_low_freq_factor,
                "model.rope_low_freq_factor = ", m.rope_low_freq_factor, " and model.rope_high_freq_factor = ",
                m.rope_high_freq_factor, " must be positive with low < high; LLaMA-3 uses 1 and 4");
    FORGE_CHECK(m.rope_original_context > 0, "model.rope_original_context must be > 0, got ",
                m.rope_original_context, "; LLaMA-3 uses 8192");
  }
}

// n_kv_head = 0 is n_head; ffn_hidden = 0 is LlamaConfig::default_ffn_hidden(dim).
TransformerShape llama_shape(const ModelConfig& m) {
  TransformerShape s;
  s.arch = Arch::llama;
  s.n_layer = m.n_layer;
  s.d_model = m.dim;
  s.n_head = m.n_head;
  s.n_kv_head = m.n_kv_head == 0 ? m.n_head : m.n_kv_head;
  s.ffn_hidden = m.ffn_hidden > 0 ? m.ffn_hidden : LlamaConfig::default_ffn_hidden(m.dim);
  s.vocab_size = m.vocab_size;
  s.block_size = m.block_size;
  s.bias = false;
  return s;
}

std::shared_ptr<CausalLM> build_llama(const ModelConfig& m, uint64_t seed, const LayerSpec& spec) {
  const TransformerShape s = llama_shape(m);
  LlamaConfig c;
  c.vocab_size = s.vocab_size;
  c.block_size = s.block_size;
  c.n_layer = s.n_layer;
  c.n_head = s.n_head;
  c.n_kv_head = s.n_kv_head;
  c.dim = s.d_model;
  c.ffn_hidden = s.ffn_hidden;
  c.norm_eps = m.norm_eps;
  c.rope_theta = m.rope_theta;
  c.rope_scaling = rope_scaling(m);
  c.init_std = m.init_std;
  c.checkpoint_activations = m.checkpoint_activations;
  return std::make_shared<Llama>(c, seed, spec);
}

// ---- lenet --------------------------------------------------------------------------------------

void validate_lenet(const ModelConfig&) {}  // reads no [model] key: its shape is fixed, its classes the data's

// ---- the registry -------------------------------------------------------------------------------

const std::vector<ModelFamily>& families() {
  static const std::vector<ModelFamily> table = {
    {"gpt", "GPT-2: learned positions, pre-LN blocks, GELU MLP 4 x n_embd wide, head tied to the token embedding",
     {"vocab_size", "block_size", "n_layer", "n_head", "n_embd", "dropout", "bias", "checkpoint_activations",
      "init_from"},
     "4 x model.n_embd", &validate_gpt, &gpt_shape, &build_gpt},
    {"llama",
     "LLaMA: rotary positions, RMSNorm, grouped-query attention, SwiGLU MLP, untied head (Hugging Face names)",
     {"vocab_size", "block_size", "n_layer", "n_head", "n_kv_head", "dim", "ffn_hidden", "rope_theta", "rope_scaling",
      "rope_factor", "rope_low_freq_factor", "rope_high_freq_factor", "rope_original_context", "norm_eps", "init_std",
      "checkpoint_activations", "init_from"},
     "model.ffn_hidden", &validate_llama, &llama_shape,
     &build_llama},
    {"lenet", "LeNet-5 for 28x28 grey images (Fashion-MNIST); its classes come from the data", {}, "",
     &validate_lenet, nullptr, nullptr},
  };
  return table;
}

}  // namespace

const std::vector<ModelFamily>& model_families() { return families(); }

const ModelFamily* find_model_family(const std::string& type) {
  for (const auto& f : families())
    if (f.type == type) return &f;
  return nullptr;
}

std::string model_type_list(bool transformers_only, const char* last) {
  std::vector<std::string> names;
  for (const auto& f : families())
    if (!transformers_only || f.is_transformer()) names.push_back("\"" + f.type + "\"");
  std::string s;
  for (size_t i = 0; i < names.size(); ++i) s += (i == 0 ? "" : i + 1 == names.size() ? last : ", ") + names[i];
  return s;
}

const ModelFamily& model_family(const std::string& type) {
  const ModelFamily* f = find_model_family(type);
  FORGE_CHECK(f != nullptr, "model.type = '", type, "' is not a model forge trains; use ", model_type_list());
  return *f;
}

ops::RopeScaling rope_scaling(const ModelConfig& m) {
  if (m.rope_scaling != "llama3") return ops::RopeScaling::none();
  return {.factor = m.rope_factor, .low_freq_factor = m.rope_low_freq_factor,
          .high_freq_factor = m.rope_high_freq_factor,
          .original_context = static_cast<double>(m.rope_original_context)};
}

void validate_model(const ModelConfig& m) { model_family(m.type).validate(m); }

TransformerShape transformer_shape(const ModelConfig& m) {
  const ModelFamily& f = model_family(m.type);
  FORGE_CHECK(f.is_transformer(), "model.type = '", m.type, "' is not a transformer language model; use ",
              model_type_list(true));
  f.validate(m);
  return f.shape(m);
}

std::shared_ptr<CausalLM> build_causal_lm(const ModelConfig& m, uint64_t seed, const LayerSpec& spec) {
  const ModelFamily& f = model_family(m.type);
  FORGE_CHECK(f.build != nullptr, "model.type = '", m.type, "' is not a transformer language model; use ",
              model_type_list(true));
  return f.build(m, seed, spec);
}

ModelConfig model_config(const GPTConfig& c) {
  ModelConfig m;
  m.type = "gpt";
  m.vocab_size = c.vocab_size;
  m.block_size = c.block_size;
  m.n_layer = c.n_layer;
  m.n_head = c.n_head;
  m.n_embd = c.n_embd;
  m.dropout = c.dropout;
  m.bias = c.bias;
  m.checkpoint_activations = c.checkpoint_activations;
  return m;
}

ModelConfig model_config(const LlamaConfig& c) {
  ModelConfig m;
  m.type = "llama";
  m.vocab_size = c.vocab_size;
  m.block_size = c.block_size;
  m.n_layer = c.n_layer;
  m.n_head = c.n_head;
  m.n_kv_head = c.n_kv_head;
  m.dim = c.dim;
  m.ffn_hidden = c.ffn_hidden;
  m.rope_theta = c.rope_theta;
  if (c.rope_scaling.enabled()) {
    m.rope_scaling = "llama3";
    m.rope_factor = c.rope_scaling.factor;
    m.rope_low_freq_factor = c.rope_scaling.low_freq_factor;
    m.rope_high_freq_factor = c.rope_scaling.high_freq_factor;
    m.rope_original_context = static_cast<int64_t>(c.rope_scaling.original_context);
  }
  m.norm_eps = c.norm_eps;
  m.init_std = c.init_std;
  m.checkpoint_activations = c.checkpoint_activations;
  return m;
}

}  // namespace forge::nn
