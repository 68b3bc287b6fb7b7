// Hugging Face models in and out (run/hf_model.h, interop/export.h): config.json of both
// families (LLaMA-3's rope_scaling included), the precedence of [model] keys, `forge export`'s
// files (tokenizer, generation config, shards), export -> model.init_from -> the same weights bit
// for bit and the same loss, and the errors (unknown architecture, shape mismatch, missing and
// unexpected tensors).
#include <gtest/gtest.h>

#include <cmath>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "forge/core/error.h"
#include "forge/forge.h"
#include "forge/io/checkpoint.h"
#include "forge/io/hf_checkpoint.h"
#include "forge/ops/loss.h"
#include "forge/run/config.h"
#include "forge/run/hf_model.h"
#include "forge/train/trainer.h"
#include "testing/tensor_testing.h"
#include "train_testing.h"

namespace forge::train {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using train_testing::Scratch;

using forge::testing::error_of;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

json read_json(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}
void write_json(const fs::path& p, const json& j) { std::ofstream(p) << j.dump(2); }

// ---- config.json ---------------------------------------------------------------------------

TEST(HfConfig, Gpt2) {
  const HfModel h = parse_hf_config(
      json::parse(R"({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 50257,
                      "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": null,
                      "activation_function": "gelu_new", "layer_norm_epsilon": 1e-05, "bos_token_id": 50256,
                      "eos_token_id": 50256})"),
      "gpt2/config.json");
  EXPECT_EQ(h.architecture, "GPT2LMHeadModel");
  EXPECT_EQ(h.model.type, "gpt");
  EXPECT_EQ(h.model.vocab_size, 50257);
  EXPECT_EQ(h.model.block_size, 1024);
  EXPECT_EQ(h.model.n_embd, 768);
  EXPECT_EQ(h.model.n_layer, 12);
  EXPECT_EQ(h.model.n_head, 12);
  EXPECT_TRUE(h.tied_head);
  EXPECT_EQ(h.eos_token_id, 50256);
}

