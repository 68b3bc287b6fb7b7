// The language-model trainer end to end on a tiny GPT: the loss falls, metrics.jsonl is
// well-formed, resume is bit-identical, incompatible checkpoints are refused, and sampling
// is deterministic for a seed.
#include <gtest/gtest.h>

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>

#include "forge/core/error.h"
#include "forge/data/bpe.h"
#include "forge/data/idx.h"
#include "forge/data/shards.h"
#include "forge/io/checkpoint.h"
#include "forge/optim/schedule.h"
#include "forge/telemetry/metrics.h"
#include "forge/run/config.h"
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

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override { train_testing::write_corpus(scratch.path() / "corpus"); }
  RunConfig config(const std::string& name, int64_t steps, const std::vector<std::string>& overrides = {}) const {
    return parse_config(train_testing::tiny_toml(scratch.path(), name, steps), name + ".toml", overrides);
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

double mean(const std::vector<double>& v, size_t from, size_t to) {
  return std::accumulate(v.begin() + static_cast<std::ptrdiff_t>(from), v.begin() + static_cast<std::ptrdiff_t>(to), 0.0) /
         static_cast<double>(to - from);
}

TEST_F(TrainerTest, TrainSmokeLossFallsAndRunDirIsComplete) {
  const RunConfig c = config("smoke", 30);
  const TrainResult r = train(c);
  ASSERT_EQ(r.losses.size(), 30u);
  EXPECT_EQ(r.start_step, 0);
  EXPECT_EQ(r.final_step, 30);
  for (double l : r.losses) EXPECT_TRUE(std::isfinite(l));
  // The initial loss is about log(vocab); 30 steps on a repetitive corpus take it well down.
  EXPECT_NEAR(r.losses[0], std::log(300.0), 0.5);
  EXPECT_LT(mean(r.losses, 25, 30), mean(r.losses, 0, 5) - 1.0) << last_log;
  EXPECT_TRUE(std::isfinite(r.final_val_loss));
  EXPECT_TRUE(std::isfinite(r.bigram_val_loss));
  ASSERT_EQ(r.evals.size(), 3u);  // steps 10, 20 and the final one at 30
  EXPECT_EQ(r.evals[0].step, 10);
  EXPECT_EQ(r.evals.back().step, 30);
  EXPECT_DOUBLE_EQ(r.evals.back().val_loss, r.final_val_loss);

  const fs::path dir = r.run_dir;
  EXPECT_TRUE(fs::is_regular_file(dir / "tokenizer.json"));
  EXPECT_TRUE(fs::is_regular_file(dir / "config.toml"));
  EXPECT_TRUE(fs::is_regular_file(dir / "data" / "manifest.json"));
  EXPECT_EQ(r.last_checkpoint, io::checkpoint_path(dir, 30).string());
  const auto ck = io::load_checkpoint(r.last_checkpoint);
  EXPECT_EQ(ck.step, 30);
  EXPECT_EQ(ck.config["train"]["steps"], 30);
  EXPECT_EQ(ck.config["model"]["vocab_size"], 300);  // resolved from the tokenizer
  EXPECT_TRUE(ck.extra.contains("optimizer"));
  EXPECT_TRUE(ck.data_loader.contains("rng_offset"));
  // The progress lines and the final comparison.
  EXPECT_NE(last_log.find("step 30/30 | loss "), std::string::npos) << last_log;
  EXPECT_NE(last_log.find("tok/s"), std::string::npos);
  EXPECT_NE(last_log.find("ETA"), std::string::npos);
  EXPECT_NE(last_log.find(" vs bigram "), std::string::npos) << last_log;
}

TEST_F(TrainerTest, TrainMetricsJsonlIsWellFormed) {
  const RunConfig c = config("metrics", 12, {"--train.log_every=4", "--eval.every=6"});
  const TrainResult r = train(c);
  const auto path = fs::path(r.run_dir) / "metrics.jsonl";
  // Every line is one JSON object.
  std::istringstream lines(train_testing::read_text(path));
  std::string line;
  int n = 0;
  while (std::getline(lines, line)) {
    ++n;
    const auto j = nlohmann::json::parse(line);
    EXPECT_TRUE(j.is_object()) << line;
    EXPECT_TRUE(j.contains("step")) << line;
  }
  const auto records = telemetry::read_jsonl(path);
  ASSERT_EQ(records.size(), static_cast<size_t>(n));
  std::vector<int64_t> logged, evaluated;
  bool final_seen = false;
  for (const auto& j : records) {
    if (j.contains("loss")) {
      logged.push_back(j["step"]);
      for (const char* k : {"loss", "lr", "tokens_per_s", "grad_norm", "elapsed_s"}) EXPECT_TRUE(j[k].is_number()) << j;
      EXPECT_EQ(j["loss"].get<double>(), r.losses[static_cast<size_t>(j["step"].get<int64_t>() - 1)]);
    } else if (j.contains("checkpoint")) {  // Note [async checkpoints]: the final checkpoint's stall
      EXPECT_EQ(j["step"], 12);
      for (const char* k : {"stall_s", "snapshot_s", "wait_previous_s", "snapshot_bytes"}) EXPECT_TRUE(j[k].is_number()) << j;
      EXPECT_GT(j["snapshot_bytes"].get<double>(), 0.0) << j;
      EXPECT_EQ(j["checkpoint"], r.last_checkpoint);
    } else if (j.contains("checkpoint_write_s")) {
      EXPECT_EQ(j["step"], 12);
      EXPECT_TRUE(j["checkpoint_write_s"].is_number()) << j;
    } else if (j.value("final", false)) {
      final_seen = true;
      EXPECT_EQ(j["step"], 12);
      EXPECT_EQ(j["val_loss"].get<double>(), r.final_val_loss);
      EXPECT_EQ(j["bigram_val_loss"].get<double>(), r.bigram_val_loss);
    } else {
      ASSERT_TRUE(j.contains("val_loss")) << j;
      evaluated.push_back(j["step"]);
    }
  }
  EXPECT_EQ(logged, (std::vector<int64_t>{1, 4, 8, 12}));
  EXPECT_EQ(evaluated, (std::vector<int64_t>{6}));
  EXPECT_TRUE(final_seen);
}

// Resuming from a checkpoint at step k gives exactly (==) the losses of the uninterrupted run.
TEST_F(TrainerTest, TrainResumeIsBitIdentical) {
  // The uninterrupted run: 12 steps, a checkpoint every 6.
  const std::vector<std::string> common = {"--checkpoint.every=6", "--schedule.decay_steps=12", "--model.dropout=0.1",
                                           "--train.grad_accum=2"};
  const TrainResult full = train(config("full", 12, common));
  ASSERT_EQ(full.losses.size(), 12u);

  // An interrupted run: stops after 6 steps (same schedule), then resumes in place to 12.
  const TrainResult first = train(config("split", 6, common));
  ASSERT_EQ(first.losses.size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(first.losses[i], full.losses[i]) << "step " << i + 1;
  const TrainResult resumed = train(config("split", 12, common), {.resume = true});
  EXPECT_EQ(resumed.start_step, 6);
  ASSERT_EQ(resumed.losses.size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(resumed.losses[i], full.losses[6 + i]) << "step " << 7 + i;
  EXPECT_EQ(resumed.final_val_loss, full.final_val_loss);
  // The token count carries across the resume: 12 steps of the global batch (8 sequences in 2
  // micro-batches of 4, Note [global batch]) of 32 tokens.
  EXPECT_EQ(io::load_checkpoint(resumed.last_checkpoint).extra["tokens"], 12 * 8 * 32);
  EXPECT_EQ(io::load_checkpoint(full.last_checkpoint).extra["tokens"], 12 * 8 * 32);
  EXPECT_NE(last_log.find("resume: from"), std::string::npos);

  // metrics.jsonl of the resumed run reads like the uninterrupted one.
  auto losses_of = [](const fs::path& p) {
    std::vector<double> out;
    for (const auto& j : telemetry::read_jsonl(p))
      if (j.contains("loss")) out.push_back(j["loss"].get<double>());
    return out;
  };
  EXPECT_EQ(losses_of(fs::path(resumed.run_dir) / "metrics.jsonl"), losses_of(fs::path(full.run_dir) / "metrics.jsonl"));

  // Resuming from the full run's mid-way checkpoint (by path) into a new run directory.
  const TrainResult other = train(config("other", 12, common),
                                  {.resume = true, .resume_from = io::checkpoint_path(full.run_dir, 6).string()});
  ASSERT_EQ(other.losses.size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(other.losses[i], full.losses[6 + i]) << "step " << 7 + i;
}

TEST_F(TrainerTest, TrainResumeRefusesACheckpointOfAnotherShape) {
  const TrainResult a = train(config("shape_a", 2));
  const std::string e = error_of([&] {
    train(config("shape_b", 4, {"--model.n_embd=64"}), {.resume = true, .resume_from = a.last_checkpoint});
  });
  EXPECT_NE(e.find("checkpoint from another model shape"), std::string::npos) << e;
  EXPECT_NE(e.find("[300, 32]"), std::string::npos) << e;  // both shapes of the first mismatch
  EXPECT_NE(e.find("[300, 64]"), std::string::npos) << e;
  // No checkpoint to resume from, and nothing left to do.
  EXPECT_NE(error_of([&] { train(config("fresh", 2), {.resume = true}); }).find("--resume: no checkpoint in"),
            std::string::npos);
  const TrainResult done = train(config("shape_a", 2), {.resume = true});  // finished: says so, no error
  EXPECT_TRUE(done.already_finished);
  EXPECT_NE(last_log.find("raise train.steps"), std::string::npos) << last_log;
}

// Note [one command starts or continues]: the same command continues a run, says when it is
// finished, and starts afresh only when asked.
TEST_F(TrainerTest, TheSameCommandContinuesARunAndStartsAfreshOnlyWhenAsked) {
  const TrainResult a = train(config("again", 2));
  EXPECT_EQ(a.start_step, 0);
  const TrainResult b = train(config("again", 2));  // the same command: nothing left to do
  EXPECT_TRUE(b.already_finished);
  EXPECT_EQ(b.final_step, 2);
  EXPECT_NE(last_log.find("run: finished already"), std::string::npos) << last_log;
  EXPECT_EQ(io::list_checkpoints(a.run_dir).size(), 1u);
  const TrainResult c = train(config("again", 4, {"--schedule.decay_steps=4"}));  // more steps: it continues
  EXPECT_EQ(c.start_step, 2);
  EXPECT_EQ(c.final_step, 4);
  EXPECT_EQ(c.losses.size(), 2u);
  // A damaged latest checkpoint is skipped with a warning naming its file; the one before is used.
  {
    const fs::path latest = io::checkpoint_path(c.run_dir, 4);
    std::string bytes = train_testing::read_text(latest / "optimizer.safetensors");
    bytes[bytes.size() / 2] ^= 0x20;
    std::ofstream(latest / "optimizer.safetensors", std::ios::binary | std::ios::trunc) << bytes;
    const TrainResult d = train(config("again", 4, {"--schedule.decay_steps=4"}));
    EXPECT_EQ(d.start_step, 2) << last_log;
    EXPECT_NE(last_log.find("optimizer.safetensors does not match its checksum"), std::string::npos) << last_log;
    EXPECT_NE(last_log.find("skipped, an older checkpoint is used"), std::string::npos) << last_log;
    // Named explicitly, a damaged checkpoint is refused with that message.
    std::ofstream(latest / "optimizer.safetensors", std::ios::binary | std::ios::trunc) << bytes;  // damaged again
    const std::string e = error_of([&] { train(config("again", 6), {.resume = true, .resume_from = latest.string()}); });
    EXPECT_NE(e.find("optimizer.safetensors does not match its checksum"), std::string::npos) << e;
  }
  const TrainResult r = train(config("again", 3, {"--run.overwrite=true"}));
  EXPECT_EQ(r.start_step, 0);
  EXPECT_EQ(r.final_step, 3);
  EXPECT_NE(last_log.find("tokenizer: reusing"), std::string::npos) << last_log;  // cached across runs
  EXPECT_NE(last_log.find("data: reusing"), std::string::npos) << last_log;
  const auto cks = io::list_checkpoints(r.run_dir);
  ASSERT_EQ(cks.size(), 1u);
  EXPECT_EQ(cks[0].first, 3);
}

TEST_F(TrainerTest, TrainLlamaAndGivenTokenizer) {
  // A tokenizer trained once (as `forge tokenize train` does), then given to a LLaMA run.
  const auto files = resolve_data_files(config("tok", 2).data);
  data::BpeTrainOptions topt;
  topt.vocab_size = 280;
  const auto tok = data::BpeTokenizer::train_files(files, topt);
  tok.save(scratch.str("tok.json"));
  const RunConfig c = config("llama", 20,
                             {"--model.type=llama", "--model.dim=32", "--model.n_head=4", "--model.n_kv_head=2",
                              "--data.tokenizer=" + scratch.str("tok.json"), "--model.vocab_size=320"});
  const TrainResult r = train(c);
  EXPECT_LT(mean(r.losses, 15, 20), mean(r.losses, 0, 5)) << last_log;
  const auto ck = io::load_checkpoint(r.last_checkpoint);
  EXPECT_EQ(ck.model.at("lm_head.weight").shape(), (Shape{320, 32}));
  EXPECT_EQ(data::BpeTokenizer::load((fs::path(r.run_dir) / "tokenizer.json").string()).to_json(), tok.to_json());
  EXPECT_NE(error_of([&] { train(config("small", 2, {"--data.tokenizer=" + scratch.str("tok.json"), "--model.vocab_size=260"})); })
                .find("model.vocab_size = 260 is smaller than the tokenizer's vocabulary (280 tokens)"),
            std::string::npos);
}

// Note [non-finite guard]: an absurd learning rate makes the weights overflow after the first
// update; every later step has a NaN loss, is skipped and counted, and the third in a row
// stops the run with the key to change. The checkpoint of the last good step stays the latest.
TEST_F(TrainerTest, NonFiniteStepsAreSkippedThenStopTheRun) {
  const RunConfig c = config("diverge", 10,
                             {"--optim.lr=1e30", "--schedule.kind=constant", "--schedule.warmup_steps=0",
                              "--schedule.min_lr=0", "--checkpoint.every=1", "--train.max_bad_steps=3"});
  const std::string err = error_of([&] { train(c); });
  EXPECT_NE(err.find("3 steps in a row had a non-finite loss or gradient norm (last at step 4)"), std::string::npos)
      << err;
  EXPECT_NE(err.find("The last good checkpoint is untouched"), std::string::npos) << err;
  const auto cks = io::list_checkpoints(c.run_dir());
  ASSERT_FALSE(cks.empty());
  EXPECT_EQ(cks.back().first, 1);  // step 1 was the last good one
  // Each skip is in metrics.jsonl.
  std::ifstream in(fs::path(c.run_dir()) / "metrics.jsonl");
  int skipped = 0;
  for (std::string line; std::getline(in, line);)
    if (nlohmann::json::parse(line).value("skipped", false)) ++skipped;
  EXPECT_EQ(skipped, 3);
}

TEST_F(TrainerTest, RandomTokensNeedNoDataFiles) {
  const RunConfig c = config("random", 6, {"--data.source=random", "--model.vocab_size=500"});
  const TrainResult r = train(c);
  ASSERT_EQ(r.losses.size(), 6u);
  // Uniform random targets: the loss starts near ln(500) and cannot go far below it.
  EXPECT_NEAR(r.losses.front(), std::log(500.0), 0.3);
  EXPECT_TRUE(std::isnan(r.final_val_loss));  // no validation split for random tokens
}

// Note [pre-encoded corpora]: the same tokens as a forge shard, an llm.c shard and a Megatron
// .bin beside its .idx train alike, bit for bit; a directory holding the Megatron pair reads the
// .idx as its index, not as text; text mixed with shards, a missing vocabulary and a token id
// outside it are refused before any step.
std::string le_bytes(uint64_t v, int n) {
  std::string b(static_cast<size_t>(n), '\0');
  for (int i = 0; i < n; ++i) b[static_cast<size_t>(i)] = static_cast<char>(v >> (8 * i));
  return b;
}

TEST_F(TrainerTest, PreEncodedShardsTrainAsTheyAre) {
  const fs::path d = scratch.path() / "pre";
  fs::create_directories(d / "megatron");
  std::vector<int32_t> toks(6000);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<int32_t>((i * 7 + i / 13) % 299);
  toks[100] = 299;  // the largest id
  data::write_shard((d / "forge.bin").string(), toks, 300);
  std::string payload;
  for (int32_t t : toks) payload += le_bytes(static_cast<uint64_t>(t), 2);
  std::string llmc = le_bytes(20240520, 4) + le_bytes(1, 4) + le_bytes(toks.size(), 4);
  llmc.resize(1024, '\0');
  train_testing::write_text(d / "llmc.bin", llmc + payload);
  train_testing::write_text(d / "megatron" / "corpus.bin", payload);
  train_testing::write_text(d / "megatron" / "corpus.idx", std::string("MMIDIDX\0\0", 9) + le_bytes(1, 8) +
                                                               std::string(1, '\x08') + le_bytes(1, 8) + le_bytes(2, 8) +
                                                               le_bytes(toks.size(), 4) + le_bytes(0, 8) +
                                                               le_bytes(0, 8) + le_bytes(1, 8));
  std::vector<std::vector<double>> losses;
  for (const auto& [files, format] : {std::pair<std::string, std::string>{(d / "forge.bin").string(), "forge"},
                                      {(d / "llmc.bin").string(), "llm.c"},
                                      {(d / "megatron").string(), "megatron"}}) {
    const TrainResult r =
        train(config("pre_" + format, 4, {"--data.files=" + files, "--model.vocab_size=300", "--eval.every=0"}));
    ASSERT_EQ(r.losses.size(), 4u) << format;
    EXPECT_NE(last_log.find("1 pre-encoded shard(s) (" + format + ")"), std::string::npos) << last_log;
    EXPECT_NE(last_log.find("tokenizer: none"), std::string::npos) << last_log;
    losses.push_back(r.losses);
  }
  EXPECT_EQ(losses[1], losses[0]);
  EXPECT_EQ(losses[2], losses[0]);
  const std::string corpus = (scratch.path() / "corpus").string();
  auto refused = [&](const std::vector<std::string>& overrides) {
    return error_of([&] { train(config("pre_bad", 2, overrides)); });
  };
  EXPECT_NE(refused({"--data.files=[\"" + (d / "llmc.bin").string() + "\", \"" + corpus + "\"]", "--model.vocab_size=300"})
                .find("mixes token shards"),
            std::string::npos);
  EXPECT_NE(refused({"--data.files=" + (d / "llmc.bin").string(), "--model.vocab_size=0"}).find("set model.vocab_size"),
            std::string::npos);
  const std::string small =
      refused({"--data.files=" + (d / "llmc.bin").string(), "--model.vocab_size=256", "--data.vocab_size=256"});
  EXPECT_NE(small.find("holds token id 299"), std::string::npos) << small;
  EXPECT_NE(small.find("llm.c shard"), std::string::npos) << small;
}

// Note [documents]: a .jsonl corpus (and the same gzip-compressed) trains on each line's
// data.text_key, every document followed by data.eos_token, which the tokenizer trained on the
// fly gets as a special token; a given tokenizer without it is refused before any work.
TEST_F(TrainerTest, JsonLinesCorpusEndsEveryDocumentWithTheEosToken) {
  const std::string text = train_testing::read_text(scratch.path() / "corpus" / "corpus_a.txt");
  std::string jsonl;
  int docs = 0;
  for (size_t at = 0; at < text.size(); at += 700, ++docs)
    jsonl += nlohmann::json{{"id", docs}, {"body", text.substr(at, 700)}}.dump() + "\n";
  const fs::path d = scratch.path() / "jsonl";
  fs::create_directories(d);
  train_testing::write_text(d / "c.jsonl", jsonl);
  {
    gzFile f = gzopen((d / "c.jsonl.gz").string().c_str(), "wb");
    ASSERT_NE(f, nullptr);
    gzwrite(f, jsonl.data(), static_cast<unsigned>(jsonl.size()));
    gzclose(f);
  }
  std::vector<std::vector<int32_t>> shards;
  for (const char* file : {"c.jsonl", "c.jsonl.gz"}) {
    const std::string name = std::string("jsonl_") + (std::string(file).ends_with(".gz") ? "gz" : "plain");
    const RunConfig c = config(name, 3, {"--data.files=" + (d / file).string(), "--data.text_key=body",
                                         "--data.eos_token=<|endoftext|>", "--eval.every=0"});
    const TrainResult r = train(c);
    ASSERT_EQ(r.losses.size(), 3u) << last_log;
    const auto tok = data::BpeTokenizer::load((fs::path(c.run_dir()) / "tokenizer.json").string());
    ASSERT_EQ(tok.special_tokens(), (std::vector<std::string>{"<|endoftext|>"}));
    const int32_t eos = tok.special_id("<|endoftext|>");
    EXPECT_EQ(tok.vocab_size(), 300);
    const auto ids = data::TokenShard((fs::path(c.run_dir()) / "data" / "shard_00000.bin").string()).to_vector();
    EXPECT_EQ(std::count(ids.begin(), ids.end(), eos), docs) << name;
    EXPECT_EQ(ids.back(), eos);
    // The tokens between two end-of-text tokens are the document's text.
    const auto second = std::find(ids.begin(), ids.end(), eos) + 1;
    const auto third = std::find(second, ids.end(), eos);
    EXPECT_EQ(tok.decode(std::vector<int32_t>(second, third)), text.substr(700, 700));
    shards.push_back(ids);
  }
  EXPECT_EQ(shards[0], shards[1]);
  // A given tokenizer without the token.
  const fs::path given = scratch.path() / "plain_tok.json";
  data::BpeTokenizer().save(given.string());
  const std::string m = error_of([&] {
    train(config("jsonl_given", 2, {"--data.files=" + (d / "c.jsonl").string(), "--data.text_key=body",
                                    "--data.tokenizer=" + given.string(), "--data.eos_token=<|endoftext|>"}));
  });
  EXPECT_NE(m.find("data.eos_token = \"<|endoftext|>\" is not a special token of the tokenizer (it has none; forge byte-level BPE"),
            std::string::npos)
      << m;
  const std::string k = error_of([&] { train(config("jsonl_key", 2, {"--data.files=" + (d / "c.jsonl").string()})); });
  EXPECT_NE(k.find("line 1 has no key \"text\"; set data.text_key"), std::string::npos) << k;
}

// data.eos_token = "auto" (the default; Note [end-of-text token]): a tokenizer trained on the fly
// gets "<|endoftext|>" and every document ends with it; a given tokenizer's own token is used
// ("</s>" here); one that has none joins documents as they are and the log says so; "" = none.
TEST_F(TrainerTest, DocumentsEndWithTheTokenizersEndOfTextTokenByDefault) {
  const fs::path d = scratch.path() / "auto_eos";
  fs::create_directories(d);
  std::string jsonl;
  for (int i = 0; i < 40; ++i)
    jsonl += nlohmann::json{{"text", "document number " + std::to_string(i) + " says hello to the world. "}}.dump() + "\n";
  train_testing::write_text(d / "c.jsonl", jsonl);
  auto shard_of = [](const RunConfig& c) {
    return data::TokenShard((fs::path(c.run_dir()) / "data" / "shard_00000.bin").string()).to_vector();
  };
  {  // trained on the fly
    const RunConfig c = config("eos_auto", 2, {"--data.files=" + (d / "c.jsonl").string(), "--eval.every=0"});
    EXPECT_EQ(c.data.eos_token, "auto");
    train(c);
    const auto tok = data::BpeTokenizer::load((fs::path(c.run_dir()) / "tokenizer.json").string());
    ASSERT_EQ(tok.special_tokens(), (std::vector<std::string>{"<|endoftext|>"})) << last_log;
    const auto ids = shard_of(c);
    EXPECT_EQ(std::count(ids.begin(), ids.end(), tok.special_id("<|endoftext|>")), 40);
    EXPECT_NE(last_log.find("every document ends with the tokenizer's end-of-text token \"<|endoftext|>\""),
              std::string::npos) << last_log;
  }
  {  // a given tokenizer's own token
    const fs::path given = scratch.path() / "s_tok.json";
    data::BpeTokenizer::train(jsonl, 300, {"<s>", "</s>"}).save(given.string());
    const RunConfig c = config("eos_given", 2, {"--data.files=" + (d / "c.jsonl").string(), "--eval.every=0",
                                                "--data.tokenizer=" + given.string()});
    train(c);
    const auto tok = data::BpeTokenizer::load(given.string());
    const auto ids = shard_of(c);
    EXPECT_EQ(std::count(ids.begin(), ids.end(), tok.special_id("</s>")), 40) << last_log;
    EXPECT_EQ(std::count(ids.begin(), ids.end(), tok.special_id("<s>")), 0);
  }
  {  // a given tokenizer without one, and "" = none: the same shard, no extra tokens
    const fs::path plain = scratch.path() / "plain_auto_tok.json";
    data::BpeTokenizer().save(plain.string());
    const RunConfig a = config("eos_none_auto", 2, {"--data.files=" + (d / "c.jsonl").string(), "--eval.every=0",
                                                    "--data.tokenizer=" + plain.string()});
    train(a);
    EXPECT_NE(last_log.find("the tokenizer has no end-of-text token"), std::string::npos) << last_log;
    const RunConfig b = config("eos_none", 2, {"--data.files=" + (d / "c.jsonl").string(), "--eval.every=0",
                                               "--data.tokenizer=" + plain.string(), "--data.eos_token="});
    train(b);
    EXPECT_EQ(shard_of(a), shard_of(b));
    EXPECT_EQ(shard_of(a).size(), jsonl.size() - 40 * std::string("{\"text\":\"\"}\n").size());  // bytes of the texts
  }
}

// run.dtype on the CPU: bf16 and f16 parameters with f32 masters train; f16 goes through the
// loss scaler (its scale is in metrics.jsonl) and nothing is skipped at this scale.
TEST_F(TrainerTest, SixteenBitDtypesTrain) {
  for (const char* dtype : {"bf16", "f16"}) {
    const RunConfig c = config(std::string("dt-") + dtype, 12, {std::string("--run.dtype=") + dtype});
    const TrainResult r = train(c);
    ASSERT_EQ(r.losses.size(), 12u) << dtype;
    EXPECT_EQ(r.skipped_steps, 0) << dtype;
    for (double l : r.losses) EXPECT_TRUE(std::isfinite(l)) << dtype;
    EXPECT_LT(mean(r.losses, 9, 12), mean(r.losses, 0, 3)) << dtype;
    std::ifstream in(fs::path(c.run_dir()) / "metrics.jsonl");
    bool has_scale = false;
    for (std::string line; std::getline(in, line);) has_scale |= nlohmann::json::parse(line).contains("loss_scale");
    EXPECT_EQ(has_scale, std::string(dtype) == "f16") << dtype;
  }
}

TEST_F(TrainerTest, TrainRejectsTooLittleValidationData) {
  const std::string e = error_of([&] { train(config("tinyval", 2, {"--data.val_fraction=0.001"})); });
  EXPECT_NE(e.find("data.val_fraction = 0.001 leaves no validation window"), std::string::npos) << e;
}

TEST_F(TrainerTest, BigramBaselineMatchesHandCount) {
  // Tokens 0 1 0 1 0 2 (train) and the window (0 -> 1), (1 -> 0) for validation, vocab 3.
  data::write_shard(scratch.str("train.bin"), std::vector<int32_t>{0, 1, 0, 1, 0, 2}, 3);
  data::write_shard(scratch.str("val.bin"), std::vector<int32_t>{0, 1, 0}, 3);
  const auto shards = data::open_shards({scratch.str("train.bin"), scratch.str("val.bin")});
  data::SequentialWindows val({{shards[1], 0, 3}}, 1, 2);
  // count(0, 1) = 2, count(0) = 3; count(1, 0) = 2, count(1) = 2.
  const double expected = -(std::log(3.0 / 6.0) + std::log(3.0 / 5.0)) / 2.0;
  EXPECT_NEAR(bigram_baseline({{shards[0], 0, 6}}, val, 0, 3), expected, 1e-12);
}

TEST_F(TrainerTest, SampleIsDeterministicForASeed) {
  const TrainResult r = train(config("sample", 20));
  SampleOptions o;
  o.checkpoint = r.run_dir;  // a run directory: its latest checkpoint
  o.prompt = "The cat";
  o.tokens = 24;
  o.temperature = 0.9;
  o.top_k = 20;
  o.seed = 5;
  const SampleResult a = sample(o), b = sample(o);
  EXPECT_EQ(a.text, b.text);
  EXPECT_EQ(a.checkpoint, r.last_checkpoint);
  EXPECT_EQ(a.step, 20);
  EXPECT_EQ(a.text.rfind("The cat", 0), 0u) << a.text;
  EXPECT_FALSE(a.completion.empty());
  EXPECT_EQ(a.text, "The cat" + a.completion);
  o.seed = 6;
  const SampleResult c = sample(o);
  o.seed = 7;
  const SampleResult d = sample(o);
  EXPECT_TRUE(c.text != a.text || d.text != a.text);  // another seed, another draw
  // Greedy decoding ignores the seed.
  o.temperature = 0;
  o.seed = 1;
  const SampleResult g1 = sample(o);
  o.seed = 2;
  EXPECT_EQ(sample(o).text, g1.text);
  // A missing checkpoint is named.
  o.checkpoint = scratch.str("nowhere");
  EXPECT_NE(error_of([&] { sample(o); }).find("does not exist"), std::string::npos);
}

// A lenet run goes through the same loop and reads the same keys as a language model's: each key
// of the config shows in what the run did (steps, lr at every step, optimizer state, metrics).
TEST_F(TrainerTest, LenetRunReadsItsConfigKeys) {
  const std::string toml =
      "[run]\nname = \"fm\"\ndir = \"" + scratch.str("runs") + "\"\nseed = 3\ndevice = \"cpu\"\n"
      "[model]\ntype = \"lenet\"\n"
      "[data]\ndir = \"DATA\"\nmax_train_samples = 100\nmax_test_samples = 50\n"
      "[optim]\nname = \"sgd\"\nlr = 0.05\nmomentum = 0.8\nnesterov = true\nweight_decay = 1e-4\ngrad_clip = 2.0\n"
      "[schedule]\nkind = \"linear\"\nwarmup_steps = 7\nmin_lr = 0.001\n"
      "[train]\nepochs = 2\nbatch_size = 32\neval_batch_size = 20\nlog_every = 3\n";
  auto with_data = [&](const std::string& dir) {
    std::string t = toml;
    return t.replace(t.find("DATA"), 4, dir);
  };
  // The data directory is checked with the config, before any work.
  const std::string e = error_of([&] { parse_config(with_data("/data/fm"), "fm.toml"); });
  EXPECT_NE(e.find("/data/fm/train-images-idx3-ubyte.gz"), std::string::npos) << e;
  EXPECT_NE(e.find("dataset-fashion-mnist"), std::string::npos) << e;
  if (!data::missing_fashion_mnist_file(data::kFashionMnistDir).empty())
    GTEST_SKIP() << "Fashion-MNIST not installed in " << data::kFashionMnistDir;

  const RunConfig c = parse_config(with_data(data::kFashionMnistDir), "fm.toml");
  const TrainResult r = train(c);
  EXPECT_EQ(r.run_dir, scratch.str("runs") + "/fm");
  ASSERT_TRUE(r.image.has_value()) << last_log;
  EXPECT_EQ(r.image->train_images, 100);  // data.max_train_samples
  EXPECT_EQ(r.image->test_images, 50);    // data.max_test_samples
  EXPECT_EQ(r.image->steps_per_epoch, 4);  // ceil(100 / train.batch_size)
  EXPECT_EQ(r.final_step, 8);              // train.epochs x 4
  EXPECT_EQ(r.image->epoch_test_accuracy.size(), 2u);
  EXPECT_NE(last_log.find("sgd, lr 0.05, linear schedule"), std::string::npos) << last_log;

  // train.log_every = 3 (and the first step and each epoch's last); the schedule's lr at each.
  const optim::LRSchedule schedule{.kind = optim::ScheduleKind::linear, .lr = 0.05, .min_lr = 0.001,
                                   .warmup_steps = 7, .total_steps = 8};
  std::vector<int64_t> logged;
  for (const auto& j : telemetry::read_jsonl(fs::path(r.run_dir) / "metrics.jsonl")) {
    if (!j.contains("lr")) continue;
    const int64_t step = j["step"].get<int64_t>();
    logged.push_back(step);
    EXPECT_DOUBLE_EQ(j["lr"].get<double>(), schedule.lr_at(step - 1)) << "step " << step;
  }
  EXPECT_EQ(logged, (std::vector<int64_t>{1, 3, 4, 6, 8}));

  // The optimizer the [optim] keys make, as its checkpointed state records it.
  const auto ck = io::load_checkpoint(r.last_checkpoint);
  const auto& opt = ck.extra.at("optimizer");
  EXPECT_EQ(opt.at("name"), "SGD");
  EXPECT_DOUBLE_EQ(opt.at("scalars").at("group.0.momentum").get<double>(), 0.8);
  EXPECT_DOUBLE_EQ(opt.at("scalars").at("group.0.nesterov").get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(opt.at("scalars").at("group.0.weight_decay").get<double>(), 1e-4);
  EXPECT_DOUBLE_EQ(opt.at("scalars").at("group.1.weight_decay").get<double>(), 0.0);  // biases
  EXPECT_EQ(ck.config.at("run").at("seed"), 3);
  EXPECT_DOUBLE_EQ(ck.config.at("optim").at("grad_clip").get<double>(), 2.0);
  EXPECT_EQ(ck.config.at("train").at("eval_batch_size"), 20);
}

}  // namespace
}  // namespace forge::train
