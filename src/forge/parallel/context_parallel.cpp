// Context parallelism: the sequence layout, ring attention and Ulysses attention (contracts in
// context_parallel.h).
#include "forge/parallel/context_parallel.h"

#include <cmath>
#include <utility>

#include "forge/autograd/grad_mode.h"
#include "forge/autograd/node.h"
#include "forge/core/error.h"
#include "forge/ops/attention.h"
#include "forge/ops/binary.h"
#include "forge/ops/copy.h"
#include "forge/ops/creation.h"
#include "forge/ops/join.h"
#include "forge/ops/unary.h"
#include "forge/ops/view.h"

namespace forge::parallel::cp {

Kind kind_from_name(const std::string& name) {
  if (name == "ring") return Kind::ring;
  if (name == "ulysses") return Kind::ulysses;
  FORGE_THROW("dist.cp_kind = '", name,
             "' is not a kind of context parallelism; use \"ring\" (K/V passed around the ranks) or \"ulysses\" "
             "(all-to-all over the heads)");
}

const char* kind_name(Kind kind) { return kind == Kind::ring ? "ring" : "ulysses"; }

std::vector<nn::PositionRange> local_ranges(int64_t local_length, int rank, int size) {
  FORGE_CHECK(size >= 1 && rank >= 0 && rank < size, "context parallelism: rank ", rank, " of ", size);
  if (size == 1) return {{0, local_length}};
  FORGE_CHECK(local_length % 2 == 0, "context parallelism: a local sequence of ", local_length,
              " tokens is not two equal chunks; train.seq_len must be divisible by 2 x dist.cp = ", 2 * size);
  const int64_t c = local_length / 2;
  return {{rank * c, c}, {(2 * static_cast<int64_t>(size) - 1 - rank) * c, c}};
}

Tensor local_sequence(const Tensor& whole, int rank, int size) {
  if (size == 1) return whole;
  FORGE_CHECK(whole.dim() >= 2, "context parallelism: expected (B, T, ...) rows, got shape ", whole.shape());
  const int64_t T = whole.size(1);
  FORGE_CHECK(T % (2 * size) == 0, "context parallelism: a sequence of ", T, " tokens does not cut into 2 x dist.cp = ",
              2 * size, " equal chunks; make train.seq_len a multiple of ", 2 * size);
  NoGradGuard no_grad;
  const int64_t c = T / (2 * size);
  return ops::cat({ops::narrow(whole, 1, rank * c, c), ops::narrow(whole, 1, (2 * size - 1 - rank) * c, c)}, 1);
}

namespace {

int size_of(const ProcessGroupPtr& g) { return g ? g->size() : 1; }

void check_qkv(const Tensor& q, const Tensor& k, const Tensor& v, const char* op) {
  FORGE_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, op, ": expected q (B, H, t, D), k and v (B, Hkv, t, D), got ",
              q.shape(), ", ", k.shape(), ", ", v.shape());
  FORGE_CHECK(k.shape() == v.shape() && k.size(2) == q.size(2) && k.size(3) == q.size(3) && k.size(0) == q.size(0), op,
              ": k and v must be (B, Hkv, t, D) of q's B, t and D, got q ", q.shape(), ", k ", k.shape(), ", v ",
              v.shape());
}

// Sends `out` to the next rank of the ring and receives the previous rank's into `in`; even ranks
// send first, odd ranks receive first, so that blocking point-to-point engines (NCCL's
// send/recv, one at a time on its stream) pair up for any ring size.
std::pair<WorkPtr, WorkPtr> start_shift(const ProcessGroupPtr& g, const Tensor& out, const Tensor& in, int tag) {
  const int W = g->size(), r = g->rank();
  const int next = (r + 1) % W, prev = (r + W - 1) % W;
  if (r % 2 == 0) {
    WorkPtr s = g->send(out, next, tag);
    WorkPtr q = g->recv(in, prev, tag);
    return {s, q};
  }
  WorkPtr q = g->recv(in, prev, tag);
  WorkPtr s = g->send(out, next, tag);
  return {s, q};
}

void finish_shift(std::pair<WorkPtr, WorkPtr>& w) {
  if (w.first) w.first->wait();
  if (w.second) w.second->wait();
  w = {};
}

// Rows [row0, row0 + n) of the running output and logsumexp (f32, or f64) merged with a block's:
//   lse = log(e^lse + e^lse_b),  out = out e^(lse_old - lse) + out_b e^(lse_b - lse).
void merge_block(Tensor& acc_out, Tensor& acc_lse, int64_t row0, const ops::AttentionBlock& b) {
  const int64_t n = b.lse.size(2);
  Tensor o = ops::narrow(acc_out, 2, row0, n), l = ops::narrow(acc_lse, 2, row0, n);
  const Tensor bl = b.lse.to(acc_lse.dtype());
  const Tensor m = ops::maximum(l, bl);
  const Tensor lse = ops::add(m, ops::log(ops::add(ops::exp(ops::sub(l, m)), ops::exp(ops::sub(bl, m)))));
  const Tensor merged = ops::add(ops::mul(o, ops::unsqueeze(ops::exp(ops::sub(l, lse)), -1)),
                                 ops::mul(b.out.to(acc_out.dtype()), ops::unsqueeze(ops::exp(ops::sub(bl, lse)), -1)));
  ops::copy_(o, merged);
  ops::copy_(l, lse);
}

// Adds `g` into rows [row0, row0 + g.size(2)) of dim 2 of `acc`.
void add_rows(Tensor& acc, int64_t row0, const Tensor& g) {
  Tensor dst = ops::narrow(acc, 2, row0, g.size(2));
  ops::copy_(dst, ops::add(dst, g.to(acc.dtype())));
}

// The keys and values of a travelling buffer (2, B, Hkv, t, D).
Tensor k_of(const Tensor& buf) { return ops::select(buf, 0, 0); }
Tensor v_of(const Tensor& buf) { return ops::select(buf, 0, 1); }

// What the pieces are combined in: f64 for f64 inputs, else f32.
DType accumulation_dtype(const Tensor& t) { return t.dtype() == DType::f64 ? DType::f64 : DType::f32; }

// The block of ring step `s` for this rank: which keys of the held block (all, or the first
// chunk) and which query rows (all, or the second chunk), and whether it is the causal one.
struct RingBlock {
  bool causal;
  int64_t q_row0, q_rows;  // local query rows
  int64_t k_rows;          // leading rows of the held key/value block
};
RingBlock ring_block(int rank, int src, int64_t t) {
  const int64_t c = t / 2;
  if (src == rank) return {true, 0, t, t};
  if (src < rank) return {false, 0, t, c};
  return {false, c, c, t};
}

// Note [context-parallel documents]: packed documents (nn/documents.h) under context parallelism.
// Each rank holds its tokens' document ids (B, t), cut from the whole row's like the tokens; the
// group gathers them once per forward ((W, B, t) i32: rank j's at j), so a ring step knows the ids
// of the keys it holds without sending them around, and Ulysses lays them out in the sequence's
// order as it does the heads. Every block then masks by document (Note [document masks]).
struct BlockIds {
  Tensor q, k;  // undefined: no documents
};
BlockIds block_ids(const Tensor& gathered, int rank, int src, const RingBlock& b) {
  if (!gathered.defined()) return {};
  return {ops::narrow(ops::select(gathered, 0, rank), 1, b.q_row0, b.q_rows).contiguous(),
          ops::narrow(ops::select(gathered, 0, src), 1, 0, b.k_rows).contiguous()};
}

// The forward of ring attention: this rank's output (q's dtype) and its rows' logsumexp (f32, or
// f64), q (B, H, t, D) against the group's key/value blocks, kv (2, B, Hkv, t, D) being this rank's.
std::pair<Tensor, Tensor> ring_forward(const Tensor& qd, const Tensor& kv, const ProcessGroupPtr& group,
                                       const Tensor& ids) {
  NoGradGuard no_grad;
  const int W = group->size(), r = group->rank();
  const int64_t B = qd.size(0), H = qd.size(1), t = qd.size(2), D = qd.size(3);
  const DType acc = accumulation_dtype(qd);
  Tensor acc_out = zeros({B, H, t, D}, {.dtype = acc, .device = qd.device()});
  Tensor acc_lse = full({B, H, t}, -INFINITY, {.dtype = acc, .device = qd.device()});
  Tensor cur = kv;
  for (int s = 0; s < W; ++s) {
    std::pair<WorkPtr, WorkPtr> shift;
    Tensor next;
    if (s + 1 < W) {  // the next block travels while this one is attended to
      next = empty_like(cur);
      shift = start_shift(group, cur, next, /*tag=*/1);
    }
    const int src = (r - s + W) % W;
    const RingBlock b = ring_block(r, src, t);
    const BlockIds d = block_ids(ids, r, src, b);
    const ops::AttentionBlock blk =
        ops::attention_block_forward(ops::narrow(qd, 2, b.q_row0, b.q_rows), ops::narrow(k_of(cur), 2, 0, b.k_rows),
                                     ops::narrow(v_of(cur), 2, 0, b.k_rows), b.causal, 0.0, d.q, d.k);
    merge_block(acc_out, acc_lse, b.q_row0, blk);
    if (s + 1 < W) {
      finish_shift(shift);
      cur = next;
    }
  }
  return {acc_out.to(qd.dtype()), acc_lse};
}

}  // namespace

