// data.format = "chat" end to end (docs/chat.md): conversations whose user turns are random and
// whose assistant answer is always the same train to near-zero loss, which they can only do if
// the random prompts are masked out of the loss (Note [chat masks]); and the refusals.
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cstdio>

#include <fstream>
#include <sstream>

#include "forge/data/bpe.h"
#include "forge/interop/export.h"
#include "forge/ops/reduce.h"
#include "forge/ops/view.h"
#include "forge/run/config.h"
#include "forge/run/run_chat_data.h"
#include "forge/run/hf_model.h"
#include "forge/run/language_model.h"
#include "forge/train/trainer.h"
#include "testing/tensor_testing.h"
#include "testing/cli_testing.h"
#include "train_testing.h"

namespace forge::train {
namespace {

namespace fs = std::filesystem;
using forge::testing::error_of;
using train_testing::Scratch;

constexpr const char* kAnswer = "Sure, here is the answer.";

class ChatTrain : public ::testing::Test {
 protected:
  void SetUp() override {
    data::BpeTokenizer().save(scratch.str("bytes.json"));  // 256 byte tokens: the template's are added
    std::string lines;
    uint64_t s = 12345;
    for (int i = 0; i < 200; ++i) {
      std::string question;
      for (int k = 0; k < 8; ++k) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        question += static_cast<char>('a' + (s >> 33) % 26);
      }
      lines += R"({"messages": [{"role": "user", "content": ")" + question +
               R"("}, {"role": "assistant", "content": ")" + kAnswer + "\"}]}\n";
    }
    train_testing::write_text(scratch.path() / "chat.jsonl", lines);
  }
  RunConfig config(const std::string& name, int64_t steps, const std::vector<std::string>& overrides = {}) {
    return parse_config(toml(name, steps), name + ".toml", overrides);
  }
  std::string toml(const std::string& name, int64_t steps) {
    return
        "[run]\nname = \"" + name + "\"\ndir = \"" + scratch.str("runs") + "\"\nseed = 7\ndevice = \"cpu\"\n"
        "[model]\ntype = \"gpt\"\nblock_size = 64\nn_layer = 2\nn_head = 2\nn_embd = 32\n"
        "[data]\nfiles = [\"" + scratch.str("chat.jsonl") + "\"]\nformat = \"chat\"\ntokenizer = \"" +
        scratch.str("bytes.json") + "\"\nchat_template = \"chatml\"\nval_fraction = 0.1\n"
        "[optim]\nlr = 3e-3\nweight_decay = 0.0\n"
        "[schedule]\nkind = \"cosine\"\nwarmup_steps = 10\nmin_lr = 3e-4\n"
        "[train]\nsteps = " + std::to_string(steps) + "\nbatch_size = 8\nseq_len = 64\nlog_every = 50\n"
        "[eval]\nevery = 0\nbatches = 4\nbigram_baseline = false\n"
        "[checkpoint]\nevery = 0\n";
  }
  TrainResult train(const RunConfig& c) {
    std::ostringstream log;
    TrainResult r = run_training(c, {}, log);
    last_log = log.str();
    return r;
  }
  Scratch scratch;
  std::string last_log;
};

// Near-zero: below 0.05 nats per trained token. The answer and its <|im_end|>\n are a fixed
// sequence a 2-layer model learns in a few hundred steps; were the random 8-letter questions in
// the loss, it could not go below 8 * ln(26) / 36 = 0.72 nats per token.
TEST_F(ChatTrain, FixedAnswersToRandomQuestionsTrainToNearZeroAssistantLoss) {
  const TrainResult r = train(config("fixed", 300));
  EXPECT_NE(last_log.find("added the template's special tokens \"<|im_start|>\", \"<|im_end|>\""), std::string::npos)
      << last_log;
  EXPECT_NE(last_log.find("180 training conversations"), std::string::npos) << last_log;
  ASSERT_FALSE(r.losses.empty());
  EXPECT_LT(r.losses.back(), 0.05) << last_log;
  EXPECT_LT(r.final_val_loss, 0.05) << last_log;
}

