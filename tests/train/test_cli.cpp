// The `forge` executable: train/sample/tokenize parse their arguments and overrides, errors
// print "forge: error: ..." with exit status 1, usage errors exit 2. Runs the binary built
// next to this test (<build>/forge, beside <build>/tests/forge_tests).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <optional>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "forge/data/bpe.h"
#include "forge/data/shards.h"
#include "testing/cli_testing.h"
#include "train_testing.h"

namespace forge::train {
namespace {

namespace fs = std::filesystem;
using testing::CliRun;
using testing::run_forge;
using testing::Stderr;
using train_testing::Scratch;

class CliTest : public testing::ForgeCliTest {
 protected:
  void SetUp() override {
    testing::ForgeCliTest::SetUp();
    train_testing::write_corpus(scratch.path() / "corpus");
    config = scratch.str("run.toml");
    train_testing::write_text(config, train_testing::tiny_toml(scratch.path(), "cli", 6));
  }
  Scratch scratch;
  std::string config;
};

TEST_F(CliTest, CliTrainParsesOverrides) {
  const CliRun r = run_forge({"train", config, "--train.steps=42", "--optim.lr", "0.01", "--print-config"});
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("[train]\nsteps = 42\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("lr = 0.01\n"), std::string::npos) << r.out;
}

TEST_F(CliTest, CliTrainDeviceFlagIsRunDevice) {
  const CliRun r = run_forge({"train", config, "--device", "cuda:1", "--print-config"});
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("device = 'cuda:1'\n"), std::string::npos) << r.out;
  const CliRun bad = run_forge({"train", config, "--device=gpu0"});
  EXPECT_EQ(bad.status, 1) << bad.out;
  EXPECT_NE(bad.out.find("run.device = 'gpu0' is not a device"), std::string::npos) << bad.out;
}

// A layout this world cannot hold is refused before any work (no run directory), naming the
// world size and the fix (parallel::Mesh::carve through train::run_layout).
TEST_F(CliTest, CliTensorParallelOnOneProcessIsRefusedBeforeAnyWork) {
  const CliRun r = run_forge({"train", config, "--dist.tp=2"});
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("forge: error: dist.tp = 2 x dist.pp = 1 = 2 ranks per model replica, but the world has 1 "
                       "process"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("forge launch --nproc-per-node 2"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(scratch.path() / "runs" / "cli")) << "work was done before the check";
  const CliRun pp = run_forge({"train", config, "--dist.pp=3"});  // 2 blocks
  EXPECT_EQ(pp.status, 1) << pp.out;
  EXPECT_NE(pp.out.find("the world has 1 process"), std::string::npos) << pp.out;
}

// forge export: --max-shard-size shards the weights (and the files are listed); a bad size is an
// error naming the option before anything is written; the export starts a run through
// --model.init_from (--print-config shows the shape it took).
TEST_F(CliTest, CliExportShardsAndInitFromReadsIt) {
  ASSERT_EQ(run_forge({"train", config}).status, 0);
  const std::string out = scratch.str("hf");
  const CliRun e =
      run_forge({"export", "--checkpoint", scratch.str("runs/cli"), "--out", out, "--max-shard-size", "20KB"});
  ASSERT_EQ(e.status, 0) << e.out;
  EXPECT_NE(e.out.find("model.safetensors.index.json"), std::string::npos) << e.out;
  EXPECT_NE(e.out.find("tokenizer.json"), std::string::npos) << e.out;
  EXPECT_TRUE(fs::exists(fs::path(out) / "model.safetensors.index.json")) << e.out;
  EXPECT_FALSE(fs::exists(fs::path(out) / "model.safetensors")) << e.out;
  const CliRun bad = run_forge({"export", "--checkpoint", scratch.str("runs/cli"), "--out", scratch.str("hf2"),
                                "--max-shard-size", "lots"});
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.out.find("--max-shard-size = 'lots' is not a size"), std::string::npos) << bad.out;
  EXPECT_FALSE(fs::exists(scratch.str("hf2")));
  const CliRun p = run_forge({"train", config, "--model.init_from=" + out, "--print-config"});
  EXPECT_EQ(p.status, 0) << p.out;
  EXPECT_NE(p.out.find("init_from = '" + out + "'"), std::string::npos) << p.out;
  const CliRun clash = run_forge({"train", config, "--model.init_from=" + out, "--model.n_layer=3"});
  EXPECT_EQ(clash.status, 1);
  EXPECT_NE(clash.out.find("model.n_layer = 3 contradicts n_layer = 2"), std::string::npos) << clash.out;
}

TEST_F(CliTest, CliErrorsExitOneAndUsageErrorsTwo) {
  const CliRun typo = run_forge({"train", config, "--train.stpes=5"});
  EXPECT_EQ(typo.status, 1) << typo.out;
  EXPECT_NE(typo.out.find("forge: error: override '--train.stpes=5': unknown key 'train.stpes'; did you mean "
                             "'train.steps'?"),
            std::string::npos)
      << typo.out;
  const CliRun type = run_forge({"train", config, "--train.steps=many"});
  EXPECT_EQ(type.status, 1);
  EXPECT_NE(type.out.find("train.steps must be an integer, got 'many'"), std::string::npos) << type.out;
  const CliRun missing = run_forge({"train", scratch.str("none.toml")});
  EXPECT_EQ(missing.status, 1);
  EXPECT_NE(missing.out.find("forge: error: config file '"), std::string::npos) << missing.out;

  EXPECT_EQ(run_forge({"train"}).status, 2);                        // no config
  EXPECT_EQ(run_forge({"frobnicate"}).status, 2);                   // no such command
  EXPECT_EQ(run_forge({"sample", "--prompt", "x"}).status, 2);      // --checkpoint is required
  EXPECT_EQ(run_forge({"tokenize", "train", "--out", "x"}).status, 2);
  const CliRun stray = run_forge({"sample", "--checkpoint", "x", "--train.steps=3"});
  EXPECT_EQ(stray.status, 2);
  EXPECT_NE(stray.out.find("are options of 'forge train'"), std::string::npos) << stray.out;
  EXPECT_EQ(run_forge({"version"}).status, 0);
  EXPECT_EQ(run_forge({"--help"}).status, 0);
  const CliRun help = run_forge({"train", "--help"});
  EXPECT_EQ(help.status, 0);
  EXPECT_NE(help.out.find("--section.key=value"), std::string::npos) << help.out;
}

TEST_F(CliTest, CliTrainResumeAndSample) {
  const CliRun first = run_forge({"train", config, "--train.steps=4"});
  ASSERT_EQ(first.status, 0) << first.out;
  EXPECT_NE(first.out.find("step 4/4 | loss"), std::string::npos) << first.out;
  const CliRun resumed = run_forge({"train", config, "--resume"});  // to train.steps = 6 from the file
  ASSERT_EQ(resumed.status, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("resume: from"), std::string::npos) << resumed.out;
  EXPECT_NE(resumed.out.find("step 6/6"), std::string::npos) << resumed.out;
  // elapsed_s goes on from the checkpoint's: every record of the resumed start is later than the
  // first start's final record.
  double first_final = -1.0;
  int later = 0;
  std::istringstream lines(train_testing::read_text(scratch.path() / "runs" / "cli" / "metrics.jsonl"));
  for (std::string line; std::getline(lines, line);) {
    const nlohmann::json rec = nlohmann::json::parse(line);
    if (!rec.contains("elapsed_s")) continue;
    const int64_t step = rec.at("step").get<int64_t>();
    if (step <= 4 && rec.contains("final")) first_final = rec["elapsed_s"].get<double>();
    if (step > 4) {
      ++later;
      EXPECT_GE(rec["elapsed_s"].get<double>(), first_final) << rec.dump();
    }
  }
  EXPECT_GT(first_final, 0.0);
  EXPECT_GE(later, 2);

  const std::string run_dir = scratch.str("runs/cli");
  // (stderr, which reports tokens/s, left out: the text is what a seed fixes)
  const CliRun s1 = run_forge({"sample", "--checkpoint", run_dir, "--prompt", "A dog", "--tokens", "10", "--seed", "3"},
                              Stderr::dropped);
  const CliRun s2 = run_forge({"sample", "--checkpoint", run_dir, "--prompt", "A dog", "--tokens", "10", "--seed", "3"},
                              Stderr::dropped);
  ASSERT_EQ(s1.status, 0) << s1.out;
  EXPECT_EQ(s1.out, s2.out);
  EXPECT_NE(s1.out.find("A dog"), std::string::npos) << s1.out;
  const CliRun bad = run_forge({"sample", "--checkpoint", scratch.str("nowhere")});
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.out.find("forge: error: "), std::string::npos);
  // --device and --dtype: the CPU named explicitly gives the default's text; bf16 weights run;
  // a dtype forge does not take is refused naming the valid ones.
  const CliRun cpu = run_forge({"sample", "--checkpoint", run_dir, "--prompt", "A dog", "--tokens", "10", "--seed", "3",
                                "--device", "cpu"},
                               Stderr::dropped);
  ASSERT_EQ(cpu.status, 0) << cpu.out;
  if (run_forge({"info"}).out.find("GPUs: no CUDA device") != std::string::npos) {
    EXPECT_EQ(cpu.out, s1.out);
  }
  const CliRun half = run_forge({"sample", "--checkpoint", run_dir, "--prompt", "A dog", "--tokens", "10", "--dtype",
                                 "bf16", "--device", "cpu"});
  EXPECT_EQ(half.status, 0) << half.out;
  const CliRun wrong = run_forge({"sample", "--checkpoint", run_dir, "--dtype", "f8"});
  EXPECT_EQ(wrong.status, 1) << wrong.out;
  EXPECT_NE(wrong.out.find("--dtype must be f32, bf16 or f16"), std::string::npos) << wrong.out;
}

TEST_F(CliTest, CliTokenizeTrainAndEncode) {
  const std::string tok = scratch.str("tok.json"), out = scratch.str("shards");
  const CliRun t = run_forge({"tokenize", "train", "--vocab-size", "270", "--out", tok, scratch.str("corpus")});
  ASSERT_EQ(t.status, 0) << t.out;
  EXPECT_EQ(data::BpeTokenizer::load(tok).vocab_size(), 270);
  const CliRun e = run_forge({"tokenize", "encode", "--tokenizer", tok, "--out", out, scratch.str("corpus/*.txt")});
  ASSERT_EQ(e.status, 0) << e.out;
  const data::TokenShard shard((fs::path(out) / "shard_00000.bin").string());
  EXPECT_GT(shard.size(), 1000);
  EXPECT_TRUE(fs::is_regular_file(fs::path(out) / "shard_00001.bin"));
  const CliRun small = run_forge({"tokenize", "train", "--vocab-size", "100", "--out", tok, scratch.str("corpus")});
  EXPECT_EQ(small.status, 1);
  EXPECT_NE(small.out.find("smaller than 256"), std::string::npos) << small.out;
}

// JSON Lines files under --text-key, a special token trained in and written after every
// document (--eos-token), and the refusal of an end-of-text token the tokenizer lacks.
TEST_F(CliTest, CliTokenizeJsonLinesWithAnEndOfTextToken) {
  const std::string jsonl = scratch.str("docs.jsonl"), tok = scratch.str("eot.json"), out = scratch.str("eot_shards");
  train_testing::write_text(jsonl, "{\"body\": \"the first document\"}\n{\"body\": \"and the second one\"}\n"
                                   "{\"body\": \"a third, the last\"}\n");
  const CliRun t = run_forge({"tokenize", "train", "--vocab-size", "270", "--special-token", "<|endoftext|>",
                              "--text-key", "body", "--out", tok, jsonl});
  ASSERT_EQ(t.status, 0) << t.out;
  const auto bpe = data::BpeTokenizer::load(tok);
  EXPECT_EQ(bpe.special_tokens(), (std::vector<std::string>{"<|endoftext|>"}));
  const CliRun e = run_forge({"tokenize", "encode", "--tokenizer", tok, "--text-key", "body", "--eos-token",
                              "<|endoftext|>", "--out", out, jsonl});
  ASSERT_EQ(e.status, 0) << e.out;
  EXPECT_NE(e.out.find("3 document(s)"), std::string::npos) << e.out;
  const auto ids = data::TokenShard((fs::path(out) / "shard_00000.bin").string()).to_vector();
  const int32_t eot = bpe.special_id("<|endoftext|>");
  EXPECT_EQ(std::count(ids.begin(), ids.end(), eot), 3);
  EXPECT_EQ(bpe.decode(std::vector<int32_t>(ids.begin(), std::find(ids.begin(), ids.end(), eot))), "the first document");
  const CliRun bad = run_forge({"tokenize", "encode", "--tokenizer", scratch.str("tok_plain.json"), "--eos-token",
                                "<|endoftext|>", "--out", out, jsonl});
  EXPECT_EQ(bad.status, 1);
  const CliRun plain = run_forge({"tokenize", "train", "--vocab-size", "270", "--text-key", "body", "--special-token", "",
                                  "--out", scratch.str("tok_plain.json"), jsonl});
  ASSERT_EQ(plain.status, 0) << plain.out;
  const CliRun lacks = run_forge({"tokenize", "encode", "--tokenizer", scratch.str("tok_plain.json"), "--text-key", "body",
                                  "--eos-token", "<|endoftext|>", "--out", out, jsonl});
  EXPECT_EQ(lacks.status, 1);
  EXPECT_NE(lacks.out.find("is not a special token"), std::string::npos) << lacks.out;
  EXPECT_TRUE(data::BpeTokenizer::load(scratch.str("tok_plain.json")).special_tokens().empty());
}

// forge tokenize's defaults are forge train's (data.eos_token = "auto"): the tokenizer trained with
// "<|endoftext|>", each document ended by it, so the two give the same tokenizer and the same shards.
TEST_F(CliTest, CliTokenizeDefaultsGiveWhatTrainGives) {
  const CliRun run = run_forge({"train", config, "--train.steps=1", "--data.val_fraction=0", "--eval.every=0",
                                "--eval.bigram_baseline=false", "--run.name=tokens"});
  ASSERT_EQ(run.status, 0) << run.out;
  const fs::path run_dir = scratch.path() / "runs" / "tokens";
  const std::string tok = scratch.str("default_tok.json"), out = scratch.str("default_shards");
  const CliRun t = run_forge({"tokenize", "train", "--vocab-size", "300", "--out", tok, scratch.str("corpus")});
  ASSERT_EQ(t.status, 0) << t.out;
  EXPECT_EQ(train_testing::read_text(tok), train_testing::read_text((run_dir / "tokenizer.json").string()));
  const CliRun e = run_forge({"tokenize", "encode", "--tokenizer", tok, "--out", out, scratch.str("corpus")});
  ASSERT_EQ(e.status, 0) << e.out;
  EXPECT_NE(e.out.find("every document ends with \"<|endoftext|>\""), std::string::npos) << e.out;
  int shards = 0;
  for (const auto& f : fs::directory_iterator(run_dir / "data")) {
    if (f.path().extension() != ".bin") continue;
    ++shards;
    EXPECT_EQ(train_testing::read_text(f.path().string()),
              train_testing::read_text((fs::path(out) / f.path().filename()).string()))
        << f.path().filename();
  }
  EXPECT_EQ(shards, 2);
  const auto bpe = data::BpeTokenizer::load(tok);
  const auto ids = data::TokenShard((fs::path(out) / "shard_00000.bin").string()).to_vector();
  EXPECT_EQ(ids.back(), bpe.special_id("<|endoftext|>"));
  // --eos-token "" joins the documents as they are.
  const CliRun none = run_forge({"tokenize", "encode", "--tokenizer", tok, "--eos-token", "", "--out",
                                 scratch.str("no_eos"), scratch.str("corpus")});
  ASSERT_EQ(none.status, 0) << none.out;
  EXPECT_EQ(data::TokenShard(scratch.str("no_eos/shard_00000.bin")).size() + 1, static_cast<int64_t>(ids.size()));
}

// Note [CPU threading defaults]: without OMP_WAIT_POLICY in the environment forge runs with
// "passive" (set before libgomp loads: it executes itself again) and `forge info` says so; a value
// in the environment is kept.
TEST_F(CliTest, CliForgeChoosesThePassiveOpenMpWaitPolicyItself) {
  struct Unset {  // for the child processes of this test only
    std::optional<std::string> policy, ours;
    Unset() {
      if (const char* p = std::getenv("OMP_WAIT_POLICY")) policy = p;
      if (const char* o = std::getenv("FORGE_OMP_DEFAULTS")) ours = o;
      ::unsetenv("OMP_WAIT_POLICY");
      ::unsetenv("FORGE_OMP_DEFAULTS");
    }
    ~Unset() {
      if (policy) ::setenv("OMP_WAIT_POLICY", policy->c_str(), 1);
      if (ours) ::setenv("FORGE_OMP_DEFAULTS", ours->c_str(), 1);
    }
  } unset;
  const CliRun chosen = run_forge({"info"});
  ASSERT_EQ(chosen.status, 0) << chosen.out;
  EXPECT_NE(chosen.out.find("OpenMP wait policy     passive (forge's default"), std::string::npos) << chosen.out;
  const CliRun json = run_forge({"info", "--json"}, Stderr::dropped);
  EXPECT_EQ(nlohmann::json::parse(json.out)["host"]["omp_wait_policy"].get<std::string>().rfind("passive (forge's", 0), 0u)
      << json.out;
  // Threads are left unbound unless the environment binds them (docs/environment.md).
  if (std::getenv("OMP_PROC_BIND") == nullptr && std::getenv("OMP_PLACES") == nullptr) {
    EXPECT_NE(chosen.out.find("thread binding         none (forge's default"), std::string::npos) << chosen.out;
  }
  const CliRun bound = run_forge({"info"}, Stderr::merged, {{"OMP_PROC_BIND", "close"}, {"OMP_PLACES", "cores"}});
  EXPECT_NE(bound.out.find("thread binding         OMP_PROC_BIND=close, OMP_PLACES=cores (the environment's)"),
            std::string::npos)
      << bound.out;
  const CliRun kept = run_forge({"info"}, Stderr::merged, {{"OMP_WAIT_POLICY", "active"}});
  EXPECT_NE(kept.out.find("OpenMP wait policy     active (OMP_WAIT_POLICY)"), std::string::npos) << kept.out;
  // The re-executed forge is the same program with the same arguments.
  const CliRun typo = run_forge({"train", config, "--train.stpes=5"});
  EXPECT_NE(typo.out.find("did you mean 'train.steps'?"), std::string::npos) << typo.out;
}

// A mistyped command or value gets the nearest ones named.
TEST_F(CliTest, CliMistypedCommandsAndValuesGetSuggestions) {
  const CliRun cmd = run_forge({"trian", config});
  EXPECT_EQ(cmd.status, 2) << cmd.out;
  EXPECT_NE(cmd.out.find("forge: error: 'trian' is not a command of 'forge'; did you mean 'train'?"), std::string::npos)
      << cmd.out;
  const CliRun sub = run_forge({"tokenize", "encod", "--tokenizer", "t.json"});
  EXPECT_EQ(sub.status, 2) << sub.out;
  EXPECT_NE(sub.out.find("'encod' is not a command of 'forge tokenize'; did you mean 'encode'?"), std::string::npos)
      << sub.out;
  EXPECT_NE(sub.out.find("(see 'forge tokenize --help')"), std::string::npos) << sub.out;
  const CliRun far = run_forge({"xyzzy"});
  EXPECT_EQ(far.status, 2) << far.out;
  EXPECT_NE(far.out.find("the commands are: train, sample"), std::string::npos) << far.out;
  const std::vector<std::pair<std::string, std::string>> values = {
      {"--run.dtype=fp16", "(did you mean \"f16\"?)"},       {"--run.dtype=bfloat16", "(did you mean \"bf16\"?)"},
      {"--optim.name=adam", "(did you mean \"adamw\"?)"},     {"--schedule.kind=cos", "(did you mean \"cosine\"?)"},
      {"--schedule.kind=Linear", "(did you mean \"linear\"?)"}, {"--run.attention=flsh", "(did you mean \"flash\"?)"},
      {"--dist.pp_schedule=zbh1", "(did you mean \"zb-h1\"?)"}, {"--data.source=file", "(did you mean \"files\"?)"}};
  for (const auto& [arg, hint] : values) {
    const CliRun r = run_forge({"train", config, arg, "--print-config"});
    EXPECT_EQ(r.status, 1) << arg << ": " << r.out;
    EXPECT_NE(r.out.find("is unknown; use"), std::string::npos) << arg << ": " << r.out;
    EXPECT_NE(r.out.find(hint), std::string::npos) << arg << ": " << r.out;
  }
  const CliRun nothing_near = run_forge({"train", config, "--optim.name=lion", "--print-config"});
  EXPECT_EQ(nothing_near.out.find("did you mean"), std::string::npos) << nothing_near.out;
}

// A start refused before training (a GPU that is not there, --resume without a checkpoint) leaves
// no run directory behind; a directory that was there already, and its files, stay.
TEST_F(CliTest, CliARefusedStartLeavesNoRunDirectory) {
  const fs::path runs = scratch.path() / "runs";
  const CliRun resume = run_forge({"train", config, "--run.name=never", "--resume"});
  EXPECT_EQ(resume.status, 1) << resume.out;
  EXPECT_NE(resume.out.find("--resume: no checkpoint"), std::string::npos) << resume.out;
  EXPECT_FALSE(fs::exists(runs / "never")) << resume.out;
  if (run_forge({"info"}).out.find("GPUs: no CUDA device") != std::string::npos) {
    const CliRun gpu = run_forge({"train", config, "--run.name=never", "--device", "cuda"});
    EXPECT_EQ(gpu.status, 1) << gpu.out;
    EXPECT_NE(gpu.out.find("no CUDA device is visible"), std::string::npos) << gpu.out;
    EXPECT_FALSE(fs::exists(runs / "never")) << gpu.out;
  }
  fs::create_directories(runs / "kept");
  train_testing::write_text((runs / "kept" / "notes.txt").string(), "mine");
  const CliRun kept = run_forge({"train", config, "--run.name=kept", "--resume"});
  EXPECT_EQ(kept.status, 1) << kept.out;
  EXPECT_EQ(train_testing::read_text((runs / "kept" / "notes.txt").string()), "mine");
}

// forge tokenize ids/decode: text -> ids as a JSON array and back, with any tokenizer file.
TEST_F(CliTest, CliTokenizeIdsAndDecode) {
  const std::string tok = scratch.str("ids_tok.json");
  const CliRun t = run_forge({"tokenize", "train", "--vocab-size", "270", "--special-token", "<|endoftext|>", "--out",
                              tok, scratch.str("corpus")});
  ASSERT_EQ(t.status, 0) << t.out;
  const auto bpe = data::BpeTokenizer::load(tok);
  const CliRun ids = run_forge({"tokenize", "ids", "--tokenizer", tok, "--text", "the cat<|endoftext|>"});
  ASSERT_EQ(ids.status, 0) << ids.out;
  std::string want = "[";
  for (const int32_t id : bpe.encode("the cat<|endoftext|>")) want += (want.size() > 1 ? "," : "") + std::to_string(id);
  EXPECT_NE(ids.out.find(want + "]"), std::string::npos) << ids.out;
  const CliRun ordinary = run_forge({"tokenize", "ids", "--tokenizer", tok, "--ordinary", "--text", "<|endoftext|>"});
  EXPECT_EQ(ordinary.out.find(std::to_string(bpe.special_id("<|endoftext|>"))), std::string::npos) << ordinary.out;
  const auto cat = bpe.encode("the cat");
  std::string list;
  for (const int32_t id : cat) list += (list.empty() ? "" : ",") + std::to_string(id);
  const CliRun dec = run_forge({"tokenize", "decode", "--tokenizer", tok, "--ids", list});
  ASSERT_EQ(dec.status, 0) << dec.out;
  EXPECT_NE(dec.out.find("the cat"), std::string::npos) << dec.out;
  const CliRun junk = run_forge({"tokenize", "ids", "--tokenizer", scratch.str("corpus"), "--text", "x"});
  EXPECT_EQ(junk.status, 1);
  EXPECT_NE(junk.out.find("Hugging Face tokenizer.json"), std::string::npos) << junk.out;
}

}  // namespace
}  // namespace forge::train