namespace {
// This rank's document ids (B, t), or none, gathered over the group: (W, B, t), rank j's at j.
Tensor gather_ids(const Tensor& ids, const ProcessGroupPtr& group, int64_t B, int64_t t) {
  if (!ids.defined()) return {};
  FORGE_CHECK(ids.dtype() == DType::i32 && ids.shape() == Shape({B, t}) && ids.device() == group->device(),
              "context parallelism: the document ids must be this rank's (B, t) = (", B, ", ", t, ") i32 on ",
              group->device().str(), ", got ", dtype_name(ids.dtype()), " ", ids.shape(), " on ", ids.device().str());
  NoGradGuard no_grad;
  Tensor out = empty({static_cast<int64_t>(group->size()), B, t}, {.dtype = DType::i32, .device = ids.device()});
  group->all_gather(out, ids.contiguous())->wait();
  return out;
}
}  // namespace

Tensor ring_attention(const Tensor& q, const Tensor& k, const Tensor& v, const ProcessGroupPtr& group,
                      const Tensor& ids) {
  if (size_of(group) == 1) return ops::scaled_dot_product_attention(q, k, v, true, 0.0, {}, ids);
  constexpr const char* op = "cp::ring_attention";
  check_qkv(q, k, v, op);
  FORGE_CHECK(q.device() == group->device(), op, ": the tensors are on ", q.device().str(), " but the ",
              group->backend(), " group works on ", group->device().str());
  const int64_t t = q.size(2);
  FORGE_CHECK(t % 2 == 0, op, ": the local sequence of ", t, " positions is not two chunks (2 x dist.cp must divide train.seq_len)");
  const Tensor qd = q.detach();
  // K and V travel as one buffer (2, B, Hkv, t, D): one send and one receive a step.
  Tensor kv;
  {
    NoGradGuard no_grad;
    kv = ops::stack({k.detach(), v.detach()}, 0).contiguous();
  }
  const Tensor gathered = gather_ids(ids, group, q.size(0), t);  // Note [context-parallel documents]
  std::pair<Tensor, Tensor> forward = ring_forward(qd, kv, group, gathered);
  Tensor out = forward.first;
  if (!autograd::any_requires_grad({q, k, v})) return out;
  const Tensor od = out.detach(), lse = forward.second;
  autograd::record("cp_ring_attention", out, {q, k, v}, [qd, kv, od, lse, group, t, gathered](const Tensor& g,
                                                                                             const autograd::GradMask&) {
    NoGradGuard no_grad;
    const int W = group->size(), r = group->rank();
    const DType acc = accumulation_dtype(qd);
    Tensor dq = zeros(qd.shape(), {.dtype = acc, .device = qd.device()});
    Tensor cur = kv;
    Tensor dkv;  // the gradient of the block held, travelling with it (f32; f64 for f64)
    std::pair<WorkPtr, WorkPtr> kv_shift, grad_shift;
    Tensor next_kv, next_dkv;
    for (int s = 0; s < W; ++s) {
      if (s + 1 < W) {
        next_kv = empty_like(cur);
        kv_shift = start_shift(group, cur, next_kv, /*tag=*/2);
      }
      const int src = (r - s + W) % W;
      const RingBlock b = ring_block(r, src, t);
      const BlockIds d = block_ids(gathered, r, src, b);
      const ops::AttentionBlockGrads gr = ops::attention_block_backward(
          ops::narrow(g, 2, b.q_row0, b.q_rows), ops::narrow(qd, 2, b.q_row0, b.q_rows),
          ops::narrow(k_of(cur), 2, 0, b.k_rows), ops::narrow(v_of(cur), 2, 0, b.k_rows),
          ops::narrow(od, 2, b.q_row0, b.q_rows), ops::narrow(lse, 2, b.q_row0, b.q_rows), b.causal, 0.0, d.q, d.k);
      add_rows(dq, b.q_row0, gr.dq);
      if (s == 0) {
        dkv = zeros(kv.shape(), {.dtype = acc, .device = kv.device()});
      } else {
        finish_shift(grad_shift);  // the accumulator of the block now held arrived with it
        dkv = next_dkv;
      }
      Tensor dk = k_of(dkv), dv = v_of(dkv);
      add_rows(dk, 0, gr.dk);
      add_rows(dv, 0, gr.dv);
      // The accumulator follows its block to the next rank; after the last step it is home.
      next_dkv = empty_like(dkv);
      grad_shift = start_shift(group, dkv, next_dkv, /*tag=*/3);
      if (s + 1 < W) {
        finish_shift(kv_shift);
        cur = next_kv;
      }
    }
    finish_shift(grad_shift);
    return TensorList{dq.to(qd.dtype()), k_of(next_dkv).to(kv.dtype()).contiguous(),
                      v_of(next_dkv).to(kv.dtype()).contiguous()};
  });
  return out;
}