TEST_F(ChatTrain, MistakesAreRefusedNamingTheFix) {
  EXPECT_NE(error_of([&] { train(config("f", 1, {"--data.format=chats"})); }).find("data.format"), std::string::npos);
  EXPECT_NE(error_of([&] { train(config("t", 1, {"--data.train_on=prompts"})); }).find("data.train_on"), std::string::npos);
  EXPECT_NE(error_of([&] { train(config("r", 1, {"--data.source=random", "--model.vocab_size=300"})); })
                .find("data.format = \"chat\" with data.source = \"random\""),
            std::string::npos);
  EXPECT_NE(error_of([&] { train(config("k", 1, {"--data.tokenizer="})); }).find("needs data.tokenizer"), std::string::npos);
  EXPECT_NE(error_of([&] { train(config("n", 1, {"--data.chat_template=alpaca"})); }).find("not a built-in template"),
            std::string::npos);
  EXPECT_NE(error_of([&] { train(config("a", 1, {"--data.chat_template=auto"})); }).find("data.chat_template = \"auto\""),
            std::string::npos);
  // Rows of 16 tokens cut every conversation before its answer: reported, never trained at zero loss.
  const std::string cut = error_of([&] { train(config("cut", 1, {"--train.seq_len=16"})); });
  EXPECT_NE(cut.find("no conversation of data.files has a trained token"), std::string::npos) << cut;
}

TEST_F(ChatTrain, CutConversationsAreReportedAndSkipped) {
  // One conversation's answer is long enough to be cut off entirely at seq_len = 64.
  std::ofstream(scratch.path() / "chat.jsonl", std::ios::app)
      << R"({"messages": [{"role": "user", "content": ")" << std::string(80, 'q')
      << R"("}, {"role": "assistant", "content": "late"}]})" << "\n";
  train(config("skip", 2));
  EXPECT_NE(last_log.find("skipped 1 conversation(s) with no trained token left"), std::string::npos) << last_log;
  EXPECT_NE(last_log.find("lines 201"), std::string::npos) << last_log;
}

// Note [grown vocabulary]: a model saved without the template's tokens (a base run over plain text
// with the 256-byte tokenizer, exported as Hugging Face files) starts a chat run: its embedding
// (GPT's tied wte) grows by the two ChatML tokens, the new rows at the mean of the saved ones, every
// saved row unchanged; and the run trains.
TEST_F(ChatTrain, AnInitFromModelGrowsItsEmbeddingForTheTemplatesTokens) {
  train_testing::write_text(scratch.path() / "plain.txt", train_testing::synthetic_text(20000, 3));
  const std::string base_toml =
      "[run]\nname = \"base\"\ndir = \"" + scratch.str("runs") + "\"\nseed = 7\ndevice = \"cpu\"\n"
      "[model]\ntype = \"gpt\"\nblock_size = 64\nn_layer = 2\nn_head = 2\nn_embd = 32\n"
      "[data]\nfiles = [\"" + scratch.str("plain.txt") + "\"]\ntokenizer = \"" + scratch.str("bytes.json") +
      "\"\neos_token = \"\"\nval_fraction = 0.1\n"
      "[train]\nsteps = 2\nbatch_size = 4\nseq_len = 64\n[eval]\nevery = 0\nbigram_baseline = false\n";
  std::ostringstream base_log;
  const TrainResult base = run_training(parse_config(base_toml, "base.toml"), {}, base_log);
  ExportOptions o;
  o.checkpoint = base.last_checkpoint;
  o.out = scratch.str("base_hf");
  export_model(o);

  RunConfig c = config("grown", 2, {"--model.init_from=" + scratch.str("base_hf"), "--data.tokenizer="});
  const int64_t saved = c.model.vocab_size;
  train(c);
  EXPECT_NE(last_log.find("chat: model.init_from's token embedding and head grow from " + std::to_string(saved) +
                          " to " + std::to_string(saved + 2) + " rows"),
            std::string::npos)
      << last_log;

  // The loaded table itself: the saved rows, then their mean twice.
  RunConfig g = c;
  g.model.vocab_size = saved + 2;
  const LanguageModel m = build_language_model(g);
  io::NamedShapes shapes;
  for (const auto& [name, p] : m.module->named_parameters()) shapes.emplace_back(name, p.shape());
  const Tensor grown = load_init_from(g, shapes).at("transformer.wte.weight").to(DType::f64);
  io::NamedShapes plain_shapes = shapes;
  for (auto& [name, shape] : plain_shapes)
    if (name == "transformer.wte.weight") shape[0] = saved;
  const Tensor old = load_init_from(c, plain_shapes).at("transformer.wte.weight").to(DType::f64);
  ASSERT_EQ(grown.shape(), (Shape{saved + 2, old.size(1)}));
  EXPECT_EQ(ops::narrow(grown, 0, 0, saved).contiguous().to_vector<double>(), old.contiguous().to_vector<double>());
  const std::vector<double> mean = ops::mean(old, {0}).to_vector<double>();
  for (int64_t r = saved; r < saved + 2; ++r) {
    const std::vector<double> row = ops::narrow(grown, 0, r, 1).contiguous().to_vector<double>();
    for (size_t j = 0; j < mean.size(); ++j) EXPECT_NEAR(row[j], mean[j], 1e-6) << "row " << r << " col " << j;
  }
}

