// Gradient reductions that send FP8 (Note [FP8 gradient reduction] in fp8_reduce.h).
#include "forge/parallel/fp8_reduce.h"

#include <algorithm>
#include <utility>

#include "forge/autograd/grad_mode.h"
#include "forge/core/error.h"
#include "forge/ops/binary.h"
#include "forge/ops/copy.h"
#include "forge/ops/creation.h"
#include "forge/ops/fp8_wire.h"
#include "forge/ops/reduce.h"
#include "forge/parallel/chain_work.h"
#include "forge/parallel/hierarchical_group.h"

namespace forge::parallel {

struct Fp8GradReduce::Slot {
  Tensor worker_error;  // f32 (W C): e_w, undefined until the first reduction
  Tensor owner_error;   // f32 (C): e_o (all-reduce only)
};

namespace {

constexpr fp8::Format kFormat = fp8::Format::e4m3;
constexpr int64_t kB = fp8::kWireBlock;

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// e with its NaNs (the blocks that held a non-finite value) set to zero.
Tensor finite_or_zero(const Tensor& e) { return ops::masked_fill(e, ops::ne(e, e), 0.0); }

// The values of one coded reduction between its stages.
struct Coded {
  Tensor v;             // f32 (W C): this rank's input, set by the stage before the coded ones
  int64_t C = 0, Cp = 0, R = 0;
  fp8::WireBlocks mine, back;  // coded chunks / this rank's coded average
  Tensor rcodes, rinv;  // what the all-to-all brought: chunk r of every rank
  Tensor gcodes, ginv;  // what the all-gather brought: every rank's coded average
  Tensor result;        // f32: (C) reduce-scatter, (W C) all-reduce
};

// Steps 1-5 of the Note on group g, appended to `stages`; `gather`: all-reduce (else reduce-scatter).
// `feedback`: the worker's error feedback kept (else the coding's residue is dropped).
void coded_stages(std::vector<Stage>& stages, const ProcessGroupPtr& g, const std::shared_ptr<Coded>& c,
                  const std::shared_ptr<Fp8GradReduce::Slot>& slot, bool gather, bool feedback) {
  const int64_t W = g->size();
  stages.push_back([=]() -> WorkPtr {
    const int64_t L = c->v.numel();
    c->C = L / W, c->Cp = round_up(std::max<int64_t>(c->C, 1), kB), c->R = c->Cp / kB;
    Tensor m = slot->worker_error.defined() ? ops::add(c->v, slot->worker_error) : c->v;
    Tensor chunks = m.view({W, c->C});
    if (c->Cp != c->C) {
      chunks = zeros({W, c->Cp}, {.dtype = DType::f32, .device = m.device()});
      Tensor dst = chunks.narrow(1, 0, c->C);
      dst.copy_(m.view({W, c->C}));
    } else {
      chunks = chunks.contiguous();
    }
    c->mine = fp8::encode_blocks(chunks.view({W * c->R, kB}), kFormat);
    if (feedback) {
      const Tensor sent = fp8::decode_blocks(c->mine.codes, c->mine.inv_scales, kFormat).view({W, c->Cp});
      slot->worker_error = finite_or_zero(ops::sub(m, sent.narrow(1, 0, c->C).reshape({L})));
    }
    c->rcodes = empty({W * c->R, kB}, {.dtype = DType::u8, .device = m.device()});
    return g->all_to_all(c->rcodes, c->mine.codes);
  });
  stages.push_back([=]() -> WorkPtr {
    c->rinv = empty({W * c->R}, {.dtype = DType::f32, .device = c->v.device()});
    return g->all_to_all(c->rinv, c->mine.inv_scales);
  });
  stages.push_back([=]() -> WorkPtr {
    const Tensor got = fp8::decode_blocks(c->rcodes, c->rinv, kFormat).view({W, c->Cp});
    Tensor avg = ops::div(ops::sum(got, {0}), static_cast<double>(W));  // (Cp)
    c->mine = {};
    c->rcodes = c->rinv = Tensor();
    if (!gather) {
      c->result = avg.narrow(0, 0, c->C);
      return nullptr;
    }
    if (slot->owner_error.defined()) avg = ops::add(avg, slot->owner_error);
    c->back = fp8::encode_blocks(avg.view({c->R, kB}), kFormat);
    if (feedback)
      slot->owner_error =
          finite_or_zero(ops::sub(avg, fp8::decode_blocks(c->back.codes, c->back.inv_scales, kFormat).view({c->Cp})));
    c->gcodes = empty({W * c->R, kB}, {.dtype = DType::u8, .device = avg.device()});
    return g->all_gather(c->gcodes, c->back.codes);
  });
  if (!gather) return;
  stages.push_back([=]() -> WorkPtr {
    c->ginv = empty({W * c->R}, {.dtype = DType::f32, .device = c->v.device()});
    return g->all_gather(c->ginv, c->back.inv_scales);
  });
  stages.push_back([=]() -> WorkPtr {
    const Tensor all = fp8::decode_blocks(c->gcodes, c->ginv, kFormat).view({W, c->Cp});
    c->result = all.narrow(1, 0, c->C).reshape({W * c->C});
    c->back = {};
    c->gcodes = c->ginv = Tensor();
    return nullptr;
  });
}

// Bytes one rank sends in the coded reduction of L values over W ranks (codes and a factor per
// 128), and in the uncompressed one of the same values of `es` bytes (ring algorithms).
double coded_bytes(int64_t L, int64_t W, bool gather) {
  const int64_t C = L / W, Cp = round_up(std::max<int64_t>(C, 1), kB);
  const double per_exchange = static_cast<double>(W - 1) * static_cast<double>(Cp) * (1.0 + 4.0 / kB);
  return (gather ? 2 : 1) * per_exchange;
}
double plain_bytes(int64_t L, int64_t W, bool gather, size_t es) {
  return (gather ? 2 : 1) * static_cast<double>(L) * static_cast<double>(W - 1) / static_cast<double>(W) *
         static_cast<double>(es);
}

}  // namespace

Fp8GradReduce::Fp8GradReduce(const DpState& st, Fp8Feedback feedback)
    : st_(st), feedback_(feedback), slots_(st.buckets.size()) {
  for (auto& s : slots_) s = std::make_shared<Slot>();
  if (auto parts = node_groups(st.group)) {
    coded_ = parts->inter;
    intra_ = parts->intra;
    per_node_ = parts->per_node;
  } else {
    coded_ = st.group;
  }
  if (st.device.is_cuda()) side_ = std::make_unique<runtime::SideStream>(st.device);
  // What a step will send (sent_fraction before the first reduction): each bucket reduced once.
  const int64_t N = coded_->size(), k = intra_ ? per_node_ : 1;
  for (const DpBucket& b : st.buckets) {
    const size_t es = element_size(b.dtype);
    if (!st.sharding.gradients()) {
      const int64_t s = round_up((b.padded + k - 1) / k, N);
      expected_sent_ += coded_bytes(s, N, true), expected_plain_ += plain_bytes(s, N, true, es);
    } else {
      expected_sent_ += coded_bytes(N * b.shard, N, false), expected_plain_ += plain_bytes(N * b.shard, N, false, es);
    }
  }
}

Fp8GradReduce::~Fp8GradReduce() = default;

double Fp8GradReduce::sent_fraction() const {
  return plain_ > 0 ? sent_ / plain_ : expected_plain_ > 0 ? expected_sent_ / expected_plain_ : 1.0;
}

WorkPtr Fp8GradReduce::all_reduce(int bucket, const Tensor& grads) {
  NoGradGuard no_grad;
  FORGE_CHECK(bucket >= 0 && bucket < static_cast<int>(slots_.size()), "Fp8GradReduce: no bucket ", bucket);
  const std::shared_ptr<Slot> slot = slots_[static_cast<size_t>(bucket)];
  const int64_t n = grads.numel(), N = coded_->size(), k = intra_ ? per_node_ : 1;
  if (N == 1 && !intra_) return st_.group->all_reduce(grads, ReduceOp::avg);
  // The node's slice s (a multiple of N, so that the coded group splits it evenly); padded = k s.
  const int64_t s = round_up((n + k - 1) / k, N), padded = s * k, local = intra_ ? intra_->rank() : 0;
  auto buf = std::make_shared<Tensor>();
  auto c = std::make_shared<Coded>();
  const Tensor flat = grads.view({n});
  std::vector<Stage> stages;
  stages.push_back([=, this]() -> WorkPtr {
    if (padded == n) {
      *buf = flat;
    } else {
      *buf = zeros({padded}, {.dtype = grads.dtype(), .device = grads.device()});
      Tensor dst = buf->narrow(0, 0, n);
      dst.copy_(flat);
    }
    if (!intra_) return nullptr;
    return intra_->reduce_scatter(buf->narrow(0, local * s, s), *buf, ReduceOp::avg);
  });
  stages.push_back([=]() -> WorkPtr {
    c->v = buf->narrow(0, local * s, s).to(DType::f32);
    return nullptr;
  });
  coded_stages(stages, coded_, c, slot, /*gather=*/true, feedback_.all_reduce);
  stages.push_back([=, this]() -> WorkPtr {
    Tensor mine = buf->narrow(0, local * s, s);
    ops::copy_as_communication_(mine, c->result);
    c->result = c->v = Tensor();
    if (!intra_) return nullptr;
    return intra_->all_gather(*buf, buf->narrow(0, local * s, s));
  });
  if (padded != n)
    stages.push_back([=]() -> WorkPtr {
      Tensor dst = flat;
      ops::copy_as_communication_(dst, buf->narrow(0, 0, n));
      *buf = Tensor();
      return nullptr;
    });
  sent_ += coded_bytes(s, N, true);
  plain_ += plain_bytes(s, N, true, element_size(grads.dtype()));
  return chain_work(std::move(stages), side_.get(), {grads});
}

WorkPtr Fp8GradReduce::reduce_scatter(int bucket, const Tensor& output, const Tensor& input) {
  NoGradGuard no_grad;
  FORGE_CHECK(bucket >= 0 && bucket < static_cast<int>(slots_.size()), "Fp8GradReduce: no bucket ", bucket);
  const std::shared_ptr<Slot> slot = slots_[static_cast<size_t>(bucket)];
  const int64_t W = st_.group->size(), s = output.numel(), N = coded_->size(), k = intra_ ? per_node_ : 1;
  FORGE_CHECK(input.numel() == W * s, "Fp8GradReduce::reduce_scatter: the input holds ", input.numel(),
              " values, not the ", W, " x ", s, " of the output's group");
  if (W == 1) return st_.group->reduce_scatter(output, input, ReduceOp::avg);
  auto c = std::make_shared<Coded>();
  auto mid = std::make_shared<Tensor>();
  std::vector<Stage> stages;
  stages.push_back([=, this]() -> WorkPtr {
    if (!intra_) {
      c->v = input.reshape({W * s}).to(DType::f32);
      return nullptr;
    }
    // Slices (node, local) -> (local, node) (as the hierarchical group's reduce-scatter): this
    // rank's local index then holds every node's slice of it, reduced exactly in the node.
    const Tensor local_major = input.view({N, k, s}).transpose(0, 1).contiguous().view({W * s});
    *mid = empty({N * s}, {.dtype = input.dtype(), .device = input.device()});
    return intra_->reduce_scatter(*mid, local_major, ReduceOp::avg);
  });
  if (intra_)
    stages.push_back([=]() -> WorkPtr {
      c->v = mid->to(DType::f32);
      *mid = Tensor();
      return nullptr;
    });
  coded_stages(stages, coded_, c, slot, /*gather=*/false, feedback_.reduce_scatter);
  stages.push_back([=]() -> WorkPtr {
    Tensor out = output.view({s});
    ops::copy_as_communication_(out, c->result);
    c->result = c->v = Tensor();
    return nullptr;
  });
  sent_ += coded_bytes(N * s, N, false);
  plain_ += plain_bytes(N * s, N, false, element_size(input.dtype()));
  return chain_work(std::move(stages), side_.get(), {output, input});
}

}  // namespace forge::parallel
