// The `forge` executable: train/sample/tokenize parse their arguments and overrides, errors
// print "forge: error: ..." with exit status 1, usage errors exit 2. Runs the binary built
// next to this test (<build>/forge, beside <build>/tests/forge_tests).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <string>

#include "forge/data/bpe.h"
#include "forge/data/shards.h"
#include "train_testing.h"

namespace forge::train {
namespace {

namespace fs = std::filesystem;
using train_testing::Scratch;

fs::path forge_binary() { return fs::read_symlink("/proc/self/exe").parent_path().parent_path() / "forge"; }

struct CliRun {
  int status = -1;
  std::string output;  // stdout and stderr together
};

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

CliRun run_forge(const std::vector<std::string>& args) {
  std::string cmd = quote(forge_binary().string());
  for (const auto& a : args) {
    cmd += ' ';
    cmd += quote(a);
  }
  cmd += " 2>&1";
  CliRun r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf{};
  size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  const int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::is_regular_file(forge_binary()))
        << "the forge executable is not built at " << forge_binary() << " (build the 'forge' target)";
    train_testing::write_corpus(scratch.path() / "corpus");
    config = scratch.str("run.toml");
    train_testing::write_text(config, train_testing::tiny_toml(scratch.path(), "cli", 6));
  }
  Scratch scratch;
  std::string config;
};

TEST_F(CliTest, CliTrainParsesOverrides) {
  const CliRun r = run_forge({"train", config, "--train.steps=42", "--optim.lr", "0.01", "--print-config"});
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("[train]\nsteps = 42\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("lr = 0.01\n"), std::string::npos) << r.output;
}

TEST_F(CliTest, CliTrainDeviceFlagIsRunDevice) {
  const CliRun r = run_forge({"train", config, "--device", "cuda:1", "--print-config"});
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("device = 'cuda:1'\n"), std::string::npos) << r.output;
  const CliRun bad = run_forge({"train", config, "--device=gpu0"});
  EXPECT_EQ(bad.status, 1) << bad.output;
  EXPECT_NE(bad.output.find("run.device = 'gpu0' is not a device"), std::string::npos) << bad.output;
}

TEST_F(CliTest, CliErrorsExitOneAndUsageErrorsTwo) {
  const CliRun typo = run_forge({"train", config, "--train.stpes=5"});
  EXPECT_EQ(typo.status, 1) << typo.output;
  EXPECT_NE(typo.output.find("forge: error: override '--train.stpes=5': unknown key 'train.stpes'; did you mean "
                             "'train.steps'?"),
            std::string::npos)
      << typo.output;
  const CliRun type = run_forge({"train", config, "--train.steps=many"});
  EXPECT_EQ(type.status, 1);
  EXPECT_NE(type.output.find("train.steps must be an integer, got 'many'"), std::string::npos) << type.output;
  const CliRun missing = run_forge({"train", scratch.str("none.toml")});
  EXPECT_EQ(missing.status, 1);
  EXPECT_NE(missing.output.find("forge: error: config file '"), std::string::npos) << missing.output;

  EXPECT_EQ(run_forge({"train"}).status, 2);                        // no config
  EXPECT_EQ(run_forge({"frobnicate"}).status, 2);                   // no such command
  EXPECT_EQ(run_forge({"sample", "--prompt", "x"}).status, 2);      // --checkpoint is required
  EXPECT_EQ(run_forge({"tokenize", "train", "--out", "x"}).status, 2);
  const CliRun stray = run_forge({"sample", "--checkpoint", "x", "--train.steps=3"});
  EXPECT_EQ(stray.status, 2);
  EXPECT_NE(stray.output.find("are options of 'forge train'"), std::string::npos) << stray.output;
  EXPECT_EQ(run_forge({"version"}).status, 0);
  EXPECT_EQ(run_forge({"--help"}).status, 0);
  const CliRun help = run_forge({"train", "--help"});
  EXPECT_EQ(help.status, 0);
  EXPECT_NE(help.output.find("--section.key=value"), std::string::npos) << help.output;
}

TEST_F(CliTest, CliTrainResumeAndSample) {
  const CliRun first = run_forge({"train", config, "--train.steps=4"});
  ASSERT_EQ(first.status, 0) << first.output;
  EXPECT_NE(first.output.find("step 4/4 | loss"), std::string::npos) << first.output;
  const CliRun resumed = run_forge({"train", config, "--resume"});  // to train.steps = 6 from the file
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resume: from"), std::string::npos) << resumed.output;
  EXPECT_NE(resumed.output.find("step 6/6"), std::string::npos) << resumed.output;

  const std::string run_dir = scratch.str("runs/cli");
  const CliRun s1 = run_forge({"sample", "--checkpoint", run_dir, "--prompt", "A dog", "--tokens", "10", "--seed", "3"});
  const CliRun s2 = run_forge({"sample", "--checkpoint", run_dir, "--prompt", "A dog", "--tokens", "10", "--seed", "3"});
  ASSERT_EQ(s1.status, 0) << s1.output;
  EXPECT_EQ(s1.output, s2.output);
  EXPECT_NE(s1.output.find("A dog"), std::string::npos) << s1.output;
  const CliRun bad = run_forge({"sample", "--checkpoint", scratch.str("nowhere")});
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.output.find("forge: error: "), std::string::npos);
}

TEST_F(CliTest, CliTokenizeTrainAndEncode) {
  const std::string tok = scratch.str("tok.json"), out = scratch.str("shards");
  const CliRun t = run_forge({"tokenize", "train", "--vocab-size", "270", "--out", tok, scratch.str("corpus")});
  ASSERT_EQ(t.status, 0) << t.output;
  EXPECT_EQ(data::BpeTokenizer::load(tok).vocab_size(), 270);
  const CliRun e = run_forge({"tokenize", "encode", "--tokenizer", tok, "--out", out, scratch.str("corpus/*.txt")});
  ASSERT_EQ(e.status, 0) << e.output;
  const data::TokenShard shard((fs::path(out) / "shard_00000.bin").string());
  EXPECT_GT(shard.size(), 1000);
  EXPECT_TRUE(fs::is_regular_file(fs::path(out) / "shard_00001.bin"));
  const CliRun small = run_forge({"tokenize", "train", "--vocab-size", "100", "--out", tok, scratch.str("corpus")});
  EXPECT_EQ(small.status, 1);
  EXPECT_NE(small.output.find("smaller than 256"), std::string::npos) << small.output;
}

}  // namespace
}  // namespace forge::train
