// GEMM candidates timed as CUDA graphs. Contract in gemm_graph_timing.h.
//
// Note [GEMM timing in CUDA graphs]: forge's training step replays as one CUDA graph (Note [the
// step as a CUDA graph]), where a kernel follows the one before it within ~0.4 us, but some
// cuBLASLt algorithms issue a small memset of their workspace before their kernel (stream-K and
// split-K bookkeeping), and a memset node in a graph costs ~4-5 us of idle GPU around it (an
// H200 trace of the LLaMA step: 243 such memsets a step in front of GEMMs, ~1.2 ms; GPT-2 on an
// H100: ~100, ~0.5 ms; docs/performance.md item 35). Timed by stream launches, as the tuner did,
// those algorithms pay less than that, so the tuner can prefer one that is slower where it runs.
// Timing the candidates as graphs charges each what the step will pay. Each candidate is first
// run once on the stream (module loading is not captured), then its `runs` calls are captured on
// a private stream (thread-local capture mode: no other thread is disturbed) and instantiated; a
// candidate whose call or capture fails is skipped, and if the heuristic's first choice cannot
// be captured the candidates are timed by stream launches as before (counted as graph_refused).
// The memset nodes of each graph are counted, so the tuner can say how many first choices and
// chosen algorithms carry one.
#include "forge/backends/cuda/gemm_graph_timing.h"

#include <algorithm>
#include <utility>

#include "forge/backends/cuda/runtime.h"

namespace forge::cuda::blas {

GraphRuns::GraphRuns(GraphRuns&& o) noexcept
    : used(o.used), exec(std::move(o.exec)), memsets(std::move(o.memsets)) {
  o.exec.clear();
}

GraphRuns& GraphRuns::operator=(GraphRuns&& o) noexcept {
  std::swap(used, o.used);
  std::swap(exec, o.exec);
  std::swap(memsets, o.memsets);
  return *this;
}

GraphRuns::~GraphRuns() {
  for (cudaGraphExec_t e : exec)
    if (e) cudaGraphExecDestroy(e);
}

namespace {
// The memset nodes of a captured graph (what cuBLASLt issued besides its kernels).
int memset_nodes(cudaGraph_t graph) {
  size_t count = 0;
  if (cudaGraphGetNodes(graph, nullptr, &count) != cudaSuccess) return 0;
  std::vector<cudaGraphNode_t> nodes(count);
  if (cudaGraphGetNodes(graph, nodes.data(), &count) != cudaSuccess) return 0;
  int memsets = 0;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    if (cudaGraphNodeGetType(node, &type) == cudaSuccess && type == cudaGraphNodeTypeMemset) ++memsets;
  }
  return memsets;
}
}  // namespace

GraphRuns capture_runs(const std::vector<cublasLtMatmulAlgo_t>& cand, size_t n, int runs, std::vector<char>& ok,
                       const GemmCall& call, cudaStream_t stream) {
  GraphRuns out;
  out.exec.assign(n, nullptr);
  out.memsets.assign(n, 0);
  cudaStream_t cs = nullptr;
  FORGE_CUDA_CHECK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
  for (size_t i = 0; i < n; ++i) {
    if (call(cand[i], stream) != CUBLAS_STATUS_SUCCESS) {  // warm-up: loads the candidate's kernels
      ok[i] = 0;
      continue;
    }
    if (cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
      (void)cudaGetLastError();
      ok[i] = 0;
      continue;
    }
    bool good = true;
    for (int r = 0; r < runs && good; ++r) good = call(cand[i], cs) == CUBLAS_STATUS_SUCCESS;
    cudaGraph_t graph = nullptr;
    good = cudaStreamEndCapture(cs, &graph) == cudaSuccess && good && graph != nullptr;
    if (good) out.memsets[i] = memset_nodes(graph);
    if (good) good = cudaGraphInstantiate(&out.exec[i], graph, 0) == cudaSuccess;
    if (graph) cudaGraphDestroy(graph);
    if (!good) {
      (void)cudaGetLastError();
      out.exec[i] = nullptr;
      ok[i] = 0;
    }
  }
  FORGE_CUDA_CHECK(cudaStreamDestroy(cs));
  out.used = ok[0] != 0;
  if (!out.used) std::fill(ok.begin(), ok.end(), 1);  // stream launches time them all, as without graphs
  return out;
}

}  // namespace forge::cuda::blas