// ---- Ulysses ----------------------------------------------------------------------------------

namespace {

// (B, h, t, D) with every head of this rank's chunks -> (B, h / W, T, D): this rank's share of the
// heads over the whole sequence in its order (no history).
Tensor heads_to_sequence_now(const Tensor& x, const ProcessGroupPtr& g) {
  const int W = g->size();
  const int64_t B = x.size(0), h = x.size(1), t = x.size(2), D = x.size(3), hw = h / W, c = t / 2;
  // Block j (to rank j): heads [j hw, (j + 1) hw) of the local chunks.
  const Tensor in = ops::contiguous(ops::permute(ops::reshape(x, {B, W, hw, t, D}), {1, 0, 2, 3, 4}));
  Tensor out = empty({W, B, hw, t, D}, {.dtype = x.dtype(), .device = x.device()});
  g->all_to_all(out, in)->wait();
  // Block i came from rank i: its chunks i and 2W-1-i. Chunk m of the sequence is rank m's
  // first (m < W) or rank 2W-1-m's second.
  TensorList chunks;
  for (int m = 0; m < 2 * W; ++m) {
    const int owner = m < W ? m : 2 * W - 1 - m;
    chunks.push_back(ops::narrow(ops::select(out, 0, owner), 2, m < W ? 0 : c, c));
  }
  return ops::cat(chunks, 2);
}

// The inverse: (B, h / W, T, D) -> (B, h, t, D).
Tensor sequence_to_heads_now(const Tensor& y, const ProcessGroupPtr& g) {
  const int W = g->size();
  const int64_t B = y.size(0), hw = y.size(1), T = y.size(2), D = y.size(3), c = T / (2 * W);
  TensorList blocks;  // block j (to rank j): j's chunks of the sequence, in its order
  for (int j = 0; j < W; ++j)
    blocks.push_back(ops::cat({ops::narrow(y, 2, j * c, c), ops::narrow(y, 2, (2 * W - 1 - j) * c, c)}, 2));
  const Tensor in = ops::stack(blocks, 0).contiguous();  // (W, B, hw, 2c, D)
  Tensor out = empty({W, B, hw, 2 * c, D}, {.dtype = y.dtype(), .device = y.device()});
  g->all_to_all(out, in)->wait();
  // Block i: heads [i hw, (i + 1) hw) of this rank's chunks.
  return ops::reshape(ops::contiguous(ops::permute(out, {1, 0, 2, 3, 4})), {B, W * hw, 2 * c, D});
}

Tensor heads_to_sequence(const Tensor& x, const ProcessGroupPtr& g) {
  Tensor out;
  {
    NoGradGuard no_grad;
    out = heads_to_sequence_now(x.detach(), g);
  }
  if (!autograd::any_requires_grad({x})) return out;
  autograd::record("cp_heads_to_sequence", out, {x}, [g](const Tensor& grad, const autograd::GradMask&) {
    NoGradGuard no_grad;
    return TensorList{sequence_to_heads_now(grad, g)};
  });
  return out;
}

Tensor sequence_to_heads(const Tensor& y, const ProcessGroupPtr& g) {
  Tensor out;
  {
    NoGradGuard no_grad;
    out = sequence_to_heads_now(y.detach(), g);
  }
  if (!autograd::any_requires_grad({y})) return out;
  autograd::record("cp_sequence_to_heads", out, {y}, [g](const Tensor& grad, const autograd::GradMask&) {
    NoGradGuard no_grad;
    return TensorList{heads_to_sequence_now(grad, g)};
  });
  return out;
}

}  // namespace

