#include "forge/nn/causal_lm.h"

#include "forge/core/memory_owner.h"
#include "forge/ops/binary.h"

namespace forge::nn {

Tensor Stream::materialize() const { return pending.defined() ? ops::add(x, pending) : x; }

namespace {
// Note [memory owners]: the embedding's and the head's allocations (the blocks label their own).
Stream embed_owned(const CausalLM& m, const Tensor& idx) {
  static const char* label = intern_memory_owner("forward: embedding");
  const MemoryOwner owner(label);
  return m.embed(idx);
}
const char* head_label() {
  static const char* label = intern_memory_owner("forward: head and loss");
  return label;
}
}  // namespace

Tensor CausalLM::head_loss(const Stream& in, const Tensor& targets) const {
  const MemoryOwner owner(head_label());
  return layer_spec.cross_entropy(head(in), targets);
}

Tensor CausalLM::forward(const Tensor& idx) const {
  const Stream s = blocks(embed_owned(*this, idx), 0, num_blocks());
  const MemoryOwner owner(head_label());
  return head(s);
}

Tensor CausalLM::loss(const Tensor& idx, const Tensor& targets) const {
  return head_loss(blocks(embed_owned(*this, idx), 0, num_blocks()), targets);
}

void CausalLM::check_block_range(const char* model, int64_t begin, int64_t end) const {
  FORGE_CHECK(0 <= begin && begin <= end && end <= num_blocks(), model, "::blocks: the range [", begin, ", ", end,
              ") is not within the model's ", num_blocks(), " blocks; pass 0 <= begin <= end <= num_blocks()");
}

}  // namespace forge::nn
