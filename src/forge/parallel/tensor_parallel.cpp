// Tensor parallelism's collectives and linears: Note [tensor-parallel collectives] in
// tensor_parallel.h.
#include "forge/parallel/tensor_parallel.h"

#include <utility>

#include "forge/autograd/deferred.h"
#include "forge/autograd/engine.h"
#include "forge/autograd/grad_mode.h"
#include "forge/autograd/node.h"
#include "forge/core/env.h"
#include "forge/core/error.h"
#include "forge/nn/module.h"
#include "forge/ops/binary.h"
#include "forge/ops/copy.h"
#include "forge/ops/creation.h"
#include "forge/ops/embedding.h"
#include "forge/ops/index.h"
#include "forge/ops/join.h"
#include "forge/ops/loss.h"
#include "forge/ops/fp8.h"
#include "forge/ops/matmul.h"
#include "forge/ops/reduce.h"
#include "forge/ops/unary.h"
#include "forge/ops/view.h"

namespace forge::parallel::tp {
namespace {

int size_of(const ProcessGroupPtr& g) { return g ? g->size() : 1; }

int64_t wrap_dim(const Tensor& x, int64_t dim, const char* op) {
  const int64_t n = x.dim();
  FORGE_CHECK(n > 0, op, ": expected a tensor of at least one dimension, got a scalar");
  const int64_t d = dim < 0 ? dim + n : dim;
  FORGE_CHECK(d >= 0 && d < n, op, ": dim ", dim, " is out of range for a tensor of shape ", x.shape());
  return d;
}

void check_device(const Tensor& x, const ProcessGroupPtr& g, const char* op) {
  FORGE_CHECK(x.device() == g->device(), op, ": the tensor is on ", x.device().str(), " but the ", g->backend(),
              " group works on ", g->device().str(), "; move it there first");
}

// In-place all-reduce (sum) of a contiguous copy; the result is a new tensor, no history.
Tensor all_reduce_sum(const Tensor& x, const ProcessGroupPtr& g) {
  NoGradGuard no_grad;
  Tensor t = x.detach().clone();
  g->all_reduce(t, ReduceOp::sum)->wait();
  return t;
}

// The ranks' x concatenated along `dim` (every rank's x of one shape), no history: started (the
// flat buffer of the ranks' x, valid once the work has been waited for), then assembled; or both.
std::pair<Tensor, WorkPtr> start_all_gather(const Tensor& x, const ProcessGroupPtr& g) {
  NoGradGuard no_grad;
  const Tensor in = x.detach().contiguous();
  Tensor flat = empty({g->size() * in.numel()}, {.dtype = in.dtype(), .device = in.device()});
  WorkPtr work = g->all_gather(flat, in.reshape({-1}));
  return {flat, work};
}

Tensor assemble_gathered(const Tensor& flat, const Tensor& x, int64_t dim, int W) {
  NoGradGuard no_grad;
  TensorList parts;
  parts.reserve(static_cast<size_t>(W));
  for (int r = 0; r < W; ++r) parts.push_back(ops::narrow(flat, 0, r * x.numel(), x.numel()).reshape(x.shape()));
  return ops::cat(parts, dim);
}

Tensor all_gather_dim(const Tensor& x, int64_t dim, const ProcessGroupPtr& g) {
  auto [flat, work] = start_all_gather(x, g);
  work->wait();
  return assemble_gathered(flat, x, dim, g->size());
}

// Part `rank` (of W equal parts along `dim`) of the sum over the ranks of x, no history: started
// (the result is valid once the work has been waited for), or done.
std::pair<Tensor, WorkPtr> start_reduce_scatter_dim(const Tensor& x, int64_t dim, const ProcessGroupPtr& g,
                                                    const char* op) {
  NoGradGuard no_grad;
  const int W = g->size();
  const int64_t n = x.size(dim);
  FORGE_CHECK(n % W == 0, op, ": dim ", dim, " of shape ", x.shape(), " (", n, ") is not divisible by the group's ",
              W, " ranks");
  // The input in rank order, rank r's part [r n / W, (r + 1) n / W) of `dim` contiguous: x itself
  // when every dimension before `dim` has size 1, else one permuted copy (prefix, W, n / W, rest)
  // -> (W, prefix, n / W, rest).
  int64_t prefix = 1, rest = 1;
  for (int64_t i = 0; i < dim; ++i) prefix *= x.size(i);
  for (int64_t i = dim + 1; i < x.dim(); ++i) rest *= x.size(i);
  const Tensor xc = x.detach().contiguous();
  const Tensor in = prefix == 1 ? xc.reshape({-1})
                                : ops::permute(xc.reshape({prefix, W, n / W, rest}), {1, 0, 2, 3}).contiguous().reshape({-1});
  Shape part = x.shape();
  part[static_cast<size_t>(dim)] = n / W;
  Tensor out = empty(part, {.dtype = x.dtype(), .device = x.device()});
  WorkPtr work = g->reduce_scatter(out, in, ReduceOp::sum);
  return {out, work};
}

Tensor reduce_scatter_dim(const Tensor& x, int64_t dim, const ProcessGroupPtr& g, const char* op) {
  auto [out, work] = start_reduce_scatter_dim(x, dim, g, op);
  work->wait();
  return out;
}

// Note [sequence-parallel shards]: the shard (B, T / W, ...) of a whole (B, T, ...) is part r of the
// flattened whole, so both collectives work on the contiguous tensors as they are.
Shape whole_of_shard(const Tensor& shard, int W, const char* op) {
  FORGE_CHECK(shard.dim() >= 2, op, ": expected a sequence shard (B, T / tp, ...), got shape ", shard.shape());
  Shape whole = shard.shape();
  whole[1] *= W;
  return whole;
}

Tensor gather_sequence_now(const Tensor& shard, const ProcessGroupPtr& g) {
  auto [flat, work] = start_all_gather(shard, g);
  work->wait();
  NoGradGuard no_grad;
  return flat.reshape(whole_of_shard(shard, g->size(), "tp::gather_sequence"));
}

std::pair<Tensor, WorkPtr> start_reduce_scatter_sequence(const Tensor& x, const ProcessGroupPtr& g, const char* op) {
  NoGradGuard no_grad;
  const int W = g->size();
  FORGE_CHECK(x.dim() >= 2 && x.size(1) % W == 0, op, ": the sequence (dim 1) of shape ", x.shape(),
              " is not divisible by the group's ", W, " ranks");
  Shape part = x.shape();
  part[1] /= W;
  Tensor out = empty(part, {.dtype = x.dtype(), .device = x.device()});
  WorkPtr work = g->reduce_scatter(out, x.detach().contiguous().reshape({-1}), ReduceOp::sum);
  return {out, work};
}

Tensor reduce_scatter_sequence_now(const Tensor& x, const ProcessGroupPtr& g, const char* op) {
  auto [out, work] = start_reduce_scatter_sequence(x, g, op);
  work->wait();
  return out;
}

Tensor own_slice(const Tensor& x, int64_t dim, const ProcessGroupPtr& g, const char* op) {
  const int W = g->size();
  const int64_t n = x.size(dim);
  FORGE_CHECK(n % W == 0, op, ": dim ", dim, " of shape ", x.shape(), " (", n, ") is not divisible by the group's ",
              W, " ranks");
  return ops::narrow(x, dim, g->rank() * (n / W), n / W).contiguous();
}

// `out` (computed without history) gets a node whose backward is `fn` of the gradient.
Tensor with_history(const char* name, Tensor out, const Tensor& x, std::function<Tensor(const Tensor&)> fn) {
  if (!autograd::any_requires_grad({x})) return out;
  autograd::record(name, out, {x}, [fn = std::move(fn)](const Tensor& g, const autograd::GradMask&) {
    return TensorList{fn(g)};
  });
  return out;
}

}  // namespace

Tensor copy_to_region(const Tensor& x, const ProcessGroupPtr& g) {
  if (size_of(g) == 1) return x;
  check_device(x, g, "tp::copy_to_region");
  return with_history("tp_copy_to_region", x.detach(), x, [g](const Tensor& grad) { return all_reduce_sum(grad, g); });
}

Tensor reduce_from_region(const Tensor& x, const ProcessGroupPtr& g) {
  if (size_of(g) == 1) return x;
  check_device(x, g, "tp::reduce_from_region");
  return with_history("tp_reduce_from_region", all_reduce_sum(x, g), x, [](const Tensor& grad) { return grad; });
}

namespace {
// reduce_from_region of a partial product nothing else will read (a row-parallel linear's, which
// its GEMM's history does not keep): summed in place, saving a copy of it.
Tensor reduce_from_region_in_place(const Tensor& partial, const ProcessGroupPtr& g) {
  if (size_of(g) == 1) return partial;
  check_device(partial, g, "tp::reduce_from_region");
  if (!partial.is_contiguous()) return reduce_from_region(partial, g);
  Tensor out = partial.detach();
  g->all_reduce(out, ReduceOp::sum)->wait();
  return with_history("tp_reduce_from_region", out, partial, [](const Tensor& grad) { return grad; });
}
}  // namespace

// Megatron's gather: every rank then computes the same thing from the whole output, so every
// rank's gradient of it is the same, and this rank's slice of it is its shard's gradient.
Tensor gather_last_dim(const Tensor& x, const ProcessGroupPtr& g) {
  if (size_of(g) == 1) return x;
  check_device(x, g, "tp::gather_last_dim");
  const int64_t d = wrap_dim(x, -1, "tp::gather_last_dim");
  return with_history("tp_gather_last_dim", all_gather_dim(x, d, g), x, [g, d](const Tensor& grad) {
    NoGradGuard no_grad;
    return own_slice(grad, d, g, "tp::gather_last_dim backward");
  });
}

Tensor scatter_last_dim(const Tensor& x, const ProcessGroupPtr& g) {
  if (size_of(g) == 1) return x;
  check_device(x, g, "tp::scatter_last_dim");
  const int64_t d = wrap_dim(x, -1, "tp::scatter_last_dim");
  Tensor out;
  {
    NoGradGuard no_grad;
    out = own_slice(x.detach(), d, g, "tp::scatter_last_dim");
  }
  return with_history("tp_scatter_last_dim", out, x, [g, d](const Tensor& grad) { return all_gather_dim(grad, d, g); });
}

// Sequence parallelism's gather: each rank's activations differ after it (the ranks' row-parallel
// slices), so the gradient of this rank's part is the sum over the ranks of their gradients of it.
Tensor gather_along(const Tensor& x, int64_t dim, const ProcessGroupPtr& g) {
  if (size_of(g) == 1) return x;
  check_device(x, g, "tp::gather_along");
  const int64_t d = wrap_dim(x, dim, "tp::gather_along");
  return with_history("tp_gather_along", all_gather_dim(x, d, g), x, [g, d](const Tensor& grad) {
    return reduce_scatter_dim(grad, d, g, "tp::gather_along backward");
  });
}

Tensor gather_sequence(const Tensor& x, const ProcessGroupPtr& g) {
  if (size_of(g) == 1) return x;
  check_device(x, g, "tp::gather_sequence");
  return with_history("tp_gather_sequence", gather_sequence_now(x, g), x, [g](const Tensor& grad) {
    return reduce_scatter_sequence_now(grad, g, "tp::gather_sequence backward");
  });
}

Tensor reduce_scatter_sequence(const Tensor& x, const ProcessGroupPtr& g) {
  if (size_of(g) == 1) return x;
  check_device(x, g, "tp::reduce_scatter_sequence");
  return with_history("tp_reduce_scatter_sequence", reduce_scatter_sequence_now(x, g, "tp::reduce_scatter_sequence"),
                      x, [g](const Tensor& grad) { return gather_sequence_now(grad, g); });
}

// Note [one collective per input]: LLaMA's q, k and v projections (and its gate and up) are
// separate linears fed the same normed activations. Each entering its tensor-parallel region on
// its own would cost, per block, three all-reduces of the input gradient in backward (one per
// copy_to_region) where one of their sum does, and under sequence parallelism three all-gathers,
// three whole-sequence copies saved for backward and three reduce-scatters. So the last entry is
// remembered (its input by a weak reference, its output held): the same input tensor (alive, the same
// object, the same group, kind and grad mode) gets the same output, whose gradient autograd sums
// over its users before the one collective of its backward. The memo holds the last entry's
// output: its users need not keep it (a linear whose weight gradient is deferred saves nothing of
// it, and under sequence parallelism nothing may keep the gathered input), and a memo that held
// it only weakly missed every time (measured: five entries per LLaMA block instead of two, three
// collectives and copies too many each way). A region ends at its row-parallel linear and the
// head's at the loss: both let the memo go (leave_regions), so it holds nothing past its region.
namespace {
bool overlap_enabled() { return env::flag("FORGE_TP_OVERLAP"); }

// The entry node: forward copy_to_region (identity) or gather_along(x, 1); backward starts the
// all-reduce / reduce-scatter of the summed input gradient, runs the region's queued weight
// gradients while it is in flight (Note [weight gradients behind the collective]), then waits.
RegionEntry make_entry(const Tensor& x, const ProcessGroupPtr& g, bool sequence) {
  RegionEntry e;
  if (overlap_enabled() && autograd::any_requires_grad({x})) e.defer = std::make_shared<autograd::DeferredGrads>();
  auto defer = e.defer;
  if (sequence) {
    // The linears save nothing for their weight gradients: the entry keeps this rank's slice x
    // and gathers it again in backward (Megatron's sequence-parallel memory).
    if (e.defer) e.defer = std::make_shared<autograd::DeferredGrads>(/*provides_input=*/true);
    defer = e.defer;
    const Tensor shard = defer ? x.detach() : Tensor();
    // The re-gather of the shard for the weight gradients starts when the region's first linear
    // queues its weight gradient: it then runs behind the linears' input-gradient GEMMs.
    struct Prefetch {
      Tensor flat;
      WorkPtr work;
    };
    auto pre = std::make_shared<Prefetch>();
    if (defer)
      defer->on_first_push([g, shard, pre] {
        NoGradGuard no_grad;
        std::tie(pre->flat, pre->work) = start_all_gather(shard, g);
      });
    e.input = with_history("tp_enter_sequence", gather_sequence_now(x, g), x, [g, defer, shard, pre](const Tensor& grad) {
      if (!defer) return reduce_scatter_sequence_now(grad, g, "tp::gather_sequence backward");
      NoGradGuard no_grad;
      // The gather (started early, or now), the reduce-scatter behind it, and the
      // weight-gradient GEMMs while the reduce-scatter runs.
      if (!pre->work) std::tie(pre->flat, pre->work) = start_all_gather(shard, g);
      auto [out, scatter] = start_reduce_scatter_sequence(grad, g, "tp::gather_sequence backward");
      pre->work->wait();
      defer->run(pre->flat.reshape(whole_of_shard(shard, g->size(), "tp::gather_sequence backward")));
      *pre = {};
      scatter->wait();
      return out;
    });
  } else {
    e.input = with_history("tp_enter_region", x.detach(), x, [g, defer](const Tensor& grad) {
      NoGradGuard no_grad;
      Tensor t = grad.detach().contiguous().clone();
      WorkPtr work = g->all_reduce(t, ReduceOp::sum);
      if (defer) defer->run();
      work->wait();
      return t;
    });
  }
  if (!e.input.grad_fn()) e.defer = nullptr;  // (no backward will run the queue)
  return e;
}

struct EntryMemo {
  std::weak_ptr<TensorImpl> input;
  std::shared_ptr<TensorImpl> output;
  std::weak_ptr<autograd::DeferredGrads> defer;
  const ProcessGroup* group = nullptr;
  bool sequence = false, grad = false;
};
thread_local EntryMemo memo;

void leave_regions() { memo = {}; }
}  // namespace

RegionEntry enter_column_region(const Tensor& x, const ProcessGroupPtr& g, bool sequence_parallel) {
  if (size_of(g) == 1) return {x, nullptr};
  check_device(x, g, "tp::enter_column_region");
  const bool grad = grad_enabled();
  if (memo.group == g.get() && memo.sequence == sequence_parallel && memo.grad == grad) {
    const auto in = memo.input.lock();
    if (in && memo.output && in.get() == x.impl()) return {Tensor(memo.output), memo.defer.lock()};
  }
  RegionEntry e = make_entry(x, g, sequence_parallel);
  memo = {x.impl_ptr(), e.input.impl_ptr(), e.defer, g.get(), sequence_parallel, grad};
  return e;
}


Tensor reduce_scatter_along(const Tensor& x, int64_t dim, const ProcessGroupPtr& g) {
  if (size_of(g) == 1) return x;
  check_device(x, g, "tp::reduce_scatter_along");
  const int64_t d = wrap_dim(x, dim, "tp::reduce_scatter_along");
  return with_history("tp_reduce_scatter_along", reduce_scatter_dim(x, d, g, "tp::reduce_scatter_along"), x,
                      [g, d](const Tensor& grad) { return all_gather_dim(grad, d, g); });
}

Tensor shard(const Tensor& full, int64_t dim, int rank, int parts) {
  const int64_t d = wrap_dim(full, dim, "tp::shard");
  const int64_t n = full.size(d);
  FORGE_CHECK(parts >= 1 && rank >= 0 && rank < parts, "tp::shard: rank ", rank, " outside ", parts, " parts");
  FORGE_CHECK(n % parts == 0, "tp::shard: dim ", dim, " of shape ", full.shape(), " (", n, ") is not divisible into ",
              parts, " equal parts");
  NoGradGuard no_grad;
  return ops::narrow(full.detach(), d, rank * (n / parts), n / parts).contiguous().clone();
}

// ---- linears ------------------------------------------------------------------------------

namespace {
int64_t local_size(int64_t whole, const ProcessGroupPtr& g, const char* layer, const char* what) {
  const int W = size_of(g);
  FORGE_CHECK(whole % W == 0, layer, ": ", what, " = ", whole, " is not divisible by the tensor-parallel size ", W,
              "; choose sizes that tp divides");
  return whole / W;
}

void copy_into(Tensor& param, const Tensor& value, const char* what) {
  FORGE_CHECK(value.shape() == param.shape(), what, ": expected shape ", param.shape(), ", got ", value.shape());
  NoGradGuard no_grad;
  ops::copy_(param, value);
}
}  // namespace

ColumnParallelLinear::ColumnParallelLinear(int64_t in, int64_t out, bool bias, ProcessGroupPtr g, bool gather,
                                           int64_t n_parts, bool sp)
    : nn::Linear(in, local_size(out, g, "ColumnParallelLinear", "out_features"), bias),
      whole_out_features(out),
      gather_output(gather),
      parts(n_parts),
      sequence_parallel(sp),
      group(std::move(g)) {
  FORGE_CHECK(parts >= 1 && out % (parts * size_of(group)) == 0, "ColumnParallelLinear: out_features = ", out,
              " in ", parts, " parts is not divisible by the tensor-parallel size ", size_of(group),
              " within each part; choose sizes that tp divides");
  FORGE_CHECK(parts == 1 || !gather_output, "ColumnParallelLinear: gather_output with ", parts,
              " parts would interleave the parts; gather each part instead");
}

namespace {
// Note [FP8 under tensor parallelism] (ops/fp8.h): the recipe of this linear's GEMMs, if run.fp8
// applies to it, and the element-wise max of amaxes over its group.
std::optional<fp8::Recipe> fp8_recipe(const nn::Linear& l) {
  return l.fp8 ? fp8::training_recipe() : std::nullopt;
}
fp8::Split fp8_split(bool k, bool n, const ProcessGroupPtr& group) {
  fp8::Split s{.k = k, .n = n, .all_max = {}};
  if (size_of(group) > 1)
    s.all_max = [group](std::vector<float>& amax) {
      const Tensor t = from_vector(amax, {static_cast<int64_t>(amax.size())});
      group->all_reduce(t, ReduceOp::max)->wait();
      amax = t.to_vector<float>();
    };
  return s;
}
// Blockwise keeps its tiles and blocks inside a shard only when the split dimension's shard is a
// whole number of them.
void check_fp8_blocks(const nn::Linear& l, int64_t shard, const char* what) {
  const std::optional<fp8::Recipe> r = fp8_recipe(l);
  FORGE_CHECK(!r || *r != fp8::Recipe::blockwise || shard % fp8::kBlock == 0, "run.fp8 = \"blockwise\" under "
              "tensor parallelism needs each rank's ", what, " (", shard, " in ", l.name.empty() ? "a linear" : l.name,
              ") to be a multiple of ", fp8::kBlock, " so that no 128-wide tile or block spans two ranks; use "
              "run.fp8 = \"tensorwise\" or \"rowwise\", or another dist.tp");
}
}  // namespace

Tensor ColumnParallelLinear::forward(const Tensor& x) const {
  FORGE_CHECK(x.dim() >= 1 && x.shape().back() == in_features, "ColumnParallelLinear: input of shape ", x.shape(),
              " does not end in in_features = ", in_features);
  const RegionEntry in = enter_column_region(x, group, sequence_parallel);
  if (const std::optional<fp8::Recipe> r = fp8_recipe(*this)) {  // Note [FP8 under tensor parallelism]
    check_fp8_blocks(*this, out_features, "output features");
    const Tensor y = fp8::linear(in.input, weight, bias, *r, name, fp8_split(false, true, group));
    return gather_output ? gather_last_dim(y, group) : y;
  }
  const Tensor y = ops::linear(in.input, weight, bias, in.defer);
  return gather_output ? gather_last_dim(y, group) : y;
}

void ColumnParallelLinear::load_whole(const Tensor& w, const Tensor& b) {
  const int W = size_of(group), r = group ? group->rank() : 0;
  // This rank's slice of each part, the parts in order.
  auto rows = [&](const Tensor& whole) {
    FORGE_CHECK(whole.dim() >= 1 && whole.size(0) == whole_out_features, "ColumnParallelLinear::load_whole: expected ",
                whole_out_features, " rows, got shape ", whole.shape());
    if (parts == 1) return shard(whole, 0, r, W);
    const int64_t n = whole_out_features / parts;
    TensorList pieces;
    for (int64_t p = 0; p < parts; ++p) pieces.push_back(shard(ops::narrow(whole, 0, p * n, n), 0, r, W));
    NoGradGuard no_grad;
    return ops::cat(pieces, 0);
  };
  copy_into(weight, rows(w), "ColumnParallelLinear::load_whole (weight)");
  if (bias.defined()) copy_into(bias, rows(b), "ColumnParallelLinear::load_whole (bias)");
}

RowParallelLinear::RowParallelLinear(int64_t in, int64_t out, bool bias, ProcessGroupPtr g, bool parallel_input,
                                     bool sp)
    : nn::Linear(local_size(in, g, "RowParallelLinear", "in_features"), out, bias),
      whole_in_features(in),
      input_is_parallel(parallel_input),
      sequence_parallel(sp),
      group(std::move(g)) {}

Tensor RowParallelLinear::forward(const Tensor& x) const { return forward_partial(x, nullptr); }

Tensor RowParallelLinear::forward_partial(const Tensor& x, const std::function<Tensor(const Tensor&)>& partial_of) const {
  leave_regions();
  const Tensor xs = input_is_parallel ? x : scatter_last_dim(x, group);
  FORGE_CHECK(xs.dim() >= 1 && xs.shape().back() == in_features, "RowParallelLinear: input of shape ", xs.shape(),
              " does not end in this rank's in_features = ", in_features, " (of ", whole_in_features, ")");
  const Tensor partial = partial_of ? partial_of(xs) : partial_product(xs);
  const Tensor y =
      sequence_parallel ? reduce_scatter_sequence(partial, group) : reduce_from_region_in_place(partial, group);
  return bias.defined() ? ops::add(y, bias) : y;
}

Tensor RowParallelLinear::partial_product(const Tensor& xs) const {
  if (const std::optional<fp8::Recipe> r = fp8_recipe(*this)) {  // Note [FP8 under tensor parallelism]
    check_fp8_blocks(*this, in_features, "input features");
    return fp8::linear(xs, weight, Tensor(), *r, name, fp8_split(true, false, group));
  }
  return ops::linear(xs, weight, Tensor());
}

void RowParallelLinear::load_whole(const Tensor& w, const Tensor& b) {
  const int W = size_of(group), r = group ? group->rank() : 0;
  copy_into(weight, shard(w, 1, r, W), "RowParallelLinear::load_whole (weight)");
  if (bias.defined()) copy_into(bias, b, "RowParallelLinear::load_whole (bias)");
}

// ---- vocabulary parallelism ----------------------------------------------------------------

VocabParallelEmbedding::VocabParallelEmbedding(int64_t num, int64_t dim, ProcessGroupPtr g, bool sp)
    : nn::Embedding(local_size(num, g, "VocabParallelEmbedding", "the vocabulary"), dim),
      whole_num(num),
      vocab_start((g ? g->rank() : 0) * (num / size_of(g))),
      sequence_parallel(sp),
      group(std::move(g)) {}

Tensor VocabParallelEmbedding::forward(const Tensor& ids) const {
  if (size_of(group) == 1) return nn::Embedding::forward(ids);
  // This rank's rows: ids in [vocab_start, vocab_start + num); the others look up row 0 and are
  // zeroed (their gradient too).
  Tensor local, inside;
  {
    NoGradGuard no_grad;
    const Tensor shifted = ops::sub(ids, static_cast<double>(vocab_start));
    const Tensor in_range = ops::mul(ops::ge(shifted, 0.0).to(ids.dtype()), ops::lt(shifted, static_cast<double>(num)).to(ids.dtype()));
    local = ops::mul(shifted, in_range);
    inside = ops::unsqueeze(in_range.to(weight.dtype()), -1);
  }
  const Tensor partial = ops::mul(ops::embedding(weight, local), inside);
  return sequence_parallel ? reduce_scatter_sequence(partial, group) : reduce_from_region_in_place(partial, group);
}

Tensor VocabParallelEmbedding::attend(const Tensor& x) const {
  const Tensor xin = sequence_parallel ? gather_sequence(x, group) : copy_to_region(x, group);
  return ops::matmul(xin, ops::transpose(weight, 0, 1));
}

namespace {
int64_t shared_head(int64_t out, int64_t head_dim, const ProcessGroupPtr& g) {
  const int W = size_of(g);
  FORGE_CHECK(head_dim > 0 && out % head_dim == 0, "ReplicatedKVLinear: out_features = ", out,
              " is not a whole number of heads of size ", head_dim);
  const int64_t kv = out / head_dim;
  FORGE_CHECK(W % kv == 0, "ReplicatedKVLinear: ", kv, " key-value heads do not divide the tensor-parallel size ", W,
              "; kv-heads must be a multiple of tp, or divide it");
  return (g ? g->rank() : 0) / (W / kv);
}
}  // namespace

ReplicatedKVLinear::ReplicatedKVLinear(int64_t in, int64_t out, int64_t hd, ProcessGroupPtr g, bool sp)
    : nn::Linear(in, hd, false),
      whole_out_features(out),
      head_dim(hd),
      head(shared_head(out, hd, g)),
      sequence_parallel(sp),
      group(std::move(g)) {}

Tensor ReplicatedKVLinear::forward(const Tensor& x) const {
  const RegionEntry in = enter_column_region(x, group, sequence_parallel);
  // (Note [FP8 under tensor parallelism]: this rank's head is a slice of the whole projection's rows.)
  if (const std::optional<fp8::Recipe> r = fp8_recipe(*this)) {
    check_fp8_blocks(*this, out_features, "output features");
    return fp8::linear(in.input, weight, Tensor(), *r, name, fp8_split(false, true, group));
  }
  return ops::linear(in.input, weight, Tensor(), in.defer);
}

void ReplicatedKVLinear::load_whole(const Tensor& w) {
  FORGE_CHECK(w.dim() == 2 && w.size(0) == whole_out_features, "ReplicatedKVLinear::load_whole: expected ",
              whole_out_features, " rows, got shape ", w.shape());
  NoGradGuard no_grad;
  copy_into(weight, ops::narrow(w, 0, head * head_dim, head_dim).contiguous(), "ReplicatedKVLinear::load_whole");
}

SequenceShardEmbedding::SequenceShardEmbedding(int64_t num, int64_t dim, ProcessGroupPtr g)
    : nn::Embedding(num, dim), group(std::move(g)) {}

// Row b of rank r's shard holds positions [s n, (s + 1) n), s = (r B + b) mod W (Note
// [sequence-parallel shards]): the table's rows for all T positions, as W blocks of n, picked per row.
Tensor SequenceShardEmbedding::add_to(const Tensor& x, const Tensor& positions) const {
  const int W = size_of(group);
  FORGE_CHECK(positions.dim() == 1 && positions.size(0) % W == 0, "SequenceShardEmbedding: ", positions.size(0),
              " positions are not divisible by the tensor-parallel size ", W,
              " (sequence parallelism splits the sequence evenly); choose train.seq_len a multiple of dist.tp");
  const int64_t n = positions.size(0) / W;
  FORGE_CHECK(x.dim() == 3 && x.size(1) == n && x.size(2) == dim, "SequenceShardEmbedding: expected the token "
              "embeddings' shard (B, ", n, ", ", dim, ") of ", positions.size(0), " positions, got shape ", x.shape());
  const int64_t B = x.size(0), r = group ? group->rank() : 0;
  const Tensor blocks = ops::reshape(nn::Embedding::forward(positions), {W, n, dim});
  if (W == 1) return ops::add(x, blocks);
  Tensor rows;  // s for each row b: W-periodic from (r B) mod W
  {
    NoGradGuard no_grad;
    const Tensor period = arange(W, {.dtype = DType::i64, .device = x.device()});
    const int64_t first = (r * B) % W, copies = (first + B + W - 1) / W;
    rows = ops::narrow(ops::cat(TensorList(static_cast<size_t>(copies), period), 0), 0, first, B).contiguous();
  }
  return ops::add(x, ops::index_select(blocks, 0, rows));
}

void VocabParallelEmbedding::load_whole(const Tensor& w) {
  copy_into(weight, shard(w, 0, group ? group->rank() : 0, size_of(group)), "VocabParallelEmbedding::load_whole");
}

// Note [fused vocabulary-parallel cross-entropy]
// The loss over logits split by classes: each rank's log-sum-exp per row (cross_entropy's fused
// forward, no (N, V) temporary) and the target's logit (on the one rank whose slice holds it),
// combined over the group, give the whole vocabulary's log-sum-exp `lse` and the loss. The node
// keeps only the logits slice, the targets and lse (N values), and its backward is
// cross_entropy's fused kernel given the slice's first class (ops::cross_entropy_backward with
// class_start): dlogits = (exp(x - lse) - [x is the target]) g / count, written over the logits
// when the node holds the last reference to them (Note [dlogits in place] in ops/loss.cpp). The
// first version composed autograd ops (to f32, sub, exp, sum, gather, log): they kept f32 copies
// of the (N, V / W) slice for backward and made more in forward (the tp 2 LLaMA on the CPU kept
// 2.3 logits-sized tensors more than forge plan counts; at the 0.85B LLaMA, batch 8 x 2048, each
// is 0.5-1 GB). This keeps what the whole-vocabulary cross_entropy keeps.
Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                    const ProcessGroupPtr& g, int64_t ignore_index) {
  FORGE_CHECK(logits.dim() >= 1 && targets.shape() == Shape(logits.shape().begin(), logits.shape().end() - 1),
              "tp::vocab_parallel_cross_entropy: targets of shape ", targets.shape(), " do not match logits ",
              logits.shape(), " without their last (class) dim");
  FORGE_CHECK(is_floating(logits.dtype()), "tp::vocab_parallel_cross_entropy: floating logits, got ",
              dtype_name(logits.dtype()));
  leave_regions();  // (the head's)
  const int64_t V = logits.size(-1), N = targets.numel();
  // The loss's dtype (Note [loss dtype]): f32 for 16-bit logits, else the logits'.
  const DType dt = logits.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const Tensor x = ops::reshape(logits.detach(), {N, V}).contiguous();
  const Tensor t = ops::reshape(targets.detach().to(DType::i64), {N}).contiguous();
  Tensor lse, loss, scale;
  {
    NoGradGuard no_grad;
    const Tensor local_t = ops::sub(t, static_cast<double>(vocab_start));
    const Tensor valid = ops::ne(t, static_cast<double>(ignore_index)).to(dt);
    const Tensor in_range =
        ops::mul(ops::mul(ops::ge(local_t, 0.0).to(dt), ops::lt(local_t, static_cast<double>(V)).to(dt)), valid);
    const Tensor column = ops::mul(local_t, in_range.to(DType::i64));  // 0 where not here (masked below)
    // This slice's log-sum-exp per row and its logit at `column` (lse - row loss), fused.
    const ops::CrossEntropyRows rows = ops::cross_entropy_rows(x, column);
    Tensor target_logit = ops::mul(ops::sub(rows.lse, rows.loss), in_range);
    if (size_of(g) > 1) g->all_reduce(target_logit, ReduceOp::sum)->wait();
    // The whole vocabulary's: lse = M + log sum_r exp(lse_r - M), M the largest slice's lse.
    Tensor most = rows.lse.clone();
    if (size_of(g) > 1) g->all_reduce(most, ReduceOp::max)->wait();
    Tensor sum_exp = ops::exp(ops::sub(rows.lse, most));
    if (size_of(g) > 1) g->all_reduce(sum_exp, ReduceOp::sum)->wait();
    lse = ops::add(most, ops::log(sum_exp)).contiguous();
    const Tensor count = ops::sum(valid);
    loss = ops::div(ops::sum(ops::mul(ops::sub(lse, target_logit), valid)), count);
    scale = ops::div(ones_like(count), count);  // (0 targets: inf, never used, as cross_entropy's NaN loss)
  }
  if (!autograd::any_requires_grad({logits})) return loss;
  const Shape shape = logits.shape();
  autograd::record("tp_vocab_parallel_cross_entropy", loss, {logits},
                   [x, t, lse, scale, vocab_start, ignore_index, shape](const Tensor& grad, const autograd::GradMask&) {
                     const bool reuse =
                         !autograd::retaining_graph() && x.storage().use_count() == 1 && x.is_contiguous();
                     const Tensor dl = ops::cross_entropy_backward(x, t, lse, grad.contiguous(), scale, ignore_index,
                                                                   vocab_start, reuse);
                     return TensorList{ops::reshape(dl, shape)};
                   },
                   {x, t, lse, scale});
  return loss;
}

