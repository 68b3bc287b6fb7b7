// LoRA runs end to end (nn/lora.h, docs/lora.md): the [lora] keys' errors, the frozen base's
// bytes after training (f32 and bf16), an optimizer state of the adapters alone, bit-identical
// resume, and the exported adapter read back into forge (export -> --adapter -> the same logits).
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "forge/forge.h"
#include "forge/interop/export.h"
#include "forge/interop/peft_adapter.h"
#include "forge/interop/sample.h"
#include "forge/io/checkpoint.h"
#include "forge/io/json_input.h"
#include "forge/io/safetensors.h"
#include "forge/nn/lora.h"
#include "forge/run/config.h"
#include "forge/run/language_model.h"
#include "forge/run/run_checkpoint.h"
#include "forge/train/trainer.h"
#include "train_testing.h"

namespace forge::train {
namespace {

namespace fs = std::filesystem;
using train_testing::Scratch;

template <class F> std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The same bytes: dtype, shape and every byte of the data.
bool same_bytes(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const Tensor x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), static_cast<size_t>(x.numel()) * element_size(x.dtype())) == 0;
}

ExportOptions export_to(const std::string& checkpoint, const fs::path& out, bool merge = false) {
  ExportOptions o;
  o.checkpoint = checkpoint;
  o.out = out.string();
  o.merge = merge;
  return o;
}

class LoraTrain : public ::testing::Test {
 protected:
  void SetUp() override { train_testing::write_corpus(scratch.path() / "corpus"); }

  RunConfig config(const std::string& name, int64_t steps, std::vector<std::string> more = {}) {
    std::vector<std::string> o = {"--eval.every=0", "--checkpoint.at_end=true", "--lora.targets=c_attn,c_fc",
                                  "--lora.rank=4", "--lora.alpha=8", "--optim.lr=1e-2"};
    o.insert(o.end(), more.begin(), more.end());
    return parse_config(train_testing::tiny_toml(scratch.path(), name, steps), name + ".toml", o);
  }
  TrainResult train(const RunConfig& c, const TrainOptions& opt = {}) {
    std::ostringstream log;
    TrainResult r = run_training(c, opt, log);
    last_log = log.str();
    return r;
  }
  Scratch scratch;
  std::string last_log;
};

// The MFU's FLOPs per token (docs/train.md): the adapters count 6 per parameter, the frozen base 4
// (no weight gradients). The split of the matmul parameters behind it: the trained ones are the
// adapters, the frozen ones every other parameter but the look-up-only position table.
TEST_F(LoraTrain, MatmulParametersSplitIntoTheAdaptersAndTheFrozenBase) {
  RunConfig c = config("flops", 1);
  c.model.vocab_size = 300;
  const LanguageModel m = build_language_model(c);
  const MatmulParameters n = matmul_parameters_by_training(m);
  const ParameterCounts counts = parameter_counts(m);
  EXPECT_GT(n.trained, 0);
  EXPECT_EQ(n.trained, counts.trainable);
  EXPECT_EQ(n.trained + n.frozen, matmul_parameters(m));
  EXPECT_EQ(n.frozen, counts.total - counts.trainable - c.model.block_size * c.model.n_embd)
      << "all but the adapters and transformer.wpe";
}

TEST_F(LoraTrain, ConfigErrorsNameTheKeyAndTheFix) {
  auto err = [&](std::vector<std::string> o) { return error_of([&] { config("bad", 2, std::move(o)); }); };
  EXPECT_NE(err({"--lora.rank=0"}).find("lora.rank must be > 0"), std::string::npos);
  EXPECT_NE(err({"--lora.rank=-1"}).find("lora.rank must be > 0"), std::string::npos);
  EXPECT_NE(err({"--lora.targets=c_attn,qkv"}).find("lora.targets: 'qkv' is not a linear LoRA can adapt; a GPT's "
                                                     "targets are c_attn"),
            std::string::npos);
  // A target of the other family matches nothing here.
  EXPECT_NE(err({"--lora.targets=q,v"}).find("'q' is a LLaMA linear and matches no linear of a GPT"),
            std::string::npos);
  EXPECT_NE(err({"--lora.dropout=1.5"}).find("lora.dropout must be in [0, 1)"), std::string::npos);
  EXPECT_NE(err({"--lora.alpha=0"}).find("lora.alpha must be > 0"), std::string::npos);
  EXPECT_NE(err({"--lora.rnak=4"}).find("did you mean 'lora.rank'"), std::string::npos);
  // Off (no targets): the other keys are still checked, and nothing is adapted.
  EXPECT_NE(err({"--lora.targets=", "--lora.rank=0"}).find("lora.rank must be > 0"), std::string::npos);
  EXPECT_FALSE(config("off", 2, {"--lora.targets="}).lora.enabled());
}

