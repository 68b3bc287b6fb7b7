// `forge export`: a checkpoint as a Hugging Face model directory (contracts in export.h).
#include "forge/interop/export.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <memory>
#include <optional>
#include <set>

#include "forge/core/error.h"
#include "forge/data/bpe_hf.h"
#include "forge/data/tokenizer.h"
#include "forge/io/atomic_file.h"
#include "forge/io/checkpoint.h"
#include "forge/io/hf_names.h"
#include "forge/io/json_input.h"
#include "forge/io/output_guard.h"
#include "forge/io/safetensors.h"
#include "forge/interop/peft_adapter.h"
#include "forge/nn/model_registry.h"
#include "forge/run/language_model.h"
#include "forge/run/run_checkpoint.h"
#include "forge/run/run_data.h"

namespace forge::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kExportMarker = "forge_export.json";

// The marker of an earlier export in `out`, or null.
json earlier_export(const fs::path& out) {
  std::error_code ec;
  if (!fs::is_regular_file(out / kExportMarker, ec)) return json();
  try {
    json j = io::read_json_file((out / kExportMarker).string());
    if (j.is_object() && j.value("format", std::string()) == "forge-export" && j.contains("files") &&
        j["files"].is_array()) {
      for (const auto& f : j["files"])
        if (!f.is_string() || f.get<std::string>().find('/') != std::string::npos) return json();
      return j;
    }
  } catch (const std::exception&) {
  }
  return json();
}

}  // namespace

