// forge's side of the Hugging Face parity check (tests/python/hf_parity.py).
//
//   forge_hf_parity <dir> <device> <n_layer> <n_head> <n_embd> <vocab> <ctx> <lr> <weight_decay>
//
// Reads <dir>/model.safetensors, written by transformers' GPT2LMHeadModel.save_pretrained
// (HF names, Conv1D layout), and <dir>/batches.safetensors ("idx", "targets": (S, B, T) i64).
// Writes <dir>/forge.safetensors:
//   "logits"  (B, T, V) f32: the forward of batch 0 in f32 on <device>;
//   "losses"  (S) f32: the loss of each of S AdamW steps (one per batch) of the same weights
//             in bf16 on <device> (bf16 parameters and activations, f32 master weights and
//             moments: run.dtype = "bf16"), betas (0.9, 0.95), eps 1e-8, no clipping;
// metadata "decay": the parameter names optim::decay_groups puts in the decayed group
// (comma-separated), so the PyTorch side groups its parameters the same way.
// Exit status 0 on success, 1 with "error: <message>" on stderr, 2 on usage.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "forge/forge.h"
#include "forge/io/hf_names.h"
#include "forge/nn/gpt.h"

namespace {

using namespace forge;
namespace fs = std::filesystem;

std::shared_ptr<nn::GPT> load_gpt(const nn::GPTConfig& c, const fs::path& file) {
  auto model = std::make_shared<nn::GPT>(c, 7);
  const io::SafetensorsFile f = io::load_safetensors(file);
  model->load_state_dict(io::gpt2_from_hf(f.tensors.items()));
  return model;
}

void run(const fs::path& dir, Device device, const nn::GPTConfig& c, double lr, double wd) {
  const io::SafetensorsFile batches = io::load_safetensors(dir / "batches.safetensors");
  const Tensor idx = batches.tensors.at("idx"), targets = batches.tensors.at("targets");
  const int64_t steps = idx.size(0);

  std::vector<std::pair<std::string, Tensor>> out;
  {  // f32 logits of batch 0
    auto model = load_gpt(c, dir / "model.safetensors");
    model->to(device);
    model->eval();
    NoGradGuard no_grad;
    out.emplace_back("logits", model->forward(idx.select(0, 0).to(device)).to(Device::cpu(), DType::f32));
  }
  // bf16 training
  auto model = load_gpt(c, dir / "model.safetensors");
  model->to(device, DType::bf16);
  model->train();
  const nn::NamedTensors named = model->named_parameters();
  auto groups = optim::decay_groups(named, wd);
  std::string decay;
  for (const auto& [name, p] : named)
    for (const Tensor& m : groups.front().params)
      if (m.is_same(p)) decay += (decay.empty() ? "" : ",") + name;
  optim::AdamW opt(std::move(groups), {.lr = lr, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = wd});
  std::vector<float> losses;
  for (int64_t s = 0; s < steps; ++s) {
    const Tensor loss = ops::cross_entropy(model->forward(idx.select(0, s).to(device)), targets.select(0, s).to(device));
    loss.backward();
    opt.step();
    opt.zero_grad();
    losses.push_back(static_cast<float>(loss.item()));
  }
  out.emplace_back("losses", from_vector(losses, {steps}));
  io::save_safetensors(dir / "forge.safetensors", out, {{"decay", decay}});
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 10) {
    std::fprintf(stderr, "usage: forge_hf_parity <dir> <device> <n_layer> <n_head> <n_embd> <vocab> <ctx> <lr> <wd>\n");
    return 2;
  }
  try {
    nn::GPTConfig c;
    c.n_layer = std::atoll(argv[3]);
    c.n_head = std::atoll(argv[4]);
    c.n_embd = std::atoll(argv[5]);
    c.vocab_size = std::atoll(argv[6]);
    c.block_size = std::atoll(argv[7]);
    c.dropout = 0.0;
    c.bias = true;
    run(argv[1], Device::parse(argv[2]), c, std::atof(argv[8]), std::atof(argv[9]));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