// LLaMA-3.2 1B's config.json (as published), rope_scaling included.
TEST(HfConfig, Llama3WithRopeScaling) {
  const HfModel h = parse_hf_config(json::parse(R"({
      "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": false, "mlp_bias": false,
      "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048,
      "intermediate_size": 8192, "max_position_embeddings": 131072, "num_attention_heads": 32,
      "num_hidden_layers": 16, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
      "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                       "original_max_position_embeddings": 8192, "rope_type": "llama3"},
      "tie_word_embeddings": true, "torch_dtype": "bfloat16", "vocab_size": 128256})"),
                                    "llama/config.json");
  const auto& m = h.model;
  EXPECT_EQ(h.architecture, "LlamaForCausalLM");
  EXPECT_EQ(m.type, "llama");
  EXPECT_EQ(m.dim, 2048);
  EXPECT_EQ(m.n_layer, 16);
  EXPECT_EQ(m.n_head, 32);
  EXPECT_EQ(m.n_kv_head, 8);
  EXPECT_EQ(m.ffn_hidden, 8192);
  EXPECT_EQ(m.vocab_size, 128256);
  EXPECT_EQ(m.block_size, 131072);
  EXPECT_DOUBLE_EQ(m.norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(m.rope_theta, 500000.0);
  EXPECT_EQ(m.rope_scaling, "llama3");
  EXPECT_DOUBLE_EQ(m.rope_factor, 32.0);
  EXPECT_DOUBLE_EQ(m.rope_low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(m.rope_high_freq_factor, 4.0);
  EXPECT_EQ(m.rope_original_context, 8192);
  EXPECT_TRUE(h.tied_head);
  EXPECT_EQ(h.bos_token_id, 128000);
  // LLaMA-2 style: no rope_scaling, kv heads defaulting to the heads.
  const HfModel l2 = parse_hf_config(
      json::parse(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 160,
                      "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 300, "rope_scaling": null})"),
      "l2");
  EXPECT_EQ(l2.model.rope_scaling, "");
  EXPECT_EQ(l2.model.n_kv_head, 4);
  EXPECT_FALSE(l2.tied_head);
}

// transformers >= 5 saves theta and the scaling together as "rope_parameters".
TEST(HfConfig, Llama3WithRopeParametersOfTransformers5) {
  const HfModel h = parse_hf_config(json::parse(R"({
      "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 176, "num_attention_heads": 4,
      "num_hidden_layers": 2, "num_key_value_heads": 2, "vocab_size": 1000, "max_position_embeddings": 4096,
      "rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}})"),
                                    "v5/config.json");
  const auto& m = h.model;
  EXPECT_DOUBLE_EQ(m.rope_theta, 500000.0);
  EXPECT_EQ(m.rope_scaling, "llama3");
  EXPECT_DOUBLE_EQ(m.rope_factor, 8.0);
  EXPECT_DOUBLE_EQ(m.rope_low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(m.rope_high_freq_factor, 4.0);
  EXPECT_EQ(m.rope_original_context, 64);
  // Without scaling: the default type, theta from the object.
  const HfModel d = parse_hf_config(json::parse(R"({
      "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 176, "num_attention_heads": 4,
      "num_hidden_layers": 2, "vocab_size": 1000, "rope_parameters": {"rope_theta": 250000.0, "rope_type": "default"}})"),
                                    "v5d/config.json");
  EXPECT_DOUBLE_EQ(d.model.rope_theta, 250000.0);
  EXPECT_EQ(d.model.rope_scaling, "");
}

TEST(HfConfig, ErrorsNameTheSupportedArchitecturesAndTheField) {
  std::string e = error_of([] {
    parse_hf_config(json::parse(R"({"architectures": ["MistralForCausalLM"], "model_type": "mistral"})"), "m.json");
  });
  EXPECT_TRUE(contains(e, "MistralForCausalLM")) << e;
  EXPECT_TRUE(contains(e, "GPT2LMHeadModel")) << e;
  EXPECT_TRUE(contains(e, "LlamaForCausalLM")) << e;
  e = error_of([] {
    parse_hf_config(json::parse(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 1,
        "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 300,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})"), "y.json");
  });
  EXPECT_TRUE(contains(e, "yarn") && contains(e, "llama3")) << e;
  e = error_of([] {
    parse_hf_config(json::parse(R"({"architectures": ["LlamaForCausalLM"], "intermediate_size": 1,
        "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 300})"), "n.json");
  });
  EXPECT_TRUE(contains(e, "\"hidden_size\" is missing")) << e;
}

// ---- runs, exports, init_from --------------------------------------------------------------

class InitFromTest : public ::testing::Test {
 protected:
  void SetUp() override { train_testing::write_corpus(scratch.path() / "corpus"); }
  std::string toml(const std::string& name, int64_t steps, bool llama) const {
    std::string t = train_testing::tiny_toml(scratch.path(), name, steps);
    if (llama) {
      const std::string gpt = "type = \"gpt\"\nblock_size = 32\nn_layer = 2\nn_head = 2\nn_embd = 32\n";
      t.replace(t.find(gpt), gpt.size(),
                "type = \"llama\"\nblock_size = 32\nn_layer = 2\nn_head = 4\nn_kv_head = 2\ndim = 32\n"
                "rope_scaling = \"llama3\"\nrope_factor = 4.0\nrope_original_context = 16\n");
    }
    return t;
  }
  RunConfig config(const std::string& name, int64_t steps, bool llama, const std::vector<std::string>& o = {}) const {
    return parse_config(toml(name, steps, llama), name + ".toml", o);
  }
  TrainResult train(const RunConfig& c) {
    std::ostringstream log;
    TrainResult r = run_training(c, {}, log);
    last_log = log.str();
    return r;
  }
  // Trains `name` for 3 steps and exports it (shards of at most `shard` bytes) to <name>_hf.
  fs::path trained_export(const std::string& name, bool llama, int64_t shard = io::kHfDefaultMaxShardBytes) {
    train(config(name, 3, llama));
    const fs::path out = scratch.path() / (name + "_hf");
    const ExportResult r = export_model({.checkpoint = (scratch.path() / "runs" / name).string(),
                                         .out = out.string(), .dtype = "", .max_shard_bytes = shard});
    EXPECT_EQ(r.step, 3);
    return out;
  }
  Scratch scratch;
  std::string last_log;
};

// The loss of `m` on a fixed batch (tokens 1..), in f32 on the CPU.
double fixed_batch_loss(const LanguageModel& m) {
  std::vector<int64_t> ids(2 * 17);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 37 + 11) % 250);
  const Tensor t = from_vector(ids, {2, 17});
  m.module->eval();
  NoGradGuard no_grad;
  return ops::cross_entropy(m.forward(t.slice(1, 0, 16).contiguous()), t.slice(1, 1, 17).contiguous()).item();
}

