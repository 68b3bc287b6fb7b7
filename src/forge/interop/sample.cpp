// `forge sample`: autoregressive generation from a checkpoint (contracts in sample.h).
#include "forge/interop/sample.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>

#include "forge/autograd/grad_mode.h"
#include "forge/core/error.h"
#include "forge/core/generator.h"
#include "forge/interop/peft_adapter.h"
#include "forge/io/checkpoint.h"
#include "forge/nn/lora.h"
#include "forge/nn/model_registry.h"
#include "forge/nn/causal_lm.h"
#include "forge/ops/creation.h"
#include "forge/run/hf_model.h"
#include "forge/run/run_checkpoint.h"
#include "forge/run/run_data.h"

namespace forge::train {

namespace fs = std::filesystem;

int32_t pick_token(std::vector<double> logits, const Sampling& how, Generator& gen) {
  const auto V = static_cast<int64_t>(logits.size());
  if (how.temperature == 0.0) return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  double threshold = -INFINITY;
  if (how.top_k > 0 && how.top_k < V) {
    std::vector<double> sorted = logits;
    std::nth_element(sorted.begin(), sorted.begin() + (how.top_k - 1), sorted.end(), std::greater<double>());
    threshold = sorted[static_cast<size_t>(how.top_k - 1)];
  }
  const double mx = *std::max_element(logits.begin(), logits.end());
  double total = 0.0;
  for (auto& l : logits) {
    l = l < threshold ? 0.0 : std::exp((l - mx) / how.temperature);
    total += l;
  }
  if (how.top_p < 1.0) {  // nucleus: drop the tail beyond the smallest set reaching top_p of the mass
    std::vector<int32_t> order(static_cast<size_t>(V));
    for (int32_t i = 0; i < static_cast<int32_t>(V); ++i) order[static_cast<size_t>(i)] = i;
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)] || (logits[static_cast<size_t>(a)] ==
             logits[static_cast<size_t>(b)] && a < b);
    });
    double mass = 0.0, kept = 0.0;
    for (int32_t i : order) {
      double& p = logits[static_cast<size_t>(i)];
      if (mass >= how.top_p * total) {
        p = 0.0;
        continue;
      }
      mass += p;
      kept += p;
    }
    total = kept;
  }
  const double u = rand({1}, {.dtype = DType::f64}, &gen).item() * total;
  double acc = 0.0;
  int32_t last_nonzero = 0;
  for (int64_t i = 0; i < V; ++i) {
    if (logits[static_cast<size_t>(i)] == 0.0) continue;
    acc += logits[static_cast<size_t>(i)];
    last_nonzero = static_cast<int32_t>(i);
    if (u < acc) return last_nonzero;
  }
  return last_nonzero;  // rounding at the top end
}