// Note [shard manifests]: a second run over the same conversations, template and tokenizer (the
// job's other ranks, a resume) reuses the shards and says again what encoding them reported; a
// shards directory holding a file forge did not write is refused, never overwritten.
TEST_F(ChatTrain, ShardsAreReusedAndForeignFilesKept) {
  const std::string shards = scratch.str("chat_shards");
  train(config("first", 1, {"--data.shards_dir=" + shards}));
  EXPECT_EQ(last_log.find("chat: reusing"), std::string::npos) << last_log;
  train(config("second", 1, {"--data.shards_dir=" + shards}));
  EXPECT_NE(last_log.find("chat: reusing 1 chat shard(s)"), std::string::npos) << last_log;
  EXPECT_NE(last_log.find("of 200 conversations"), std::string::npos) << last_log;
  // A run killed while encoding leaves its writer's temporary: the next run removes it (its pid is
  // no live process) and writes the shards again.
  fs::remove(fs::path(shards) / "manifest.json");
  const fs::path stale = fs::path(shards) / "shard_00000.bin.tmp.999999999.0123456789abcdef";
  train_testing::write_text(stale, "half a shard");
  train(config("after_kill", 1, {"--data.shards_dir=" + shards}));
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_NE(last_log.find("the temporary of a shard writer that did not finish"), std::string::npos) << last_log;
  train_testing::write_text(scratch.path() / "mine", "keep me");
  const std::string e = error_of([&] {
    train(config("third", 1, {"--data.shards_dir=" + scratch.str(""), "--data.train_on=all"}));
  });
  EXPECT_NE(e.find("data.shards_dir"), std::string::npos) << e;
  EXPECT_EQ(train_testing::read_text(scratch.path() / "mine"), "keep me");
}

