// forge's side of the Hugging Face init_from check (tests/python/hf_init_from.py).
//
//   forge_hf_init_from <model dir> <batch file> <out file> <device>
//
// Resolves a run config whose only model key is model.init_from = <model dir> (the shape from
// its config.json: run/hf_model.h, Note [init_from precedence]), builds the model, loads the
// directory's weights through load_init_from (single file or shards, any float dtype, into
// f32), and writes <out file> with "logits" (B, T, V) f32: the forward of <batch file>'s "idx"
// (B, T) i64 on <device> in f32; and "loss" (1) f32: the training loss of the first step on the
// same batch (Model::training_loss: idx[:, :-1] predicting idx[:, 1:], the mean over every token).
// Exit status 0 on success, 1 with "error: <message>" on stderr, 2 on usage.
#include <cstdio>
#include <exception>
#include <string>

#include "forge/forge.h"
#include "forge/run/config.h"
#include "forge/run/hf_model.h"
#include "forge/run/language_model.h"

int main(int argc, char** argv) {
  using namespace forge;
  if (argc != 5) {
    std::fprintf(stderr, "usage: forge_hf_init_from <model dir> <batch file> <out file> <device>\n");
    return 2;
  }
  try {
    const Device device = Device::parse(argv[4]);
    // Random tokens: no data files to read; the vocabulary comes from config.json.
    const std::string toml =
        "[run]\ndevice = \"cpu\"\ndtype = \"f32\"\n[data]\nsource = \"random\"\n[train]\nseq_len = 8\n";
    const train::RunConfig cfg =
        train::parse_config(toml, "hf_init_from.toml", {std::string("--model.init_from=") + argv[1]});
    train::LanguageModel m = train::build_language_model(cfg);
    m.module->load_state_dict(train::load_init_from(cfg, m.whole_shapes()).items());
    m.module->to(device);
    m.module->eval();
    NoGradGuard no_grad;
    const Tensor idx = io::load_safetensors(argv[2]).tensors.at("idx");
    const Tensor logits = m.forward(idx.to(device)).to(Device::cpu(), DType::f32);
    const int64_t T = idx.size(1);
    const Tensor on = idx.to(device);
    data::Batch batch;
    batch.inputs = ops::contiguous(ops::narrow(on, 1, 0, T - 1));
    batch.targets = ops::contiguous(ops::narrow(on, 1, 1, T - 1));
    const Tensor loss = m.training_loss(batch)
                            .to(Device::cpu(), DType::f32)
                            .reshape({1});
    io::save_safetensors(argv[3], {{"logits", logits}, {"loss", loss}});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
