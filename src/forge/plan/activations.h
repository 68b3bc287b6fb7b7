#pragma once
// Activation memory: the tensors a training step keeps from the forward pass for the
// backward, per token, as two lists per architecture.
//
// ActivationModel::megatron is Korthikanti et al. 2022, "Reducing Activation Recomputation in
// Large Transformer Models" (arXiv:2205.05198), Section 4: for a GPT layer with 16-bit
// activations, dropout and attention that materialises the s x s scores it is exactly
//     s*b*h * (34 + 5*a*s/h)  bytes                       (no parallelism)
//     s*b*h * (10 + 24/t + 5*a*s/(h*t))                   (tensor parallel t)
//     s*b*h * (34/t + 5*a*s/(h*t))                        (tensor + sequence parallel)
// and 2*s*b*h per layer (its input) with full recomputation. The same accounting is applied
// to LLaMA blocks (RMSNorm, GQA, a fused SwiGLU that keeps its 2f input and f output, no
// dropout) and to flash attention, which keeps no s x s matrix, only the f32 row
// logsumexp (4*a bytes per token). It is what `forge plan` uses for GPU plans: the memory
// of a Megatron-style implementation.
//
// ActivationModel::forge lists what forge's own autograd keeps today (ops/*.cpp `record`
// closures): its attention (CPU flash-style kernel; CUDA GEMMs + fused softmax) keeps q, k,
// v, the output and the f32 logsumexp, no s x s matrix; ops::linear keeps its input; the
// fused add + layer_norm (GPT) keeps the new residual stream and f32 mean/rstd; rms_norm its
// input and rstd; gelu/silu their input; every *binary* op's closure holds both inputs and
// its output (LLaMA's residual adds and SwiGLU product); the head's logits stay alive for
// cross_entropy, whose backward writes dlogits over them (no transient). A GPT block keeps 17*h values per token,
// a LLaMA block 9h + 2*kv*d + 3f. It predicts forge's measured CPU peak (tests/plan,
// docs/plan.md) and is the default for `--gpu cpu`.
#include <cstdint>
#include <string>
#include <vector>

#include "forge/plan/model_spec.h"

namespace forge::plan {

enum class ActivationModel { megatron, forge };
enum class AttentionKind { flash, naive };
const char* activation_model_name(ActivationModel m);
const char* attention_name(AttentionKind a);

// One saved tensor: `width` values per token on one GPU (after tensor-parallel splitting),
// `bytes` per value. `replicated` tensors are whole on every tensor-parallel rank unless
// sequence parallelism splits them too. `core` marks the s x s attention terms that
// selective recomputation drops.
struct SavedTensor {
  std::string name;
  double width = 0;
  double bytes = 0;
  bool replicated = false;
  bool core = false;
};

struct SavedTensors {
  std::vector<SavedTensor> layer;           // one transformer block
  std::vector<SavedTensor> embedding;       // first pipeline stage, beyond the blocks
  std::vector<SavedTensor> head;            // last stage: final norm, head input, logits
  std::vector<SavedTensor> head_transient;  // last stage, at the start of backward (dlogits)
  SavedTensor checkpoint;                   // what a fully recomputed block keeps
  std::string convention;                   // which boundary tensor a block counts
};

struct ActivationOptions {
  ActivationModel model = ActivationModel::megatron;
  AttentionKind attention = AttentionKind::flash;
  bool dropout = false;       // dropout masks (GPT); LLaMA has no dropout
  double act_bytes = 2;       // bytes per activation value (2 for bf16/fp16, 4 for fp32)
};

SavedTensors saved_tensors(const ModelSpec& m, const ActivationOptions& o, int64_t tp);

// Bytes of `list` for b sequences of s tokens on one GPU (replicated tensors divided by tp
// under sequence parallelism). `skip_core` drops the attention-core terms.
double activation_bytes(const std::vector<SavedTensor>& list, int64_t b, int64_t s, int64_t tp, bool sp,
                        bool skip_core = false);

// Korthikanti et al.'s closed forms, for the tests and docs: bytes per layer.
double korthikanti_layer_bytes(int64_t s, int64_t b, int64_t h, int64_t a, int64_t t, bool sequence_parallel);

}  // namespace forge::plan