// forge plan for chat SFT (docs/plan.md): the conversations encoded as the run encodes them give
// the run's own figures (training conversations, rows, trained targets, as its log says them), the
// epochs train.steps makes, and nothing is left behind in the temporary directory.
TEST_F(ChatTrain, PlanCountsTheRunsRowsTrainedTargetsAndEpochs) {
  const fs::path cfg = scratch.path() / "plan.toml";
  train_testing::write_text(cfg, toml("planned", 40));
  auto temporaries = [] {
    int n = 0;
    for (const auto& e : fs::directory_iterator(fs::temp_directory_path()))
      n += e.path().filename().string().rfind("forge-plan-chat-", 0) == 0;
    return n;
  };
  const int before = temporaries();
  const auto p = testing::run_forge({"plan", "--config", cfg.string(), "--gpu", "cpu", "--json"}, testing::Stderr::dropped);
  ASSERT_EQ(p.status, 0) << p.out;
  const auto j = nlohmann::json::parse(p.out);
  ASSERT_TRUE(j.contains("sft")) << p.out;
  const auto& s = j["sft"];
  EXPECT_EQ(temporaries(), before) << "the plan's encoding directory is removed";

  train(config("planned", 1));
  const size_t mid = last_log.find(" training conversations in ");
  ASSERT_NE(mid, std::string::npos) << last_log;
  const size_t line = last_log.rfind('\n', mid) + 1;  // (npos + 1 = 0: the first line)
  long conversations = 0, rows = 0, seq = 0, trained = 0;
  ASSERT_EQ(std::sscanf(last_log.c_str() + line, "chat: %ld training conversations in %ld rows of %ld (%ld trained targets)",
                        &conversations, &rows, &seq, &trained),
            4)
      << last_log.substr(line, 200);
  EXPECT_EQ(s["train_conversations"].get<int64_t>(), conversations);
  EXPECT_EQ(s["rows"].get<int64_t>(), rows);
  EXPECT_EQ(s["seq_len"].get<int64_t>(), seq);
  EXPECT_EQ(s["trained_targets"].get<int64_t>(), trained);
  EXPECT_EQ(s["conversations"].get<int64_t>(), 200);
  EXPECT_EQ(s["train_conversations"].get<int64_t>() + s["val_conversations"].get<int64_t>(), 200);
  EXPECT_NEAR(s["epochs"].get<double>(), 40.0 * 8 / static_cast<double>(rows), 1e-9);
  EXPECT_GT(s["fill"].get<double>(), 0.5);
  EXPECT_LE(s["fill"].get<double>(), 1.0);
  EXPECT_GT(s["trained_share"].get<double>(), 0.0);
  EXPECT_LT(s["trained_share"].get<double>(), s["fill"].get<double>()) << "the questions are not trained";
  // The table says the same.
  const auto t = testing::run_forge({"plan", "--config", cfg.string(), "--gpu", "cpu"}, testing::Stderr::dropped);
  ASSERT_EQ(t.status, 0) << t.out;
  EXPECT_NE(t.out.find("chat SFT (data.format = \"chat\""), std::string::npos) << t.out;
  EXPECT_NE(t.out.find(std::to_string(rows) + " rows of 64 positions"), std::string::npos) << t.out;
}

// A plan killed mid-way leaves its encoding directory; the next plan removes it, only when its
// process is gone and it holds nothing but shards (never another process's, never other files).
TEST_F(ChatTrain, PlanRemovesOnlyTheDirectoriesOfKilledPlans) {
  const fs::path tmp = scratch.path() / "tmp";
  const std::string dead = std::to_string(0x7ffffff0);  // above any pid_max: no such process
  auto make = [&](const std::string& name, const std::vector<std::string>& files) {
    fs::create_directories(tmp / name);
    for (const auto& f : files) train_testing::write_text(tmp / name / f, "x");
  };
  make(std::string(kPlanDirPrefix) + dead + "-0", {"shard_00000.bin", "shard_00000.flags.bin.tmp.12.0123456789abcdef"});
  make(std::string(kPlanDirPrefix) + dead + "-1", {"shard_00000.bin", "notes.txt"});
  make(std::string(kPlanDirPrefix) + std::to_string(::getpid()) + "-0", {"shard_00000.bin"});
  make("forge-plan-chatty", {"shard_00000.bin"});
  std::ostringstream log;
  remove_stale_plan_dirs(tmp, log);
  EXPECT_FALSE(fs::exists(tmp / (std::string(kPlanDirPrefix) + dead + "-0"))) << log.str();
  EXPECT_NE(log.str().find("left by a plan that was stopped"), std::string::npos) << log.str();
  EXPECT_TRUE(fs::exists(tmp / (std::string(kPlanDirPrefix) + dead + "-1" + "/notes.txt"))) << "another file inside";
  EXPECT_TRUE(fs::exists(tmp / (std::string(kPlanDirPrefix) + std::to_string(::getpid()) + "-0"))) << "a live process's";
  EXPECT_TRUE(fs::exists(tmp / "forge-plan-chatty")) << "another name";
}

}  // namespace
}  // namespace forge::train
