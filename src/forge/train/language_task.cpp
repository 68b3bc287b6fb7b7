// The task of language models (model.type = "gpt" | "llama"; train/task.h): the tokenizer,
// token shards (or random tokens), random training windows, validation over sequential windows,
// the bigram baseline, tokens per second and MFU. What the loop does with them: train/trainer.h.
#include <algorithm>
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "forge/core/error.h"
#include "forge/data/chat_rows.h"
#include "forge/data/packing.h"
#include "forge/data/shards.h"
#include "forge/nn/model_registry.h"
#include "forge/telemetry/metrics.h"
#include "forge/telemetry/mfu.h"
#include "forge/interop/evaluate.h"
#include "forge/run/language_model.h"
#include "forge/run/layout.h"
#include "forge/run/run_chat_data.h"
#include "forge/run/run_data.h"
#include "forge/train/task.h"

namespace forge::train {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

class LanguageTask final : public Task {
 public:
  // The layout is the one source of the batch's shape (Note [global batch]): its micro-batches per
  // step and each data-parallel rank's rows of a global micro-batch.
  LanguageTask(RunConfig& cfg, const parallel::Layout& layout, bool rank0) : cfg_(cfg), layout_(layout), rank0_(rank0) {}

  Units units() const override { return {"tokens", "tok"}; }
  DType compute_dtype(Device device) const override { return resolve_run_dtype(cfg_.run.dtype, device); }

