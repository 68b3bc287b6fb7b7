// `forge eval` (contracts and Notes in evaluate.h).
#include "forge/interop/evaluate.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "forge/autograd/grad_mode.h"
#include "forge/core/error.h"
#include "forge/data/documents.h"
#include "forge/io/checkpoint.h"
#include "forge/io/json_input.h"
#include "forge/ops/creation.h"
#include "forge/ops/loss.h"
#include "forge/run/run_checkpoint.h"
#include "forge/run/run_data.h"
#include "forge/interop/sample.h"

namespace forge::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The model in eval mode without gradients for a scope.
class Inference {
 public:
  explicit Inference(const LanguageModel& m) : m_(m), was_training_(m.module->is_training()) { m.module->eval(); }
  ~Inference() { m_.module->train(was_training_); }
  Inference(const Inference&) = delete;
  Inference& operator=(const Inference&) = delete;

 private:
  NoGradGuard no_grad_;
  const LanguageModel& m_;
  bool was_training_;
};

// Per-token cross-entropy of next-token prediction over a (B, L) batch of ids: inputs [:, :-1],
// targets [:, 1:] with `ignore` (B x (L - 1), true = not scored) -> (B, L - 1) losses on the host.
std::vector<float> token_losses(const LanguageModel& model, const std::vector<int64_t>& ids, int64_t B, int64_t L,
                                const std::vector<bool>& ignore) {
  std::vector<int64_t> in(static_cast<size_t>(B * (L - 1))), tg(in.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t + 1 < L; ++t) {
      const auto k = static_cast<size_t>(b * (L - 1) + t);
      in[k] = ids[static_cast<size_t>(b * L + t)];
      tg[k] = ignore[k] ? -100 : ids[static_cast<size_t>(b * L + t + 1)];
    }
  const Tensor logits = model.forward(from_vector(in, {B, L - 1}).to(model.device()));  // (B, L-1, V)
  const Tensor loss = ops::cross_entropy(logits, from_vector(tg, {B, L - 1}).to(model.device()), -100,
                                         ops::Reduction::none);
  return loss.to(Device::cpu()).to(DType::f32).to_vector<float>();
}

std::string task_name(const std::string& file) {
  std::string n = fs::path(file).filename().string();
  for (const char* ext : {".gz", ".jsonl", ".json"})
    if (n.size() > std::strlen(ext) && n.ends_with(ext)) n.resize(n.size() - std::strlen(ext));
  return n;
}

std::string resolved_eos(const RunConfig& cfg, const data::Tokenizer& tok) {
  if (cfg.data.eos_token != kAutoEosToken) return cfg.data.eos_token;
  return tok.eos_token().value_or("");
}

}  // namespace

std::vector<double> continuation_logprobs(const LanguageModel& model, const std::vector<std::vector<int32_t>>& seqs,
                                          const std::vector<size_t>& from) {
  FORGE_CHECK(!seqs.empty() && seqs.size() == from.size(), "continuation_logprobs: one start per sequence");
  size_t L = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    FORGE_CHECK(seqs[i].size() >= 2 && static_cast<int64_t>(seqs[i].size()) <= model.block_size + 1,
                "continuation_logprobs: sequence ", i, " has ", seqs[i].size(), " tokens; give 2 .. block_size + 1 = ",
                model.block_size + 1);
    FORGE_CHECK(from[i] >= 1 && from[i] < seqs[i].size(), "continuation_logprobs: sequence ", i,
                " scores from token ", from[i], " of ", seqs[i].size(), " (the first token has no prediction)");
    L = std::max(L, seqs[i].size());
  }
  const auto B = static_cast<int64_t>(seqs.size());
  const auto Li = static_cast<int64_t>(L);
  std::vector<int64_t> ids(static_cast<size_t>(B * Li), 0);  // right-padded: causal attention never sees the pad
  std::vector<bool> ignore(static_cast<size_t>(B * (Li - 1)), true);
  for (int64_t b = 0; b < B; ++b) {
    const auto& s = seqs[static_cast<size_t>(b)];
    for (size_t t = 0; t < s.size(); ++t) ids[static_cast<size_t>(b * Li) + t] = s[t];
    for (size_t t = from[static_cast<size_t>(b)]; t < s.size(); ++t) ignore[static_cast<size_t>(b * (Li - 1)) + t - 1] = false;
  }
  Inference guard(model);
  const InferenceKernels kernels;  // each group of answers its own length (Note [inference kernels])
  const std::vector<float> loss = token_losses(model, ids, B, Li, ignore);
  std::vector<double> out(seqs.size(), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t + 1 < Li; ++t)
      if (!ignore[static_cast<size_t>(b * (Li - 1) + t)]) out[static_cast<size_t>(b)] -= loss[static_cast<size_t>(b * (Li - 1) + t)];
  return out;
}