// The base's bytes after training are the initial ones (frozen: no gradient, no update), in f32
// and in bf16 (the base kept in bf16, the adapters with f32 masters); the adapters moved; the
// optimizer's state holds the adapters alone; the log reports what is trained.
TEST_F(LoraTrain, BaseBytesAreUnchangedAfterTrainingAndOnlyAdaptersHaveOptimizerState) {
  for (const std::string dtype : {"f32", "bf16"}) {
    SCOPED_TRACE(dtype);
    const RunConfig c = config("frozen_" + dtype, 4, {"--run.dtype=" + dtype});
    const TrainResult r = train(c);
    EXPECT_NE(last_log.find("lora: rank 4, alpha 8.00, dropout 0.00 on c_attn, c_fc: 2304 trainable parameters of"),
              std::string::npos)
        << last_log;
    // The initial model of the run's config (its seed, its resolved vocabulary), in the run's dtype.
    const io::CheckpointData ck = io::load_checkpoint(r.last_checkpoint);
    LanguageModel init = build_language_model(config_from_json(ck.config, "the checkpoint's config"));
    init.module->to(dtype == "bf16" ? DType::bf16 : DType::f32);
    int64_t base = 0, adapters = 0;
    for (const auto& [name, t] : init.module->state_dict()) {
      const Tensor& trained = ck.model.at(name);
      if (nn::is_lora_parameter(name)) {
        if (name.find("lora_B") != std::string::npos) {
          EXPECT_FALSE(same_bytes(trained, t)) << name << " did not train";
        }
        ++adapters;
      } else {
        EXPECT_TRUE(same_bytes(trained, t)) << name << " changed";
        ++base;
      }
    }
    EXPECT_EQ(adapters, 2 * 2 * 2);  // 2 blocks x (c_attn, c_fc) x (A, B)
    EXPECT_GT(base, 10);
    // optimizer.safetensors: slots of the adapters' factors only.
    const io::SafetensorsFile opt = io::load_safetensors(fs::path(r.last_checkpoint) / "optimizer.safetensors");
    int64_t state_elems = 0;
    for (const auto& [name, t] : opt.tensors)
      if (name.rfind("state.", 0) == 0 && t.dim() > 0) state_elems += t.numel();
    // AdamW: m and v (and f32 masters for bf16) of the 2304 adapter parameters, nothing of the base.
    EXPECT_EQ(state_elems, (dtype == "bf16" ? 3 : 2) * 2304) << "the optimizer holds more than the adapters";
  }
}

