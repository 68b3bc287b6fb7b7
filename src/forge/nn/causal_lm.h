#pragma once
// CausalLM: a decoder-only language model cut at its seams, so that a pipeline stage runs a
// range of its blocks and a vocabulary-parallel head computes the loss itself. GPT and LLaMA
// derive from it.
//
//   Stream s = model.embed(idx);                 // idx (B, T) i64 -> token (+ position) embedding
//   s = model.blocks(s, 0, k);                    // blocks [0, k), on one stage ...
//   s = model.blocks(s, k, model.num_blocks());   // ... blocks [k, n), on the next
//   Tensor logits = model.head(s);                // final norm + LM head: (B, T, vocab_size)
//   Tensor loss = model.head_loss(s, targets);    // final norm + head + mean cross-entropy
//
// forward(idx) = head(blocks(embed(idx), 0, n)) and loss(idx, targets) = head_loss(blocks(
// embed(idx), 0, n), targets), so the pieces give the same values and gradients as the whole,
// bit for bit, wherever the blocks are cut (tests/nn/test_model_seams.cpp).
//
// Note [model seams]: the residual stream between blocks is a Stream {x, pending}, not one
// tensor, because GPT fuses every residual add with the LayerNorm after it (Note [fused
// residual + layer norm in GPT], nn/gpt.cpp): a block's MLP output is not added to the stream
// where the block ends but carried as `pending` into the next block's ln_1 (or ln_f), where
// ops::add_layer_norm adds and normalises in one pass. A cut between blocks k-1 and k falls
// inside that fused add, so blocks(s, 0, k) returns the stream still split, and blocks(s, k,
// n) finishes the add in block k's ln_1 exactly as the uncut model does. A pipeline stage
// therefore sends both tensors across (x and, when defined, pending), or calls
// Stream::materialize() and sends their sum: one tensor less to send, at the cost of the
// fusion at that boundary (one more pass over the activation; on the CPU the values stay
// bit-identical, since add_layer_norm equals add + layer_norm there). LLaMA does the same with
// ops::add_rms_norm (Note [fused residual + RMS norm in LLaMA], nn/llama.cpp); with activation
// checkpointing both models' checkpointed regions take and return the plain stream.
//
// Hooks: blocks() calls block_hooks (nn/block_hooks.h; ZeRO-3) around each block it runs, with
// the block's index in the whole model, exactly as forward() does.
//
// Note [the block loop]: CausalLM::blocks is the one loop over the blocks for every family: it
// names each block's memory (Note [memory owners]) and trace range, calls the hooks around it
// (ZeRO-3's gather and release: nn/block_hooks.h), and under activation checkpointing wraps the
// block in autograd::checkpoint. A family supplies only its block (block_step, block_forward);
// what a layout changes inside a block comes through the LayerSpec it was built from (tensor
// parallelism's linears, context parallelism's positions and attention), and around it through
// the hooks, so no family has a loop of its own to keep in step.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "forge/nn/block_hooks.h"
#include "forge/nn/documents.h"
#include "forge/nn/layer_spec.h"
#include "forge/nn/module.h"

namespace forge::nn {

// The residual stream between blocks: x + pending, the sum not yet formed while pending is
// defined (Note [model seams]). Each tensor is (B, T, C).
struct Stream {
  Tensor x;
  Tensor pending;  // undefined: the stream is x alone
  Documents documents = {};  // a packed batch's documents (Note [packed documents]); else undefined
  // x + pending as one tensor (x itself when nothing is pending). Forming the sum costs GPT
  // the fused add + LayerNorm at this point.
  Tensor materialize() const;
};

// Note [KV cache]: decoding keeps every block's keys and values of the positions seen so far,
// so each new token costs one position's work instead of the whole context's. forward_cached
// runs the T new tokens of idx at positions [length, length + T) over the cached ones (causal,
// bottom-right: ops/attention.h) and appends their keys and values. Inference only; the
// context is the model's block_size (the caller starts again past it). Equal to forward() on
// the whole sequence up to rounding (tests/nn/test_kv_cache.cpp).
//
// Note [padded prompts]: prompts of different lengths decode as one batch left-padded to the
// longest: row b's first pad[b] positions are padding. Its real tokens keep the positions they
// would have alone (position = cache position - pad[b]: GPT's position table, LLaMA's rotary
// embedding per row), and every query attends only to keys past the row's padding (key_mask,
// with the causal mask), so each row computes what it would alone, up to the batched GEMMs'
// rounding. The padding's own queries see no key and give zero rows nobody reads.
struct KvCache {
  std::vector<Tensor> k, v;  // per block: (B, H_kv, length, D)
  int64_t length = 0;
  std::vector<int64_t> pad;  // per row, its left padding (Note [padded prompts]); empty: none
  void clear() {
    k.clear();
    v.clear();
    length = 0;
    pad.clear();
  }
  bool padded() const;
  // (B, 1, 1, length + new_tokens) bool on `device`: true where a row may attend (past its
  // padding); undefined when no row is padded.
  Tensor key_mask(int64_t new_tokens, Device device) const;
  // (B, new_tokens) i64 on `device`: each row's positions of the new tokens, cache position
  // minus its padding (0 on the padding itself).
  Tensor positions(int64_t new_tokens, Device device) const;
};

class CausalLM : public Module {
 public:
  explicit CausalLM(LayerSpec spec = {}) : layer_spec(std::move(spec)) {}

