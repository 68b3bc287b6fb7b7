#pragma once
// GEMM candidates timed as CUDA graphs of their runs (Note [GEMM timing in CUDA graphs] in
// gemm_graph_timing.cpp), for the GEMM tuner of blaslt.cpp (FORGE_GEMM_TUNE_IN_GRAPH). Host code.
//
//   std::vector<char> ok(n, 1);
//   GraphRuns g = capture_runs(candidates, n, runs, ok, call, stream);
//   if (g.used) cudaGraphLaunch(g.exec[i], stream);   // candidate i's `runs` calls
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>
#include <vector>

namespace forge::cuda::blas {

// One instantiated graph per candidate (null where it could not be captured); `used` is false
// when the first candidate (the heuristic's choice) could not be: then time by stream launches.
struct GraphRuns {
  bool used = false;
  std::vector<cudaGraphExec_t> exec;
  std::vector<int> memsets;  // memset nodes in each candidate's graph (of `runs` calls)
  GraphRuns() = default;
  GraphRuns(const GraphRuns&) = delete;
  GraphRuns& operator=(const GraphRuns&) = delete;
  GraphRuns(GraphRuns&& o) noexcept;
  GraphRuns& operator=(GraphRuns&& o) noexcept;
  ~GraphRuns();
};

// One cuBLASLt call of a candidate algorithm on a stream.
using GemmCall = std::function<cublasStatus_t(const cublasLtMatmulAlgo_t&, cudaStream_t)>;

// Runs each of the first n candidates once on `stream` (loading its kernels), then captures its
// `runs` calls on a private stream and instantiates them. ok[i] = 0 for a candidate whose call
// or capture failed; when the first one failed, every ok is reset to 1 and used is false.
GraphRuns capture_runs(const std::vector<cublasLtMatmulAlgo_t>& cand, size_t n, int runs, std::vector<char>& ok,
                       const GemmCall& call, cudaStream_t stream);

}  // namespace forge::cuda::blas
