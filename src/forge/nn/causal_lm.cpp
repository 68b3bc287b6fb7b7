#include "forge/nn/causal_lm.h"

#include "forge/ops/binary.h"

namespace forge::nn {

Tensor Stream::materialize() const { return pending.defined() ? ops::add(x, pending) : x; }

Tensor CausalLM::head_loss(const Stream& in, const Tensor& targets) const {
  return layer_spec.cross_entropy(head(in), targets);
}

Tensor CausalLM::forward(const Tensor& idx) const { return head(blocks(embed(idx), 0, num_blocks())); }

Tensor CausalLM::loss(const Tensor& idx, const Tensor& targets) const {
  return head_loss(blocks(embed(idx), 0, num_blocks()), targets);
}

void CausalLM::check_block_range(const char* model, int64_t begin, int64_t end) const {
  FORGE_CHECK(0 <= begin && begin <= end && end <= num_blocks(), model, "::blocks: the range [", begin, ", ", end,
              ") is not within the model's ", num_blocks(), " blocks; pass 0 <= begin <= end <= num_blocks()");
}

}  // namespace forge::nn
