#include "forge/plan/activations.h"

namespace forge::plan {

const char* activation_model_name(ActivationModel m) { return m == ActivationModel::megatron ? "megatron" : "forge"; }
const char* attention_name(AttentionKind a) { return a == AttentionKind::flash ? "flash" : "naive"; }

namespace {

constexpr double kStat = 4;  // f32 statistics (norm mean/rstd, attention and loss logsumexp)
constexpr double kMask = 1;  // a bool dropout mask

SavedTensors megatron(const ModelSpec& m, const ActivationOptions& o, int64_t tp) {
  const double e = o.act_bytes, h = static_cast<double>(m.d_model), d = static_cast<double>(m.head_dim());
  const double s = static_cast<double>(m.seq_len);
  const double heads = static_cast<double>(m.n_head / tp);
  const double kv = static_cast<double>(m.n_kv_head >= tp ? m.n_kv_head / tp : 1);
  const double f = static_cast<double>((m.ffn_hidden + tp - 1) / tp);
  const double V = static_cast<double>((m.vocab_size + tp - 1) / tp);
  const bool gpt = m.arch == Arch::gpt;
  const bool dropout = o.dropout && gpt;
  SavedTensors t;
  t.convention = "each block counts its input (Korthikanti et al.)";
  auto& L = t.layer;
  L.push_back({gpt ? "ln_1.input" : "input_layernorm.input", h, e, true, false});
  L.push_back({"attn.qkv_input", h, e, true, false});
  L.push_back({"attn.q", heads * d, e, false, false});
  L.push_back({"attn.k", kv * d, e, false, false});
  L.push_back({"attn.v", kv * d, e, false, false});
  if (o.attention == AttentionKind::naive) {
    L.push_back({"attn.softmax", heads * s, e, false, true});
    if (dropout) {
      L.push_back({"attn.softmax_dropout_mask", heads * s, kMask, false, true});
      L.push_back({"attn.softmax_dropout", heads * s, e, false, true});
    }
  } else {
    L.push_back({"attn.logsumexp", heads, kStat, false, false});
  }
  L.push_back({"attn.proj_input", heads * d, e, false, false});
  if (dropout) L.push_back({"attn.dropout_mask", h, kMask, true, false});
  L.push_back({gpt ? "ln_2.input" : "post_attention_layernorm.input", h, e, true, false});
  L.push_back({"mlp.input", h, e, true, false});
  if (gpt) {
    L.push_back({"mlp.gelu_input", f, e, false, false});
    L.push_back({"mlp.gelu_output", f, e, false, false});
  } else {
    L.push_back({"mlp.swiglu_input (gate, up)", 2 * f, e, false, false});
    L.push_back({"mlp.swiglu_output", f, e, false, false});
  }
  if (dropout) L.push_back({"mlp.dropout_mask", h, kMask, true, false});
  if (dropout) t.embedding.push_back({"embedding.dropout_mask", h, kMask, true, false});
  t.head.push_back({"final_norm.input", h, e, true, false});
  t.head.push_back({"head.input", h, e, true, false});
  t.head.push_back({"cross_entropy.logits_f32", V, 4, false, false});
  t.head_transient.push_back({"cross_entropy.grad_logits", V, e, false, false});
  t.checkpoint = {"block.input", h, e, true, false};
  return t;
}

SavedTensors forge_lists(const ModelSpec& m, const ActivationOptions& o, int64_t tp) {
  const double e = o.act_bytes, h = static_cast<double>(m.d_model), d = static_cast<double>(m.head_dim());
  const double heads = static_cast<double>(m.n_head / tp);
  const double kv = static_cast<double>(m.n_kv_head >= tp ? m.n_kv_head / tp : 1);
  const double f = static_cast<double>((m.ffn_hidden + tp - 1) / tp);
  const double V = static_cast<double>((m.vocab_size + tp - 1) / tp);
  SavedTensors t;
  auto& L = t.layer;
  if (m.arch == Arch::gpt) {
    // nn::GPT runs each residual add fused with the LayerNorm after it (ops::add_layer_norm,
    // Note [fused residual + layer norm in GPT]): the norm keeps the new stream, the add keeps
    // nothing; Linear is ops::linear (keeps its input, no separate bias add).
    const bool dropout = o.dropout;
    t.convention = "each block counts its input stream (kept by its ln_1)";
    L.push_back({"stream (ln_1 input)", h, e, true, false});
    L.push_back({"ln_1.out (c_attn input)", h, e, true, false});
    L.push_back({"ln_1.mean_rstd", 2, kStat, true, false});
    L.push_back({"attn.c_attn.out (q, k, v views)", 3 * heads * d, e, false, false});
    L.push_back({"attn.sdpa.out", heads * d, e, false, false});
    L.push_back({"attn.sdpa.logsumexp", heads, kStat, false, false});
    L.push_back({"attn.merged_heads (c_proj input)", heads * d, e, false, false});
    if (dropout) {
      L.push_back({"attn.resid_dropout.mask", h, kMask, true, false});
      L.push_back({"attn.resid_dropout.out", h, e, true, false});
    }
    L.push_back({"stream + attn (ln_2 input)", h, e, true, false});
    L.push_back({"ln_2.out (c_fc input)", h, e, true, false});
    L.push_back({"ln_2.mean_rstd", 2, kStat, true, false});
    L.push_back({"mlp.c_fc.out (gelu input)", f, e, false, false});
    L.push_back({"mlp.gelu.out (c_proj input)", f, e, false, false});
    if (dropout) {
      L.push_back({"mlp.dropout.mask", h, kMask, true, false});
      L.push_back({"mlp.dropout.out", h, e, true, false});
    }
    t.embedding.push_back({"tokens (inputs, targets: i64)", 2, 8, true, false});
    t.embedding.push_back({"wte.out (kept by the position add)", h, e, true, false});
    if (dropout) {
      t.embedding.push_back({"embedding.add.out", h, e, true, false});
      t.embedding.push_back({"drop.mask", h, kMask, true, false});
    }
    t.head.push_back({"final stream (ln_f input)", h, e, true, false});
    t.head.push_back({"ln_f.out (head input)", h, e, true, false});
    t.head.push_back({"ln_f.mean_rstd", 2, kStat, true, false});
    t.checkpoint = {"block.input (the checkpoint's saved input)", h, e, true, false};
  } else {
    // nn::Llama runs each residual add fused with the RMSNorm after it (ops::add_rms_norm, Note
    // [fused residual + RMS norm in LLaMA]): the norm keeps the new stream, the add keeps
    // nothing, so o_proj's and down_proj's outputs die once added; no biases.
    t.convention = "each block counts its input stream (kept by its input_layernorm)";
    L.push_back({"stream (input_layernorm input)", h, e, true, false});
    L.push_back({"input_layernorm.out", h, e, true, false});
    L.push_back({"input_layernorm.rstd", 1, kStat, true, false});
    L.push_back({"self_attn.q (after rope)", heads * d, e, false, false});
    L.push_back({"self_attn.k (after rope)", kv * d, e, false, false});
    L.push_back({"self_attn.v", kv * d, e, false, false});
    L.push_back({"self_attn.sdpa.out", heads * d, e, false, false});
    L.push_back({"self_attn.sdpa.logsumexp", heads, kStat, false, false});
    L.push_back({"self_attn.merged_heads (o_proj input)", heads * d, e, false, false});
    L.push_back({"stream + attn (post_attention_layernorm input)", h, e, true, false});
    L.push_back({"post_attention_layernorm.out", h, e, true, false});
    L.push_back({"post_attention_layernorm.rstd", 1, kStat, true, false});
    L.push_back({"mlp.gate_proj.out (swiglu input)", f, e, false, false});
    L.push_back({"mlp.up_proj.out (swiglu input)", f, e, false, false});
    L.push_back({"mlp.swiglu.out (down_proj input)", f, e, false, false});
    t.embedding.push_back({"tokens (inputs, targets: i64)", 2, 8, true, false});
    t.head.push_back({"final stream (norm input)", h, e, true, false});
    t.head.push_back({"norm.out (head input)", h, e, true, false});
    t.head.push_back({"norm.rstd", 1, kStat, true, false});
    t.checkpoint = {"block.input (the checkpoint's saved input)", h, e, true, false};
  }
  t.head.push_back({"logits (kept by cross_entropy)", V, e, false, false});
  t.head.push_back({"cross_entropy.logsumexp", 1, kStat, true, false});
  // No transient for dlogits: cross_entropy's backward writes it over the logits (Note [dlogits
  // in place] in ops/loss.cpp).
  return t;
}

}  // namespace

SavedTensors saved_tensors(const ModelSpec& m, const ActivationOptions& o, int64_t tp) {
  return o.model == ActivationModel::megatron ? megatron(m, o, tp) : forge_lists(m, o, tp);
}

double activation_bytes(const std::vector<SavedTensor>& list, int64_t b, int64_t s, int64_t tp, bool sp,
                        bool skip_core) {
  double per_token = 0;
  for (const auto& t : list) {
    if (skip_core && t.core) continue;
    per_token += t.width * t.bytes / (t.replicated && sp ? static_cast<double>(tp) : 1.0);
  }
  return per_token * static_cast<double>(b) * static_cast<double>(s);
}

double korthikanti_layer_bytes(int64_t s, int64_t b, int64_t h, int64_t a, int64_t t, bool sequence_parallel) {
  const double sbh = static_cast<double>(s) * static_cast<double>(b) * static_cast<double>(h);
  const double core = 5.0 * static_cast<double>(a) * static_cast<double>(s) / (static_cast<double>(h) * static_cast<double>(t));
  if (sequence_parallel) return sbh * (34.0 / static_cast<double>(t) + core);
  return sbh * (10.0 + 24.0 / static_cast<double>(t) + core);
}

}  // namespace forge::plan
