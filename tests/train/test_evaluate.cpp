// forge eval (interop/evaluate.h) and forge sample's controls (interop/sample.h) on a tiny GPT trained
// for a few steps. eval: the held-out loss and the
// multiple-choice scores against an independent computation from the model's logits (log-softmax
// in f64, one sequence at a time, no padding), the HellaSwag layouts, errors, and the CLI.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "forge/autograd/grad_mode.h"
#include "forge/core/generator.h"
#include "forge/core/error.h"
#include "forge/io/checkpoint.h"
#include "forge/ops/creation.h"
#include "forge/run/config.h"
#include "forge/ops/attention.h"
#include "forge/ops/matmul.h"
#include "forge/interop/evaluate.h"
#include "forge/run/run_checkpoint.h"
#include "forge/run/run_data.h"
#include "forge/interop/sample.h"
#include "forge/train/trainer.h"
#include "testing/cli_testing.h"
#include "testing/tensor_testing.h"
#include "train_testing.h"

namespace forge::train {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using forge::testing::error_of;

// log p(ids[i] | ids[< i]) for i >= 1, from the model's logits in f64 (one sequence, batch 1).
std::vector<double> reference_logprobs(const LanguageModel& m, const std::vector<int32_t>& ids) {
  NoGradGuard ng;
  std::vector<int64_t> in(ids.begin(), ids.end() - 1);
  const Tensor logits = m.forward(from_vector(in, {1, static_cast<int64_t>(in.size())}));
  const auto V = m.vocab_size;
  const std::vector<double> l = logits.to(DType::f64).to_vector<double>();
  std::vector<double> out;
  for (size_t t = 0; t < in.size(); ++t) {
    const double* row = l.data() + t * static_cast<size_t>(V);
    const double mx = *std::max_element(row, row + V);
    double z = 0;
    for (int64_t v = 0; v < V; ++v) z += std::exp(row[v] - mx);
    out.push_back(row[ids[t + 1]] - mx - std::log(z));
  }
  return out;
}

class EvaluateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    train_testing::write_corpus(scratch.path() / "corpus");
    const RunConfig c = parse_config(train_testing::tiny_toml(scratch.path(), "ev", 12), "ev.toml", {"--eval.every=0"});
    std::ostringstream log;
    run = run_training(c, {}, log);
    // The checkpoint's model and tokenizer, loaded as forge eval loads them.
    const io::CheckpointData ck = io::load_checkpoint(run.last_checkpoint);
    cfg = config_from_json(ck.config, "test");
    model = build_language_model(cfg);
    model.module->load_state_dict(ck.model.items());
    model.module->eval();
    tok = data::load_tokenizer((fs::path(run.run_dir) / kTokenizerFile).string());
  }
  train_testing::Scratch scratch;
  TrainResult run;
  RunConfig cfg;
  LanguageModel model;
  std::shared_ptr<const data::Tokenizer> tok;
};

TEST_F(EvaluateTest, HeldOutLossIsTheMeanOfEveryWindowsPredictions) {
  const fs::path f = scratch.path() / "held_out.txt";
  train_testing::write_text(f, train_testing::synthetic_text(3000, 9));
  for (const char* eos_name : {"", "<|endoftext|>"}) {
    const std::string eos = eos_name;
    const FileLoss r = file_loss(model, *tok, f.string(), "text", eos, 32, 3);
    // Independently: the same stream, windows of 33 tokens stepping by 32, the last shorter one.
    std::vector<int32_t> s = tok->encode_ordinary(train_testing::read_text(f));
    if (!eos.empty()) s.push_back(tok->special_id(eos));
    double total = 0;
    int64_t n = 0;
    for (size_t at = 0; at + 1 < s.size(); at += 32) {
      const size_t end = std::min(s.size(), at + 33);
      for (double lp : reference_logprobs(model, std::vector<int32_t>(s.begin() + at, s.begin() + end))) total -= lp, ++n;
    }
    EXPECT_EQ(r.tokens, n);
    EXPECT_EQ(r.documents, 1);
    EXPECT_NEAR(r.loss, total / n, 1e-5) << "eos '" << eos << "'";
    EXPECT_NEAR(r.perplexity, std::exp(total / n), 1e-3);
    EXPECT_GT(r.loss, 0.5);
    EXPECT_LT(r.loss, std::log(300.0) + 0.5);  // trained a little: about uniform at worst
  }
}

