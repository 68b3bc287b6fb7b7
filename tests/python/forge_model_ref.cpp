// forge's side of the whole-model PyTorch parity check (tests/python/model_reference.py).
//
//   forge_model_ref <dir>
//
// For each model, `gpt` (the GPT-2 layout) and `llama`, writes into <dir> (all safetensors,
// floating tensors f32, token ids i64):
//
//   <m>.weights.safetensors  the initial weights under their state-dict names (nanoGPT /
//                            Hugging Face), from the model built with a fixed seed; metadata:
//                            "model" (gpt | llama) and every key of the model's config.
//   <m>.batch.safetensors    "idx", "targets": (B, T) token ids drawn with a fixed seed
//                            (targets are idx shifted by one, as in language modelling).
//   <m>.grad.safetensors     "logits" (B, T, V), "loss" () (mean cross-entropy) and
//                            "grad.<name>" for every parameter, from one forward + backward.
//   <m>.train.safetensors    "losses" (steps): the loss before each AdamW step, on the same
//                            batch; "param.<name>": every parameter after the last step;
//                            metadata: the AdamW settings and "decay" / "no_decay" (the names
//                            optim::decay_groups put in each group, comma-separated).
//
// The forward, backward and training run on a second model, built with another seed and
// then loaded from the weights and batch files: both sides compute from exactly the bytes
// in the files. Exit status 0 on success, 1 with "error: <message>" on stderr, 2 on usage.
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "forge/forge.h"
#include "forge/nn/gpt.h"
#include "forge/nn/llama.h"

namespace {

using namespace forge;
namespace fs = std::filesystem;

constexpr int64_t kBatch = 3, kSeqLen = 16;
constexpr int kSteps = 10;
constexpr optim::AdamWOptions kAdamW{.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};

std::string num(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

io::SafetensorsMetadata config_metadata(const nn::GPTConfig& c) {
  return {{"model", "gpt"},
          {"vocab_size", num(static_cast<double>(c.vocab_size))},
          {"block_size", num(static_cast<double>(c.block_size))},
          {"n_layer", num(static_cast<double>(c.n_layer))},
          {"n_head", num(static_cast<double>(c.n_head))},
          {"n_embd", num(static_cast<double>(c.n_embd))},
          {"layer_norm_eps", num(1e-5)}};  // nn::GPTBlock's LayerNorms
}

io::SafetensorsMetadata config_metadata(const nn::LlamaConfig& c) {
  return {{"model", "llama"},
          {"vocab_size", num(static_cast<double>(c.vocab_size))},
          {"block_size", num(static_cast<double>(c.block_size))},
          {"n_layer", num(static_cast<double>(c.n_layer))},
          {"n_head", num(static_cast<double>(c.n_head))},
          {"n_kv_head", num(static_cast<double>(c.n_kv_head))},
          {"dim", num(static_cast<double>(c.dim))},
          {"ffn_hidden", num(static_cast<double>(c.ffn_hidden))},
          {"norm_eps", num(c.norm_eps)},
          {"rope_theta", num(c.rope_theta)}};
}

std::string join_names(const nn::NamedTensors& named, const std::vector<Tensor>& members) {
  std::string out;
  for (const auto& [name, p] : named) {
    for (const Tensor& m : members) {
      if (!m.is_same(p)) continue;
      out += (out.empty() ? "" : ",") + name;
      break;
    }
  }
  return out;
}

template <class Model, class Config>
void run_model(const fs::path& dir, const std::string& kind, const Config& config, uint64_t seed) {
  const fs::path weights_file = dir / (kind + ".weights.safetensors");
  const fs::path batch_file = dir / (kind + ".batch.safetensors");

  // 1. Initial weights and the batch, from fixed seeds.
  {
    Model source(config, seed);
    io::save_safetensors(weights_file, source.named_parameters(), config_metadata(config));
    Generator gen(seed + 1);
    Tensor tokens = randint(0, config.vocab_size, {kBatch, kSeqLen + 1}, {.dtype = DType::i64}, &gen);
    io::save_safetensors(batch_file, {{"idx", tokens.slice(1, 0, kSeqLen)}, {"targets", tokens.slice(1, 1, kSeqLen + 1)}});
  }

  // 2. Another model, loaded from the files.
  Model model(config, seed + 1000);
  model.load_state_dict(io::load_safetensors(weights_file).tensors.items());
  const io::SafetensorsFile batch = io::load_safetensors(batch_file);
  const Tensor& idx = batch.tensors.at("idx");
  const Tensor& targets = batch.tensors.at("targets");

  // 3. One forward and backward.
  {
    Tensor logits = model.forward(idx);
    Tensor loss = ops::cross_entropy(logits, targets);
    loss.backward();
    std::vector<std::pair<std::string, Tensor>> out{{"logits", logits}, {"loss", loss}};
    for (const auto& [name, p] : model.named_parameters()) {
      FORGE_CHECK(p.grad().defined(), "forge_model_ref: ", kind, " parameter ", name, " got no gradient");
      out.emplace_back("grad." + name, p.grad());
    }
    io::save_safetensors(dir / (kind + ".grad.safetensors"), out);
    model.zero_grad();
  }

  // 4. AdamW on the same batch.
  const nn::NamedTensors named = model.named_parameters();
  std::vector<optim::ParamGroup> groups = optim::decay_groups(named, kAdamW.weight_decay);
  FORGE_CHECK(groups.size() == 2, "forge_model_ref: decay_groups returned ", groups.size(), " groups");
  const std::string decay = join_names(named, groups[0].params), no_decay = join_names(named, groups[1].params);
  optim::AdamW opt(std::move(groups), kAdamW);
  std::vector<float> losses;
  for (int step = 0; step < kSteps; ++step) {
    Tensor loss = model.loss(idx, targets);
    losses.push_back(loss.item<float>());
    loss.backward();
    opt.step();
    opt.zero_grad();
  }
  std::vector<std::pair<std::string, Tensor>> out{{"losses", from_vector(losses, {kSteps})}};
  for (const auto& [name, p] : named) out.emplace_back("param." + name, p);
  io::save_safetensors(dir / (kind + ".train.safetensors"), out,
                       {{"lr", num(kAdamW.lr)},
                        {"beta1", num(kAdamW.beta1)},
                        {"beta2", num(kAdamW.beta2)},
                        {"eps", num(kAdamW.eps)},
                        {"weight_decay", num(kAdamW.weight_decay)},
                        {"steps", num(kSteps)},
                        {"decay", decay},
                        {"no_decay", no_decay}});
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <output directory>\n", argv[0]);
    return 2;
  }
  try {
    const fs::path dir = argv[1];
    fs::create_directories(dir);

    nn::GPTConfig gpt;
    gpt.vocab_size = 97;
    gpt.block_size = 32;
    gpt.n_layer = 2;
    gpt.n_head = 4;
    gpt.n_embd = 64;
    gpt.dropout = 0.0;
    run_model<nn::GPT>(dir, "gpt", gpt, 1234);

    nn::LlamaConfig llama;
    llama.vocab_size = 97;
    llama.block_size = 32;
    llama.n_layer = 2;
    llama.n_head = 4;
    llama.n_kv_head = 2;
    llama.dim = 64;
    llama.ffn_hidden = 160;
    run_model<nn::Llama>(dir, "llama", llama, 4321);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
