#pragma once
// CUDA matrix products and Linear layers on cuBLASLt (blaslt.h), the counterparts of
// backends/cpu/matmul.h. Plain C++ declarations; the definitions are in matmul.cu.
//
// Every product is one cuBLASLt call where the layout allows it (Note [row-major GEMMs on
// cuBLASLt] in blaslt.h): transposed views become transpose flags, batch dims become one
// strided batch (stride 0 for a broadcast operand), and only a matrix whose strides fit
// neither row- nor column-major storage is copied first.
#include <cstdint>

#include "forge/core/tensor.h"

namespace forge::cuda {

// out[b] = a[b] @ b[b] for every index b of the batch dims, as cpu::matmul:
//   a   (*batch, M, K)  any strides; batch strides may be 0 (broadcast, never materialised)
//   b   (*batch, K, N)  any strides; likewise
//   out (*batch, M, N)  contiguous; overwritten (beta = 0), or out = a @ b + beta * out
// f32 (f32 accumulate; TF32 tensor cores when allow_tf32()), bf16/f16 (f32 accumulate,
// rounded once), f64.
void matmul(const Tensor& a, const Tensor& b, Tensor& out, double beta = 0.0);

// out = x w^T + bias, the forward of torch.nn.Linear:
//   x    (M, K)  any strides
//   w    (N, K)  any strides (the weight, (out_features, in_features))
//   bias (N)     or undefined; added in the GEMM's epilogue (CUBLASLT_EPILOGUE_BIAS)
//   out  (M, N)  contiguous; overwritten
void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out);

// pre = x w^T + bias and out = gelu_tanh(pre) in one GEMM (CUBLASLT_EPILOGUE_GELU_AUX_BIAS)
// when cuBLASLt has an algorithm for it (N a multiple of 8; not for f64), else the GEMM
// with bias then the elementwise GELU. Shapes as linear_forward; pre and out (M, N) contiguous.
void linear_gelu_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out, Tensor& pre);

// The parameter gradients of linear_forward from dy = dL/d(out):
//   dy    (M, N)  any strides
//   x     (M, K)  any strides (may be undefined when dw is)
//   dw    (N, K)  contiguous, overwritten with dy^T x; or undefined (not computed)
//   dbias (N)     contiguous, overwritten with the column sums of dy; or undefined
// When both are wanted, dbias comes from the same GEMM (CUBLASLT_EPILOGUE_BGRADB). The
// input gradient dx = dy w is a plain matmul(dy, w, dx).
void linear_backward_params(const Tensor& dy, const Tensor& x, Tensor& dw, Tensor& dbias);
// out (N) = the column sums of dy (M, N), accumulated in f32 (f64 for f64) in a fixed order (the
// bias gradient where no GEMM epilogue computes it). 16-byte loads where dy's rows allow them.
void column_sums(const Tensor& dy, Tensor& out);
// linear_gelu's backward in one pass over g and pre (Note [GELU and bias gradients in one pass]):
//   g     (M, N)  contiguous: the gradient of gelu_tanh(pre)
//   pre   (M, N)  contiguous: the GELU's input, saved by linear_gelu_forward
//   dpre  (M, N)  contiguous, overwritten with g * gelu_tanh'(pre), rounded to the dtype
//   dbias (N)     contiguous, overwritten with the column sums of dpre as stored
// The same bits as unary_backward(gelu_tanh) followed by column_sums(dpre). Returns false, having
// done nothing, where the rows do not allow 16-byte loads (N not a multiple of 16 bytes, an
// unaligned start); then the caller runs those two steps.
bool gelu_backward_column_sums(const Tensor& g, const Tensor& pre, Tensor& dpre, Tensor& dbias);
// Whether gelu_backward_column_sums runs for g and pre (and a fresh dpre): both contiguous (M, N),
// M and N > 0, 16-byte vectors per row, 16-byte aligned.
bool gelu_backward_column_sums_fit(const Tensor& g, const Tensor& pre);
// The MLP's backward through a GELU (Note [GELU gradient in the GEMM] in ops/matmul.cpp), one
// cuBLASLt GEMM with the DGELU_BGRAD epilogue:
//   dy    (M, K)  any strides: the gradient of the down projection's output
//   w     (K, N)  the down projection's weight (out_features K, in_features N)
//   pre   (M, N)  contiguous: the GELU's input, saved by linear_gelu_forward
//   dpre  (M, N)  contiguous, overwritten with (dy w) * gelu_tanh'(pre)
//   dbias (N)     contiguous, overwritten with the column sums of dpre (the up projection's bias
//                 gradient)
// Returns false, having done nothing, where cuBLASLt has no algorithm (or N % 8 != 0, f64).
bool gelu_input_gradient(const Tensor& dy, const Tensor& w, const Tensor& pre, Tensor& dpre, Tensor& dbias);