// export -> model.init_from: every tensor bit for bit, and the same loss; the trainer starts at
// step 0 from them.
void check_round_trip(const RunConfig& c, const fs::path& run_dir) {
  const auto ck = io::load_checkpoint(*io::find_latest_checkpoint(run_dir));
  LanguageModel loaded = build_language_model(c);
  loaded.module->load_state_dict(load_init_from(c, loaded.whole_shapes()).items());
  LanguageModel source = build_language_model(c);
  source.module->load_state_dict(ck.model.items());
  size_t compared = 0;
  for (const auto& [name, t] : loaded.module->state_dict()) {
    const Tensor& want = ck.model.at(name);
    ASSERT_EQ(t.shape(), want.shape()) << name;
    ASSERT_EQ(t.dtype(), want.dtype()) << name;
    EXPECT_EQ(std::memcmp(t.contiguous().data_ptr(), want.contiguous().data_ptr(),
                          static_cast<size_t>(t.numel()) * element_size(t.dtype())), 0)
        << name << " differs after export -> init_from";
    ++compared;
  }
  EXPECT_EQ(compared, ck.model.size());
  EXPECT_EQ(fixed_batch_loss(loaded), fixed_batch_loss(source));
}

TEST_F(InitFromTest, GptExportShardedRoundTripsBitForBit) {
  const fs::path out = trained_export("gpt", false, 8000);  // ~40k parameters: several shards
  EXPECT_TRUE(fs::exists(out / "model.safetensors.index.json"));
  std::set<std::string> shards;
  const json index = read_json(out / "model.safetensors.index.json");
  for (const auto& [name, file] : index["weight_map"].items())
    shards.insert(file.get<std::string>());
  EXPECT_GE(shards.size(), 2u);
  for (const auto& f : shards) EXPECT_TRUE(fs::exists(out / f)) << f;
  EXPECT_FALSE(fs::exists(out / "model.safetensors"));
  // forge's BPE: converted to tokenizer.json for transformers, and as it is for forge.
  EXPECT_TRUE(fs::exists(out / "tokenizer.json"));
  EXPECT_TRUE(fs::exists(out / "forge_tokenizer.json"));
  const json tok_cfg = read_json(out / "tokenizer_config.json");
  EXPECT_EQ(tok_cfg["eos_token"], "<|endoftext|>");
  EXPECT_EQ(tok_cfg["model_max_length"], 32);
  EXPECT_EQ(tok_cfg["tokenizer_class"], "PreTrainedTokenizerFast");
  const json gen = read_json(out / "generation_config.json");
  EXPECT_EQ(gen["eos_token_id"], read_json(out / "config.json")["eos_token_id"]);
  const RunConfig c = config("gpt_init", 2, false, {"--model.init_from=" + out.string()});
  EXPECT_EQ(c.data.tokenizer, (out / "forge_tokenizer.json").string());
  check_round_trip(c, scratch.path() / "runs" / "gpt");
  // The trainer: a fresh run from the export, at step 0.
  const TrainResult r = train(c);
  EXPECT_EQ(r.start_step, 0);
  EXPECT_EQ(r.final_step, 2);
  EXPECT_TRUE(contains(last_log, "init_from: " + out.string())) << last_log;
}

TEST_F(InitFromTest, LlamaWithRopeScalingRoundTripsBitForBit) {
  const fs::path single = trained_export("llama", true);
  EXPECT_TRUE(fs::exists(single / "model.safetensors"));
  const json hf = read_json(single / "config.json");
  EXPECT_EQ(hf["rope_scaling"]["rope_type"], "llama3");
  EXPECT_EQ(hf["rope_scaling"]["original_max_position_embeddings"], 16);
  RunConfig c = config("llama_init", 2, true, {"--model.init_from=" + single.string()});
  EXPECT_EQ(c.model.rope_scaling, "llama3");
  EXPECT_EQ(c.model.ffn_hidden, hf["intermediate_size"].get<int64_t>());
  check_round_trip(c, scratch.path() / "runs" / "llama");

  // The same checkpoint exported in shards loads the same; so do the first losses of runs from both.
  const fs::path sharded = scratch.path() / "llama_hf_sharded";
  export_model({.checkpoint = (scratch.path() / "runs" / "llama").string(), .out = sharded.string(), .dtype = "",
                .max_shard_bytes = 6000});
  EXPECT_TRUE(fs::exists(sharded / "model.safetensors.index.json"));
  const RunConfig cs = config("llama_init_sharded", 2, true, {"--model.init_from=" + sharded.string()});
  check_round_trip(cs, scratch.path() / "runs" / "llama");
  const TrainResult a = train(c);
  const TrainResult b = train(cs);
  ASSERT_FALSE(a.losses.empty());
  ASSERT_FALSE(b.losses.empty());
  EXPECT_EQ(a.losses[0], b.losses[0]);
}