  // The tokenizer (the run's, or its checkpoint run's on resume), and model.vocab_size from it.
  void prepare_data(const std::optional<io::CheckpointData>& ck, const fs::path& ck_path, std::ostream& log) override {
    if (random_data()) return;
    const auto files = resolve_data_files(cfg_.data);
    // Note [pre-encoded corpora] (run_data.h): shards are trained on as they are; a tokenizer
    // only when data.tokenizer names one (or the checkpoint's run kept one).
    shard_files_ = pre_encoded_shards(files);
    // data.val_files: of the same kind as data.files (both shards, or both text for the tokenizer).
    val_inputs_ = resolve_val_files(cfg_.data);
    if (!val_inputs_.empty()) {
      val_shard_files_ = pre_encoded_shards(val_inputs_);
      FORGE_CHECK(val_shard_files_.empty() == shard_files_.empty(), "data.val_files are ",
                  val_shard_files_.empty() ? "text files" : "token shards", " but data.files are ",
                  shard_files_.empty() ? "text files" : "token shards",
                  "; give both as text, or both as token shards of one tokenizer (forge tokenize encode)");
    }
    if (ck) resume_tok_ = ck_path.parent_path().parent_path() / kTokenizerFile;
    FORGE_CHECK(!chat() || shard_files_.empty(), "data.format = \"chat\" reads .jsonl conversations, but data.files are "
                "token shards ('", shard_files_.empty() ? std::string() : shard_files_.front(), "'); give the .jsonl files");
    if (!shard_files_.empty()) {
      std::error_code ec;
      if (resume_tok_ && !fs::is_regular_file(*resume_tok_, ec)) resume_tok_.reset();
      if (cfg_.data.tokenizer.empty() && !resume_tok_) {
        FORGE_CHECK(cfg_.model.vocab_size > 0, "data.files are token shards already encoded (",
                    data::token_shard_format(shard_files_.front()), ": '", shard_files_.front(),
                    "'): set model.vocab_size to their vocabulary (e.g. 50304 for GPT-2's ids) or data.tokenizer to "
                    "the tokenizer that encoded them");
        log << "tokenizer: none (pre-encoded shards; model.vocab_size = " << cfg_.model.vocab_size << ")\n";
        check_vocab_splits(cfg_, cfg_.model.vocab_size);
        return;
      }
    }
    // data.eos_token = "auto" (Note [end-of-text token], run_data.h): a tokenizer trained here
    // gets "<|endoftext|>"; a given one (or the checkpoint run's) names its own.
    const bool auto_eos = cfg_.data.eos_token == kAutoEosToken;
    if (auto_eos && cfg_.data.tokenizer.empty() && !resume_tok_) cfg_.data.eos_token = kDefaultEosToken;
    tok_ = load_or_train_tokenizer(cfg_, files, resume_tok_, log);
    if (chat()) {  // run/run_chat_data.h: the template, and its special tokens in the tokenizer
      chat_template_.emplace(resolve_chat_template(cfg_, log));
      const int64_t before = tok_->vocab_size();
      tok_ = chat_tokenizer(cfg_, tok_, *chat_template_, log);
      if (cfg_.model.vocab_size == 0) cfg_.model.vocab_size = tok_->vocab_size();
      if (!cfg_.model.init_from.empty() && tok_->vocab_size() > before && cfg_.model.vocab_size < tok_->vocab_size()) {
        // Note [grown vocabulary] (run/hf_model.h): the saved model's tables grow for the new tokens.
        log << "chat: model.init_from's token embedding and head grow from " << cfg_.model.vocab_size << " to "
            << tok_->vocab_size() << " rows for the template's tokens; the new rows start at the mean of the old ones\n";
        cfg_.model.vocab_size = tok_->vocab_size();
      }
      FORGE_CHECK(cfg_.model.vocab_size >= tok_->vocab_size(), "model.vocab_size = ", cfg_.model.vocab_size,
                  " is smaller than the tokenizer's vocabulary with the chat template's tokens (", tok_->vocab_size(),
                  " tokens); set model.vocab_size = 0 or >= ", tok_->vocab_size());
      check_vocab_splits(cfg_, cfg_.model.vocab_size);
      return;
    }
    if (auto_eos) {
      const auto eos = cfg_.data.eos_token == kAutoEosToken ? tok_->eos_token() : std::optional(cfg_.data.eos_token);
      cfg_.data.eos_token = eos.value_or("");
      if (shard_files_.empty())
        log << "data: " << (eos ? "every document ends with the tokenizer's end-of-text token \"" + *eos + "\""
                                : std::string("the tokenizer has no end-of-text token: documents are joined as they "
                                              "are (set data.eos_token to one of its special tokens)"))
            << "\n";
    }
    if (!cfg_.data.eos_token.empty() && shard_files_.empty()) {
      const auto sp = tok_->special_tokens();
      std::string have;
      for (size_t i = 0; i < sp.size() && i < 8; ++i) have += (have.empty() ? "\"" : ", \"") + sp[i] + "\"";
      if (sp.size() > 8) have += ", ...";
      FORGE_CHECK(tok_->token_id(cfg_.data.eos_token).has_value(), "data.eos_token = \"", cfg_.data.eos_token,
                  "\" is not a special token of the tokenizer (",
                  have.empty() ? std::string("it has none") : "it has " + have, "; ", tok_->describe(),
                  "); set data.eos_token to one of them, or \"\" for none");
    }
    if (cfg_.model.vocab_size == 0) cfg_.model.vocab_size = tok_->vocab_size();
    FORGE_CHECK(cfg_.model.vocab_size >= tok_->vocab_size(), "model.vocab_size = ", cfg_.model.vocab_size,
                " is smaller than the tokenizer's vocabulary (", tok_->vocab_size(),
                " tokens); set model.vocab_size = 0 or >= ", tok_->vocab_size());
    check_vocab_splits(cfg_, cfg_.model.vocab_size);
  }

  Model& model() override {
    if (!model_.module) model_ = build_language_model(cfg_);
    return model_;
  }

  void check_resume(const io::CheckpointData& ck, const fs::path& ck_path) const override {
    FORGE_CHECK(ck.step < cfg_.train.steps, "--resume: checkpoint '", ck_path.string(), "' is at step ", ck.step,
                ", and train.steps = ", cfg_.train.steps, "; raise train.steps (e.g. --train.steps=", 2 * ck.step,
                ") to train further");
    if (tok_) {
      const std::string tok_hash = fnv1a_hex(tok_->serialized());
      FORGE_CHECK(!ck.extra.is_object() || ck.extra.value("tokenizer", tok_hash) == tok_hash, "--resume: checkpoint '",
                  ck_path.string(), "' was trained with another tokenizer than '", resume_tok_->string(), "'");
    }
  }