// TF32 tensor cores for f32 GEMMs (attention included): off by default, as PyTorch's
// torch.backends.cuda.matmul.allow_tf32; FORGE_ALLOW_TF32=1 in the environment turns it on
// at start-up. Affects GEMMs issued after the call.
void set_allow_tf32(bool on);
bool allow_tf32();

// GEMM algorithm tuning (Note [GEMM algorithm tuning] in blaslt.h): on, each GEMM plan's first
// use outside a CUDA graph capture times cuBLASLt's candidate algorithms (or takes the one the
// tuning cache file holds for it) and keeps the fastest; off, the heuristic's first choice
// runs, as before. The choice changes which kernel runs, so results may differ in the last
// bits. Starts as FORGE_GEMM_TUNING (default cached); forge train sets it from
// run.gemm_tuning. Affects GEMMs issued after the call; a plan keeps both algorithms, so
// switching back and forth costs nothing.
void set_gemm_tuning(bool on);
bool gemm_tuning();

// What tuning and the fallbacks did in this process (every device), for tests, forge bench
// and the trainer's log.
struct GemmTuningStats {
  int64_t tuned = 0;            // plans whose algorithm this process chose (timed, or a single candidate)
  int64_t timed = 0;            //   of which two or more candidates were timed
  int64_t changed = 0;          //   of which the winner is not the heuristic's first choice
  int64_t loaded = 0;           // plans whose algorithm came from the tuning cache file
  int64_t stale = 0;            // cache entries cuBLASLt refused (cublasLtMatmulAlgoCheck): dropped, timed again
  int64_t capture_skips = 0;    // plans first used inside a stream capture (heuristic choice; tuned later)
  int64_t failed = 0;           // timings that failed (the heuristic's choice runs)
  int64_t fallback_shapes = 0;  // plans cuBLASLt has no algorithm for (each reported once on stderr)
  int64_t fallback_calls = 0;   // GEMM calls that took such a plan's fallback
  double tuning_ms = 0;         // host time spent timing candidates
  int64_t file_writes = 0;      // successful writes of the tuning cache file
  int64_t graph_timed = 0;      // timed plans whose candidates ran as CUDA graphs (FORGE_GEMM_TUNE_IN_GRAPH)
  int64_t graph_refused = 0;    //   that could not be, and were timed by stream launches instead
  int64_t memset_first = 0;     // graph-timed plans whose heuristic first choice memsets its workspace
  int64_t memset_chosen = 0;    // graph-timed plans whose chosen algorithm does
};
GemmTuningStats gemm_tuning_stats();

// GEMM plans (descriptors + chosen algorithm) cached for `device`, for tests.
int64_t gemm_plans_cached(int device);

// Drops `device`'s plans and what it read of the tuning cache file: the next GEMMs plan again
// and read FORGE_GEMM_TUNE_CACHE again (for tests and forge bench: "a new process").
void reset_gemm_plans(int device);

}  // namespace forge::cuda