TEST_F(EvaluateTest, ContinuationsOfDifferentLengthsInOneBatchScoreAsAlone) {
  const std::vector<std::vector<int32_t>> seqs = {tok->encode_ordinary("The cat sat on the mat. A dog"),
                                                  tok->encode_ordinary("The cat"),
                                                  tok->encode_ordinary("Birds sing in the morning while it rains")};
  const std::vector<size_t> from = {3, 1, 5};
  const std::vector<double> got = continuation_logprobs(model, seqs, from);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const auto ref = reference_logprobs(model, seqs[i]);
    double want = 0;
    for (size_t t = from[i]; t < seqs[i].size(); ++t) want += ref[t - 1];
    EXPECT_NEAR(got[i], want, 1e-4 * (1 + std::abs(want))) << i;
  }
  EXPECT_NE(error_of([&] { continuation_logprobs(model, {{1, 2, 3}}, {0}); }).find("the first token has no prediction"),
            std::string::npos);
}

TEST_F(EvaluateTest, MultipleChoiceAccuracyPicksTheLikeliestEnding) {
  // Eight examples in both HellaSwag layouts; the expected picks computed one ending at a time.
  const std::vector<std::string> ctxs = {"The cat", "A dog runs", "Birds", "The man reads", "Rain falls on",
                                         "She writes", "The old tree", "Children play"};
  const std::vector<std::vector<std::string>> ends = {
      {"sat on the mat.", "zq xv.", "sat.", "runs fast"}, {"in the park.", "qqq", "to the house and back.", "on"},
      {"sing.", "sing in the morning.", "xx yy zz", "fly"}, {"a book.", "the newspaper today.", "zzzz", "a"},
      {"the roof.", "the green grass of the field.", "kk", "it"}, {"a letter.", "poems at night.", "qz", "x"},
      {"falls.", "grows tall in the garden.", "vv", "is"}, {"outside.", "with the ball in the yard.", "ww", "a"}};
  std::string jsonl;
  int64_t want = 0, want_norm = 0;
  for (size_t i = 0; i < ctxs.size(); ++i) {
    std::vector<double> lp, norm;
    for (const auto& e : ends[i]) {
      std::vector<int32_t> s = tok->encode_ordinary(ctxs[i]);
      const size_t from = s.size();
      const auto c = tok->encode_ordinary(" " + e);
      s.insert(s.end(), c.begin(), c.end());
      const auto ref = reference_logprobs(model, s);
      double sum = 0;
      for (size_t t = from; t < s.size(); ++t) sum += ref[t - 1];
      lp.push_back(sum);
      norm.push_back(sum / static_cast<double>(e.size() + 1));
    }
    const auto best = std::max_element(lp.begin(), lp.end()) - lp.begin();
    const auto best_norm = std::max_element(norm.begin(), norm.end()) - norm.begin();
    const int64_t label = static_cast<int64_t>(i % 4);  // some right, some wrong
    want += best == label;
    want_norm += best_norm == label;
    json ex = {{"endings", ends[i]}, {"label", i % 2 ? json(label) : json(std::to_string(label))}};
    if (i % 3 == 0) {
      const auto sp = ctxs[i].find(' ');
      ex["ctx_a"] = sp == std::string::npos ? ctxs[i] : ctxs[i].substr(0, sp);
      ex["ctx_b"] = sp == std::string::npos ? "" : ctxs[i].substr(sp + 1);
    } else {
      ex["ctx"] = ctxs[i];
    }
    jsonl += ex.dump() + "\n";
  }
  const fs::path f = scratch.path() / "mc_val.jsonl";
  train_testing::write_text(f, jsonl);
  const TaskScore r = multiple_choice(model, *tok, f.string(), 0);
  EXPECT_EQ(r.task, "mc_val");
  EXPECT_EQ(r.examples, 8);
  EXPECT_DOUBLE_EQ(r.acc, static_cast<double>(want) / 8);
  EXPECT_DOUBLE_EQ(r.acc_norm, static_cast<double>(want_norm) / 8);
  EXPECT_EQ(multiple_choice(model, *tok, f.string(), 3).examples, 3);

  // Bad lines are named.
  const fs::path bad = scratch.path() / "bad.jsonl";
  train_testing::write_text(bad, jsonl.substr(0, jsonl.find('\n') + 1) + "{\"ctx\": \"x\", \"endings\": [\"a\", \"b\"]}\n");
  EXPECT_NE(error_of([&] { multiple_choice(model, *tok, bad.string(), 0); }).find("line 2 needs \"label\""),
            std::string::npos);
  train_testing::write_text(bad, "not json\n");
  EXPECT_NE(error_of([&] { multiple_choice(model, *tok, bad.string(), 0); }).find("line 1 is not JSON"), std::string::npos);
}