// ---- models ------------------------------------------------------------------------------

nn::LayerSpec layer_spec(const ProcessGroupPtr& g, bool sp, int64_t head_dim) {
  using nn::LinearRole;
  nn::LayerSpec spec;
  spec.linear = [g, sp, head_dim](int64_t in, int64_t out, bool bias, LinearRole role) -> std::shared_ptr<nn::Linear> {
    const int W = size_of(g);
    switch (role) {
      case LinearRole::attention_qkv:
        return std::make_shared<ColumnParallelLinear>(in, out, bias, g, false, /*parts=*/3, sp);
      case LinearRole::attention_k:
      case LinearRole::attention_v:
        if (head_dim > 0 && !bias && out % head_dim == 0 && (out / head_dim) % W != 0 && W % (out / head_dim) == 0)
          return std::make_shared<ReplicatedKVLinear>(in, out, head_dim, g, sp);
        return std::make_shared<ColumnParallelLinear>(in, out, bias, g, false, 1, sp);
      case LinearRole::attention_q:
      case LinearRole::mlp_up:
      case LinearRole::mlp_gate:
      case LinearRole::lm_head:
        return std::make_shared<ColumnParallelLinear>(in, out, bias, g, false, 1, sp);
      case LinearRole::attention_out:
      case LinearRole::mlp_down:
        return std::make_shared<RowParallelLinear>(in, out, bias, g, true, sp);
    }
    FORGE_THROW("tp::layer_spec: unknown linear role");
  };
  spec.embedding = [g, sp](int64_t num, int64_t dim, nn::EmbeddingRole role) -> std::shared_ptr<nn::Embedding> {
    if (role == nn::EmbeddingRole::token) return std::make_shared<VocabParallelEmbedding>(num, dim, g, sp);
    if (sp) return std::make_shared<SequenceShardEmbedding>(num, dim, g);
    return std::make_shared<nn::Embedding>(num, dim);
  };
  spec.loss = [g](const Tensor& logits, const Tensor& targets) {
    // This rank's classes start at rank x (its slice's width): the head is split evenly.
    const int64_t start = (g ? g->rank() : 0) * logits.size(-1);
    return vocab_parallel_cross_entropy(logits, targets, start, g);
  };
  return spec;
}

}  // namespace forge::parallel::tp