  // Shards (or the random-token shard), the train/val split, the training sampler and the
  // validation windows.
  std::unique_ptr<data::BatchSource> train_batches(std::ostream& log) override {
    if (chat()) return chat_batches(log);
    std::vector<std::string> shard_paths;
    if (random_data()) {
      shard_paths = {write_random_shard(cfg_, log, rank0_)};
      cfg_.data.val_fraction = 0.0;  // random tokens have nothing to validate
    } else if (!shard_files_.empty()) {
      shard_paths = shard_files_;
    } else {
      shard_paths = prepare_shards(cfg_, *tok_, resolve_data_files(cfg_.data), log);
    }
    shards_ = data::open_shards(shard_paths);
    if (!shard_files_.empty()) check_shard_vocabulary(shards_, cfg_.model.vocab_size, log);
    if (val_inputs_.empty()) {
      split_ = data::split_train_val(shards_, cfg_.data.val_fraction);
    } else {  // data.val_files: validation shards of their own; data.files train whole
      const std::vector<std::string> val_paths =
          !val_shard_files_.empty()
              ? val_shard_files_
              : prepare_shards(cfg_, *tok_, val_inputs_, log, data_shards_dir(cfg_).string() + "_val");
      val_shards_ = data::open_shards(val_paths);
      if (!val_shard_files_.empty()) check_shard_vocabulary(val_shards_, cfg_.model.vocab_size, log);
      split_ = {data::whole_shards(shards_), data::whole_shards(val_shards_)};
      log << "data: validation on data.val_files (" << val_paths.size() << " shard(s)); data.files train whole\n";
    }
    // Note [global batch]: B sequences per optimizer step over every rank, drawn as K global
    // micro-batches of B / K; each data-parallel rank trains on its B / (K * dp) rows of each.
    const int64_t T = cfg_.train.seq_len, micro = layout_.micro_batch * layout_.dp;  // a global micro-batch's rows
    int64_t train_starts = 0;
    for (const auto& r : split_.train) train_tokens_ += r.size(), train_starts += std::max<int64_t>(0, r.size() - T);
    for (const auto& r : split_.val) val_tokens_ += r.size();
    FORGE_CHECK(train_starts > 0, "data: no training file holds a window of train.seq_len + 1 = ", T + 1, " tokens (",
                train_tokens_, " training tokens in ", shards_.size(),
                " file(s)); lower train.seq_len or add text to data.files");
    val_windows_.emplace(split_.val, micro, T);
    FORGE_CHECK(!has_val() || val_windows_->num_windows() > 0,
                val_inputs_.empty() ? "data.val_fraction = " + fixed(cfg_.data.val_fraction, 3) : "data.val_files",
                " leaves no validation window of train.seq_len + 1 = ", T + 1, " tokens (", val_tokens_,
                " validation tokens); ", val_inputs_.empty() ? "raise data.val_fraction" : "add validation data",
                " or lower train.seq_len");
    // data.order: random windows (Note [Data RNG]), or every window in order, epoch after epoch.
    std::unique_ptr<data::BatchSource> windows;
    if (cfg_.data.order == "sequential")
      windows = std::make_unique<data::SequentialTrainWindows>(split_.train, micro, T);
    else
      windows = std::make_unique<data::RandomWindowSampler>(split_.train, micro, T,
                                                             static_cast<uint64_t>(cfg_.run.seed) ^ kDataSeedSalt);
    if (cfg_.data.packing != "documents") return windows;
    // Note [packed documents]: every batch marked with its documents, validation's too.
    const int64_t eos = packing_eos_id();
    val_marked_.emplace(*val_windows_, eos);
    log << "data: packed documents: attention and positions restart after each \"" << cfg_.data.eos_token
        << "\" (id " << eos << ")\n";
    return std::make_unique<data::DocumentMarking>(std::move(windows), eos);
  }