TEST_F(EvaluateTest, ForgeEvalReadsTheCheckpointItsTokenizerAndPrintsJson) {
  const fs::path f = scratch.path() / "val.txt";
  train_testing::write_text(f, train_testing::synthetic_text(2000, 4));
  const fs::path t = scratch.path() / "task.jsonl";
  train_testing::write_text(t, "{\"ctx\": \"The cat\", \"endings\": [\"sat.\", \"qq\"], \"label\": 0}\n");
  const EvalResult e = evaluate({.checkpoint = run.run_dir, .files = {f.string()}, .tasks = {t.string()}});
  ASSERT_EQ(e.files.size(), 1u);
  ASSERT_EQ(e.tasks.size(), 1u);
  EXPECT_EQ(e.step, 12);
  // The run's eos is "auto" -> "<|endoftext|>" (a tokenizer trained on the fly has it).
  EXPECT_NEAR(e.files[0].loss, file_loss(model, *tok, f.string(), "text", "<|endoftext|>", 32, 8).loss, 1e-6);

  const auto r = testing::run_forge({"eval", "--checkpoint", run.run_dir, "--files", f.string(), "--tasks", t.string(),
                                     "--json"},
                                    testing::Stderr::dropped);
  ASSERT_EQ(r.status, 0) << r.out;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["step"], 12);
  EXPECT_NEAR(j["files"][0]["loss"].get<double>(), e.files[0].loss, 1e-9);
  EXPECT_EQ(j["tasks"][0]["examples"], 1);
  const auto none = testing::run_forge({"eval", "--checkpoint", run.run_dir});
  EXPECT_NE(none.status, 0);
  EXPECT_NE(none.out.find("nothing to evaluate"), std::string::npos) << none.out;
  const auto missing = testing::run_forge({"eval", "--checkpoint", run.run_dir, "--files", "/no/such.txt"});
  EXPECT_NE(missing.out.find("'/no/such.txt' is not a readable file"), std::string::npos) << missing.out;
}

