// A split model's tensors against the whole model's: Notes [split tensors], [split gradients]
// and [split gradient norm] in tensor_parallel_state.h.
#include "forge/parallel/tensor_parallel_state.h"

#include <algorithm>
#include <utility>

#include "forge/autograd/grad_mode.h"
#include "forge/core/error.h"
#include "forge/ops/copy.h"
#include "forge/ops/creation.h"
#include "forge/ops/join.h"
#include "forge/ops/view.h"
#include "forge/nn/lora.h"
#include "forge/parallel/tensor_parallel.h"

namespace forge::parallel::tp {

int64_t ParamSplit::whole_numel() const {
  int64_t n = 1;
  for (int64_t d : whole_shape) n *= d;
  return n;
}

namespace {

int size_of(const ProcessGroupPtr& g) { return g ? g->size() : 1; }
int rank_of(const ProcessGroupPtr& g) { return g ? g->rank() : 0; }

// The group of the first parallel module in `m` (null when it has none).
ProcessGroupPtr group_in(const nn::Module& m) {
  if (const auto* lora = dynamic_cast<const nn::LoraLinear*>(&m)) return group_in(*lora->base);
  if (const auto* c = dynamic_cast<const ColumnParallelLinear*>(&m)) return c->group;
  if (const auto* r = dynamic_cast<const RowParallelLinear*>(&m)) return r->group;
  if (const auto* e = dynamic_cast<const VocabParallelEmbedding*>(&m)) return e->group;
  if (const auto* kv = dynamic_cast<const ReplicatedKVLinear*>(&m)) return kv->group;
  for (const auto& [child, module] : m.named_children())
    if (auto g = group_in(*module)) return g;
  return nullptr;
}

// `chunks` chunks along `dim`, rank r holding held(r).
template <class Held>
ParamSplit make_split(const Tensor& local, int64_t dim, int64_t chunks, int W, int rank, Held held, int copies) {
  ParamSplit s;
  s.dim = dim;
  s.chunks = chunks;
  for (int r = 0; r < W; ++r) s.held.push_back(held(r));
  s.copies = copies;
  s.whole_shape = local.shape();
  const auto mine = static_cast<int64_t>(s.held[static_cast<size_t>(rank)].size());
  s.whole_shape[static_cast<size_t>(dim)] = local.size(dim) / mine * chunks;
  return s;
}

void find_splits(const nn::Module& m, const std::string& prefix, int W, int rank,
                 std::map<std::string, ParamSplit>& out) {
  auto name = [&](const char* p) { return prefix.empty() ? std::string(p) : prefix + "." + p; };
  if (const auto* lora = dynamic_cast<const nn::LoraLinear*>(&m)) {
    // Note [tensor-parallel LoRA]: the base's weight and bias as the base splits them (the
    // LoraLinear registers them under the same names); the factors after them.
    find_splits(*lora->base, prefix, W, rank, out);
    if (!lora->attached()) return;
    const std::string a = name("lora_A.weight"), b = name("lora_B.weight");
    auto replicated = [&](const Tensor& t) {
      ParamSplit s = make_split(t, 0, 1, W, rank, [](int) { return std::vector<int64_t>{0}; }, W);
      s.partial_grad = W > 1;
      return s;
    };
    const auto w = out.find(name("weight"));
    // A plain base: both factors whole (found below). (A replicated key-value head may be one
    // chunk held by every rank: split all the same, its gradients partial.)
    if (w == out.end() || (w->second.chunks == 1 && !w->second.kv_replica)) return;
    ParamSplit like_weight = w->second;                   // the factor split along the weight's dim
    if (like_weight.dim == 0) {  // column-parallel or a replicated key-value head: B (out, r) by rows
      like_weight.whole_shape = {like_weight.whole_shape[0], lora->rank};
      out[b] = like_weight;
      out[a] = replicated(lora->lora_A->weight);
    } else {  // row-parallel: A (r, in) by columns
      like_weight.whole_shape = {lora->rank, like_weight.whole_shape[1]};
      out[a] = like_weight;
      out[b] = replicated(lora->lora_B->weight);
    }
    return;
  }
  if (const auto* c = dynamic_cast<const ColumnParallelLinear*>(&m)) {
    const int64_t P = c->parts;
    auto held = [P, W](int r) {
      std::vector<int64_t> v;
      for (int64_t p = 0; p < P; ++p) v.push_back(p * W + r);
      return v;
    };
    out[name("weight")] = make_split(c->weight, 0, P * W, W, rank, held, 1);
    if (c->bias.defined()) out[name("bias")] = make_split(c->bias, 0, P * W, W, rank, held, 1);
  } else if (const auto* r = dynamic_cast<const RowParallelLinear*>(&m)) {
    out[name("weight")] = make_split(r->weight, 1, W, W, rank, [](int q) { return std::vector<int64_t>{q}; }, 1);
  } else if (const auto* e = dynamic_cast<const VocabParallelEmbedding*>(&m)) {
    out[name("weight")] = make_split(e->weight, 0, W, W, rank, [](int q) { return std::vector<int64_t>{q}; }, 1);
  } else if (const auto* kv = dynamic_cast<const ReplicatedKVLinear*>(&m)) {
    const int64_t n_kv = kv->whole_out_features / kv->head_dim;
    const int share = static_cast<int>(W / n_kv);
    ParamSplit s = make_split(kv->weight, 0, n_kv, W, rank, [share](int q) { return std::vector<int64_t>{q / share}; },
                              share);
    s.kv_replica = true;
    out[name("weight")] = s;
  }
  for (const auto& [child, module] : m.named_children()) find_splits(*module, name(child.c_str()), W, rank, out);
}

// The items flattened one after another (per dtype, in order) into row `row` of a zero
// (rows, n) buffer, all-reduced (sum) over the group, and copied back from that row.
void sum_batched(const std::vector<Tensor>& items, const ProcessGroupPtr& g, int64_t rows, int64_t row) {
  std::map<DType, std::vector<Tensor>> by_dtype;
  for (const Tensor& t : items) by_dtype[t.dtype()].push_back(t);
  for (auto& [dt, ts] : by_dtype) {
    int64_t n = 0;
    for (const Tensor& t : ts) n += t.numel();
    if (n == 0) continue;
    Tensor buf = zeros({rows, n}, {.dtype = dt, .device = ts.front().device()});
    int64_t off = 0;
    const Tensor mine = ops::select(buf, 0, row);
    for (const Tensor& t : ts) {
      Tensor dst = ops::narrow(mine, 0, off, t.numel());
      ops::copy_(dst, t.reshape({-1}));
      off += t.numel();
    }
    g->all_reduce(buf, ReduceOp::sum)->wait();
    off = 0;
    for (const Tensor& t : ts) {
      Tensor dst = t;
      ops::copy_(dst, ops::narrow(mine, 0, off, t.numel()).reshape(t.shape()));
      off += t.numel();
    }
  }
}

}  // namespace

SplitModel::SplitModel(const nn::Module& model, ProcessGroupPtr group, bool sequence_parallel)
    : group_(group ? std::move(group) : group_in(model)), sequence_parallel_(sequence_parallel) {
  const int W = size_of(group_), rank = rank_of(group_);
  find_splits(model, "", W, rank, splits_);
  for (const auto& [n, t] : model.state_dict()) {
    if (splits_.count(n) != 0) continue;
    ParamSplit s = make_split(t, 0, 1, W, rank, [](int) { return std::vector<int64_t>{0}; }, W);
    if (t.dim() == 0) s.whole_shape = t.shape();
    splits_[n] = s;
  }
}

const ParamSplit& SplitModel::at(const std::string& name) const {
  const auto it = splits_.find(name);
  FORGE_CHECK(it != splits_.end(), "tp::SplitModel: the model has no tensor '", name, "'");
  return it->second;
}

std::map<std::string, Shape> SplitModel::whole_shapes() const {
  std::map<std::string, Shape> m;
  for (const auto& [n, s] : splits_) m[n] = s.whole_shape;
  return m;
}

int64_t SplitModel::whole_parameters(const nn::Module& model) const {
  int64_t n = 0;
  for (const auto& [name, p] : model.named_parameters()) n += at(name).whole_numel();
  return n;
}

Tensor SplitModel::local_of(const std::string& name, const Tensor& whole) const {
  const ParamSplit& s = at(name);
  FORGE_CHECK(whole.shape() == s.whole_shape, "tp: '", name, "' of the whole model should have shape ", s.whole_shape,
              ", got ", whole.shape(), "; load the state of the same model built without tensor parallelism");
  NoGradGuard no_grad;
  if (s.chunks == 1) return whole.detach().contiguous().clone();
  const int64_t cs = s.whole_shape[static_cast<size_t>(s.dim)] / s.chunks;
  TensorList parts;
  for (int64_t c : s.held[static_cast<size_t>(rank_of(group_))])
    parts.push_back(ops::narrow(whole.detach(), s.dim, c * cs, cs));
  return (parts.size() == 1 ? parts.front() : ops::cat(parts, s.dim)).contiguous().clone();
}

Tensor SplitModel::whole_of(const std::string& name, const Tensor& local) const {
  const ParamSplit& s = at(name);
  if (s.chunks == 1 || size_of(group_) == 1) return local;
  NoGradGuard no_grad;
  const int W = size_of(group_);
  const Tensor in = local.detach().contiguous();
  Tensor flat = empty({W * in.numel()}, {.dtype = in.dtype(), .device = in.device()});
  group_->all_gather(flat, in.reshape({-1}))->wait();
  const int64_t cs = s.whole_shape[static_cast<size_t>(s.dim)] / s.chunks;
  TensorList parts;
  for (int64_t c = 0; c < s.chunks; ++c) {
    for (int r = 0; r < W; ++r) {
      const auto& h = s.held[static_cast<size_t>(r)];
      const auto it = std::find(h.begin(), h.end(), c);
      if (it == h.end()) continue;
      const Tensor part = ops::narrow(flat, 0, r * in.numel(), in.numel()).reshape(in.shape());
      parts.push_back(ops::narrow(part, s.dim, (it - h.begin()) * cs, cs));
      break;
    }
  }
  return ops::cat(parts, s.dim).contiguous();
}

void SplitModel::load_whole(nn::Module& model, const std::map<std::string, Tensor>& whole) const {
  NoGradGuard no_grad;
  for (auto& [n, t] : model.state_dict()) {
    const auto it = whole.find(n);
    FORGE_CHECK(it != whole.end(), "tp: the whole state has no '", n,
                "'; load the state of the same model built without tensor parallelism");
    const Tensor local = local_of(n, it->second);
    FORGE_CHECK(local.shape() == t.shape(), "tp: this rank's part of '", n, "' has shape ", local.shape(),
                ", the split model's tensor ", t.shape());
    Tensor dst = t;
    ops::copy_(dst, local.to(t.device(), t.dtype()));
  }
}

void SplitModel::reduce_grads(const std::vector<std::pair<std::string, Tensor>>& grads) const {
  if (size_of(group_) == 1) return;
  NoGradGuard no_grad;
  std::vector<Tensor> partial, kv;
  int64_t kv_heads = 0, kv_head = 0;
  for (const auto& [n, g] : grads) {
    if (!g.defined()) continue;
    FORGE_CHECK(g.is_contiguous(), "tp::reduce_grads: the gradient of '", n, "' is not contiguous");
    const ParamSplit& s = at(n);
    if (s.kv_replica) {
      kv.push_back(g);
      kv_heads = s.chunks;
      kv_head = s.held[static_cast<size_t>(rank_of(group_))].front();
    } else if (s.partial_grad || (sequence_parallel_ && s.chunks == 1)) {
      partial.push_back(g);
    }
  }
  // A replicated head's gradient: this rank's part in its head's row of an (n_kv, len) buffer,
  // summed over the group (the ranks of other heads add zeros to it).
  if (!kv.empty()) sum_batched(kv, group_, kv_heads, kv_head);
  if (!partial.empty()) sum_batched(partial, group_, 1, 0);
}

// ---- tensor_parallel.h's whole-model helpers, on SplitModel ---------------------------------

void reduce_grads(nn::Module& model, const ProcessGroupPtr& g, bool sequence_parallel) {
  if (size_of(g) == 1) return;
  const SplitModel split(model, g, sequence_parallel);
  std::vector<std::pair<std::string, Tensor>> grads;
  for (const auto& [n, p] : model.named_parameters()) grads.emplace_back(n, p.grad());
  split.reduce_grads(grads);
}

void load_whole_state(nn::Module& model, const std::map<std::string, Tensor>& whole) {
  SplitModel(model, nullptr, false).load_whole(model, whole);
}

}  // namespace forge::parallel::tp