  void restore(const io::CheckpointData&) override {}

  int64_t micro_batches_per_step() const override { return layout_.grad_accum; }
  int64_t total_steps() const override { return cfg_.train.steps; }

  std::string describe() const override {
    const auto& m = cfg_.model;
    const int64_t B = layout_.global_batch(), T = cfg_.train.seq_len, K = layout_.grad_accum;
    std::string s = "model: " + m.type + ", " +
                    telemetry::format_count(static_cast<double>(model_.whole_parameters())) + " parameters (" +
                    std::to_string(m.n_layer) + " layers, " + std::to_string(m.n_head) + " heads, width " +
                    std::to_string(width()) + ", vocabulary " + std::to_string(m.vocab_size) + ", context " +
                    std::to_string(m.block_size) + ")\n";
    if (cfg_.lora.enabled()) s += lora_line() + "\n";
    s += "data: " + telemetry::format_count(static_cast<double>(train_tokens_)) + " training tokens, " +
         telemetry::format_count(static_cast<double>(val_tokens_)) + " validation tokens; batch " + std::to_string(B) +
         " x " + std::to_string(T) +
         (K > 1 ? " (" + std::to_string(K) + " micro-batches of " + std::to_string(B / K) + ")" : std::string()) +
         " = " + std::to_string(B * T) + " tokens per step\n";
    return s;
  }

  // 6 FLOPs per matmul parameter and token, plus attention's 12 L T width; with LoRA the frozen
  // base's parameters count 4 (no weight gradients), as forge plan counts them: the MFU of what
  // the step computes, not of full training's work.
  std::optional<double> flops_per_unit() const override {
    const MatmulParameters n = matmul_parameters_by_training(model_);
    const double frozen_saving = cfg_.lora.enabled() ? 2.0 * static_cast<double>(n.frozen) : 0.0;
    return telemetry::transformer_flops_per_token(static_cast<double>(n.trained + n.frozen), cfg_.model.n_layer,
                                                  cfg_.train.seq_len, width()) -
           frozen_saving;
  }
  std::optional<EpochPlace> epoch_of(int64_t) const override { return std::nullopt; }
  void on_step(int64_t, double, int64_t) override {}

  // Every eval.every steps before the last; the last step's evaluation is finish()'s.
  bool eval_due(int64_t step) const override {
    return has_val() && cfg_.eval.every > 0 && step % cfg_.eval.every == 0 && step != cfg_.train.steps;
  }
  Evaluation evaluate(Strategy& strategy, int64_t step) override {
    const double v = validation_loss(strategy);
    Evaluation e{v, json{{"val_loss", v}}, "eval step " + std::to_string(step) + ": val loss " + fixed(v, 4)};
    score_tasks(e.record, e.line);
    return e;
  }

  json checkpoint_extra() const override {
    return tok_ ? json{{"tokenizer", fnv1a_hex(tok_->serialized())}}
                : json{{"data", shard_files_.empty() ? "random" : "pre-encoded shards"}};
  }

  // A last validation pass and the bigram baseline on the same windows.
  void finish(Strategy& strategy, bool evaluates, int64_t step, double units_per_s, TrainResult& result,
              json& final_record, std::ostream& log) override {
    result.train_tokens = train_tokens_;
    result.val_tokens = val_tokens_;
    result.tokens_per_s = units_per_s;
    if (!has_val() || !evaluates) return;
    result.final_val_loss = validation_loss(strategy);
    result.evals.push_back({step, result.final_val_loss});
    final_record["val_loss"] = result.final_val_loss;
    if (!cfg_.eval.tasks.empty()) {
      std::string line = "tasks at step " + std::to_string(step);
      score_tasks(final_record, line);
      log << line << std::endl;
    }
    if (cfg_.eval.bigram_baseline && rank0_ && !chat()) {
      val_windows_->reset();
      result.bigram_val_loss = bigram_baseline(split_.train, *val_windows_, cfg_.eval.batches,
                                               tok_ ? tok_->vocab_size() : cfg_.model.vocab_size);
      final_record["bigram_val_loss"] = result.bigram_val_loss;
      log << "val loss " << fixed(result.final_val_loss, 2) << " vs bigram " << fixed(result.bigram_val_loss, 2)
          << " (step " << step << ")" << std::endl;
    } else {
      log << "val loss " << fixed(result.final_val_loss, 2) << " (step " << step << ")" << std::endl;
    }
  }

