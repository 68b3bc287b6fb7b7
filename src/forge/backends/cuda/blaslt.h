#pragma once
// cuBLASLt for every GEMM of the CUDA backend: one handle, one workspace and one plan cache
// per device, and a row-major GEMM call on top (Note [row-major GEMMs on cuBLASLt]).
//
// Internal to backends/cuda/ (the plain C++ entry points are matmul.h and attention.h).
//
//   blas::Gemm g;
//   g.dtype = DType::bf16; g.m = M; g.n = N; g.k = K;
//   g.a = {x_ptr, K};                 // (M, K) row-major, row stride K
//   g.b = {w_ptr, K, /*trans=*/true}; // (K, N) = w^T, w (N, K) row-major
//   g.c = y_ptr; g.ldc = N;
//   g.epilogue = blas::Epilogue::bias; g.bias = b_ptr;
//   blas::gemm(device, g);            // false: no cuBLASLt algorithm for this epilogue
//
// Note [row-major GEMMs on cuBLASLt]
// forge's matrices are row-major views; cuBLASLt is column-major. A row-major (r, c)
// matrix with row stride ld is, byte for byte, the column-major (c, r) matrix with leading
// dimension ld, i.e. its transpose. So the row-major product C = A B (C (m, n), A (m, k),
// B (k, n)) is computed as the column-major product C^T = B^T A^T: cuBLASLt's "A" is our
// B, its "B" is our A, and its (m, n, k) is our (n, m, k). An operand stored transposed
// (a view such as w.t(), whose last dim has stride ld and whose rows are contiguous,
// element (r, c) at c * ld + r) is the same column-major matrix without the transpose, so
// it becomes the transpose flag of the call instead of a copy:
//   our A not transposed  -> cuBLASLt B layout (k, m, ld), op N
//   our A transposed      -> cuBLASLt B layout (m, k, ld), op T
//   our B not transposed  -> cuBLASLt A layout (n, k, ld), op N
//   our B transposed      -> cuBLASLt A layout (k, n, ld), op T
//   C                     -> cuBLASLt C = D layout (n, m, ldc)
// Batches are strided (one batch stride per operand, 0 broadcasts an operand: cuBLASLt
// allows stride 0 for A and B). Epilogues in these terms (cuBLASLt's D has n rows):
//   bias           C[i, j] += bias[j]          (j < n)   CUBLASLT_EPILOGUE_BIAS
//   gelu_aux       aux = A B + bias; C = gelu_tanh(aux)  CUBLASLT_EPILOGUE_GELU_AUX_BIAS
//                  (GELU_AUX without a bias; aux row-major (m, n), row stride aux_ld, a
//                  multiple of 8; cuBLASLt's GELU is the tanh approximation)
//   bgrad_a        bias_grad[i] = sum_k A[i, k] (i < m)  CUBLASLT_EPILOGUE_BGRADB, which
//                  reduces cuBLASLt's B (= our A) over k into a vector as long as D has
//                  columns (= our m). Linear's weight gradient dW = dY^T X has A = dY^T,
//                  so this is dbias = column sums of dY, in the same pass.
//   dgelu_bgrad    C = (A B) * gelu_tanh'(aux) and bias_grad[j] = sum_i C[i, j] (j < n)
//                  CUBLASLT_EPILOGUE_DGELU_BGRAD: aux is the GELU's input saved by gelu_aux
//                  ((m, n), row stride aux_ld); the MLP's backward: d(pre) and the up
//                  projection's bias gradient from the down projection's input-gradient GEMM.
//
// Plans: the matmul descriptor, the three layouts and the algorithms (the heuristic's
// candidates from cublasLtMatmulAlgoGetHeuristic, and the tuned one: Note [GEMM algorithm
// tuning]) are cached per device, keyed by everything they depend on (dtype, compute type,
// shapes, leading dims, batch count and strides, transposes, epilogue, the alignment of every
// pointer, which the heuristic takes into account, and FORGE_GEMM_SM_TARGET).
// In the steady state a GEMM is one hash lookup, the pointer attributes of the epilogue,
// and cublasLtMatmul on cuda::current_stream(device): no descriptor is created, no host
// synchronisation. A shape for which cuBLASLt offers no algorithm (never expected for
// plain GEMMs; possible for epilogues with some dtypes or alignments) is remembered too:
// plain GEMMs then go to cublasGemmStridedBatchedEx (any layout, any alignment), and
// gemm() returns false for epilogues so the caller can run the unfused sequence. Neither is
// silent: the first call of such a plan prints one line on stderr naming the shape, dtype,
// epilogue and why cuBLASLt had none, and cuda::gemm_tuning_stats() counts the shapes
// (fallback_shapes) and calls (fallback_calls).
//
// Note [GEMM algorithm tuning]
// cuBLASLt's heuristic ranks algorithms by a model, not by measurement, so its first choice
// is not always the fastest for a given shape (the vocabulary-wide head GEMMs included). With
// tuning on (cuda::set_gemm_tuning; forge train: run.gemm_tuning = "cached", the default; else
// FORGE_GEMM_TUNING), the first use of a plan picks its algorithm once, as PyTorch's TunableOp:
//   1. the tuning cache file (backends/gemm_tuning_cache.h; FORGE_GEMM_TUNE_CACHE, default
//      ~/.cache/forge/gemm_tuning.json), read once per device, holds the algorithm chosen for
//      this plan key on this GPU model and cuBLASLt version: if cublasLtMatmulAlgoCheck still
//      accepts it for the plan's descriptors (and it fits the workspace) it is used, untimed;
//      a refused entry is dropped and the plan timed again;
//   2. else, unless the stream is capturing a CUDA graph, the heuristic's usable candidates
//      (up to 16, each fitting the 32 MiB workspace) are timed with CUDA events on the current
//      stream: the first choice once to warm up and once to size the measurement (runs of about
//      0.25 ms, at most 10 per measurement; at most ~200 ms per plan, cutting the candidates for
//      very large GEMMs, never below 2), then two passes over the candidates (the second in
//      reverse order), the better of each candidate's two means kept. The fastest wins unless
//      it is within 1% of the first choice, which then stays. Candidates that fail
//      (cublasLtMatmul returns an error) are skipped. The result and both times go into the
//      cache file at once (an atomic rewrite, merged with what other processes wrote; a file
//      that cannot be written is reported once and the choice kept for the process);
//   3. inside a capture nothing is timed (timing synchronises the host, and the scratch below
//      would be allocated): the heuristic's choice runs, and is what the graph replays; the
//      plan is tuned at its first use outside a capture (reported once, counted as
//      capture_skips). Warm up before capturing, as with PyTorch, to capture tuned GEMMs.
// Timing never corrupts the real outputs: with beta != 0 (C is read: accumulating GEMMs) the
// runs write a scratch C from the caching allocator, and epilogue outputs (gelu_aux's aux,
// bgrad_a's bias gradient) always go to scratch buffers; with beta = 0 the runs write C,
// which the real call then overwrites. The real call follows with the winner. A failing
// timing (out of memory for the scratch) is reported and leaves the heuristic's choice.
// Every algorithm computes the same GEMM with f32 accumulation, but the order of the sums
// (split-K, tile shapes) differs, so results may differ in the last bits between tuning on
// and off, or between a run that timed and one that read another machine's choice: that is
// why the switch is a config key recorded with the run. Within a process a plan's algorithm
// never changes once chosen (except for the capture case above), and a process that reads
// the cache file runs the same algorithms as the one that wrote it. The plan key ignores
// beta, so a shape tuned with beta = 0 runs the same algorithm with beta = 1. The cost is
// paid at the first use of each shape: 2 + 2 x candidates x runs GEMMs (34 for a large GEMM;
// more, but shorter, for small ones; aimed at well under a second for GPT-2 124M's ~20
// shapes), once per GPU model and cuBLASLt version while the file persists.
// cuda::gemm_tuning_stats() counts what happened (tuned, timed, changed, loaded, stale, ...).
//
// Workspace: 32 MiB per (device, stream), allocated once through the device allocator (so
// the caching allocator) and kept for the life of the process; GEMMs on one stream share
// it in stream order (the timing runs too). The cuBLAS fallback handle uses the same workspace.
//
// Precision: f32 accumulate for f32/bf16/f16 (CUBLAS_COMPUTE_32F; output rounded once to
// the input dtype), CUBLAS_COMPUTE_32F_FAST_TF32 for f32 when allow_tf32() is on, and
// CUBLAS_COMPUTE_64F for f64.
#include <cstdint>

