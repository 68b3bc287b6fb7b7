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
//   out (*batch, M, N)  contiguous; overwritten
// f32 (f32 accumulate; TF32 tensor cores when allow_tf32()), bf16/f16 (f32 accumulate,
// rounded once), f64.
void matmul(const Tensor& a, const Tensor& b, Tensor& out);

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

// TF32 tensor cores for f32 GEMMs (attention included): off by default, as PyTorch's
// torch.backends.cuda.matmul.allow_tf32; FORGE_ALLOW_TF32=1 in the environment turns it on
// at start-up. Affects GEMMs issued after the call.
void set_allow_tf32(bool on);
bool allow_tf32();

// GEMM plans (descriptors + chosen algorithm) cached for `device`, for tests.
int64_t gemm_plans_cached(int device);

}  // namespace forge::cuda