Tensor ulysses_attention(const Tensor& q, const Tensor& k, const Tensor& v, const ProcessGroupPtr& group,
                         const Tensor& ids) {
  if (size_of(group) == 1) return ops::scaled_dot_product_attention(q, k, v, true, 0.0, {}, ids);
  constexpr const char* op = "cp::ulysses_attention";
  check_qkv(q, k, v, op);
  const int W = group->size();
  FORGE_CHECK(q.size(1) % W == 0 && k.size(1) % W == 0, op, ": ", q.size(1), " query heads and ", k.size(1),
              " key/value heads on this rank do not both divide by dist.cp = ", W,
              "; use dist.cp_kind = \"ring\" (any head count) or a dist.cp that divides both");
  FORGE_CHECK(q.size(2) % 2 == 0, op, ": the local sequence of ", q.size(2),
              " positions is not two chunks (2 x dist.cp must divide train.seq_len)");
  // The whole sequence's document ids in its order (Note [context-parallel documents]).
  Tensor whole_ids;
  if (ids.defined()) {
    const Tensor gathered = gather_ids(ids, group, q.size(0), q.size(2));  // (W, B, t)
    const int64_t c = q.size(2) / 2;
    TensorList chunks;
    for (int m = 0; m < 2 * W; ++m) {
      const int owner = m < W ? m : 2 * W - 1 - m;
      chunks.push_back(ops::narrow(ops::select(gathered, 0, owner), 1, m < W ? 0 : c, c));
    }
    whole_ids = ops::cat(chunks, 1).contiguous();
  }
  const Tensor y = ops::scaled_dot_product_attention(heads_to_sequence(q, group), heads_to_sequence(k, group),
                                                     heads_to_sequence(v, group), true, 0.0, {}, whole_ids);
  return sequence_to_heads(y, group);
}

nn::LayerSpec layer_spec(nn::LayerSpec base, const ProcessGroupPtr& group, Kind kind) {
  if (size_of(group) == 1) return base;
  const int rank = group->rank(), size = group->size();
  base.positions = [rank, size](int64_t local_length) { return local_ranges(local_length, rank, size); };
  if (kind == Kind::ring)
    base.attention = [group](const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& ids) {
      return ring_attention(q, k, v, group, ids);
    };
  else
    base.attention = [group](const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& ids) {
      return ulysses_attention(q, k, v, group, ids);
    };
  return base;
}

}  // namespace forge::parallel::cp