FileLoss file_loss(const LanguageModel& model, const data::Tokenizer& tok, const std::string& file,
                   const std::string& text_key, const std::string& eos, int64_t seq_len, int64_t batch) {
  FORGE_CHECK(seq_len >= 1 && batch >= 1, "eval: the window (", seq_len, ") and the batch (", batch, ") must be >= 1");
  FileLoss r;
  r.file = file;
  const int32_t eos_id = eos.empty() ? -1 : tok.special_id(eos);
  std::vector<int32_t> stream;
  r.documents = data::for_each_document(file, text_key, [&](std::string_view doc) {
    tok.encode_ordinary_into(doc, stream);
    if (eos_id >= 0) stream.push_back(eos_id);
  });
  FORGE_CHECK(stream.size() >= 2, "eval: '", file, "' holds ", stream.size(),
              " token(s); a loss needs at least 2 (one to predict from, one to predict)");
  const int64_t T = std::min(seq_len, model.block_size);
  const auto n = static_cast<int64_t>(stream.size());
  Inference guard(model);
  double total = 0;
  // Full windows of T + 1 tokens, `batch` at a time; then the shorter last one.
  std::vector<int64_t> starts;
  for (int64_t s = 0; s + T + 1 <= n; s += T) starts.push_back(s);
  for (size_t i = 0; i < starts.size(); i += static_cast<size_t>(batch)) {
    const auto B = static_cast<int64_t>(std::min(starts.size() - i, static_cast<size_t>(batch)));
    std::vector<int64_t> ids(static_cast<size_t>(B * (T + 1)));
    for (int64_t b = 0; b < B; ++b)
      std::copy_n(stream.begin() + starts[i + static_cast<size_t>(b)], T + 1, ids.begin() + b * (T + 1));
    for (float l : token_losses(model, ids, B, T + 1, std::vector<bool>(static_cast<size_t>(B * T), false))) total += l;
    r.tokens += B * T;
  }
  const int64_t rest_from = starts.empty() ? 0 : starts.back() + T;
  if (n - rest_from >= 2) {
    const int64_t L = n - rest_from;
    std::vector<int64_t> ids(stream.begin() + rest_from, stream.end());
    for (float l : token_losses(model, ids, 1, L, std::vector<bool>(static_cast<size_t>(L - 1), false))) total += l;
    r.tokens += L - 1;
  }
  r.loss = total / static_cast<double>(r.tokens);
  r.perplexity = std::exp(r.loss);
  return r;
}

