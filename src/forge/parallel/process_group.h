#pragma once
// forge::parallel::ProcessGroup: collective and point-to-point communication between the ranks
// of a group, on existing engines: NCCL for CUDA tensors (nccl_group), MPI for CPU tensors
// (mpi_group). Never a home-made transport.
//
//   auto world = parallel::init_world(Device::cuda(local_rank));   // world.h: from the launch environment
//   Tensor g = ...;                                             // (N,) gradients on cuda:local_rank
//   auto work = world->all_reduce(g, parallel::ReduceOp::avg);      // queued on the group's stream
//   ... more compute on the current stream ...
//   work->wait();   // the current stream waits for the all-reduce: later kernels see the mean
//
// Every operation returns a Work handle at once. Semantics follow torch.distributed:
//   - Inputs must be ready when the call is made, in the caller's stream order: NCCL groups
//     make their communication stream wait (an event, not the host) for the caller's current
//     stream before starting; MPI groups start at once (CPU tensors are ready by definition).
//   - Work::wait(): afterwards the results may be used on the caller's CURRENT STREAM. For
//     NCCL this is a stream-to-stream wait (no host block); for MPI it blocks the host until
//     the operation is complete. Work::synchronize() always blocks the host until done.
//   - The group keeps every tensor of an operation alive, and tells the caching allocator
//     (record_stream) that the communication stream uses them, until the operation is done.
//   - Operations on one group are started in call order on every rank; every rank of the
//     group must make the same sequence of collective calls (as with NCCL and MPI).
//
// Tensors: contiguous, on the group's device (device()), dtype f32, f64, bf16, f16, i32, i64
// or u8, the same dtype on every argument of a call. A call with bad arguments throws
// forge::Error naming the operation, the argument and the fix, before anything is started.
// Sizes below are element counts; W = size().
//   all_reduce(t, op)            in place; op sum | avg | max | min
//   reduce(t, root, op)          in place; the result is defined on root only
//   broadcast(t, root)           in place; root's t everywhere
//   all_gather(out, in)          out.numel() == W * in.numel(); rank r's `in` lands at out[r*n, (r+1)*n)
//   reduce_scatter(out, in, op)  in.numel() == W * out.numel(); rank r gets op over ranks of in[r*n, (r+1)*n)
//   gather(out, in, root)        as all_gather, on root only (out is ignored elsewhere and may be undefined)
//   scatter(out, in, root)       root's in[r*n, (r+1)*n) to rank r's out (in is ignored off root)
//   all_to_all(out, in)          in.numel() == out.numel() == W * n; rank r's in[j*n, (j+1)*n) lands at
//                                rank j's out[r*n, (r+1)*n) (a transpose of the W x W blocks); out and
//                                in must not overlap
//   send(t, dst, tag) / recv(t, src, tag)   point to point (NCCL ignores tags: order is what matches)
//   barrier()                    every rank has reached it
// avg is sum then divide by W (in the tensor's dtype; integer avg is refused).
//
// Sub-groups: new_group(ranks) carves a group out of this one (ranks are this group's rank
// numbers, strictly increasing). It is collective over THIS group: every rank calls it with
// the same list, and ranks not in the list get nullptr. A later dp x tp x pp mesh takes its
// groups from the world this way.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "forge/core/tensor.h"

namespace forge::parallel {

enum class ReduceOp { sum, avg, max, min };
const char* reduce_op_name(ReduceOp op);

class Work {
 public:
  virtual ~Work() = default;
  // The results may be used on the caller's current stream after this (see above).
  virtual void wait() = 0;
  // Blocks the host until the operation is complete.
  virtual void synchronize() = 0;
  // Whether the operation has completed (never blocks).
  virtual bool is_completed() = 0;
};
using WorkPtr = std::shared_ptr<Work>;
// A Work that is already complete: an operation done by the time it was called (a group of one's
// collectives, PowerSGD's reductions).
WorkPtr completed_work();

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // "mpi" or "nccl".
  virtual std::string backend() const = 0;
  // The device of the tensors this group takes: Device::cpu() for MPI, cuda:N for NCCL.
  virtual Device device() const = 0;

  virtual WorkPtr all_reduce(const Tensor& t, ReduceOp op = ReduceOp::sum) = 0;
  virtual WorkPtr reduce(const Tensor& t, int root, ReduceOp op = ReduceOp::sum) = 0;
  virtual WorkPtr broadcast(const Tensor& t, int root) = 0;
  virtual WorkPtr all_gather(const Tensor& output, const Tensor& input) = 0;
  virtual WorkPtr reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op = ReduceOp::sum) = 0;
  virtual WorkPtr gather(const Tensor& output, const Tensor& input, int root) = 0;
  virtual WorkPtr scatter(const Tensor& output, const Tensor& input, int root) = 0;
  virtual WorkPtr all_to_all(const Tensor& output, const Tensor& input) = 0;
  virtual WorkPtr send(const Tensor& t, int dst, int tag = 0) = 0;
  virtual WorkPtr recv(const Tensor& t, int src, int tag = 0) = 0;
  virtual WorkPtr barrier() = 0;

  virtual std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks) = 0;

  // Collectives queued inside a CUDA graph capture run when the graph is replayed, out of the
  // group's sight: after launching a replay, the caller hands the group the work queued so far
  // on the device's current stream, which it then watches like its own operations (NCCL: the
  // watchdog ends a process whose replay does not complete within FORGE_DIST_TIMEOUT, Note
  // [NCCL watchdog]). `what` names the work in that message. A no-op for MPI.
  virtual void watch_replayed_work(const char* what) { (void)what; }

 protected:
  ProcessGroup(int rank, int size) : rank_(rank), size_(size) {}

 private:
  int rank_;
  int size_;
};

using ProcessGroupPtr = std::shared_ptr<ProcessGroup>;

// Argument checks shared by the backends (throw forge::Error naming `op` and the fix).
namespace detail {
void check_tensor(const ProcessGroup& pg, const char* op, const char* arg, const Tensor& t);
void check_same_dtype(const char* op, const Tensor& a, const Tensor& b);
void check_rank(const ProcessGroup& pg, const char* op, const char* arg, int r);
void check_reduce_op(const char* op, ReduceOp rop, DType dtype);
std::vector<int> check_group_ranks(const ProcessGroup& pg, const std::vector<int>& ranks);
// Whole-call checks of the operations whose arguments relate to each other.
void check_all_gather(const ProcessGroup& pg, const Tensor& output, const Tensor& input);
void check_reduce_scatter(const ProcessGroup& pg, const Tensor& output, const Tensor& input, ReduceOp op);
void check_gather(const ProcessGroup& pg, const Tensor& output, const Tensor& input, int root);
void check_scatter(const ProcessGroup& pg, const Tensor& output, const Tensor& input, int root);
void check_all_to_all(const ProcessGroup& pg, const Tensor& output, const Tensor& input);
void check_peer(const ProcessGroup& pg, const char* op, const char* arg, int peer);
}  // namespace detail

}  // namespace forge::parallel