  // idx (B, T) i64 token ids -> the stream entering block 0. Checks the shape and the context,
  // and the documents of a packed batch (Note [packed documents]), which the stream carries.
  Stream embed(const Tensor& idx, const Documents& documents = {}) const;
  // Runs blocks [begin, end) (0 <= begin <= end <= num_blocks()) on the stream: the one block
  // loop of every family (Note [the block loop]); returns the stream with the last block's
  // residual branch pending, or, with activation checkpointing in training, as one tensor.
  Stream blocks(const Stream& in, int64_t begin, int64_t end) const;
  // Final norm + LM head on the stream after the last block -> logits (B, T, vocab_size)
  // (a vocabulary-parallel head: this rank's slice of the vocabulary).
  virtual Tensor head(const Stream& in) const = 0;
  // Final norm + head + the mean cross-entropy against targets (B, T) (ignore_index -100),
  // through layer_spec.loss when set (a vocabulary-parallel cross-entropy that never gathers
  // the logits), else ops::cross_entropy. Virtual so a model can compute it another way.
  virtual Tensor head_loss(const Stream& in, const Tensor& targets) const;

  // idx (B, T) i64 -> logits (B, T, vocab_size): head(blocks(embed(idx), 0, num_blocks())).
  Tensor forward(const Tensor& idx, const Documents& documents = {}) const;
  // Mean cross-entropy against targets (B, T): head_loss(blocks(embed(idx), 0, n), targets).
  Tensor loss(const Tensor& idx, const Tensor& targets, const Documents& documents = {}) const;

  // idx (B, T) i64, the tokens after the cache's -> logits (B, T, vocab_size) (Note [KV cache]);
  // last_only: the last position's alone, (B, 1, vocab_size): what decoding reads, without the
  // head's work and the (B, T, vocab) logits of a long prompt.
  virtual Tensor forward_cached(const Tensor& idx, KvCache& cache, bool last_only = false) const = 0;
  // The logits of the last position alone, (B, 1, vocab_size): forward(idx)[:, -1:] up to the
  // head GEMM's rounding, with the head run on one position per row.
  Tensor forward_last(const Tensor& idx) const;

  virtual int64_t num_blocks() const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t block_size() const = 0;  // the longest context
  // The block a parameter name belongs to, or -1 outside the blocks (embeddings, final
  // norm, head). (Not named block_of: GPT::block_of and Llama::block_of are static
  // functions other code takes the address of, and C++ allows no static and virtual member
  // of one name and signature.)
  virtual int block_of_param(const std::string& param_name) const = 0;

  // The layers the model was built from (nn/layer_spec.h); its loss is head_loss's.
  LayerSpec layer_spec;
  // Called around every block's forward when set (nn/block_hooks.h; ZeRO-3).
  std::shared_ptr<BlockHooks> block_hooks;

 protected:
  // What a family supplies to the block loop (Note [the block loop]):
  // the token (and position) embedding of idx, checked, with a packed batch's documents;
  virtual Tensor embed_input(const Tensor& idx, const Documents& documents) const = 0;
  // block i on the stream x + pending (pending undefined: x alone) -> the new stream as {x,
  // pending}, the sum left for the next block's fused add + norm (Note [model seams]);
  virtual std::pair<Tensor, Tensor> block_step(int64_t i, const Tensor& x, const Tensor& pending,
                                               const Documents& documents) const = 0;
  // block i on one tensor -> one tensor (the region activation checkpointing recomputes);
  virtual Tensor block_forward(int64_t i, const Tensor& x, const Documents& documents) const = 0;
  // whether the family's config checkpoints its blocks' activations (model.checkpoint_activations);
  virtual bool checkpoints_activations() const = 0;
  // its name in errors ("GPT", "Llama").
  virtual const char* family_name() const = 0;
};

}  // namespace forge::nn
