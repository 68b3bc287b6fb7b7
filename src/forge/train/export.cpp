// `forge export`: a checkpoint as a Hugging Face model directory (contracts in export.h).
#include "forge/train/export.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "forge/core/error.h"
#include "forge/io/atomic_file.h"
#include "forge/io/checkpoint.h"
#include "forge/io/hf_names.h"
#include "forge/io/safetensors.h"
#include "forge/nn/model_registry.h"
#include "forge/train/language_model.h"
#include "forge/train/run_checkpoint.h"
#include "forge/train/run_data.h"

namespace forge::train {

namespace fs = std::filesystem;
using nlohmann::json;

ExportResult export_model(const ExportOptions& opt) {
  FORGE_CHECK(!opt.checkpoint.empty(), "export: --checkpoint is required (a checkpoint or a run directory)");
  FORGE_CHECK(!opt.out.empty(), "export: --out is required (the directory to write the model to)");
  std::optional<DType> dtype;
  if (!opt.dtype.empty()) {
    FORGE_CHECK(opt.dtype == "f32" || opt.dtype == "bf16" || opt.dtype == "f16", "export: --dtype '", opt.dtype,
                "' is not one of f32, bf16, f16 (or omit it to keep the trained dtype)");
    dtype = parse_dtype(opt.dtype);
  }
  const fs::path dir = resolve_checkpoint(opt.checkpoint, "export: --checkpoint");
  const io::CheckpointData ck = io::load_checkpoint(dir);
  const RunConfig cfg = config_from_json(ck.config, (dir / "state.json").string() + " (config)");
  FORGE_CHECK(cfg.is_language_model(), "export: checkpoint '", dir.string(), "' holds a ", cfg.model.type,
              " model; only language models (gpt, llama) have a Hugging Face layout");
  // Checked against the architecture before anything is written.
  LanguageModel model = build_language_model(cfg);
  io::check_compatible(io::named_shapes(io::NamedTensors(model.module->state_dict())), ck.model,
                       "checkpoint '" + dir.string() + "'");
  io::TensorItems state = ck.model.items();
  json hf;
  // The HF config from the family's shape (nn/model_registry.h): widths, kv-heads and FFN resolved.
  const auto& m = cfg.model;
  const nn::TransformerShape s = nn::transformer_shape(m);
  if (s.arch == nn::Arch::gpt) {
    state = io::gpt2_to_hf(state);
    hf = {{"architectures", {"GPT2LMHeadModel"}}, {"model_type", "gpt2"}, {"vocab_size", s.vocab_size},
          {"n_positions", s.block_size}, {"n_ctx", s.block_size}, {"n_embd", s.d_model}, {"n_layer", s.n_layer},
          {"n_head", s.n_head}, {"activation_function", "gelu_new"}, {"layer_norm_epsilon", 1e-5},
          {"resid_pdrop", m.dropout}, {"embd_pdrop", m.dropout}, {"attn_pdrop", m.dropout},
          {"tie_word_embeddings", s.tied_head()}};
    FORGE_CHECK(s.bias, "export: a GPT without biases (model.bias = false) has no GPT2LMHeadModel layout");
  } else {
    hf = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"vocab_size", s.vocab_size},
          {"hidden_size", s.d_model}, {"intermediate_size", s.ffn_hidden}, {"num_hidden_layers", s.n_layer},
          {"num_attention_heads", s.n_head}, {"num_key_value_heads", s.n_kv_head},
          {"max_position_embeddings", s.block_size}, {"rms_norm_eps", m.norm_eps}, {"rope_theta", m.rope_theta},
          {"hidden_act", "silu"}, {"tie_word_embeddings", s.tied_head()}};
  }
  ExportResult r;
  r.checkpoint = dir.string();
  r.step = ck.step;
  for (auto& [name, t] : state) {
    if (dtype && is_floating(t.dtype())) t = t.to(*dtype);
    r.parameters += t.numel();
  }
  r.tensors = static_cast<int64_t>(state.size());
  hf["torch_dtype"] = dtype ? (*dtype == DType::bf16 ? "bfloat16" : *dtype == DType::f16 ? "float16" : "float32")
                            : (state.empty() || state.front().second.dtype() == DType::f32 ? "float32"
                               : state.front().second.dtype() == DType::bf16             ? "bfloat16"
                                                                                          : "float16");
  const fs::path tok = dir.parent_path().parent_path() / kTokenizerFile;
  io::replace_directory_atomic(opt.out, [&](const fs::path& tmp) {
    io::save_safetensors(tmp / "model.safetensors", state, {{"format", "pt"}, {"forge_step", std::to_string(ck.step)}});
    io::write_file_atomic(tmp / "config.json", hf.dump(2) + "\n");
    std::error_code ec;
    if (fs::is_regular_file(tok, ec)) fs::copy_file(tok, tmp / "forge_tokenizer.json", ec);
  });
  return r;
}

}  // namespace forge::train
