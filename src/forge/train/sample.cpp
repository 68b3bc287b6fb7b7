// `forge sample`: autoregressive generation from a checkpoint (contracts in sample.h).
#include "forge/train/sample.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>

#include "forge/autograd/grad_mode.h"
#include "forge/core/error.h"
#include "forge/core/generator.h"
#include "forge/io/checkpoint.h"
#include "forge/ops/creation.h"
#include "forge/train/run_checkpoint.h"
#include "forge/train/run_data.h"

namespace forge::train {

namespace fs = std::filesystem;

namespace {

int32_t pick_token(std::vector<double> logits, double temperature, int64_t top_k, Generator& gen) {
  const auto V = static_cast<int64_t>(logits.size());
  if (temperature == 0.0) return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  double threshold = -INFINITY;
  if (top_k > 0 && top_k < V) {
    std::vector<double> sorted = logits;
    std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(), std::greater<double>());
    threshold = sorted[static_cast<size_t>(top_k - 1)];
  }
  const double mx = *std::max_element(logits.begin(), logits.end());
  double total = 0.0;
  for (auto& l : logits) {
    l = l < threshold ? 0.0 : std::exp((l - mx) / temperature);
    total += l;
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

}  // namespace

std::vector<int32_t> generate(const LanguageModel& model, std::vector<int32_t> ids, int64_t n, double temperature,
                              int64_t top_k, uint64_t seed) {
  FORGE_CHECK(!ids.empty(), "generate: the prompt has no tokens");
  FORGE_CHECK(temperature >= 0 && std::isfinite(temperature), "generate: temperature must be >= 0, got ", temperature);
  FORGE_CHECK(top_k >= 0, "generate: top_k must be >= 0 (0 = all tokens), got ", top_k);
  NoGradGuard no_grad;
  const bool was_training = model.module->is_training();
  model.module->eval();
  Generator gen(seed);
  for (int64_t i = 0; i < n; ++i) {
    const auto ctx = static_cast<int64_t>(std::min<size_t>(ids.size(), static_cast<size_t>(model.block_size)));
    std::vector<int64_t> window(ids.end() - ctx, ids.end());
    const Tensor logits = model.forward(from_vector(window, {1, ctx}).to(model.device()));  // (1, T, V)
    ids.push_back(pick_token(logits.select(0, 0).select(0, ctx - 1).to_vector<double>(), temperature, top_k, gen));
  }
  model.module->train(was_training);
  return ids;
}

SampleResult sample(const SampleOptions& opt) {
  FORGE_CHECK(opt.tokens >= 0, "sample: --tokens must be >= 0, got ", opt.tokens);
  FORGE_CHECK(opt.temperature >= 0, "sample: --temperature must be >= 0 (0 = greedy), got ", opt.temperature);
  FORGE_CHECK(opt.top_k >= 0, "sample: --top-k must be >= 0 (0 = all tokens), got ", opt.top_k);
  FORGE_CHECK(!opt.checkpoint.empty(), "sample: --checkpoint is required (a checkpoint or a run directory)");
  const fs::path dir = resolve_checkpoint(opt.checkpoint, "sample: --checkpoint");
  const io::CheckpointData ck = io::load_checkpoint(dir);
  const RunConfig cfg = config_from_json(ck.config, (dir / "state.json").string() + " (config)");
  FORGE_CHECK(cfg.is_language_model(), "sample: checkpoint '", dir.string(), "' holds a ", cfg.model.type,
              " model, not a language model");
  const fs::path tok_path = dir.parent_path().parent_path() / kTokenizerFile;
  std::error_code ec;
  FORGE_CHECK(fs::is_regular_file(tok_path, ec), "sample: the run's tokenizer '", tok_path.string(),
              "' is missing (a checkpoint is read with the tokenizer.json of its run directory; a run on "
              "pre-encoded shards without data.tokenizer has none: copy the tokenizer that encoded them there)");
  const auto tok = data::load_tokenizer(tok_path.string());
  LanguageModel model = build_language_model(cfg);
  io::check_compatible(io::named_shapes(io::NamedTensors(model.module->state_dict())), ck.model,
                       "checkpoint '" + dir.string() + "'");
  model.module->load_state_dict(ck.model.items());

  std::vector<int32_t> prompt = tok->encode_ordinary(opt.prompt.empty() ? std::string("\n") : opt.prompt);
  const auto n_prompt = prompt.size();
  const auto ids = generate(model, std::move(prompt), opt.tokens, opt.temperature, opt.top_k, opt.seed);
  SampleResult r;
  r.checkpoint = dir.string();
  r.step = ck.step;
  r.text = tok->decode(ids);
  r.completion = tok->decode(std::vector<int32_t>(ids.begin() + static_cast<std::ptrdiff_t>(n_prompt), ids.end()));
  if (opt.prompt.empty()) r.text = r.completion;
  return r;
}

}  // namespace forge::train
