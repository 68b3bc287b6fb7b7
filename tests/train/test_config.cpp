// RunConfig: TOML parsing, defaults, overrides, JSON/TOML round trips, and every rejected input
// with the message that names the key and the fix.
#include <gtest/gtest.h>

#include <set>

#include "forge/core/error.h"
#include "forge/ops/creation.h"
#include "forge/run/config.h"
#include "train_testing.h"

namespace forge::train {
namespace {

using train_testing::Scratch;

// The error message of `f()`, or "" when it does not throw forge::Error.
template <class F> std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A config over a corpus that exists, so data checks pass unless a test breaks them.
class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override { train_testing::write_corpus(scratch.path() / "corpus", 2000); }
  std::string base() const { return train_testing::tiny_toml(scratch.path()); }
  RunConfig parse(const std::string& extra, const std::vector<std::string>& overrides = {}) const {
    return parse_config(base() + extra, "test.toml", overrides);
  }
  std::string error(const std::string& toml, const std::vector<std::string>& overrides = {}) const {
    return error_of([&] { parse_config(toml, "test.toml", overrides); });
  }
  Scratch scratch;
};

TEST_F(ConfigTest, ParsesEverySectionAndKeepsDefaults) {
  const RunConfig c = parse("");
  EXPECT_EQ(c.run.name, "tiny");
  EXPECT_EQ(c.run.seed, 7);
  EXPECT_EQ(c.model.type, "gpt");
  EXPECT_EQ(c.model.n_embd, 32);
  EXPECT_EQ(c.train.steps, 30);
  EXPECT_DOUBLE_EQ(c.optim.lr, 3e-3);
  EXPECT_EQ(c.data.files.size(), 1u);
  // Keys the file leaves out keep their documented defaults.
  const RunConfig d;
  EXPECT_EQ(c.optim.beta2, d.optim.beta2);
  EXPECT_EQ(c.train.grad_accum, 1);
  EXPECT_EQ(c.checkpoint.keep_last, 10);
  EXPECT_EQ(c.run_dir(), (scratch.path() / "runs" / "tiny").string());
  EXPECT_EQ(c.source, "test.toml");
}

TEST_F(ConfigTest, IntegerIsAcceptedForAFloatKey) {
  EXPECT_DOUBLE_EQ(parse("", {"--optim.lr=1"}).optim.lr, 1.0);
  std::string toml = base();
  toml.replace(toml.find("lr = 3e-3"), 9, "lr = 1");
  EXPECT_DOUBLE_EQ(parse_config(toml, "t").optim.lr, 1.0);
}

TEST(RunDevice, AutoCpuCudaAndClearErrors) {
  EXPECT_EQ(resolve_run_device("cpu"), Device::cpu());
  EXPECT_EQ(resolve_run_device("auto"), cuda_device_count() > 0 ? Device::cuda(0) : Device::cpu());
  if (cuda_device_count() == 0) {
    std::string err;
    try {
      resolve_run_device("cuda:1");
    } catch (const Error& e) {
      err = e.what();
    }
    EXPECT_NE(err.find("run.device = 'cuda:1' but no CUDA device is visible"), std::string::npos) << err;
  }
  EXPECT_EQ(resolve_run_dtype("auto", Device::cpu()), DType::f32);
  EXPECT_EQ(resolve_run_dtype("auto", Device::cuda(0)), DType::bf16);
  EXPECT_EQ(resolve_run_dtype("f16", Device::cpu()), DType::f16);
}

TEST_F(ConfigTest, EveryKeyHasATypeDefaultAndDoc) {
  std::set<std::string> seen;
  for (const auto& k : config_keys()) {
    EXPECT_TRUE(seen.insert(k.key).second) << k.key;
    EXPECT_FALSE(k.doc.empty()) << k.key;
    EXPECT_FALSE(k.default_value.empty()) << k.key;
  }
  for (const char* key : {"run.name", "run.dir", "run.seed", "run.device", "run.dtype", "data.source",
                          "train.max_bad_steps", "model.type", "model.vocab_size",
                          "model.block_size", "model.n_layer", "model.n_head", "model.n_embd", "model.dropout",
                          "model.bias", "model.checkpoint_activations", "model.n_kv_head", "model.dim",
                          "model.ffn_hidden", "model.rope_theta", "model.norm_eps", "data.files", "data.tokenizer",
                          "data.vocab_size", "data.val_fraction", "data.shards_dir", "optim.lr", "optim.weight_decay",
                          "optim.beta1", "optim.beta2", "optim.eps", "optim.grad_clip", "schedule.kind",
                          "schedule.warmup_steps", "schedule.min_lr", "train.steps", "train.batch_size",
                          "train.seq_len", "train.grad_accum", "train.log_every", "eval.every", "eval.batches",
                          "checkpoint.every", "checkpoint.keep_last", "dist.tp", "dist.sequence_parallel", "dist.pp", "dist.pp_schedule", "dist.pp_virtual_stages", "dist.pp_layers", "dist.zero_stage",
                          "debug.skip_reductions", "debug.abort_at", "debug.hang_at", "run.allow_tf32",
                          "run.gemm_tuning"})
    EXPECT_TRUE(seen.count(key)) << key;
  const auto it = std::find_if(config_keys().begin(), config_keys().end(), [](const KeyInfo& k) { return k.key == "train.steps"; });
  EXPECT_EQ(it->default_value, "1000");
  EXPECT_EQ(it->type, KeyType::integer);
}

TEST_F(ConfigTest, OverridesParseToTheDeclaredType) {
  const RunConfig c = parse("", {"--train.steps=100", "--optim.lr=3e-4", "--model.bias=false", "--run.name=other",
                                 "train.batch_size=4", "--data.exclude=*.dat,*.u8", "--run.overwrite"});
  EXPECT_EQ(c.train.steps, 100);
  EXPECT_DOUBLE_EQ(c.optim.lr, 3e-4);
  EXPECT_FALSE(c.model.bias);
  EXPECT_EQ(c.run.name, "other");
  EXPECT_EQ(c.train.batch_size, 4);
  EXPECT_EQ(c.data.exclude, (std::vector<std::string>{"*.dat", "*.u8"}));
  EXPECT_TRUE(c.run.overwrite);
  // TOML array syntax; later overrides win.
  const RunConfig d = parse("", {"--data.exclude=[\"a*\", \"b*\"]", "--train.steps=5", "--train.steps=6"});
  EXPECT_EQ(d.data.exclude, (std::vector<std::string>{"a*", "b*"}));
  EXPECT_EQ(d.train.steps, 6);
}

TEST_F(ConfigTest, BadOverridesAreRejected) {
  EXPECT_NE(error(base(), {"--train.steps=ten"}).find("train.steps must be an integer, got 'ten'"), std::string::npos);
  EXPECT_NE(error(base(), {"--train.steps=1.5"}).find("must be an integer"), std::string::npos);
  EXPECT_NE(error(base(), {"--model.bias=maybe"}).find("model.bias must be a boolean"), std::string::npos);
  EXPECT_NE(error(base(), {"--optim.lr=fast"}).find("optim.lr must be a number"), std::string::npos);
  EXPECT_NE(error(base(), {"--train.stpes=5"}).find("unknown key 'train.stpes'; did you mean 'train.steps'?"),
            std::string::npos);
  EXPECT_NE(error(base(), {"--trian.steps=5"}).find("unknown section [trian]; did you mean [train]?"), std::string::npos);
  EXPECT_NE(error(base(), {"--train.steps"}).find("has no value; write --train.steps=VALUE"), std::string::npos);
  EXPECT_NE(error(base(), {"--steps=5"}).find("not of the form --section.key=value"), std::string::npos);
}

TEST_F(ConfigTest, SplitOverridesKeepsOrderAndJoinsSeparateValues) {
  const SplitArgs s = split_overrides({"configs/x.toml", "--train.steps", "100", "--resume", "--optim.lr=1e-3",
                                       "--run.overwrite", "--print-config"});
  EXPECT_EQ(s.overrides, (std::vector<std::string>{"--train.steps=100", "--optim.lr=1e-3", "--run.overwrite"}));
  EXPECT_EQ(s.rest, (std::vector<std::string>{"configs/x.toml", "--resume", "--print-config"}));
  // Values with dots are not overrides; only the key part decides.
  const SplitArgs t = split_overrides({"--resume=runs/a.b", "--checkpoint", "x.y"});
  EXPECT_TRUE(t.overrides.empty());
  EXPECT_EQ(t.rest.size(), 3u);
}

TEST_F(ConfigTest, UnknownKeySuggestsTheNearestValidKey) {
  std::string toml = base();
  toml.replace(toml.find("steps = 30"), 10, "stpes = 30");
  const std::string e = error(toml);
  EXPECT_NE(e.find("unknown key 'train.stpes'; did you mean 'train.steps'?"), std::string::npos) << e;
  EXPECT_NE(e.find("test.toml:"), std::string::npos) << e;  // with the line
  // The right name in the wrong section.
  const std::string wrong_section = error("[train]\nlr = 1e-3\n");
  EXPECT_NE(wrong_section.find("unknown key 'train.lr'; did you mean 'optim.lr'?"), std::string::npos) << wrong_section;
  // Nothing close: the keys of the section are listed.
  const std::string far = error("[eval]\nzzzzzzzzzz = 1\n");
  EXPECT_NE(far.find("the keys of [eval] are: every, batches"), std::string::npos) << far;
  const std::string section = error("[optimizer]\nlr = 1.0\n");
  EXPECT_NE(section.find("unknown section [optimizer]; did you mean [optim]?"), std::string::npos) << section;
  EXPECT_NE(error("[train]\nlog = 1\n").find("did you mean 'train.log_every'?"), std::string::npos);
  // Problems are reported in the order of the file (toml++ tables are sorted by key).
  const std::string first = error("[train]\nsteps = \"many\"\n[aaa]\n");
  EXPECT_NE(first.find("test.toml:2: train.steps must be an integer"), std::string::npos) << first;
  const std::string top = error("steps = 3\n");
  EXPECT_NE(top.find("key 'steps' is outside any section; did you mean 'train.steps'"), std::string::npos) << top;
}

TEST_F(ConfigTest, WrongTypesNameTheKeyAndTheExpectedType) {
  std::string toml = base();
  toml.replace(toml.find("steps = 30"), 10, "steps = \"abc\"");
  const std::string e = error(toml);
  EXPECT_NE(e.find("train.steps must be an integer, got string 'abc'"), std::string::npos) << e;
  EXPECT_NE(e.find("write e.g. train.steps = 1000"), std::string::npos) << e;
  EXPECT_NE(error("[model]\nbias = 1\n").find("model.bias must be a boolean"), std::string::npos);
  EXPECT_NE(error("[data]\nfiles = [1, 2]\n").find("data.files must be a list of strings"), std::string::npos);
  EXPECT_NE(error("[optim]\nlr = \"fast\"\n").find("optim.lr must be a number"), std::string::npos);
  EXPECT_NE(error("[train]\nsteps = 1.5\n").find("train.steps must be an integer, got floating-point 1.5"),
            std::string::npos)
      << error("[train]\nsteps = 1.5\n");
  EXPECT_NE(error("[train\nsteps = 1\n").find("invalid TOML"), std::string::npos);
}

TEST_F(ConfigTest, MissingAndEmptyDataFiles) {
  const std::string missing = error(base(), {"--data.files=" + scratch.str("nope.txt")});
  EXPECT_NE(missing.find("data.files: '" + scratch.str("nope.txt") + "' does not exist"), std::string::npos) << missing;
  train_testing::write_text(scratch.path() / "empty.txt", "");
  const std::string empty = error(base(), {"--data.files=" + scratch.str("empty.txt")});
  EXPECT_NE(empty.find("is empty (0 bytes); remove it from data.files"), std::string::npos) << empty;
  const std::string none = error(base(), {"--data.files=" + scratch.str("*.nothing")});
  EXPECT_NE(none.find("matches no file"), std::string::npos) << none;
  EXPECT_NE(error(base(), {"--data.files=[]"}).find("data.files is empty"), std::string::npos);
  // A directory holding only an empty file gives no data.
  std::filesystem::create_directories(scratch.path() / "hollow");
  train_testing::write_text(scratch.path() / "hollow" / "e.txt", "");
  EXPECT_NE(error(base(), {"--data.files=" + scratch.str("hollow")}).find("gives no non-empty file"), std::string::npos);
}

TEST_F(ConfigTest, ResolveDataFilesExpandsDirectoriesGlobsAndExcludes) {
  DataSection d;
  d.files = {scratch.str("corpus")};
  EXPECT_EQ(resolve_data_files(d).size(), 2u);
  d.exclude = {"*_b.txt"};
  const auto only_a = resolve_data_files(d);
  ASSERT_EQ(only_a.size(), 1u);
  EXPECT_NE(only_a[0].find("corpus_a.txt"), std::string::npos);
  d.files = {scratch.str("corpus/*.txt"), scratch.str("corpus/corpus_a.txt")};
  d.exclude = {};
  EXPECT_EQ(resolve_data_files(d).size(), 2u);  // a file named twice is read once
}

TEST_F(ConfigTest, ShapeAndSizeChecksNameTheKeyAndTheFix) {
  EXPECT_NE(error(base(), {"--data.vocab_size=100"}).find("data.vocab_size = 100 is smaller than 256"),
            std::string::npos);
  EXPECT_NE(error(base(), {"--model.vocab_size=200"}).find("model.vocab_size = 200 is smaller than 256"),
            std::string::npos);
  EXPECT_NE(error(base(), {"--model.n_head=3"}).find("model.n_head = 3 does not divide model.n_embd = 32"),
            std::string::npos);
  EXPECT_NE(error(base(), {"--model.type=llama", "--model.dim=32", "--model.n_head=4", "--model.n_kv_head=3"})
                .find("model.n_kv_head = 3 does not divide model.n_head = 4"),
            std::string::npos);
  EXPECT_NE(error(base(), {"--model.type=llama", "--model.dim=30", "--model.n_head=4"})
                .find("model.n_head = 4 does not divide model.dim = 30"),
            std::string::npos);
  EXPECT_NE(error(base(), {"--train.batch_size=0"}).find("train.batch_size must be > 0, got 0"), std::string::npos);
  EXPECT_NE(error(base(), {"--train.seq_len=-4"}).find("train.seq_len must be > 0, got -4"), std::string::npos);
  EXPECT_NE(error(base(), {"--train.seq_len=64"}).find("train.seq_len = 64 exceeds model.block_size = 32"),
            std::string::npos);
  EXPECT_NE(error(base(), {"--train.steps=0"}).find("train.steps must be > 0"), std::string::npos);
  EXPECT_NE(error(base(), {"--train.grad_accum=0"}).find("train.grad_accum must be > 0"), std::string::npos);
  EXPECT_NE(error(base(), {"--model.type=bert"}).find("model.type = 'bert'"), std::string::npos);
  EXPECT_NE(error(base(), {"--run.device=gpu0"}).find("run.device = 'gpu0' is not a device; use \"auto\", \"cpu\""),
            std::string::npos);
  EXPECT_NE(error(base(), {"--run.dtype=fp8"}).find("run.dtype = 'fp8' is unknown"), std::string::npos);
  EXPECT_NE(error(base(), {"--run.gemm_tuning=on"}).find("run.gemm_tuning = 'on' is unknown; use \"cached\""),
            std::string::npos);
  EXPECT_NE(error(base(), {"--dist.grad_compression=int4"})
                .find("dist.grad_compression = 'int4' is unknown; use \"none\", \"fp8\" or \"powersgd\""),
            std::string::npos);
  EXPECT_NE(error(base(), {"--dist.grad_compression=fp8", "--dist.fp8_error_feedback=yes"})
                .find("dist.fp8_error_feedback = 'yes' is unknown; use \"auto\", \"on\" or \"off\""),
            std::string::npos);
  EXPECT_NE(error(base(), {"--dist.grad_compression=fp8", "--run.dtype=f16"})
                .find("dist.grad_compression = \"fp8\" with run.dtype = \"f16\" is not supported"),
            std::string::npos);
  EXPECT_EQ(parse("", {"--run.gemm_tuning=off"}).run.gemm_tuning, "off");
  EXPECT_EQ(RunConfig().run.gemm_tuning, "cached");
  EXPECT_NE(error(base(), {"--train.max_bad_steps=0"}).find("train.max_bad_steps must be >= 1"), std::string::npos);
  EXPECT_NE(error(base(), {"--data.source=web"}).find("data.source = 'web' is unknown"), std::string::npos);
  EXPECT_NE(error(base(), {"--data.source=random"}).find("needs model.vocab_size > 0"), std::string::npos);
  EXPECT_NE(error(base(), {"--schedule.kind=step"}).find("schedule.kind = 'step' is unknown"), std::string::npos);
  EXPECT_NE(error(base(), {"--schedule.min_lr=1"}).find("schedule.min_lr = 1 must be in [0, optim.lr"),
            std::string::npos);
  EXPECT_NE(error(base(), {"--data.val_fraction=1"}).find("data.val_fraction must be in [0, 1)"), std::string::npos);
  EXPECT_NE(error(base(), {"--checkpoint.keep_last=0"}).find("checkpoint.keep_last must be >= 1"), std::string::npos);
  EXPECT_NE(error(base(), {"--data.tokenizer=" + scratch.str("tok.json")}).find("data.tokenizer: '"),
            std::string::npos);
  EXPECT_NE(error(base(), {"--model.vocab_size=256"}).find("model.vocab_size = 256 is smaller than data.vocab_size = 300"),
            std::string::npos);
}

// Note [global batch]: train.batch_size is the batch of an optimizer step, split into
// train.grad_accum micro-batches; the layout keys and the [debug] switches are checked too.
TEST_F(ConfigTest, BatchLayoutAndDebugKeysAreChecked) {
  EXPECT_NE(error(base(), {"--train.grad_accum=3"}).find("train.batch_size = 8 is not divisible by train.grad_accum = 3"),
            std::string::npos);
  EXPECT_NO_THROW(parse_config(base(), "<test>", {"--train.grad_accum=4"}));
  EXPECT_NE(error(base(), {"--dist.tp=0"}).find("dist.tp must be >= 1"), std::string::npos);
  EXPECT_NE(error(base(), {"--dist.pp=0"}).find("dist.pp must be >= 1"), std::string::npos);
  // Tensor parallelism's own keys and what it does not support yet, by name.
  EXPECT_NE(error(base(), {"--dist.sequence_parallel=true"}).find("dist.sequence_parallel = true splits the sequence"),
            std::string::npos);
  EXPECT_NE(error(base(), {"--dist.tp=2", "--dist.zero_stage=3"}).find("dist.zero_stage = 3 with dist.tp = 2"),
            std::string::npos);
  EXPECT_NE(error(base(), {"--dist.tp=2", "--model.dropout=0.1"}).find("model.dropout = 0.1 with dist.tp = 2"),
            std::string::npos);
  EXPECT_NE(error(base(), {"--dist.tp=3", "--dist.sequence_parallel=true"})
                .find("is not divisible by dist.tp = 3 (sequence parallelism splits each sequence evenly)"),
            std::string::npos);
  EXPECT_TRUE(parse_config(base(), "<test>", {"--dist.tp=2", "--dist.sequence_parallel=true"}).dist.sequence_parallel);
  // Pipeline parallelism's keys and what it does not support yet.
  EXPECT_EQ(parse_config(base(), "<test>", {"--dist.pp=2", "--dist.pp_layers=1,1"}).dist.pp_layers,
            (std::vector<int64_t>{1, 1}));
  EXPECT_NE(error(base(), {"--dist.pp=2", "--dist.pp_layers=[2, 0]"}).find("every stage needs at least one block"),
            std::string::npos);
  EXPECT_NE(config_to_toml(parse_config(base(), "<test>", {"--dist.pp=2", "--dist.pp_layers=1,1"})).find("pp_layers = [1, 1]"),
            std::string::npos);
  EXPECT_NE(error(base(), {"--dist.pp_layers=1,1"}).find("dist.pp_layers sets the blocks of each pipeline stage"),
            std::string::npos);
  EXPECT_NE(error(base(), {"--dist.pp=2", "--dist.pp_layers=1,2"}).find("sums to 3 blocks, but model.n_layer = 2"),
            std::string::npos);
  EXPECT_NE(error(base(), {"--dist.pp=3", "--dist.pp_layers=1,1"}).find("has 2 entries for dist.pp = 3 stages"),
            std::string::npos);
  EXPECT_NE(error(base(), {"--dist.pp=2", "--dist.pp_layers=a"}).find("dist.pp_layers must be a list of integers"),
            std::string::npos);
  EXPECT_NE(error(base(), {"--dist.pp_schedule=zb"}).find("dist.pp_schedule = 'zb' is unknown"), std::string::npos);
  EXPECT_NE(error(base(), {"--dist.pp=2", "--dist.zero_stage=3"}).find("dist.zero_stage = 3 with dist.pp = 2"),
            std::string::npos);
  EXPECT_NE(error(base(), {"--dist.pp=2", "--model.dropout=0.1"}).find("model.dropout = 0.1 with dist.pp = 2"),
            std::string::npos);
  EXPECT_NE(error(base(), {"--debug.abort_at=5"}).find("debug.abort_at = '5' is not <rank>:<step>"), std::string::npos);
  EXPECT_NE(error(base(), {"--debug.hang_at=1:0"}).find("debug.hang_at = '1:0' is not <rank>:<step>"),
            std::string::npos);
  EXPECT_NE(error(base(), {"--debug.skip_reductions=true", "--dist.zero_stage=2"})
                .find("debug.skip_reductions = true works with dist.zero_stage = 0 or 1 only"),
            std::string::npos);
  const RunConfig c = parse_config(base(), "<test>", {"--debug.abort_at=1:5", "--dist.tp=2"});
  EXPECT_EQ(c.dist.tp, 2);
  ASSERT_TRUE(parse_rank_step(c.debug.abort_at, "debug.abort_at").has_value());
  EXPECT_EQ(parse_rank_step(c.debug.abort_at, "debug.abort_at")->rank, 1);
  EXPECT_EQ(parse_rank_step(c.debug.abort_at, "debug.abort_at")->step, 5);
  EXPECT_FALSE(parse_rank_step("", "debug.hang_at").has_value());
  // A switch that changes what a run computes is recorded with the run's config.
  EXPECT_NE(config_to_toml(parse_config(base(), "<test>", {"--debug.skip_reductions=true"})).find("skip_reductions = true"),
            std::string::npos);
}

TEST_F(ConfigTest, JsonAndTomlRoundTrip) {
  const RunConfig c = parse("", {"--train.steps=77", "--data.exclude=a,b", "--optim.lr=0.1", "--model.dropout=0.3",
                                 "--run.name=it's \"quoted\"\tand tabbed"});
  const nlohmann::json j = config_to_json(c);
  EXPECT_EQ(j["train"]["steps"], 77);
  EXPECT_EQ(config_to_json(config_from_json(j)), j);
  const RunConfig back = parse_config(config_to_toml(c), "round-trip.toml");
  EXPECT_EQ(config_to_json(back), j);
  EXPECT_DOUBLE_EQ(back.optim.lr, 0.1);
  EXPECT_DOUBLE_EQ(back.model.dropout, 0.3);
  EXPECT_EQ(back.run.name, "it's \"quoted\"\tand tabbed");
  nlohmann::json bad = j;
  bad["train"]["stpes"] = 1;
  EXPECT_NE(error_of([&] { config_from_json(bad); }).find("did you mean 'train.steps'"), std::string::npos);
}

TEST_F(ConfigTest, LoadConfigReadsAFile) {
  train_testing::write_text(scratch.path() / "run.toml", base());
  EXPECT_EQ(load_config(scratch.str("run.toml"), {"--train.steps=3"}).train.steps, 3);
  EXPECT_NE(error_of([&] { load_config(scratch.str("missing.toml")); }).find("config file '"), std::string::npos);
}

TEST(ConfigEditDistance, Levenshtein) {
  EXPECT_EQ(edit_distance("", ""), 0u);
  EXPECT_EQ(edit_distance("abc", ""), 3u);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(edit_distance("train.stpes", "train.steps"), 2u);
}

}  // namespace
}  // namespace forge::train
