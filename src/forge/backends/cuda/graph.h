#pragma once
// CUDA graphs: capture the work a thread queues on a stream once, replay it with one launch
// (torch.cuda.CUDAGraph's model). train/graphed_step.h captures the training step with it
// (Note [the step as a CUDA graph]).
//
//   cuda::Stream s = cuda::Stream::create(0);    // not the legacy stream, which cannot be captured
//   cuda::synchronize(0);                        // s does not wait for the legacy stream's work
//   cuda::StreamGuard guard(s);
//   ... warm up once (lazy initialisation, algorithm tuning, workspaces) ...
//   cuda::CudaGraph graph;
//   graph.capture_begin(s);
//   Tensor out = f(static_in);       // queued work is recorded, not run; allocations come from
//   graph.capture_end();             //   the graph's private pool (Note [graph memory pools])
//   for (...) { static_in.copy_(next); graph.replay(); use(out); }
//
// What a capture records is fixed: the kernels, their arguments (host scalars included) and
// every address. Inputs that change must be copied into the captured tensors before a replay,
// and values the host computes per call (a learning rate) must live on the device. Work that
// needs the host mid-way (a device-to-host read, a synchronisation, cudaFree) cannot be
// captured: CUDA refuses it and capture_end throws, naming the error. The capture mode is
// thread-local: other threads (a data loader, NCCL's) are unaffected.
//
// Internal to backends/cuda/, parallel/ and train/ (it includes the CUDA runtime headers).
#include <cuda_runtime_api.h>

#include <cstddef>
#include <optional>
#include <string>

#include "forge/backends/cuda/stream.h"

namespace forge::cuda {

class CudaGraph {
 public:
  CudaGraph() = default;
  // Waits for the graph's last replay, then frees it and hands its pool back.
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  // Starts capturing the work this thread queues on `stream` (not a legacy default stream);
  // until capture_end/capture_abort this thread's allocations on its device come from the
  // graph's private pool. Throws if a graph was captured already or the stream is capturing.
  void capture_begin(const Stream& stream);
  // Ends the capture and instantiates the graph. On failure (a call the capture refused, work
  // left on another stream that never joined back) the capture is discarded and a forge::Error
  // names the CUDA error.
  void capture_end();
  // Discards a capture in progress (after an exception during it). Never throws.
  void capture_abort() noexcept;
  // Launches the graph on the stream it was captured on.
  void replay();

  bool captured() const { return exec_ != nullptr; }
  bool capturing() const { return capturing_; }
  size_t num_nodes() const { return nodes_; }

 private:
  void release_pool() noexcept;

  std::optional<Stream> stream_;  // the capture's
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  int pool_ = 0;  // the private pool's id (0: none)
  bool capturing_ = false;
  size_t nodes_ = 0;
};

// Whether this thread's current stream of `device` is capturing a graph now.
bool is_capturing(int device);

// Whether work queued on `stream` now would be captured into a CUDA graph. A query that fails
// (the legacy stream while another stream captures: cudaErrorStreamCaptureImplicit) counts as
// capturing; its error is not sticky and is cleared. Never throws (the GEMM tuner and cuDNN's
// plan timing ask it before timing anything).
bool stream_is_capturing(cudaStream_t stream);

// Throws forge::Error("<what> cannot run inside a CUDA graph capture: <why>") when this
// thread's current stream of `device` is capturing: for work that depends on host state that a
// replay would not see (a random seed drawn on the host).
void check_not_capturing(int device, const char* what, const char* why);

}  // namespace forge::cuda
