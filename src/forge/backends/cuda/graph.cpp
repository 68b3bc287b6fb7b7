// CUDA graphs (graph.h).
#include "forge/backends/cuda/graph.h"

#include "forge/backends/cuda/memory.h"
#include "forge/backends/cuda/runtime.h"
#include "forge/core/error.h"

namespace forge::cuda {

CudaGraph::~CudaGraph() {
  if (capturing_) capture_abort();
  if (exec_ != nullptr) {
    // The last replay may still run: its memory must outlive it.
    if (cudaStreamSynchronize(stream_->handle()) != cudaSuccess) (void)cudaGetLastError();
    if (cudaGraphExecDestroy(exec_) != cudaSuccess) (void)cudaGetLastError();
  }
  if (graph_ != nullptr && cudaGraphDestroy(graph_) != cudaSuccess) (void)cudaGetLastError();
  release_pool();
}

void CudaGraph::release_pool() noexcept {
  if (pool_ == 0) return;
  try {
    graph_pool_release(stream_->device(), pool_);
  } catch (...) {
  }
  pool_ = 0;
}

void CudaGraph::capture_begin(const Stream& stream) {
  FORGE_CHECK(!capturing_ && exec_ == nullptr, "CudaGraph::capture_begin: this graph was captured already; make a new one");
  FORGE_CHECK(!stream.is_legacy(), "CudaGraph::capture_begin: the legacy default stream cannot be captured; make a stream "
                                   "with cuda::Stream::create and make it current (StreamGuard)");
  DeviceGuard guard(stream.device());
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  FORGE_CUDA_CHECK(cudaStreamIsCapturing(stream.handle(), &status));
  FORGE_CHECK(status == cudaStreamCaptureStatusNone, "CudaGraph::capture_begin: the stream is capturing already");
  stream_ = stream;
  pool_ = graph_pool_begin(stream.device());
  const cudaError_t err = cudaStreamBeginCapture(stream.handle(), cudaStreamCaptureModeThreadLocal);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    graph_pool_end(stream.device());
    release_pool();
    FORGE_CUDA_CHECK(err);
  }
  capturing_ = true;
}

void CudaGraph::capture_end() {
  FORGE_CHECK(capturing_, "CudaGraph::capture_end without capture_begin");
  DeviceGuard guard(stream_->device());
  capturing_ = false;
  cudaGraph_t g = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream_->handle(), &g);
  graph_pool_end(stream_->device());
  if (end != cudaSuccess || g == nullptr) {
    (void)cudaGetLastError();
    if (g != nullptr) (void)cudaGraphDestroy(g);
    release_pool();
    FORGE_THROW("CUDA graph capture failed: ", cudaGetErrorName(end), " (", cudaGetErrorString(end),
                "): the captured work made a call a capture does not allow (a synchronisation, a device-to-host "
                "read, cudaFree), or left work on another stream that never joined the captured one");
  }
  graph_ = g;
  size_t n = 0;
  FORGE_CUDA_CHECK(cudaGraphGetNodes(graph_, nullptr, &n));
  nodes_ = n;
  const cudaError_t inst = cudaGraphInstantiate(&exec_, graph_, 0);
  if (inst != cudaSuccess) {
    (void)cudaGetLastError();
    exec_ = nullptr;
    FORGE_THROW("CUDA graph: cudaGraphInstantiate of a captured graph of ", n, " nodes failed: ", cudaGetErrorName(inst),
                " (", cudaGetErrorString(inst), ")");
  }
}

void CudaGraph::capture_abort() noexcept {
  if (!capturing_) return;
  capturing_ = false;
  int previous = -1;
  (void)cudaGetDevice(&previous);
  (void)cudaSetDevice(stream_->device());
  cudaGraph_t g = nullptr;
  (void)cudaStreamEndCapture(stream_->handle(), &g);  // an invalidated capture ends with an error: expected
  (void)cudaGetLastError();
  if (g != nullptr) (void)cudaGraphDestroy(g);
  try {
    graph_pool_end(stream_->device());
  } catch (...) {
  }
  if (previous >= 0) (void)cudaSetDevice(previous);
  // The pool stays until the graph object goes: tensors of the failed capture may still be alive.
}

void CudaGraph::replay() {
  FORGE_CHECK(exec_ != nullptr, "CudaGraph::replay: nothing was captured");
  DeviceGuard guard(stream_->device());
  FORGE_CUDA_CHECK(cudaGraphLaunch(exec_, stream_->handle()));
}

bool is_capturing(int device) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaStream_t s = current_stream(device);
  if (s == nullptr) return false;  // the legacy stream is never captured
  DeviceGuard guard(device);
  FORGE_CUDA_CHECK(cudaStreamIsCapturing(s, &status));
  return status != cudaStreamCaptureStatusNone;
}

bool stream_is_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    (void)cudaGetLastError();
    return true;
  }
  return status != cudaStreamCaptureStatusNone;
}

void check_not_capturing(int device, const char* what, const char* why) {
  FORGE_CHECK(!is_capturing(device), what, " cannot run inside a CUDA graph capture: ", why);
}

}  // namespace forge::cuda
