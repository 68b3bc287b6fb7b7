#pragma once
// Gradient reductions that send FP8 (dist.grad_compression = "fp8"; docs/dist.md "Several
// machines"): for links so slow that a bf16 gradient's bytes are the step's cost.
//
// Note [FP8 gradient reduction]. A ring all-reduce cannot carry FP8: every hop would add a
// rounding of partial sums. So each reduction is done as its two halves, each moving FP8 once
// (the "quantized reduce-scatter by all-to-all" of ZeRO++'s qgZ, with e4m3 blocks instead of int4):
//   1. m = g + e_w          this rank's gradients (f32) plus what its earlier codings left out;
//                           split into W chunks of C (the reduce-scatter's slices), each padded to a
//                           multiple of 128 and coded in 1 x 128 blocks of e4m3 with a scale each
//                           (Note [FP8 wire blocks] in ops/fp8_wire.h: 2^-4 relative per value);
//                           e_w = m - decode(codes)                  (worker error feedback)
//   2. all-to-all of the codes and scales: chunk j to rank j      ((W-1)/W of 1.03 bytes a value)
//   3. a = mean over the W decoded chunks received (f32): this rank's slice of the average.
//      reduce-scatter (ZeRO-2/3): a is the result. all-reduce (DDP, ZeRO-1), also:
//   4. a + e_o coded again; e_o = a + e_o - decode                (owner error feedback)
//   5. all-gather of the codes and scales; every rank decodes the whole average.
// An all-reduce sends 2(W-1)/W x 1.03 bytes per value where a bf16 ring sends 2(W-1)/W x 2 (0.52 of
// it; 0.26 of f32), a reduce-scatter half of that. Error feedback (both sides, as 1-bit Adam's
// worker and server errors) makes the rounding a delay, not a loss: what a coding leaves out of
// one step is sent in the next, so the sum of the applied averages over steps differs from the
// exact one by one step's residue. With dist.dp_reduce = "hierarchical" only the inter-node
// stage is coded (the node's reduce-scatter and all-gather stay exact, in the bucket's dtype):
// the group of the same local index across nodes runs steps 1-5 on this rank's 1/k slice.
// A coded block holding a non-finite value decodes to NaN everywhere (the step's non-finite check
// then sees it); the errors of such blocks are reset to zero rather than carried into later steps.
// Memory: e_w is the gradients' size in f32 on each rank (the node's 1/k slice when hierarchical).
// DDP and ZeRO-1 hold whole gradients anyway; ZeRO-2/3 exist not to, so their reduce-scatters
// keep no e_w unless asked (dist.fp8_error_feedback: "auto" keeps it for DDP and ZeRO-1 only,
// "on" everywhere, "off" nowhere); without it each coding's residue (up to 2^-4 of each value) is
// dropped, as ZeRO++'s qgZ drops its int4 residue.
// The errors are per rank and not checkpointed (a resumed run starts them at zero; docs/dist.md).
// Ordering: the stages are one chain_work (chain_work.h): on a GPU queued on a stream of this
// reducer's own, so backward keeps overlapping the buckets as with the uncompressed reductions.
#include <cstdint>
#include <memory>
#include <vector>

#include "forge/backends/device_runtime.h"
#include "forge/core/tensor.h"
#include "forge/parallel/dp_state.h"

namespace forge::parallel {

// Which reductions keep their error feedback (see the Note: dist.fp8_error_feedback).
struct Fp8Feedback {
  bool all_reduce = true, reduce_scatter = true;
};

class Fp8GradReduce {
 public:
  // st.group flat or made by make_hierarchical (then its inter-node stage is the coded one).
  explicit Fp8GradReduce(const DpState& st, Fp8Feedback feedback = {});
  ~Fp8GradReduce();
  // grads (bucket `bucket`'s flat gradients, any length) replaced by the group's average.
  WorkPtr all_reduce(int bucket, const Tensor& grads);
  // output (n) = this rank's slice of the group's average of input (W n): as
  // ProcessGroup::reduce_scatter with ReduceOp::avg (for a hierarchical group, its slice order).
  WorkPtr reduce_scatter(int bucket, const Tensor& output, const Tensor& input);
  // Bytes this rank sent across the coded group so far / bytes the uncompressed reductions of the
  // same tensors would have sent there (their dtype, ring algorithms). Before any reduction: what
  // one reduction of every bucket will send.
  double sent_fraction() const;

  struct Slot;  // (fp8_reduce.cpp) the error feedback of one bucket

 private:
  const DpState& st_;
  ProcessGroupPtr coded_, intra_;  // intra_: the node's group when hierarchical, else null
  int per_node_ = 1;
  Fp8Feedback feedback_;
  std::vector<std::shared_ptr<Slot>> slots_;
  std::unique_ptr<runtime::SideStream> side_;
  double sent_ = 0, plain_ = 0, expected_sent_ = 0, expected_plain_ = 0;
};

}  // namespace forge::parallel