namespace {

// The decoding loop of generate and generate_batch: the rows advance together (a finished row
// takes tokens nobody reads, so every row stays aligned in one KV cache), row k drawing from
// gens[k]; over a KV cache when `lm` is set, else the whole window every token. Rows of
// different lengths are left-padded to the longest over the KV cache (Note [padded prompts],
// nn/causal_lm.h); without a cache they run one length at a time (generate_batch).
std::vector<std::vector<int32_t>> decode_rows(const LanguageModel& model, const nn::CausalLM* lm,
                                              std::vector<std::vector<int32_t>> rows, int64_t n, const Sampling& how,
                                              const std::vector<uint64_t>& seeds,
                                              const std::function<bool(size_t, const std::vector<int32_t>&)>& stop) {
  FORGE_CHECK(how.temperature >= 0 && std::isfinite(how.temperature), "generate: temperature must be >= 0, got ",
              how.temperature);
  FORGE_CHECK(how.top_k >= 0, "generate: top_k must be >= 0 (0 = all tokens), got ", how.top_k);
  FORGE_CHECK(how.top_p > 0 && how.top_p <= 1, "generate: top_p must be in (0, 1] (1 = all tokens), got ", how.top_p);
  NoGradGuard no_grad;
  const InferenceKernels kernels;  // each step's shapes are new (Note [inference kernels])
  const bool was_training = model.module->is_training();
  model.module->eval();
  const auto B = static_cast<int64_t>(rows.size());
  std::vector<std::unique_ptr<Generator>> gens;  // (a Generator holds a mutex: not movable)
  for (uint64_t s : seeds) gens.push_back(std::make_unique<Generator>(s));
  std::vector<bool> done(rows.size(), false);
  std::vector<size_t> length(rows.size());  // a finished row keeps this many tokens
  nn::KvCache cache;
  for (int64_t i = 0; i < n; ++i) {
    Tensor logits;  // (B, T, V)
    int64_t last = 0;
    if (lm && cache.length > 0 && cache.length < model.block_size) {  // one new position per row
      std::vector<int64_t> next;
      for (const auto& r : rows) next.push_back(r.back());
      logits = lm->forward_cached(from_vector(next, {B, 1}).to(model.device()), cache);
    } else {  // the window: the prompts, or (past block_size) each row's last block_size tokens again
      size_t longest = 0;
      for (const auto& r : rows) longest = std::max(longest, r.size());
      const auto ctx = static_cast<int64_t>(std::min<size_t>(longest, static_cast<size_t>(model.block_size)));
      std::vector<int64_t> window, pad;
      for (const auto& r : rows) {  // left-padded with token 0 (Note [padded prompts])
        const auto own = static_cast<int64_t>(std::min<size_t>(r.size(), static_cast<size_t>(ctx)));
        pad.push_back(ctx - own);
        window.insert(window.end(), static_cast<size_t>(ctx - own), 0);
        window.insert(window.end(), r.end() - own, r.end());
      }
      const Tensor w = from_vector(window, {B, ctx}).to(model.device());
      cache.clear();
      cache.pad = pad;
      FORGE_CHECK(lm || !cache.padded(), "generate: rows of different lengths need the KV cache path");
      // Only the last position's logits are read: the head runs on it alone (a long prompt's
      // (B, T, vocab) logits are never formed).
      if (lm) {
        logits = lm->forward_cached(w, cache, /*last_only=*/true);
      } else if (const auto* whole = dynamic_cast<const nn::CausalLM*>(model.module.get())) {
        logits = whole->forward_last(w);
      } else {
        logits = model.forward(w);
        last = ctx - 1;
      }
    }
    const Tensor at = logits.select(1, last).to(Device::cpu()).to(DType::f64);  // (B, V)
    const auto V = static_cast<size_t>(at.size(1));
    const std::vector<double> all = at.to_vector<double>();
    bool all_done = true;
    for (size_t k = 0; k < rows.size(); ++k) {
      if (done[k]) {
        rows[k].push_back(rows[k].back());  // keeps the rows aligned; cut below
        continue;
      }
      rows[k].push_back(pick_token(std::vector<double>(all.begin() + k * V, all.begin() + (k + 1) * V), how, *gens[k]));
      if (stop && stop(k, rows[k])) done[k] = true, length[k] = rows[k].size();
      all_done = all_done && done[k];
    }
    if (all_done) break;
  }
  for (size_t k = 0; k < rows.size(); ++k)
    if (done[k]) rows[k].resize(length[k]);
  model.module->train(was_training);
  return rows;
}

const nn::CausalLM* cached_lm(const LanguageModel& model, const Sampling& how) {
  return how.kv_cache ? dynamic_cast<const nn::CausalLM*>(model.module.get()) : nullptr;
}

}  // namespace

std::vector<int32_t> generate(const LanguageModel& model, std::vector<int32_t> ids, int64_t n, const Sampling& how,
                              uint64_t seed, const std::function<bool(const std::vector<int32_t>&)>& stop) {
  FORGE_CHECK(!ids.empty(), "generate: the prompt has no tokens");
  std::function<bool(size_t, const std::vector<int32_t>&)> row_stop;
  if (stop) row_stop = [&stop](size_t, const std::vector<int32_t>& r) { return stop(r); };
  return decode_rows(model, cached_lm(model, how), {std::move(ids)}, n, how, {seed}, row_stop).front();
}

std::vector<std::vector<int32_t>> generate_batch(const LanguageModel& model, std::vector<std::vector<int32_t>> rows,
                                                int64_t n, const Sampling& how, const std::vector<uint64_t>& seeds,
                                                const std::function<bool(size_t, const std::vector<int32_t>&)>& stop) {
  FORGE_CHECK(!rows.empty() && rows.size() == seeds.size(), "generate_batch: one seed per prompt");
  bool same_length = true;
  for (const auto& r : rows) {
    FORGE_CHECK(!r.empty(), "generate: a prompt has no tokens");
    same_length = same_length && r.size() == rows.front().size();
  }
  // One batch over one KV cache, left-padded when the lengths differ (Note [padded prompts]).
  const nn::CausalLM* lm = cached_lm(model, how);
  if (same_length || lm) return decode_rows(model, lm, std::move(rows), n, how, seeds, stop);
  for (size_t k = 0; k < rows.size(); ++k) {  // without the cache: one at a time
    std::function<bool(size_t, const std::vector<int32_t>&)> row_stop;
    if (stop) row_stop = [&stop, k](size_t, const std::vector<int32_t>& r) { return stop(k, r); };
    rows[k] = decode_rows(model, cached_lm(model, how), {std::move(rows[k])}, n, how, {seeds[k]}, row_stop).front();
  }
  return rows;
}

