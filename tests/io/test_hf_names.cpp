// GPT-2 weights to and from Hugging Face's names and Conv1D layout.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>

#include "forge/forge.h"
#include "forge/io/hf_names.h"
#include "forge/nn/gpt.h"

namespace forge::io {
namespace {

nn::GPTConfig tiny() {
  nn::GPTConfig c;
  c.vocab_size = 61;
  c.block_size = 16;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 24;
  return c;
}

TEST(HfNames, Gpt2ExportUsesConv1DLayoutAndRoundTrips) {
  nn::GPT a(tiny(), 1);
  TensorItems hf = gpt2_to_hf(a.state_dict());
  bool saw_c_attn = false;
  for (const auto& [name, t] : hf) {
    EXPECT_NE(name, "lm_head.weight");
    if (name == "transformer.h.0.attn.c_attn.weight") {
      saw_c_attn = true;
      EXPECT_EQ(t.shape(), (Shape{24, 72}));  // (in, out) as HF's Conv1D
    }
    if (name == "transformer.h.1.mlp.c_fc.weight") {
      EXPECT_EQ(t.shape(), (Shape{24, 96}));
    }
  }
  EXPECT_TRUE(saw_c_attn);

  const auto path = std::filesystem::temp_directory_path() / ("forge_hf_gpt2_" + std::to_string(::getpid()) + ".safetensors");
  save_safetensors(path, hf);
  SafetensorsFile f = load_safetensors(path);
  std::filesystem::remove(path);
  // HF files saved from GPT2Model lack the "transformer." prefix and carry mask buffers.
  TensorItems unprefixed;
  for (const auto& [name, t] : f.tensors) unprefixed.emplace_back(name.substr(std::string("transformer.").size()), t);
  unprefixed.emplace_back("h.0.attn.bias", ones({1, 1, 16, 16}));
  unprefixed.emplace_back("lm_head.weight", a.wte->weight.detach());

  nn::GPT b(tiny(), 2);
  b.load_state_dict(gpt2_from_hf(unprefixed));
  Tensor idx = from_vector<int64_t>({1, 5, 9, 60, 0, 3}, {2, 3});
  EXPECT_EQ(a.forward(idx).to_vector<float>(), b.forward(idx).to_vector<float>());
}

}  // namespace
}  // namespace forge::io