#include "forge/core/dtype.h"
#include "forge/core/tensor.h"

namespace forge::cuda::blas {

enum class Epilogue : uint8_t { none, bias, gelu_aux, bgrad_a, dgelu_bgrad };

// A row-major operand: element (r, c) of matrix i is at
//   data + i * batch_stride + (trans ? c * ld + r : r * ld + c)   (in elements).
struct Operand {
  const void* data = nullptr;
  int64_t ld = 1;
  bool trans = false;
  int64_t batch_stride = 0;
};

// C (m, n) = alpha * A (m, k) B (k, n) + beta * C, for `batch` matrices; A, B, C of one
// dtype. C is row-major with row stride ldc and batch stride c_batch_stride.
struct Gemm {
  DType dtype = DType::f32;
  int64_t m = 0, n = 0, k = 0, batch = 1;
  Operand a, b;
  void* c = nullptr;
  int64_t ldc = 1, c_batch_stride = 0;
  double alpha = 1.0, beta = 0.0;
  Epilogue epilogue = Epilogue::none;
  const void* bias = nullptr;  // bias, gelu_aux: (n) of dtype, contiguous (optional for gelu_aux)
  void* bias_grad = nullptr;   // bgrad_a: (m) of dtype; dgelu_bgrad: (n) of dtype; overwritten
  void* aux = nullptr;         // gelu_aux: (m, n) row-major with row stride aux_ld, overwritten;
                               // dgelu_bgrad: the GELU's input (m, n), read
  int64_t aux_ld = 0;
};

// Runs `g` on cuda::current_stream(device). Requires m, n, k >= 1 (callers handle empty
// products) and batch >= 1. Returns false, having done nothing, when g has an epilogue for
// which cuBLASLt has no algorithm; a plain GEMM always runs (cuBLAS fallback). Throws on
// invalid arguments and CUDA/cuBLAS errors.
bool gemm(int device, const Gemm& g);

// Plans cached for `device` (for tests: a repeated shape must not add one).
int64_t plans_cached(int device);
// Drops `device`'s plans and its tuning cache entries read so far (cuda::reset_gemm_plans).
void reset_plans(int device);

// A new contiguous tensor on `device` from its allocator (the caching allocator), for
// the scratch buffers of the GEMM-based kernels (backends sit below ops/: no forge::empty).
Tensor device_empty(int device, const Shape& shape, DType dtype);

}  // namespace forge::cuda::blas
