#pragma once
// Matrix products with torch.matmul semantics: 1-D x 1-D dot, 2-D, 1-D promoted to a
// matrix, and batched N-D with broadcast batch dims; and Linear layers (linear,
// linear_gelu). Operands with transposed last two dims go to BLAS (OpenBLAS on the CPU,
// cuBLASLt on CUDA) as transposed without a copy.
//
// Both operands must have one dtype (no promotion, as PyTorch): f32/f64 (BLAS), bf16/f16
// (f32 accumulation), i32/i64/u8 (exact loop, CPU only, not differentiable). Gradients of
// broadcast batch dims are summed back to each operand's shape. On CUDA, f32 products use
// TF32 tensor cores only when set_allow_tf32(true) (forge train: run.allow_tf32; otherwise the
// environment's FORGE_ALLOW_TF32, default off).
#include <memory>

#include "forge/core/tensor.h"

namespace forge::autograd {
class DeferredGrads;
}

namespace forge::ops {

// (K)·(K) -> 0-d; (K)@(*, K, N) -> (*, N); (*, M, K)@(K) -> (*, M);
// (*a, M, K)@(*b, K, N) -> (*broadcast(a, b), M, N).
Tensor matmul(const Tensor& a, const Tensor& b);
// Whether f32 GEMMs on CUDA may use TF32 tensor cores (10-bit mantissa: faster, relative error
// ~1e-3). Process-wide; a no-op in a build without CUDA (the CPU computes f32 in f32).
void set_allow_tf32(bool on);
bool allow_tf32();
// Whether CUDA GEMMs time cuBLASLt's candidate algorithms once per shape and run the fastest
// (kept in the tuning cache file for later runs), instead of the heuristic's first choice:
// Note [GEMM algorithm tuning] in backends/cuda/blaslt.h. The same math, but another kernel may
// round differently in the last bits. forge train: run.gemm_tuning; otherwise the environment's
// FORGE_GEMM_TUNING (default cached). Process-wide; a no-op in a build without CUDA.
void set_gemm_tuning(bool on);
bool gemm_tuning();
// Strictly 2-D (M, K) x (K, N).
Tensor mm(const Tensor& a, const Tensor& b);
// Strictly 3-D (B, M, K) x (B, K, N).
Tensor bmm(const Tensor& a, const Tensor& b);

// torch.nn.functional.linear: y = x weight^T + bias.
//   x (*, in), weight (out, in), bias (out) or undefined  ->  y (*, out)
// One dtype for all three (floating). Differentiable in x, weight and bias. On CUDA the
// bias is added in the GEMM's epilogue, and the backward computes the bias gradient in the
// same GEMM as the weight gradient (cuBLASLt BGRADB; backends/cuda/matmul.h). On the CPU:
// matmul, then the bias added in place.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {});
// The same, with the weight and bias gradients queued on `defer` instead of returned (Note
// [weight gradients behind the collective], autograd/deferred.h); null: the thread's
// DeferWeightGrads queue if one is alive (ZB-H1), else the plain linear. (linear and linear_gelu
// without `defer` take the thread's queue too.)
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias,
              const std::shared_ptr<autograd::DeferredGrads>& defer);

// LoRA's adapted linear: linear(x, weight, bias) + scale * linear(linear(x, A), B), the same
// values as composed, one autograd node that keeps only (M, r) beyond what the plain linear keeps
// (Note [fused LoRA linear] in matmul.cpp). A (r, in), B (out, r), one dtype with x.
// Differentiable in all five (the frozen base's weight and bias usually need no gradient).
Tensor lora_linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& A, const Tensor& B,
                   double scale);
// gelu_tanh(linear(x, weight, bias)), GPT-2's MLP up-projection. On CUDA one GEMM writes
// both the pre-activation (saved for backward) and its GELU (cuBLASLt GELU_AUX_BIAS
// epilogue, when the output width is a multiple of 8); elsewhere linear, then gelu_tanh.
// The backward is gelu_tanh's derivative at the saved pre-activation, then linear's.
Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias = {});

// GPT's MLP as one op: linear(linear_gelu(x, w_fc, b_fc), w_proj, b_proj), the same values,
// one autograd node. Its backward computes the GELU's gradient and the up projection's bias
// gradient inside the down projection's input-gradient GEMM on CUDA (cuBLASLt's DGELU_BGRAD
// epilogue: Note [GELU gradient in the GEMM]). Biases may be undefined.
Tensor gelu_mlp(const Tensor& x, const Tensor& w_fc, const Tensor& b_fc, const Tensor& w_proj,
                const Tensor& b_proj);

}  // namespace forge::ops