namespace {
// The checkpoint's model as the base of a PEFT adapter: built with the adapter's options, the
// base's tensors (any LoRA factors of its own left out) and the adapter's factors loaded, each
// tensor of the model from exactly one of them.
void load_with_adapter(LoadedCheckpoint& r, const io::NamedTensors& base, const std::string& dir,
                       const std::string& who) {
  PeftAdapter a = load_peft_adapter(dir);
  r.cfg.lora = a.options;
  r.cfg.lora.dropout = 0;  // (inference)
  try {
    nn::validate_lora(r.cfg.lora, nn::transformer_shape(r.cfg.model).arch);
  } catch (const Error& e) {
    FORGE_THROW(who, ": --adapter '", dir, "' does not fit checkpoint '", r.dir.string(), "': ", e.what());
  }
  r.model = build_language_model(r.cfg);
  io::TensorItems state;
  for (const auto& [name, t] : base.items())
    if (!nn::is_lora_parameter(name)) state.emplace_back(name, t);
  const size_t base_count = state.size();
  state.insert(state.end(), a.tensors.begin(), a.tensors.end());
  try {
    io::check_compatible(io::named_shapes(io::NamedTensors(r.model.module->state_dict())), io::NamedTensors(state),
                         "checkpoint '" + r.dir.string() + "' with adapter '" + dir + "'");
  } catch (const Error& e) {
    FORGE_THROW(e.what(), "; the adapter was trained on another model (", base_count, " base tensors, ",
                a.tensors.size(), " adapter tensors here)");
  }
  r.model.module->load_state_dict(state);
}
}  // namespace

LoadedCheckpoint load_language_checkpoint(const std::string& checkpoint, const std::string& who,
                                          const std::string& device, const std::string& dtype,
                                          const std::string& adapter) {
  FORGE_CHECK(!checkpoint.empty(), who, ": --checkpoint is required (a checkpoint or a run directory)");
  FORGE_CHECK(dtype == "f32" || dtype == "bf16" || dtype == "f16", who, ": --dtype must be f32, bf16 or f16, got '",
              dtype, "'");
  const Device where = resolve_run_device(device);  // (checks the device exists, naming the forms)
  LoadedCheckpoint r;
  std::error_code ec;
  const auto to_target = [&](LoadedCheckpoint& m) {
    m.model.module->to(where, dtype == "bf16" ? DType::bf16 : dtype == "f16" ? DType::f16 : DType::f32);
  };
  // A Hugging Face model directory (config.json beside the weights, no state.json): read as
  // model.init_from reads it (Note [init_from precedence]), with its tokenizer.
  if (fs::is_directory(checkpoint, ec) && fs::is_regular_file(fs::path(checkpoint) / "config.json", ec) &&
      !fs::exists(fs::path(checkpoint) / "state.json", ec)) {
    r.dir = checkpoint;
    r.cfg.model.init_from = checkpoint;
    apply_init_from(r.cfg);
    FORGE_CHECK(!r.cfg.data.tokenizer.empty() && fs::is_regular_file(r.cfg.data.tokenizer, ec), who,
                ": Hugging Face model directory '", checkpoint, "' has no tokenizer.json (what forge export and "
                "save_pretrained with the tokenizer write); copy the model's tokenizer.json there");
    r.tok = data::load_tokenizer(r.cfg.data.tokenizer);
    r.model = build_language_model(r.cfg);
    const io::NamedTensors weights = load_init_from(r.cfg, r.model.whole_shapes());
    if (!adapter.empty()) {
      load_with_adapter(r, weights, adapter, who);
    } else {
      r.model.module->load_state_dict(weights.items());
    }
    to_target(r);
    return r;
  }
  r.dir = resolve_checkpoint(checkpoint, (who + ": --checkpoint").c_str());
  const io::CheckpointData ck = io::load_checkpoint(r.dir);
  r.step = ck.step;
  r.cfg = config_from_json(ck.config, (r.dir / "state.json").string() + " (config)");
  FORGE_CHECK(r.cfg.is_language_model(), who, ": checkpoint '", r.dir.string(), "' holds a ", r.cfg.model.type,
              " model, not a language model");
  const fs::path tok_path = r.dir.parent_path().parent_path() / kTokenizerFile;
  FORGE_CHECK(fs::is_regular_file(tok_path, ec), who, ": the run's tokenizer '", tok_path.string(),
              "' is missing (a checkpoint is read with the tokenizer.json of its run directory; a run on "
              "pre-encoded shards without data.tokenizer has none: copy the tokenizer that encoded them there)");
  r.tok = data::load_tokenizer(tok_path.string());
  if (!adapter.empty()) {
    load_with_adapter(r, ck.model, adapter, who);
  } else {
    r.model = build_language_model(r.cfg);
    io::check_compatible(io::named_shapes(io::NamedTensors(r.model.module->state_dict())), ck.model,
                         "checkpoint '" + r.dir.string() + "'");
    r.model.module->load_state_dict(ck.model.items());
  }
  to_target(r);
  return r;
}

