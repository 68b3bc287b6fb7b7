#pragma once
// PowerSGD gradient compression for DDP (dist.grad_compression = "powersgd"; docs/dist.md "Several
// machines"): Vogels, Karimireddy & Jaggi 2019, "PowerSGD: Practical Low-Rank Gradient Compression
// for Distributed Optimization", Algorithm 1 (rank r, one power iteration, warm start, error
// feedback).
//
// Note [PowerSGD]. Each weight matrix's gradient G (n x m: a parameter of shape (n, ...) seen as n
// rows) is replaced by a rank-r approximation of the ranks' average. With M = G + e (e: what this
// rank's previous approximations left out, the error feedback) and Q (m x r, kept from the last step;
// at first standard normal from a seed every rank shares):
//     P = M Q;          all-reduce(P, avg);   P = orthonormal columns of P (Gram-Schmidt, f32)
//     Q = M^T P;        all-reduce(Q, avg);
//     G' = P Q^T;       e = M - G'            (this rank's M: what it has not yet sent)
// Since P Q^T = P P^T avg(M), the result is the average's projection on the span of P: exact when
// r >= rank(avg(M)) (then P spans its columns), which the tests use. Every other parameter (biases,
// norms' gains, and matrices where r (n + m) >= n m, where compression does not pay) is all-reduced
// as it is, in one flat buffer. Per step a matrix sends r (n + m) values instead of n m (GPT-2 124M at
// r = 4: ~0.3% of its gradient bytes besides the uncompressed vectors).
//
// dist.powersgd_start_step: plain all-reduces for the first optimizer steps (DataParallel counts
// them; restored on resume). The state (Q, e) is per rank and not checkpointed: a resumed run starts
// it afresh (docs/dist.md says so).
// The reductions run when a bucket's gradients are all in, one after another, while backward waits:
// compression is for links so slow that what it saves outweighs the overlap it gives up. DDP only
// (ZeRO shards the gradients PowerSGD needs whole); with gradient accumulation the gradients of the
// step's micro-batches are summed first (DDP's no_sync), as in any DDP step.
#include <cstdint>
#include <vector>

#include "forge/core/tensor.h"
#include "forge/parallel/dp_state.h"

namespace forge::parallel {

class PowerSgd {
 public:
  // rank: r (>= 1); seed: the initial Q's (the same on every rank). compress_all (tests): every
  // matrix compressed, also where r (n + m) >= n m.
  PowerSgd(const DpState& st, int rank, uint64_t seed, bool compress_all = false);
  // Replaces `grads` (bucket `bucket`'s flat gradients, this rank's) by their compressed average
  // over the group. Collective; returns when the result is on the device's current stream.
  void reduce(int bucket, const Tensor& grads);
  // Values sent per step / values a plain all-reduce would send (over every bucket).
  double sent_fraction() const;
  int rank() const { return rank_; }

 private:
  struct Matrix {
    int param = -1;
    int64_t n = 0, m = 0;
    Tensor q;      // (m, r) f32, warm-started
    Tensor error;  // (n, m) f32, the error feedback (undefined until the first step)
  };
  struct Bucket {
    std::vector<Matrix> matrices;
    std::vector<int> plain;  // params all-reduced as they are
  };
  const DpState& st_;
  int rank_;
  std::vector<Bucket> buckets_;
  int64_t sent_ = 0, total_ = 0;
};

}  // namespace forge::parallel