TEST_F(InitFromTest, TiedLlamaHeadStartsAsTheEmbedding) {
  const fs::path dir = trained_export("tied", true);
  io::NamedTensors w = io::load_hf_weights(dir);
  io::TensorItems kept;
  for (const auto& [name, t] : w)
    if (name != "lm_head.weight") kept.emplace_back(name, t);
  fs::remove(dir / "model.safetensors");
  io::save_hf_weights(dir, kept, io::kHfDefaultMaxShardBytes);
  json hf = read_json(dir / "config.json");
  hf["tie_word_embeddings"] = true;
  write_json(dir / "config.json", hf);
  const RunConfig c = config("tied_init", 2, true, {"--model.init_from=" + dir.string()});
  LanguageModel m = build_language_model(c);
  const io::NamedTensors got = load_init_from(c, m.whole_shapes());
  const Tensor& head = got.at("lm_head.weight");
  const Tensor& emb = got.at("model.embed_tokens.weight");
  EXPECT_EQ(std::memcmp(head.data_ptr(), emb.data_ptr(), static_cast<size_t>(emb.numel()) * 4), 0);
}

TEST_F(InitFromTest, ExplicitKeysThatContradictConfigJsonAreErrors) {
  const fs::path dir = trained_export("prec", false);
  // model.n_embd = 32 agrees; 48 does not.
  std::string e = error_of([&] { config("p1", 2, false, {"--model.init_from=" + dir.string(), "--model.n_embd=48"}); });
  EXPECT_TRUE(contains(e, "model.n_embd = 48") && contains(e, "n_embd = 32") && contains(e, "config.json")) << e;
  e = error_of([&] { config("p2", 2, false, {"--model.init_from=" + dir.string(), "--model.type=llama"}); });
  EXPECT_TRUE(contains(e, "model.type = \"llama\"") && contains(e, "\"gpt\"")) << e;
  // Keys at their defaults take config.json's (the tiny toml's n_layer = 2 is config.json's too).
  const RunConfig c = config("p3", 2, false, {"--model.init_from=" + dir.string(), "--model.vocab_size=0"});
  EXPECT_EQ(c.model.vocab_size, read_json(dir / "config.json")["vocab_size"].get<int64_t>());
  e = error_of([&] { config("p4", 2, false, {"--model.init_from=" + (scratch.path() / "nowhere").string()}); });
  EXPECT_TRUE(contains(e, "model.init_from") && contains(e, "nowhere")) << e;
}

TEST_F(InitFromTest, WeightErrorsListTensorsAndShapes) {
  const fs::path dir = trained_export("bad", false);
  const RunConfig c = config("bad_init", 2, false, {"--model.init_from=" + dir.string()});
  LanguageModel m = build_language_model(c);
  const io::NamedTensors good = io::load_hf_weights(dir);
  auto rewrite = [&](const std::function<void(io::TensorItems&)>& edit) {
    io::TensorItems items = good.items();
    edit(items);
    fs::remove(dir / "model.safetensors");
    io::save_hf_weights(dir, items, io::kHfDefaultMaxShardBytes);
    return error_of([&] { load_init_from(c, m.whole_shapes()); });
  };
  // A shape mismatch names the tensor and both shapes.
  std::string e = rewrite([](io::TensorItems& items) {
    for (auto& [name, t] : items)
      if (name == "transformer.ln_f.weight") t = zeros({33});
  });
  EXPECT_TRUE(contains(e, "'transformer.ln_f.weight'") && contains(e, "[33]") && contains(e, "[32]")) << e;
  // A missing tensor, and an unexpected one, by name.
  e = rewrite([](io::TensorItems& items) {
    std::erase_if(items, [](const auto& item) { return item.first == "transformer.h.1.mlp.c_fc.bias"; });
    items.emplace_back("transformer.h.9.attn.c_attn.bias", zeros({96}));
  });
  EXPECT_TRUE(contains(e, "missing tensors: 'transformer.h.1.mlp.c_fc.bias'")) << e;
  EXPECT_TRUE(contains(e, "unexpected tensors: 'transformer.h.9.attn.c_attn.bias'")) << e;
  // HF's attention-mask buffers are ignored.
  e = rewrite([](io::TensorItems& items) { items.emplace_back("transformer.h.0.attn.bias", ones({1, 1, 32, 32})); });
  EXPECT_EQ(e, "<no error>");
  // Weights with a NaN or an infinity are refused, naming the tensor as the file names it (Note
  // [checkpoint integrity]), also in a Conv1D weight forge transposes.
  for (const double bad : {std::nan(""), double(INFINITY)}) {
    e = rewrite([bad](io::TensorItems& items) {
      for (auto& [name, t] : items)
        if (name == "transformer.h.1.attn.c_attn.weight") {
          t = t.clone();
          t.reshape({-1}).narrow(0, 7, 1).fill_(bad);
        }
    });
    EXPECT_TRUE(contains(e, "model.init_from: the weights in") && contains(e, "transformer.h.1.attn.c_attn.weight") &&
                contains(e, std::isnan(bad) ? "holds NaN" : "holds +inf") && contains(e, "cannot be trained"))
        << e;
  }
}

}  // namespace
}  // namespace forge::train
