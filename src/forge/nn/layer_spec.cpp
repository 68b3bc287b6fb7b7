#include "forge/nn/layer_spec.h"

#include "forge/nn/layers.h"
#include "forge/nn/linear.h"
#include "forge/ops/creation.h"
#include "forge/ops/loss.h"

namespace forge::nn {

const char* to_string(LinearRole role) {
  switch (role) {
    case LinearRole::attention_qkv: return "attention_qkv";
    case LinearRole::attention_q: return "attention_q";
    case LinearRole::attention_k: return "attention_k";
    case LinearRole::attention_v: return "attention_v";
    case LinearRole::attention_out: return "attention_out";
    case LinearRole::mlp_up: return "mlp_up";
    case LinearRole::mlp_gate: return "mlp_gate";
    case LinearRole::mlp_down: return "mlp_down";
    case LinearRole::lm_head: return "lm_head";
  }
  return "unknown";
}

const char* to_string(EmbeddingRole role) {
  switch (role) {
    case EmbeddingRole::token: return "token";
    case EmbeddingRole::position: return "position";
  }
  return "unknown";
}

std::shared_ptr<Linear> LayerSpec::make_linear(int64_t in, int64_t out, bool bias, LinearRole role) const {
  std::shared_ptr<Linear> m = linear ? linear(in, out, bias, role) : std::make_shared<Linear>(in, out, bias);
  FORGE_CHECK(m != nullptr, "LayerSpec: the linear factory returned no module for role ", to_string(role), " (", in,
              " -> ", out, "); return a Linear (or a subclass) for every role");
  m->fp8 = role != LinearRole::lm_head;  // Note [FP8 linear]: the head stays in the compute dtype
  return m;
}

std::shared_ptr<Embedding> LayerSpec::make_embedding(int64_t num, int64_t dim, EmbeddingRole role) const {
  if (!embedding) return std::make_shared<Embedding>(num, dim);
  std::shared_ptr<Embedding> m = embedding(num, dim, role);
  FORGE_CHECK(m != nullptr, "LayerSpec: the embedding factory returned no module for role ", to_string(role), " (",
              num, " x ", dim, "); return an Embedding (or a subclass) for every role");
  return m;
}

Tensor LayerSpec::cross_entropy(const Tensor& logits, const Tensor& targets) const {
  return loss ? loss(logits, targets) : ops::cross_entropy(logits, targets);
}

std::vector<PositionRange> LayerSpec::position_ranges(int64_t length) const {
  if (!positions) return {{0, length}};
  std::vector<PositionRange> r = positions(length);
  int64_t n = 0;
  for (const PositionRange& p : r) {
    FORGE_CHECK(p.start >= 0 && p.length >= 0, "LayerSpec: a position range [", p.start, ", +", p.length, ") is negative");
    n += p.length;
  }
  FORGE_CHECK(n == length, "LayerSpec: the position ranges cover ", n, " positions of a local sequence of ", length);
  return r;
}

Tensor LayerSpec::position_ids(int64_t length, Device device) const {
  if (!positions) return arange(length, {.dtype = DType::i64, .device = device});
  std::vector<int64_t> ids;
  ids.reserve(static_cast<size_t>(length));
  for (const PositionRange& p : position_ranges(length))
    for (int64_t i = 0; i < p.length; ++i) ids.push_back(p.start + i);
  return from_vector(ids, {length}).to(device);
}

}  // namespace forge::nn
