#pragma once
// ModelSpec: the architecture of a GPT- or LLaMA-style transformer as `forge plan` sees it,
// and everything that follows from the architecture alone: the exact parameter count (per
// module, and per GPU under tensor/pipeline parallelism), FLOPs per token, and a per-module
// summary (output shape, parameters, forward FLOPs) like torchinfo's.
//
//   ModelSpec m = preset("llama2-7b");
//   count_parameters(m).total          // 6,738,415,616
//   flops_per_token(m).model           // 6 * 6.61e9 matmul params + 12 * L * h * s
//
// The counts follow forge's own modules (nn::GPT, nn::Llama), which the tests check by
// building both for small configs:
//   GPT   (nanoGPT layout): wte (V, h) tied with the head, wpe (block_size, h); per block
//         ln_1, attn.c_attn (3h, h) + bias, attn.c_proj (h, h) + bias, ln_2,
//         mlp.c_fc (f, h) + bias, mlp.c_proj (h, f) + bias (f = 4h); ln_f. `bias = false`
//         drops every Linear and LayerNorm bias.
//   LLaMA (Hugging Face layout): embed_tokens (V, h); per block q_proj (a*d, h), k_proj and
//         v_proj (kv*d, h), o_proj (h, a*d), gate_proj and up_proj (f, h), down_proj (h, f),
//         two RMSNorm weights (h); norm (h); lm_head (V, h), untied.
#include <cstdint>
#include <string>
#include <vector>

#include "forge/nn/model_registry.h"