// eval.tasks: the tasks are scored at every evaluation and at the end, into metrics.jsonl.
TEST_F(EvaluateTest, TrainingScoresEvalTasksIntoTheMetrics) {
  const fs::path t = scratch.path() / "tiny_mc.jsonl";
  train_testing::write_text(t, "{\"ctx\": \"The cat\", \"endings\": [\"sat.\", \"qq\", \"runs\"], \"label\": 0}\n"
                               "{\"ctx\": \"A dog\", \"endings\": [\"zz\", \"runs fast.\"], \"label\": 1}\n");
  const RunConfig c = parse_config(train_testing::tiny_toml(scratch.path(), "ev_tasks", 10), "ev_tasks.toml",
                                   {"--eval.every=5", "--eval.tasks=[\"" + t.string() + "\"]"});
  std::ostringstream log;
  const TrainResult r = run_training(c, {}, log);
  std::ifstream in(fs::path(r.run_dir) / "metrics.jsonl");
  int scored = 0;
  bool final_scored = false;
  for (std::string line; std::getline(in, line);) {
    const json j = json::parse(line);
    if (!j.contains("eval_tiny_mc_acc")) continue;
    ++scored;
    for (const char* k : {"eval_tiny_mc_acc", "eval_tiny_mc_acc_norm"}) {
      const double a = j[k].get<double>();
      EXPECT_TRUE(a == 0.0 || a == 0.5 || a == 1.0) << k << " " << a;  // 2 examples
    }
    final_scored |= j.value("final", false);
  }
  EXPECT_EQ(scored, 2) << log.str();  // the evaluation at step 5, and the final one (step 10)
  EXPECT_TRUE(final_scored);
  EXPECT_NE(log.str().find("tiny_mc acc "), std::string::npos) << log.str();
  // Layouts that split the model are refused before work, and so is a missing file.
  EXPECT_NE(error_of([&] {
              parse_config(train_testing::tiny_toml(scratch.path(), "ev_tp", 2), "t.toml",
                           {"--eval.tasks=[\"" + t.string() + "\"]", "--dist.tp=2"});
            }).find("score the checkpoints with forge eval --tasks instead"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              parse_config(train_testing::tiny_toml(scratch.path(), "ev_no", 2), "t.toml", {"--eval.tasks=[\"/no/x.jsonl\"]"});
            }).find("eval.tasks: '/no/x.jsonl' is not a readable file"),
            std::string::npos);
}

// forge sample's controls: top-p keeps the smallest set of likeliest tokens reaching p.
TEST(SampleControls, TopPDrawsOnlyFromTheNucleus) {
  const std::vector<double> logits = {std::log(0.5), std::log(0.3), std::log(0.15), std::log(0.05)};
  Generator gen(11);
  std::vector<int> seen(4, 0);
  for (int i = 0; i < 4000; ++i) ++seen[static_cast<size_t>(pick_token(logits, {1.0, 0, 0.7}, gen))];
  EXPECT_EQ(seen[2] + seen[3], 0);  // 0.5 + 0.3 reaches 0.7: the nucleus is {0, 1}
  EXPECT_NEAR(seen[0] / 4000.0, 0.5 / 0.8, 0.03);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(pick_token(logits, {1.0, 0, 0.5}, gen), 0);  // 0.5 alone reaches 0.5
  std::fill(seen.begin(), seen.end(), 0);
  for (int i = 0; i < 4000; ++i) ++seen[static_cast<size_t>(pick_token(logits, {1.0, 0, 1.0}, gen))];
  EXPECT_GT(seen[3], 100);  // p = 1: every token
  // top-k then top-p: k = 3 renormalises to 0.5/0.95, 0.3/0.95, ...; p = 0.9 keeps {0, 1, 2}.
  std::fill(seen.begin(), seen.end(), 0);
  for (int i = 0; i < 4000; ++i) ++seen[static_cast<size_t>(pick_token(logits, {1.0, 3, 0.9}, gen))];
  EXPECT_EQ(seen[3], 0);
  EXPECT_GT(seen[2], 300);
}

// Note [inference kernels]: decoding and multiple-choice scoring run attention on the kernels planned for no
// shape and GEMMs without timing, then restore the process's choice ("composed" is kept).
TEST(InferenceKernels, SwitchToUnplannedKernelsForTheirScopeAndRestore) {
  const std::string before = ops::attention_backend();
  const bool tuning = ops::gemm_tuning();
  {
    const InferenceKernels k;
    EXPECT_EQ(ops::attention_backend(), "flash");
    EXPECT_FALSE(ops::gemm_tuning());
  }
  EXPECT_EQ(ops::attention_backend(), before);
  EXPECT_EQ(ops::gemm_tuning(), tuning);
  ops::set_attention_backend("composed");
  {
    const InferenceKernels k;
    EXPECT_EQ(ops::attention_backend(), "composed");
  }
  EXPECT_EQ(ops::attention_backend(), "composed");
  ops::set_attention_backend(before);
}