 private:
  bool random_data() const { return cfg_.data.source == "random"; }
  bool chat() const { return cfg_.data.format == "chat"; }
  // data.format = "chat": conversations packed into rows (Note [chat rows]), trained where their
  // masks say (Note [chat masks]); validation on the last conversations of each file, or on
  // data.val_files.
  std::unique_ptr<data::BatchSource> chat_batches(std::ostream& log) {
    const fs::path dir = data_shards_dir(cfg_);
    auto open = [&](const std::vector<std::string>& paths) {
      std::vector<std::vector<data::ChatSpan>> per_shard;
      for (const auto& p : paths) {
        auto t = std::make_shared<const data::TokenShard>(p);
        per_shard.push_back(data::chat_conversations(t, std::make_shared<const data::TokenShard>(data::chat_flags_path(p))));
        shards_.push_back(std::move(t));
      }
      return per_shard;
    };
    const auto train_files = open(prepare_chat_shards(cfg_, *tok_, *chat_template_, resolve_data_files(cfg_.data),
                                                      dir.string(), log));
    data::ChatSplit split;
    if (val_inputs_.empty()) {
      split = data::split_chat(train_files, cfg_.data.val_fraction);
    } else {
      split = data::split_chat(train_files, 0.0);
      const auto val_files =
          open(prepare_chat_shards(cfg_, *tok_, *chat_template_, val_inputs_, dir.string() + "_val", log));
      split.val = data::split_chat(val_files, 0.0).train;
    }
    const int64_t T = cfg_.train.seq_len, micro = layout_.micro_batch * layout_.dp;
    for (const auto& c : split.train) train_tokens_ += c.size();
    for (const auto& c : split.val) val_tokens_ += c.size();
    const auto order = cfg_.data.order == "sequential" ? data::ChatRows::Order::sequential : data::ChatRows::Order::random;
    auto rows = std::make_unique<data::ChatRows>(split.train, micro, T, order,
                                                 static_cast<uint64_t>(cfg_.run.seed) ^ kDataSeedSalt);
    FORGE_CHECK(rows->num_rows() >= (order == data::ChatRows::Order::sequential ? micro : 1),
                "data.format = \"chat\": the training conversations fill ", rows->num_rows(), " row(s) of train.seq_len = ",
                T, (order == data::ChatRows::Order::sequential ? "; data.order = \"sequential\" needs a global micro-batch of " +
                    std::to_string(micro) + " rows; add conversations, lower the batch or use data.order = \"random\""
                                                             : std::string("; add conversations")));
    if (has_val()) {
      val_chat_.emplace(split.val, micro, T, data::ChatRows::Order::evaluation);
      FORGE_CHECK(val_chat_->num_rows() > 0, val_inputs_.empty() ? "data.val_fraction = " + fixed(cfg_.data.val_fraction, 3)
                                                                 : std::string("data.val_files"),
                  " leaves no validation conversation; ", val_inputs_.empty() ? "raise data.val_fraction" : "add some",
                  " or set data.val_fraction = 0");
    }
    log << "chat: " << split.train.size() << " training conversations in " << rows->num_rows() << " rows of " << T
        << " (" << rows->trained_targets() << " trained targets), " << split.val.size()
        << " validation conversations; each conversation attends only to itself (Note [chat rows])\n";
    return rows;
  }
  // eval.tasks (interop/evaluate.h): every rank scores every task on its whole model (the layouts
  // allowed keep one: config_checks), so no rank waits in a collective for another's scoring;
  // eval_<task>_acc and eval_<task>_acc_norm go into the record, and the log line.
  void score_tasks(json& record, std::string& line) {
    for (const auto& file : cfg_.eval.tasks) {
      const TaskScore s = multiple_choice(model_, *tok_, file, cfg_.eval.task_examples);
      record["eval_" + s.task + "_acc"] = s.acc;
      record["eval_" + s.task + "_acc_norm"] = s.acc_norm;
      line += ", " + s.task + " acc " + fixed(s.acc, 4) + " acc_norm " + fixed(s.acc_norm, 4) + " (" +
              std::to_string(s.examples) + ")";
    }
  }
  // LoRA (nn/lora.h): what is trained of the whole model.
  std::string lora_line() const {
    const ParameterCounts n = parameter_counts(model_);
    std::string targets;
    for (const auto& t : cfg_.lora.targets) targets += (targets.empty() ? "" : ", ") + t;
    return "lora: rank " + std::to_string(cfg_.lora.rank) + ", alpha " + fixed(cfg_.lora.alpha, 2) + ", dropout " +
           fixed(cfg_.lora.dropout, 2) + " on " + targets + ": " + std::to_string(n.trainable) +
           " trainable parameters of " + std::to_string(n.total) + " (" +
           fixed(100.0 * static_cast<double>(n.trainable) / static_cast<double>(n.total), 3) +
           "%); the base frozen (no gradients, no optimizer state)";
  }
  bool has_val() const { return cfg_.data.val_fraction > 0 || !val_inputs_.empty(); }
  int64_t width() const { return nn::transformer_shape(cfg_.model).d_model; }
  // The mean cross-entropy per target token of the first eval.batches validation windows (the
  // same windows every time).
  double validation_loss(Strategy& strategy) {
    if (val_chat_) {
      val_chat_->reset();
      return strategy.evaluate(*val_chat_, cfg_.eval.batches, /*count_correct=*/false).mean_loss();
    }
    val_windows_->reset();
    data::BatchSource& windows = val_marked_ ? static_cast<data::BatchSource&>(*val_marked_) : *val_windows_;
    return strategy.evaluate(windows, cfg_.eval.batches, /*count_correct=*/false).mean_loss();
  }
  // data.packing = "documents": the id of the end-of-text token that ends each document.
  int64_t packing_eos_id() const {
    FORGE_CHECK(tok_ != nullptr, "data.packing = \"documents\" with token shards and no tokenizer: the end-of-text "
                "token's id is unknown; set data.tokenizer to the tokenizer that encoded the shards");
    const auto id = tok_->token_id(cfg_.data.eos_token);
    FORGE_CHECK(!cfg_.data.eos_token.empty() && id.has_value(), "data.packing = \"documents\": the tokenizer (",
                tok_->describe(), ") has no end-of-text token to find documents by (data.eos_token = \"",
                cfg_.data.eos_token, "\"); set data.eos_token to one of its special tokens");
    return *id;
  }

  RunConfig& cfg_;
  const parallel::Layout layout_;
  const bool rank0_;
  std::shared_ptr<const data::Tokenizer> tok_;
  std::vector<std::string> shard_files_;  // Note [pre-encoded corpora]: data.files as shards
  std::vector<std::string> val_inputs_;       // data.val_files, resolved
  std::vector<std::string> val_shard_files_;  // ... when they are shards already encoded
  std::optional<fs::path> resume_tok_;
  LanguageModel model_;
  std::vector<std::shared_ptr<const data::TokenShard>> shards_, val_shards_;
  data::TrainValRanges split_;
  std::optional<data::SequentialWindows> val_windows_;
  std::optional<data::DocumentMarking> val_marked_;  // val_windows_ marked (data.packing = "documents")
  std::optional<data::ChatTemplate> chat_template_;  // data.format = "chat"
  std::optional<data::ChatRows> val_chat_;           // ... its validation rows
  int64_t train_tokens_ = 0, val_tokens_ = 0;
};

}  // namespace

std::unique_ptr<Task> make_language_task(RunConfig& cfg, const parallel::Layout& layout, bool rank0) {
  return std::make_unique<LanguageTask>(cfg, layout, rank0);
}

}  // namespace forge::train