namespace forge::plan {

// The block layouts and the architecture are nn's (nn/model_registry.h): a run config's model
// reaches plan through its family's shape(), so plan holds no copy of a family's rules.
using Arch = nn::Arch;
using nn::arch_name;

// The architecture (nn::TransformerShape: layout, layers, width h, heads a, kv-heads, FFN width
// f, vocabulary V, context, biases; the defaults are GPT-2 small's) and what plan adds to it.
struct ModelSpec : nn::TransformerShape {
  std::string name = "custom";  // preset name, config path, or "custom"
  int64_t seq_len = 1024;       // s: tokens per training sequence (<= block_size)
  // LoRA (nn/lora.h): adapters of rank lora_rank on the linears of these roles, the rest frozen
  // (0: none; the whole model trains).
  int64_t lora_rank = 0;
  std::vector<nn::LinearRole> lora_roles;
  // Throws forge::Error naming the field and the fix for an impossible shape.
  void validate() const;
  // "LLaMA, 32 layers, width 4096, 32 heads (32 kv), ffn 11008, vocab 32000, seq 4096"
  std::string describe() const;
};

// ---- presets ----------------------------------------------------------------------------------

struct Preset {
  std::string name;                  // "llama2-7b"
  std::vector<std::string> aliases;  // "llama-2-7b", ...
  ModelSpec spec;
  int64_t default_batch;             // global batch in sequences of spec.seq_len (the published one)
  std::string source;                // where the shape comes from
};
const std::vector<Preset>& presets();

// LoRA's adapter parameters (r (in + out) per adapted linear, Note [LoRA]) of one block on one GPU
// under tensor parallelism t (Note [tensor-parallel LoRA]: a column-parallel linear's B and a
// row-parallel one's A split by t, the other factor whole), and of the whole model (t = 1). 0
// without LoRA.
int64_t lora_block_parameters(const ModelSpec& m, int64_t t = 1);
int64_t lora_parameters(const ModelSpec& m);
// The values PowerSGD at rank r sends for one block's gradients on one GPU under tensor
// parallelism t (Note [PowerSGD] in parallel/powersgd.h): r (n + m) for each weight matrix of
// n x m (this GPU's part) where that is smaller than n m, the rest (vectors, small matrices) whole.
int64_t powersgd_block_values(const ModelSpec& m, int64_t r, int64_t t = 1);
// The preset named `name` (or one of its aliases, case-insensitive). Throws forge::Error
// listing the nearest names ("unknown model 'llama2-8b'; did you mean 'llama3-8b' or
// 'llama2-7b'?") and all presets.
const Preset& find_preset(const std::string& name);

// A language model's [model] section with its vocabulary resolved (model.vocab_size > 0), trained at
// `seq_len` tokens: the architecture is the model family's shape (nn::transformer_shape). `source`
// names where the section comes from in errors. A run config's shape, model.vocab_size = 0 resolved
// as the trainer resolves it, is train::model_spec_of (run/run_model_spec.h).
ModelSpec from_model_config(const nn::ModelConfig& m, int64_t seq_len, const std::string& source);

// ---- parameters -------------------------------------------------------------------------------

struct BlockParams {
  int64_t attention = 0;  // Q, K, V, O projections (+ biases)
  int64_t mlp = 0;        // the two (GPT) or three (LLaMA) MLP projections (+ biases)
  int64_t norms = 0;      // the two norms' weights (+ biases)
  int64_t total() const { return attention + mlp + norms; }
};

struct ParamCount {
  int64_t embedding = 0;    // token embedding (GPT wte, LLaMA embed_tokens)
  int64_t position = 0;     // GPT wpe
  BlockParams block;        // one transformer block
  int64_t blocks = 0;       // n_layer * block.total()
  int64_t final_norm = 0;
  int64_t head = 0;         // 0 when tied to the embedding
  int64_t total = 0;
  int64_t matmul = 0;       // weights that multiply activations: block Linear weights + the head (tied or not)
};
ParamCount count_parameters(const ModelSpec& m);

// Parameters one GPU holds for pipeline stage `stage` of `pp` under tensor parallelism `tp`
// (Megatron layout: column/row-parallel Linears split, norms and row-parallel biases
// replicated, vocab-parallel embedding and head; the vocabulary and ffn width padded up to
// a multiple of tp; K/V heads replicated when tp > n_kv_head). A tied head on a pipeline's
// last stage keeps its own copy of the embedding (as Megatron does).
int64_t stage_parameters(const ModelSpec& m, int64_t tp, int64_t pp, int64_t stage, int64_t virtual_stages = 1);

// ---- pipeline stages --------------------------------------------------------------------------

// The blocks of each of `stages` consecutive pipeline stages (pp, or pp x virtual stages when
// interleaved), balanced by forward FLOPs per token: a block costs flops_per_token's
// layer_forward, and the last stage also runs the head (head_forward; the embeddings cost no
// FLOPs). Of the splits whose slowest stage is fastest, the most even; the stages before the
// last as even as possible, the earlier ones one block more. `forge train` splits a pipeline this
// way unless dist.pp_layers says otherwise (Note [balanced pipeline stages] in model_spec.cpp).
std::vector<int64_t> stage_layers(const ModelSpec& m, int64_t stages);
// The blocks each pipeline rank holds: rank i of pp runs virtual stages i, i + pp, ... of
// stage_layers(m, pp x virtual_stages).
std::vector<int64_t> rank_layers(const ModelSpec& m, int64_t pp, int64_t virtual_stages = 1);
// Of those, one layer's (for ZeRO-3 gather buffers).
int64_t layer_parameters_per_gpu(const ModelSpec& m, int64_t tp);

// ---- FLOPs ------------------------------------------------------------------------------------

// FLOPs per token (2 per multiply-add). Attention is counted in full (QK^T and AV over all s
// positions, no causal halving), as PaLM's MFU does: 4*s*h forward per layer.
struct FlopsPerToken {
  double layer_forward = 0;      // one block: 2 * its matmul weights + 4 * s * a * d
  double attention_forward = 0;  // of which the attention core (QK^T, AV): 4 * s * a * d
  double head_forward = 0;       // the LM head: 2 * V * h
  double forward = 0;            // n_layer * layer_forward + head_forward
  double model = 0;              // forward + backward = 3 * forward (6 * N_matmul + 12 * L * s * a*d)
  double six_n = 0;              // 6 * N with N the total parameter count (the rule of thumb)
};
FlopsPerToken flops_per_token(const ModelSpec& m);

// ---- per-module summary -----------------------------------------------------------------------

struct SummaryRow {
  std::string name;              // forge's module name ("transformer.h.0.attn.c_attn")
  std::string type;              // "Linear", "LayerNorm", "GPTBlock", ...
  int depth = 0;                 // nesting level (for indentation)
  std::vector<int64_t> shape;    // output shape for a micro-batch
  int64_t params = 0;            // parameters owned by the module and its children
  double flops = 0;              // forward FLOPs for the micro-batch (matmuls and attention)
  bool leaf = false;             // counted in the totals (owns its parameters directly, or an
                                 // aggregate of repeated blocks)
  std::string note;              // "tied to transformer.wte", "x11, like transformer.h.0"
};
struct Summary {
  std::vector<SummaryRow> rows;
  int64_t total_params = 0;      // sum over leaf rows: equals count_parameters().total
  double total_flops = 0;        // forward FLOPs of the micro-batch
  int64_t batch = 1;
};
// Blocks after the first are folded into one row unless `expand_blocks`.
Summary summarize(const ModelSpec& m, int64_t batch, bool expand_blocks = false);

}  // namespace forge::plan