SampleResult sample(const SampleOptions& opt) {
  FORGE_CHECK(opt.tokens >= 0, "sample: --tokens must be >= 0, got ", opt.tokens);
  FORGE_CHECK(opt.temperature >= 0, "sample: --temperature must be >= 0 (0 = greedy), got ", opt.temperature);
  FORGE_CHECK(opt.top_k >= 0, "sample: --top-k must be >= 0 (0 = all tokens), got ", opt.top_k);
  FORGE_CHECK(opt.top_p > 0 && opt.top_p <= 1, "sample: --top-p must be in (0, 1] (1 = all tokens), got ", opt.top_p);
  LoadedCheckpoint run = load_language_checkpoint(opt.checkpoint, "sample", opt.device, opt.dtype, opt.adapter);
  const auto& tok = run.tok;
  const LanguageModel& model = run.model;

  const std::vector<std::string> prompts = opt.prompts.empty() ? std::vector<std::string>{opt.prompt} : opt.prompts;
  const Sampling how{opt.temperature, opt.top_k, opt.top_p, opt.kv_cache};
  SampleResult r;
  r.checkpoint = run.dir.string();
  r.step = run.step;
  const auto t0 = std::chrono::steady_clock::now();
  int64_t generated = 0;
  // A stop string ends the completion before it (decoded text, so a string split over several
  // tokens is found once its last token is drawn).
  auto stop_at = [&](const std::string& text) {
    size_t at = std::string::npos;
    for (const auto& s : opt.stop)
      if (!s.empty()) at = std::min(at, text.find(s));
    return at;
  };
  // Every prompt decodes in one batch over one KV cache (generate_batch; of different lengths,
  // left-padded: Note [padded prompts]), or without the cache one length at a time; prompt k
  // draws from seed + k either way, so batching changes no text.
  std::vector<std::vector<int32_t>> encoded;
  std::vector<uint64_t> seeds;
  for (size_t k = 0; k < prompts.size(); ++k) {
    encoded.push_back(tok->encode_ordinary(prompts[k].empty() ? std::string("\n") : prompts[k]));
    seeds.push_back(opt.seed + k);
  }
  r.completions.resize(prompts.size());
  r.new_tokens.resize(prompts.size());
  auto completion_of = [&](size_t k, const std::vector<int32_t>& ids) {
    return tok->decode(std::vector<int32_t>(ids.begin() + static_cast<std::ptrdiff_t>(encoded[k].size()), ids.end()));
  };
  auto first = t0;  // when the first token of every row was drawn (the stop test sees each token)
  bool first_seen = false;
  {
    const auto out = generate_batch(model, encoded, opt.tokens, how, seeds, [&](size_t k, const std::vector<int32_t>& ids) {
      if (!first_seen && k + 1 == encoded.size()) first_seen = true, first = std::chrono::steady_clock::now();
      return !opt.stop.empty() && stop_at(completion_of(k, ids)) != std::string::npos;
    });
    for (size_t k = 0; k < out.size(); ++k) {
      std::string completion = completion_of(k, out[k]);
      if (const size_t at = stop_at(completion); at != std::string::npos) completion.resize(at);
      r.new_tokens[k] = static_cast<int64_t>(out[k].size() - encoded[k].size());
      generated += r.new_tokens[k];
      r.completions[k] = completion;
    }
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.tokens_per_s = r.seconds > 0 ? static_cast<double>(generated) / r.seconds : 0.0;
  if (first_seen) {
    r.first_token_seconds = std::chrono::duration<double>(first - t0).count();
    const double after = r.seconds - r.first_token_seconds;
    int64_t later = 0;  // the tokens after each row's first
    for (int64_t n : r.new_tokens) later += std::max<int64_t>(0, n - 1);
    r.decode_tokens_per_s = after > 0 ? static_cast<double>(later) / after : 0.0;
  }
  r.completion = r.completions.front();
  r.text = (prompts.front().empty() ? std::string() : prompts.front()) + r.completion;
  return r;
}

}  // namespace forge::train