TEST_F(EvaluateTest, SampleStopsAtAStopStringAndTakesSeveralPrompts) {
  SampleOptions o;
  o.checkpoint = run.run_dir;
  o.prompt = "The cat";
  o.tokens = 30;
  o.temperature = 0;  // greedy: the same tokens every time
  const SampleResult full = sample(o);
  ASSERT_GE(full.completion.size(), 8u) << full.completion;
  EXPECT_EQ(full.new_tokens.front(), 30);
  EXPECT_GT(full.tokens_per_s, 0);
  EXPECT_GT(full.first_token_seconds, 0);  // the prompt's window and the first draw
  EXPECT_LT(full.first_token_seconds, full.seconds);
  EXPECT_GT(full.decode_tokens_per_s, 0);  // 29 tokens after it
  EXPECT_NEAR(full.decode_tokens_per_s * (full.seconds - full.first_token_seconds), 29.0, 1e-6);
  const std::string stop = full.completion.substr(4, 3);
  o.stop = {"never appears \x01", stop};
  const SampleResult cut = sample(o);
  EXPECT_EQ(cut.completion, full.completion.substr(0, full.completion.find(stop)));
  EXPECT_LT(cut.new_tokens.front(), 30);
  // Several prompts: each as if alone, prompt i drawing from seed + i.
  SampleOptions m;
  m.checkpoint = run.run_dir;
  m.prompts = {"A dog", "Birds"};
  m.tokens = 12;
  m.temperature = 0.9;
  m.top_p = 0.9;
  m.seed = 4;
  const SampleResult both = sample(m);
  ASSERT_EQ(both.completions.size(), 2u);
  for (size_t k = 0; k < 2; ++k) {
    SampleOptions one = m;
    one.prompts = {m.prompts[k]};
    one.seed = m.seed + k;
    EXPECT_EQ(sample(one).completion, both.completions[k]) << k;
  }
  const auto r = testing::run_forge({"sample", "--checkpoint", run.run_dir, "--prompt", "A dog", "--prompt", "Birds",
                                     "--tokens", "12", "--temperature", "0.9", "--top-p", "0.9", "--seed", "4", "--json"},
                                    testing::Stderr::dropped);
  ASSERT_EQ(r.status, 0) << r.out;
  const json j = json::parse(r.out);
  ASSERT_EQ(j["samples"].size(), 2u) << r.out;
  EXPECT_EQ(j["samples"][1]["new_tokens"], both.new_tokens[1]);
  EXPECT_GT(j["tokens_per_s"].get<double>(), 0);
  EXPECT_GT(j["decode_tokens_per_s"].get<double>(), 0);
  EXPECT_GT(j["first_token_seconds"].get<double>(), 0);
  // Without the KV cache: the same text (each token from the whole window again).
  const auto nc = testing::run_forge({"sample", "--checkpoint", run.run_dir, "--prompt", "A dog", "--prompt", "Birds",
                                      "--tokens", "12", "--temperature", "0.9", "--top-p", "0.9", "--seed", "4", "--json",
                                      "--no-kv-cache"},
                                     testing::Stderr::dropped);
  ASSERT_EQ(nc.status, 0) << nc.out;
  const json jn = json::parse(nc.out);
  EXPECT_EQ(jn["kv_cache"], false);
  EXPECT_EQ(jn["samples"], j["samples"]);
  EXPECT_NE(testing::run_forge({"sample", "--checkpoint", run.run_dir, "--top-p", "0"}).out.find("--top-p must be in (0, 1]"),
            std::string::npos);
}

}  // namespace
}  // namespace forge::train
