#pragma once
// Model configs small enough for equivalence tests over several ranks (a few ms per step), shared
// by the tensor-parallel tests on MPI and on NCCL: every size divides by 1, 2 and 4 ranks (heads,
// FFN width, vocabulary, a sequence of 8 or 16 positions).
#include <cstdint>

#include "forge/nn/gpt.h"
#include "forge/nn/llama.h"

namespace forge::testing {

inline nn::GPTConfig tiny_gpt_config() {
  nn::GPTConfig c;
  c.vocab_size = 64;
  c.block_size = 16;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 32;
  return c;
}

// 8 query heads of size 8 over n_kv_head key-value heads.
inline nn::LlamaConfig tiny_llama_config(int64_t n_kv_head) {
  nn::LlamaConfig c;
  c.vocab_size = 64;
  c.block_size = 16;
  c.n_layer = 2;
  c.n_head = 8;
  c.n_kv_head = n_kv_head;
  c.dim = 64;
  c.ffn_hidden = 96;
  return c;
}

}  // namespace forge::testing