// Resuming a LoRA run from its checkpoint (the whole model, the adapters' optimizer state) gives
// exactly (==) the uninterrupted run's losses and weights.
TEST_F(LoraTrain, ResumeIsBitIdentical) {
  const std::vector<std::string> common = {"--checkpoint.every=3", "--schedule.decay_steps=6", "--lora.dropout=0.1"};
  const TrainResult full = train(config("full", 6, common));
  const TrainResult first = train(config("split", 3, common));
  const TrainResult resumed = train(config("split", 6, common), {.resume = true});
  EXPECT_EQ(resumed.start_step, 3);
  ASSERT_EQ(resumed.losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(resumed.losses[i], full.losses[3 + i]) << "step " << 4 + i;
  const io::CheckpointData a = io::load_checkpoint(full.last_checkpoint), b = io::load_checkpoint(resumed.last_checkpoint);
  for (const auto& [name, t] : a.model) EXPECT_TRUE(same_bytes(t, b.model.at(name))) << name;
  (void)first;
}

// A base run, its Hugging Face export as a LoRA run's model.init_from, the LoRA run's adapter
// exported in PEFT's layout and read back on the base run's checkpoint (forge sample / eval
// --adapter): the LoRA run's logits. And --merge: the merged weights give them too.
TEST_F(LoraTrain, ExportedAdapterRoundTripsIntoForge) {
  const TrainResult base = train(config("base", 3, {"--lora.targets="}));
  const fs::path hf = scratch.path() / "base_hf";
  export_model(export_to(base.last_checkpoint, hf));
  const TrainResult lora = train(config("adapted", 4, {"--model.init_from=" + hf.string(), "--lora.targets=c_attn,c_proj"}));
  EXPECT_NE(last_log.find("init_from: "), std::string::npos);

  const fs::path peft = scratch.path() / "adapter";
  const ExportResult e = export_model(export_to(lora.last_checkpoint, peft));
  EXPECT_EQ(e.tensors, 2 * 3 * 2);  // 2 blocks x (c_attn, attn.c_proj, mlp.c_proj) x (A, B)
  const nlohmann::json cfg = io::read_json_file((peft / kPeftConfigFile).string());
  EXPECT_EQ(cfg["peft_type"], "LORA");
  EXPECT_EQ(cfg["task_type"], "CAUSAL_LM");
  EXPECT_EQ(cfg["r"], 4);
  EXPECT_EQ(cfg["lora_alpha"], 8.0);
  EXPECT_EQ(cfg["bias"], "none");
  EXPECT_EQ(cfg["fan_in_fan_out"], true);  // GPT-2's Conv1D
  EXPECT_EQ(cfg["target_modules"], nlohmann::json({"c_attn", "c_proj"}));
  EXPECT_EQ(cfg["base_model_name_or_path"], hf.string());
  const io::SafetensorsFile w = io::load_safetensors(peft / kPeftWeightsFile);
  EXPECT_EQ(w.tensors.at("base_model.model.transformer.h.0.attn.c_attn.lora_A.weight").shape(), (Shape{4, 32}));
  EXPECT_EQ(w.tensors.at("base_model.model.transformer.h.1.mlp.c_proj.lora_B.weight").shape(), (Shape{32, 4}));

  const Tensor idx = from_vector(std::vector<int64_t>{5, 17, 42, 7, 99, 3, 250, 11}, {1, 8});
  const LoadedCheckpoint trained = load_language_checkpoint(lora.last_checkpoint, "test");
  const LoadedCheckpoint applied = load_language_checkpoint(base.last_checkpoint, "test", "cpu", "f32", peft.string());
  NoGradGuard no_grad;
  trained.model.module->eval();
  applied.model.module->eval();
  const std::vector<double> want = trained.model.forward(idx).to_vector<double>();
  EXPECT_EQ(applied.model.forward(idx).to_vector<double>(), want);
  // The base as its Hugging Face directory (forge export's, as a PEFT user holds it) with the
  // adapter: the same logits.
  const LoadedCheckpoint from_hf = load_language_checkpoint(hf.string(), "test", "cpu", "f32", peft.string());
  from_hf.model.module->eval();
  EXPECT_EQ(from_hf.model.forward(idx).to_vector<double>(), want);
  EXPECT_EQ(from_hf.step, 0);
  // The base alone differs (the adapters did something), from either kind of directory.
  const LoadedCheckpoint plain = load_language_checkpoint(base.last_checkpoint, "test");
  const LoadedCheckpoint plain_hf = load_language_checkpoint(hf.string(), "test");
  plain_hf.model.module->eval();
  EXPECT_EQ(plain_hf.model.forward(idx).to_vector<double>(), plain.model.forward(idx).to_vector<double>());
  EXPECT_NE(plain.model.forward(idx).to_vector<double>(), want);

  // --merge: the base with W + alpha / r B A; an export of the model without LoRA.
  const fs::path merged = scratch.path() / "merged";
  export_model(export_to(lora.last_checkpoint, merged, true));
  EXPECT_TRUE(fs::exists(merged / "config.json"));
  const io::TensorItems m = merge_lora_state(io::load_checkpoint(lora.last_checkpoint).model.items(), trained.cfg.lora);
  plain.model.module->load_state_dict(m);
  const std::vector<double> got = plain.model.forward(idx).to_vector<double>();
  ASSERT_EQ(got.size(), want.size());
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]));
  EXPECT_LT(worst, 1e-5);
  // --merge without LoRA is refused.
  EXPECT_NE(error_of([&] {
              export_model(export_to(base.last_checkpoint, scratch.path() / "x", true));
            }).find("--merge merges a LoRA run's adapters"),
            std::string::npos);
}

}  // namespace
}  // namespace forge::train