TaskScore multiple_choice(const LanguageModel& model, const data::Tokenizer& tok, const std::string& file,
                          int64_t max_examples) {
  TaskScore r;
  r.file = file;
  r.task = task_name(file);
  int64_t right = 0, right_norm = 0;
  int64_t line_no = 0;
  std::ifstream in(file);
  FORGE_CHECK(in.good(), "eval: cannot read task file '", file, "'");
  for (std::string line; std::getline(in, line) && (max_examples <= 0 || r.examples < max_examples);) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = "eval: '" + file + "' line " + std::to_string(line_no);
    json j;
    j = io::parse_json(line, where + " is not JSON (a task file holds one example object per line)");  // Note [untrusted JSON]
    std::string ctx;
    if (j.contains("ctx") && j["ctx"].is_string()) {
      ctx = j["ctx"].get<std::string>();
    } else {
      FORGE_CHECK(j.contains("ctx_a") && j["ctx_a"].is_string(), where,
                  " has no \"ctx\" (or \"ctx_a\" and \"ctx_b\"): the HellaSwag layout is {\"ctx\": ..., \"endings\": "
                  "[...], \"label\": k}");
      ctx = j["ctx_a"].get<std::string>();
      if (j.contains("ctx_b") && j["ctx_b"].is_string() && !j["ctx_b"].get<std::string>().empty())
        ctx.append(1, ' ').append(j["ctx_b"].get<std::string>());
    }
    FORGE_CHECK(j.contains("endings") && j["endings"].is_array() && j["endings"].size() >= 2, where,
                " needs \"endings\": an array of at least 2 strings");
    int64_t label = -1;
    if (j.contains("label") && j["label"].is_number_integer()) label = j["label"].get<int64_t>();
    else if (j.contains("label") && j["label"].is_string()) label = std::stoll(j["label"].get<std::string>());
    const auto& endings = j["endings"];
    FORGE_CHECK(label >= 0 && label < static_cast<int64_t>(endings.size()), where, " needs \"label\": the index of the "
                "right ending, 0 .. ", endings.size() - 1);
    const std::vector<int32_t> ctx_ids = tok.encode_ordinary(ctx);
    std::vector<std::vector<int32_t>> seqs;
    std::vector<size_t> from;
    std::vector<double> bytes;
    for (const auto& e : endings) {
      FORGE_CHECK(e.is_string(), where, ": every ending must be a string");
      std::string cont(1, ' ');  // (append, not " " + s: g++ 12's -Wrestrict misfires on that)
      cont.append(e.get<std::string>());
      std::vector<int32_t> s = ctx_ids;
      const std::vector<int32_t> end_ids = tok.encode_ordinary(cont);
      s.insert(s.end(), end_ids.begin(), end_ids.end());
      size_t start = ctx_ids.size();
      const auto keep = static_cast<size_t>(model.block_size + 1);
      if (s.size() > keep) {  // keep the last block_size + 1 tokens
        const size_t drop = s.size() - keep;
        s.erase(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(drop));
        start = start > drop ? start - drop : 0;
      }
      seqs.push_back(std::move(s));
      from.push_back(std::max<size_t>(start, 1));
      bytes.push_back(static_cast<double>(cont.size()));
    }
    const std::vector<double> lp = continuation_logprobs(model, seqs, from);
    size_t best = 0, best_norm = 0;
    for (size_t k = 1; k < lp.size(); ++k) {
      if (lp[k] > lp[best]) best = k;
      if (lp[k] / bytes[k] > lp[best_norm] / bytes[best_norm]) best_norm = k;
    }
    right += static_cast<int64_t>(best) == label;
    right_norm += static_cast<int64_t>(best_norm) == label;
    ++r.examples;
  }
  FORGE_CHECK(r.examples > 0, "eval: '", file, "' has no examples (one JSON object per line)");
  r.acc = static_cast<double>(right) / static_cast<double>(r.examples);
  r.acc_norm = static_cast<double>(right_norm) / static_cast<double>(r.examples);
  return r;
}

EvalResult evaluate(const EvalOptions& opt) {
  FORGE_CHECK(!opt.files.empty() || !opt.tasks.empty(),
              "eval: nothing to evaluate; give --files (loss and perplexity) and/or --tasks (multiple choice)");
  FORGE_CHECK(opt.batch >= 1, "eval: --batch must be >= 1, got ", opt.batch);
  std::error_code ec;
  for (const auto* list : {&opt.files, &opt.tasks})
    for (const auto& f : *list)
      FORGE_CHECK(fs::is_regular_file(f, ec), "eval: '", f, "' is not a readable file");
  const LoadedCheckpoint run = load_language_checkpoint(opt.checkpoint, "eval", opt.device, opt.dtype, opt.adapter);
  const RunConfig& cfg = run.cfg;
  const data::Tokenizer& tok = *run.tok;
  const LanguageModel& model = run.model;
  EvalResult r;
  r.checkpoint = run.dir.string();
  r.step = run.step;
  const std::string eos = resolved_eos(cfg, tok);
  for (const auto& f : opt.files)
    r.files.push_back(file_loss(model, tok, f, cfg.data.text_key, eos, cfg.train.seq_len, opt.batch));
  for (const auto& t : opt.tasks) r.tasks.push_back(multiple_choice(model, tok, t, opt.max_examples));
  return r;
}

}  // namespace forge::train
