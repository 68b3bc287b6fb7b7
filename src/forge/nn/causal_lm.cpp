#include "forge/nn/causal_lm.h"

#include <algorithm>
#include <tuple>
#include <vector>

#include "forge/autograd/checkpoint.h"
#include "forge/core/memory_owner.h"
#include "forge/core/trace_range.h"
#include "forge/ops/binary.h"
#include "forge/ops/copy.h"
#include "forge/ops/creation.h"
#include "forge/ops/loss.h"
#include "forge/ops/view.h"

namespace forge::nn {

Tensor Stream::materialize() const { return pending.defined() ? ops::add(x, pending) : x; }

// Note [the block loop] (causal_lm.h).
Stream CausalLM::blocks(const Stream& in, int64_t begin, int64_t end) const {
  FORGE_CHECK(0 <= begin && begin <= end && end <= num_blocks(), family_name(), "::blocks: the range [", begin, ", ",
              end, ") is not within the model's ", num_blocks(), " blocks; pass 0 <= begin <= end <= num_blocks()");
  if (begin == end) return in;
  BlockHooks* hooks = block_hooks.get();
  if (checkpoints_activations() && is_training()) {  // the regions take and return the plain stream
    Tensor x = in.materialize();
    for (int64_t i = begin; i < end; ++i) {
      const MemoryOwner owner(forward_block_owner(i));  // Note [memory owners]
      const trace::BlockScope traced(i);                // its trace range; its nodes' backward ranges
      if (hooks) hooks->before_block(static_cast<int>(i));
      x = autograd::checkpoint(
          [this, i, documents = in.documents](const TensorList& inputs) { return block_forward(i, inputs[0], documents); },
          {x});
      if (hooks) x = hooks->after_block(static_cast<int>(i), {x})[0];
    }
    return {x, Tensor(), in.documents};
  }
  Tensor x = in.x, pending = in.pending;  // the stream is x + pending (Note [model seams])
  for (int64_t i = begin; i < end; ++i) {
    const MemoryOwner owner(forward_block_owner(i));  // Note [memory owners]
    const trace::BlockScope traced(i);                // its trace range; its nodes' backward ranges
    if (hooks) hooks->before_block(static_cast<int>(i));
    std::tie(x, pending) = block_step(i, x, pending, in.documents);
    if (hooks) {
      const TensorList out = hooks->after_block(static_cast<int>(i), {x, pending});
      x = out[0];
      pending = out[1];
    }
  }
  return {x, pending, in.documents};
}

bool KvCache::padded() const {
  for (int64_t p : pad)
    if (p != 0) return true;
  return false;
}

Tensor KvCache::key_mask(int64_t new_tokens, Device device) const {
  if (!padded()) return Tensor();
  const auto B = static_cast<int64_t>(pad.size());
  const int64_t S = length + new_tokens;
  std::vector<int64_t> allowed(static_cast<size_t>(B * S));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s) allowed[static_cast<size_t>(b * S + s)] = s >= pad[static_cast<size_t>(b)] ? 1 : 0;
  return ops::ne(from_vector(allowed, {B, 1, 1, S}), 0.0).to(device);
}

Tensor KvCache::positions(int64_t new_tokens, Device device) const {
  const auto B = static_cast<int64_t>(pad.size());
  std::vector<int64_t> p(static_cast<size_t>(B * new_tokens));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < new_tokens; ++t)
      p[static_cast<size_t>(b * new_tokens + t)] = std::max<int64_t>(0, length + t - pad[static_cast<size_t>(b)]);
  return from_vector(p, {B, new_tokens}).to(device);
}

namespace {
// Note [memory owners]: the embedding's and the head's allocations (the blocks label their own).
Stream embed_owned(const CausalLM& m, const Tensor& idx, const Documents& documents = {}) {
  static const char* label = intern_memory_owner("forward: embedding");
  const MemoryOwner owner(label);
  return m.embed(idx, documents);
}
const char* head_label() {
  static const char* label = intern_memory_owner("forward: head and loss");
  return label;
}
}  // namespace

Tensor CausalLM::head_loss(const Stream& in, const Tensor& targets) const {
  const MemoryOwner owner(head_label());
  // The logits live only inside this call: the default loss may write dlogits over them in its
  // forward (ops::cross_entropy_consuming, Note [dlogits in the forward]).
  if (!layer_spec.loss) return ops::cross_entropy_consuming(head(in), targets);
  return layer_spec.cross_entropy(head(in), targets);
}

Stream CausalLM::embed(const Tensor& idx, const Documents& documents) const {
  FORGE_CHECK(idx.dim() == 2, family_name(), ": expects token ids of shape (B, T), got ", idx.shape());
  if (documents.packed() || documents.positions.defined()) {
    const Shape bt{idx.size(0), idx.size(1)};
    FORGE_CHECK(documents.ids.defined() && documents.positions.defined() && documents.ids.shape() == bt &&
                    documents.positions.shape() == bt && documents.ids.dtype() == DType::i32 &&
                    documents.positions.dtype() == DType::i64,
                family_name(), ": a packed batch's documents need ids (B, T) i32 and positions (B, T) i64 for tokens ",
                idx.shape(), " (Note [packed documents]), got ids ",
                documents.ids.defined() ? documents.ids.shape() : Shape{}, " and positions ",
                documents.positions.defined() ? documents.positions.shape() : Shape{});
    FORGE_CHECK(documents.ids.device() == idx.device() && documents.positions.device() == idx.device(), family_name(),
                ": the documents must be on the tokens' device ", idx.device().str());
  }
  Stream s{embed_input(idx, documents), Tensor(), documents};
  return s;
}

Tensor CausalLM::forward(const Tensor& idx, const Documents& documents) const {
  const Stream s = blocks(embed_owned(*this, idx, documents), 0, num_blocks());
  const MemoryOwner owner(head_label());
  return head(s);
}

Tensor CausalLM::forward_last(const Tensor& idx) const {
  const Stream s = blocks(embed_owned(*this, idx), 0, num_blocks());
  const int64_t T = s.x.size(1);
  auto last = [T](const Tensor& t) { return t.defined() ? ops::contiguous(ops::narrow(t, 1, T - 1, 1)) : Tensor(); };
  const MemoryOwner owner(head_label());
  return head(Stream{last(s.x), last(s.pending)});
}

Tensor CausalLM::loss(const Tensor& idx, const Tensor& targets, const Documents& documents) const {
  return head_loss(blocks(embed_owned(*this, idx, documents), 0, num_blocks()), targets);
}

}  // namespace forge::nn