ExportResult export_model(const ExportOptions& opt) {
  FORGE_CHECK(!opt.checkpoint.empty(), "export: --checkpoint is required (a checkpoint or a run directory)");
  FORGE_CHECK(!opt.out.empty(), "export: --out is required (the directory to write the model to)");
  std::optional<DType> dtype;
  if (!opt.dtype.empty()) {
    FORGE_CHECK(opt.dtype == "f32" || opt.dtype == "bf16" || opt.dtype == "f16", "export: --dtype '", opt.dtype,
                "' is not one of f32, bf16, f16 (or omit it to keep the trained dtype)");
    dtype = parse_dtype(opt.dtype);
  }
  // Note [nothing deletes what it did not write]: what is in --out, before any work.
  const fs::path out = opt.out;
  const json earlier = earlier_export(out);
  std::set<std::string> earlier_files = {kExportMarker};
  if (earlier.is_object())
    for (const auto& f : earlier["files"]) earlier_files.insert(f.get<std::string>());
  const bool replace_earlier = io::check_output_dir(out, "export: --out", [&](const fs::path& entry) {
    return earlier.is_object() && earlier_files.count(entry.filename().string()) > 0;
  }, opt.force);
  std::error_code ec;
  const bool into_existing = !replace_earlier && fs::exists(out, ec) && !fs::is_empty(out, ec);  // --force
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
  // A LoRA run (nn/lora.h): its adapters in PEFT's layout, or with --merge the model it adapted
  // with B A alpha / r merged into each adapted weight, exported as any model is.
  FORGE_CHECK(!opt.merge || cfg.lora.enabled(), "export: --merge merges a LoRA run's adapters; checkpoint '",
              dir.string(), "' has none (lora.targets is empty): drop --merge");
  const bool adapter = cfg.lora.enabled() && !opt.merge;
  if (cfg.lora.enabled()) state = opt.merge ? merge_lora_state(state, cfg.lora) : peft_adapter_tensors(state);
  json hf;
  // The HF config from the family's shape (nn/model_registry.h): widths, kv-heads and FFN resolved.
  const auto& m = cfg.model;
  const nn::TransformerShape s = nn::transformer_shape(m);
  if (adapter) {
    hf = peft_adapter_config(cfg);
  } else if (s.arch == nn::Arch::gpt) {
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
  if (!adapter && s.arch == nn::Arch::llama && m.rope_scaling == "llama3")
    hf["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", m.rope_factor},
                          {"low_freq_factor", m.rope_low_freq_factor}, {"high_freq_factor", m.rope_high_freq_factor},
                          {"original_max_position_embeddings", m.rope_original_context}};
  ExportResult r;
  r.checkpoint = dir.string();
  r.step = ck.step;
  for (auto& [name, t] : state) {
    if (dtype && is_floating(t.dtype())) t = t.to(*dtype);
    r.parameters += t.numel();
  }
  r.tensors = static_cast<int64_t>(state.size());
  if (!adapter)
    hf["torch_dtype"] = dtype ? (*dtype == DType::bf16 ? "bfloat16" : *dtype == DType::f16 ? "float16" : "float32")
                              : (state.empty() || state.front().second.dtype() == DType::f32 ? "float32"
                                 : state.front().second.dtype() == DType::bf16             ? "bfloat16"
                                                                                            : "float16");
  // The run's tokenizer (its run directory's) and its bos/eos tokens.
  const fs::path tok_path = dir.parent_path().parent_path() / kTokenizerFile;
  std::shared_ptr<const data::Tokenizer> tok;
  if (fs::is_regular_file(tok_path, ec)) tok = data::load_tokenizer(tok_path.string());
  json gen = json::object(), tok_cfg = json::object();
  if (tok) {
    std::optional<std::string> eos = cfg.data.eos_token == kAutoEosToken ? tok->eos_token()
                                     : cfg.data.eos_token.empty()        ? std::nullopt
                                                                         : std::optional(cfg.data.eos_token);
    if (eos && !tok->token_id(*eos)) eos.reset();
    std::optional<std::string> bos;
    if (const auto id = tok->bos_id())
      for (const auto& sp : tok->special_tokens())
        if (tok->token_id(sp) == id) bos = sp;
    tok_cfg = {{"tokenizer_class", "PreTrainedTokenizerFast"}, {"model_max_length", s.block_size},
               {"clean_up_tokenization_spaces", false}};
    if (bos) tok_cfg["bos_token"] = *bos, gen["bos_token_id"] = *tok->token_id(*bos);
    if (eos) tok_cfg["eos_token"] = *eos, gen["eos_token_id"] = *tok->token_id(*eos);
    for (const char* k : {"bos_token_id", "eos_token_id"})
      if (gen.contains(k) && !adapter) hf[k] = gen[k];
  }
  auto write_all = [&](const fs::path& tmp) {
    if (adapter) {  // PEFT's two files (interop/peft_adapter.h)
      io::save_safetensors(tmp / kPeftWeightsFile, state, {{"format", "pt"}, {"forge_step", std::to_string(ck.step)}});
      io::write_file_atomic(tmp / kPeftConfigFile, hf.dump(2) + "\n");
      r.files = {kPeftWeightsFile, kPeftConfigFile};
    } else {
      r.files = io::save_hf_weights(tmp, state, opt.max_shard_bytes,
                                    {{"format", "pt"}, {"forge_step", std::to_string(ck.step)}});
      io::write_file_atomic(tmp / "config.json", hf.dump(2) + "\n");
      r.files.push_back("config.json");
    }
    if (!gen.empty() && !adapter) {
      io::write_file_atomic(tmp / "generation_config.json", gen.dump(2) + "\n");
      r.files.push_back("generation_config.json");
    }
    // A Hugging Face file as it is; forge's BPE converted (Note [forge BPE as tokenizer.json]).
    const auto* bpe = dynamic_cast<const data::BpeTokenizer*>(tok.get());
    if (tok && (tok->kind() == "hf" || bpe)) {
      io::write_file_atomic(tmp / "tokenizer.json", bpe ? data::bpe_to_hf_tokenizer_json(*bpe) : tok->serialized());
      io::write_file_atomic(tmp / "tokenizer_config.json", tok_cfg.dump(2) + "\n");
      r.files.insert(r.files.end(), {"tokenizer.json", "tokenizer_config.json"});
    }
    if (tok && tok->kind() != "hf") {  // forge's own serialisation too, which model.init_from prefers
      io::write_file_atomic(tmp / "forge_tokenizer.json", tok->serialized());
      r.files.push_back("forge_tokenizer.json");
    }
    io::write_file_atomic(tmp / kExportMarker, json{{"format", "forge-export"}, {"checkpoint", r.checkpoint},
                                                    {"step", r.step}, {"files", r.files}}
                                                   .dump(2) + "\n");
  };
  if (into_existing) {
    write_all(out);  // --force: file by file, the directory's other files kept
  } else {
    io::replace_directory_atomic(out, write_all);
  }
  return r;
}

}  // namespace forge::train
