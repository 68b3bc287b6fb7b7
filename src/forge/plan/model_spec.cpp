#include "forge/plan/model_spec.h"

#include <algorithm>
#include <sstream>
#include <utility>
#include <vector>

#include "forge/core/error.h"
#include "forge/nn/model_registry.h"
#include "forge/plan/names.h"

namespace forge::plan {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A spec from the shape of a [model] section (nn/model_registry.h) and plan's own fields.
ModelSpec spec_of(const std::string& name, const nn::TransformerShape& shape, int64_t seq_len) {
  ModelSpec m;
  static_cast<nn::TransformerShape&>(m) = shape;
  m.name = name;
  m.seq_len = seq_len;
  return m;
}

// The presets are written as the [model] section a run config would give them.
ModelSpec gpt(const std::string& name, int64_t layers, int64_t width, int64_t heads) {
  nn::ModelConfig c;
  c.type = "gpt";
  c.n_layer = layers;
  c.n_embd = width;
  c.n_head = heads;
  c.vocab_size = 50257;
  c.block_size = 1024;
  c.bias = true;
  return spec_of(name, nn::transformer_shape(c), 1024);
}

ModelSpec llama(const std::string& name, int64_t layers, int64_t width, int64_t heads, int64_t kv, int64_t ffn,
                int64_t vocab, int64_t context) {
  nn::ModelConfig c;
  c.type = "llama";
  c.n_layer = layers;
  c.dim = width;
  c.n_head = heads;
  c.n_kv_head = kv;
  c.ffn_hidden = ffn;
  c.vocab_size = vocab;
  c.block_size = context;
  return spec_of(name, nn::transformer_shape(c), context);
}

// K/V heads one GPU holds under tensor parallelism tp (replicated when tp > n_kv_head).
int64_t kv_heads_per_gpu(const ModelSpec& m, int64_t tp) { return m.n_kv_head >= tp ? m.n_kv_head / tp : 1; }

BlockParams block_params_tp(const ModelSpec& m, int64_t tp) {
  const int64_t h = m.d_model, d = m.head_dim(), f = ceil_div(m.ffn_hidden, tp);
  BlockParams p;
  if (m.arch == Arch::gpt) {
    const int64_t b = m.bias ? 1 : 0;
    const int64_t qkv = 3 * (m.n_head / tp) * d;  // column-parallel c_attn
    const int64_t att = (m.n_head / tp) * d;
    p.attention = qkv * h + b * qkv + att * h + b * h;  // c_proj: row-parallel, its bias replicated
    p.mlp = f * h + b * f + h * f + b * h;
    p.norms = 2 * (h + b * h);
  } else {
    const int64_t q = (m.n_head / tp) * d, kv = kv_heads_per_gpu(m, tp) * d;
    p.attention = q * h + 2 * kv * h + q * h;
    p.mlp = 3 * h * f;
    p.norms = 2 * h;
  }
  return p;
}

}  // namespace

void ModelSpec::validate() const {
  FORGE_CHECK(n_layer > 0, "model: layers must be > 0, got ", n_layer);
  FORGE_CHECK(d_model > 0 && n_head > 0 && d_model % n_head == 0, "model: heads = ", n_head,
              " must divide the width = ", d_model, " (each head gets width / heads channels)");
  FORGE_CHECK(n_kv_head > 0 && n_head % n_kv_head == 0, "model: kv-heads = ", n_kv_head,
              " must divide heads = ", n_head, " (grouped-query attention shares each K/V head among heads / kv-heads)");
  FORGE_CHECK(arch == Arch::llama || n_kv_head == n_head, "model: a GPT model has kv-heads = heads (", n_head,
              "), got ", n_kv_head, "; use --arch llama for grouped-query attention");
  FORGE_CHECK(ffn_hidden > 0, "model: ffn must be > 0, got ", ffn_hidden);
  FORGE_CHECK(vocab_size > 0, "model: vocab must be > 0, got ", vocab_size);
  FORGE_CHECK(seq_len > 0, "model: seq must be > 0, got ", seq_len);
  FORGE_CHECK(block_size >= seq_len, "model: seq = ", seq_len, " exceeds the model's context (block size) ", block_size,
              "; lower --seq or raise --context");
}

std::string ModelSpec::describe() const {
  std::ostringstream os;
  os << arch_name(arch) << ", " << n_layer << " layers, width " << d_model << ", " << n_head << " heads";
  if (n_kv_head != n_head) os << " (" << n_kv_head << " kv)";
  os << ", ffn " << ffn_hidden << ", vocab " << vocab_size << ", seq " << seq_len;
  if (block_size != seq_len) os << " (context " << block_size << ")";
  if (arch == Arch::gpt && !bias) os << ", no biases";
  return os.str();
}

// ---- presets ----------------------------------------------------------------------------------

const std::vector<Preset>& presets() {
  static const std::vector<Preset> table = [] {
    const std::string gpt2_src =
        "Radford et al. 2019, 'Language Models are Unsupervised Multitask Learners' (Table 2); Hugging Face "
        "config.json of gpt2, gpt2-medium, gpt2-large, gpt2-xl; batch 512 x 1024 as in the paper";
    const std::string llama2_src =
        "Touvron et al. 2023, 'Llama 2: Open Foundation and Fine-Tuned Chat Models' (Table 1: context 4k, "
        "global batch 4M tokens); Hugging Face config.json of meta-llama/Llama-2-*-hf";
    const std::string llama3_src =
        "Llama Team 2024, 'The Llama 3 Herd of Models' (Table 3: 8B 32x4096, 70B 80x8192, 8 kv heads, "
        "vocab 128,256); Hugging Face config.json of meta-llama/Meta-Llama-3-*; batch 512 x 8192 = 4M tokens assumed";
    std::vector<Preset> t;
    t.push_back({"gpt2", {"gpt2-124m", "gpt2-small"}, gpt("gpt2", 12, 768, 12), 512, gpt2_src});
    t.push_back({"gpt2-medium", {"gpt2-350m"}, gpt("gpt2-medium", 24, 1024, 16), 512, gpt2_src});
    t.push_back({"gpt2-large", {"gpt2-774m"}, gpt("gpt2-large", 36, 1280, 20), 512, gpt2_src});
    t.push_back({"gpt2-xl", {"gpt2-1.5b", "gpt2-1558m"}, gpt("gpt2-xl", 48, 1600, 25), 512, gpt2_src});
    t.push_back({"llama2-7b", {"llama-2-7b"}, llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096), 1024, llama2_src});
    t.push_back(
        {"llama2-13b", {"llama-2-13b"}, llama("llama2-13b", 40, 5120, 40, 40, 13824, 32000, 4096), 1024, llama2_src});
    t.push_back({"llama2-70b", {"llama-2-70b"}, llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096), 1024, llama2_src});
    t.push_back({"llama3-8b", {"llama-3-8b", "llama3.1-8b"}, llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192), 512,
                 llama3_src});
    t.push_back({"llama3-70b", {"llama-3-70b", "llama3.1-70b"},
                 llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192), 512, llama3_src});
    return t;
  }();
  return table;
}

const Preset& find_preset(const std::string& name) {
  const std::string q = normalize_name(name);
  std::vector<std::string> all;
  for (const auto& p : presets()) {
    if (normalize_name(p.name) == q) return p;
    for (const auto& a : p.aliases)
      if (normalize_name(a) == q) return p;
    all.push_back(p.name);
  }
  std::string list;
  for (const auto& n : all) list += (list.empty() ? "" : ", ") + n;
  FORGE_THROW("unknown model '", name, "'", did_you_mean(nearest_names(name, all)), " (presets: ", list,
              "; or give --config FILE.toml, or the shape with --arch --layers --width --heads ...)");
}

ModelSpec from_model_config(const nn::ModelConfig& m, int64_t seq_len, const std::string& source) {
  const nn::ModelFamily* family = nn::find_model_family(m.type);
  FORGE_CHECK(family == nullptr || family->is_transformer(), "forge plan: model.type = '", m.type, "' in ", source,
              " is not a language model; plan covers ", nn::model_type_list(/*transformers_only=*/true, " and "));
  FORGE_CHECK(m.vocab_size > 0, "forge plan: model.vocab_size = ", m.vocab_size, " in ", source,
              ": give the vocabulary's size (or a tokenizer that sets it)");
  const ModelSpec s = spec_of(source, nn::transformer_shape(m), seq_len);
  s.validate();
  return s;
}

// ---- parameters -------------------------------------------------------------------------------

ParamCount count_parameters(const ModelSpec& m) {
  const int64_t h = m.d_model, V = m.vocab_size;
  ParamCount c;
  c.embedding = V * h;
  c.position = m.arch == Arch::gpt ? m.block_size * h : 0;
  c.block = block_params_tp(m, 1);
  c.blocks = m.n_layer * c.block.total();
  c.final_norm = m.arch == Arch::gpt ? (m.bias ? 2 * h : h) : h;
  c.head = m.tied_head() ? 0 : V * h;
  c.total = c.embedding + c.position + c.blocks + c.final_norm + c.head;
  const int64_t d = m.head_dim();
  int64_t block_matmul = 0;
  if (m.arch == Arch::gpt) {
    block_matmul = 3 * h * h + h * h + 2 * h * m.ffn_hidden;
  } else {
    block_matmul = 2 * h * m.n_head * d + 2 * h * m.n_kv_head * d + 3 * h * m.ffn_hidden;
  }
  c.matmul = m.n_layer * block_matmul + V * h;
  return c;
}

int64_t lora_block_parameters(const ModelSpec& m, int64_t t) {
  if (m.lora_rank <= 0) return 0;
  const int64_t h = m.d_model, hd = m.head_dim(), q = m.n_head * hd, kv = m.n_kv_head * hd, f = m.ffn_hidden;
  int64_t n = 0;
  for (const nn::LinearRole role : m.lora_roles) {
    int64_t in = 0, out = 0;
    bool row = false;  // row-parallel: A split; column-parallel: B split
    switch (role) {
      case nn::LinearRole::attention_qkv: in = h, out = 3 * h; break;
      case nn::LinearRole::attention_q: in = h, out = q; break;
      case nn::LinearRole::attention_k:
      case nn::LinearRole::attention_v: in = h, out = kv; break;
      case nn::LinearRole::attention_out: in = q, out = h, row = true; break;
      case nn::LinearRole::mlp_up:
      case nn::LinearRole::mlp_gate: in = h, out = f; break;
      case nn::LinearRole::mlp_down: in = f, out = h, row = true; break;
      case nn::LinearRole::lm_head: in = h, out = m.vocab_size; break;
    }
    n += m.lora_rank * (row ? ceil_div(in, t) + out : in + ceil_div(out, t));
  }
  return n;
}

int64_t powersgd_block_values(const ModelSpec& m, int64_t r, int64_t t) {
  const int64_t h = m.d_model, d = m.head_dim(), f = ceil_div(m.ffn_hidden, t);
  std::vector<std::pair<int64_t, int64_t>> mats;  // (rows, cols) of this GPU's weight matrices
  if (m.arch == Arch::gpt) {
    const int64_t att = (m.n_head / t) * d;
    mats = {{3 * att, h}, {h, att}, {f, h}, {h, f}};
  } else {
    const int64_t q = (m.n_head / t) * d, kv = kv_heads_per_gpu(m, t) * d;
    mats = {{q, h}, {kv, h}, {kv, h}, {h, q}, {f, h}, {f, h}, {h, f}};
  }
  int64_t values = block_params_tp(m, t).total();  // less the matrices: the vectors, sent whole
  for (const auto& [n, c] : mats) values += std::min(r * (n + c), n * c) - n * c;
  return values;
}

int64_t lora_parameters(const ModelSpec& m) { return m.n_layer * lora_block_parameters(m, 1); }

int64_t layer_parameters_per_gpu(const ModelSpec& m, int64_t tp) { return block_params_tp(m, tp).total(); }

int64_t stage_parameters(const ModelSpec& m, int64_t tp, int64_t pp, int64_t stage, int64_t virtual_stages) {
  const int64_t h = m.d_model, Vt = ceil_div(m.vocab_size, tp);
  int64_t n = rank_layers(m, pp, virtual_stages)[static_cast<size_t>(stage)] * block_params_tp(m, tp).total();
  if (stage == 0) {
    n += Vt * h;
    if (m.arch == Arch::gpt) n += m.block_size * h;
  }
  if (stage == pp - 1) {
    n += m.arch == Arch::gpt ? (m.bias ? 2 * h : h) : h;
    if (!m.tied_head() || pp > 1) n += Vt * h;  // untied head, or the last stage's copy of a tied one
  }
  return n;
}

// ---- pipeline stages --------------------------------------------------------------------------

// Note [balanced pipeline stages]
// Every stage of a pipeline runs each micro-batch once forward and once backward, so the step
// is paced by the slowest stage. The blocks cost the same, but the last stage also runs the head
// (2 V h FLOPs per token forward: 1.2 blocks for the 0.85B LLaMA, 4.5 for GPT-2 small), so an even
// split makes it the slowest by that much. With S stages, the last taking k blocks and the
// others the rest as evenly as possible, the slowest costs
//     max(ceil((L - k) / (S - 1)) c, k c + H)
// (c a block, H the head); k runs over 1 .. L - S + 1 and the smallest maximum wins, ties going
// to the split closest to even (the smallest sum of squared block counts). The embedding lookup
// has no FLOPs and stays on the first stage uncounted. Megatron balances the same way by hand
// (its --decoder-last-pipeline-num-layers); forge does it by default.
std::vector<int64_t> stage_layers(const ModelSpec& m, int64_t stages) {
  FORGE_CHECK(stages >= 1 && m.n_layer >= stages, "pipeline: ", m.n_layer, " layers cannot fill ", stages,
              " stages (each needs at least one block); use at most ", m.n_layer, " stages");
  const int64_t L = m.n_layer, S = stages;
  if (S == 1) return {L};
  const FlopsPerToken F = flops_per_token(m);
  const double c = F.layer_forward, H = F.head_forward;
  auto split = [&](int64_t k) {  // the last stage k blocks, the others the rest, earlier ones one more
    std::vector<int64_t> v(static_cast<size_t>(S));
    const int64_t rest = L - k, base = rest / (S - 1), extra = rest % (S - 1);
    for (int64_t i = 0; i < S - 1; ++i) v[static_cast<size_t>(i)] = base + (i < extra ? 1 : 0);
    v.back() = k;
    return v;
  };
  std::vector<int64_t> best;
  double best_cost = 0, best_sq = 0;
  for (int64_t k = 1; k <= L - S + 1; ++k) {
    const std::vector<int64_t> v = split(k);
    const double cost = std::max(static_cast<double>(v.front()) * c, static_cast<double>(k) * c + H);
    double sq = 0;
    for (int64_t n : v) sq += static_cast<double>(n * n);
    const bool cheaper = best.empty() || cost < best_cost * (1 - 1e-12);
    const bool tie = !best.empty() && !cheaper && cost <= best_cost * (1 + 1e-12);
    if (cheaper || (tie && sq < best_sq)) best = v, best_cost = cost, best_sq = sq;
  }
  return best;
}

std::vector<int64_t> rank_layers(const ModelSpec& m, int64_t pp, int64_t virtual_stages) {
  FORGE_CHECK(pp >= 1 && virtual_stages >= 1, "pipeline: pp = ", pp, ", virtual stages = ", virtual_stages);
  const std::vector<int64_t> v = stage_layers(m, pp * virtual_stages);
  std::vector<int64_t> r(static_cast<size_t>(pp), 0);
  for (size_t j = 0; j < v.size(); ++j) r[j % static_cast<size_t>(pp)] += v[j];
  return r;
}

// ---- FLOPs ------------------------------------------------------------------------------------

FlopsPerToken flops_per_token(const ModelSpec& m) {
  const double h = static_cast<double>(m.d_model), s = static_cast<double>(m.seq_len);
  const double ad = static_cast<double>(m.n_head * m.head_dim());
  const ParamCount c = count_parameters(m);
  const double block_matmul = static_cast<double>(c.matmul - m.vocab_size * m.d_model) / static_cast<double>(m.n_layer);
  FlopsPerToken f;
  f.attention_forward = 4.0 * s * ad;
  f.layer_forward = 2.0 * block_matmul + f.attention_forward;
  f.head_forward = 2.0 * static_cast<double>(m.vocab_size) * h;
  f.forward = static_cast<double>(m.n_layer) * f.layer_forward + f.head_forward;
  f.model = 3.0 * f.forward;
  f.six_n = 6.0 * static_cast<double>(c.total);
  return f;
}

// ---- per-module summary -----------------------------------------------------------------------

Summary summarize(const ModelSpec& m, int64_t batch, bool expand_blocks) {
  m.validate();
  FORGE_CHECK(batch > 0, "summary: the micro-batch must be > 0, got ", batch);
  const int64_t b = batch, s = m.seq_len, h = m.d_model, a = m.n_head, d = m.head_dim(), f = m.ffn_hidden;
  const int64_t kv = m.n_kv_head, V = m.vocab_size, L = m.n_layer;
  const double tokens = static_cast<double>(b * s);
  const ParamCount pc = count_parameters(m);
  const FlopsPerToken fl = flops_per_token(m);
  Summary out;
  out.batch = b;
  auto row = [&](std::string name, std::string type, int depth, std::vector<int64_t> shape, int64_t params,
                 double flops, bool leaf, std::string note = "") {
    out.rows.push_back({std::move(name), std::move(type), depth, std::move(shape), params, flops, leaf, std::move(note)});
  };
  auto linear = [&](const std::string& name, int depth, int64_t in, int64_t outf, bool bias) {
    row(name, "Linear", depth, {b, s, outf}, in * outf + (bias ? outf : 0), 2.0 * tokens * static_cast<double>(in * outf),
        true);
  };
  const double attn_core = tokens * fl.attention_forward;
  const int64_t norm_params = m.arch == Arch::gpt ? (m.bias ? 2 * h : h) : h;

  auto block = [&](const std::string& p, int depth) {
    const BlockParams bp = pc.block;
    if (m.arch == Arch::gpt) {
      row(p, "GPTBlock", depth, {b, s, h}, bp.total(), tokens * fl.layer_forward, false);
      row(p + ".ln_1", "LayerNorm", depth + 1, {b, s, h}, norm_params, 0, true);
      row(p + ".attn", "CausalSelfAttention", depth + 1, {b, s, h}, bp.attention,
          2.0 * tokens * static_cast<double>(4 * h * h) + attn_core, false);
      linear(p + ".attn.c_attn", depth + 2, h, 3 * h, m.bias);
      row(p + ".attn.sdpa", "scaled_dot_product_attention", depth + 2, {b, a, s, d}, 0, attn_core, true,
          "QK^T and AV, full s x s");
      linear(p + ".attn.c_proj", depth + 2, h, h, m.bias);
      row(p + ".ln_2", "LayerNorm", depth + 1, {b, s, h}, norm_params, 0, true);
      row(p + ".mlp", "MLP", depth + 1, {b, s, h}, bp.mlp, 2.0 * tokens * static_cast<double>(2 * h * f), false);
      linear(p + ".mlp.c_fc", depth + 2, h, f, m.bias);
      linear(p + ".mlp.c_proj", depth + 2, f, h, m.bias);
    } else {
      row(p, "LlamaBlock", depth, {b, s, h}, bp.total(), tokens * fl.layer_forward, false);
      row(p + ".self_attn", "LlamaAttention", depth + 1, {b, s, h}, bp.attention,
          2.0 * tokens * static_cast<double>(2 * h * a * d + 2 * h * kv * d) + attn_core, false);
      linear(p + ".self_attn.q_proj", depth + 2, h, a * d, false);
      linear(p + ".self_attn.k_proj", depth + 2, h, kv * d, false);
      linear(p + ".self_attn.v_proj", depth + 2, h, kv * d, false);
      row(p + ".self_attn.sdpa", "scaled_dot_product_attention", depth + 2, {b, a, s, d}, 0, attn_core, true,
          "QK^T and AV, full s x s; RoPE on q, k");
      linear(p + ".self_attn.o_proj", depth + 2, a * d, h, false);
      row(p + ".mlp", "SwiGLU", depth + 1, {b, s, h}, bp.mlp, 2.0 * tokens * static_cast<double>(3 * h * f), false);
      linear(p + ".mlp.gate_proj", depth + 2, h, f, false);
      linear(p + ".mlp.up_proj", depth + 2, h, f, false);
      linear(p + ".mlp.down_proj", depth + 2, f, h, false);
      row(p + ".input_layernorm", "RMSNorm", depth + 1, {b, s, h}, h, 0, true);
      row(p + ".post_attention_layernorm", "RMSNorm", depth + 1, {b, s, h}, h, 0, true);
    }
  };
  // A block row stands for its children when folded; only children are leaves.
  auto blocks = [&](const std::string& prefix, int depth) {
    block(prefix + ".0", depth);
    if (L == 1) return;
    if (expand_blocks) {
      for (int64_t i = 1; i < L; ++i) block(prefix + "." + std::to_string(i), depth);
    } else {
      std::string name = prefix, note = "x";
      name.append(".1-").append(std::to_string(L - 1));
      note.append(std::to_string(L - 1)).append(", each like ").append(prefix).append(".0");
      row(name, m.arch == Arch::gpt ? "GPTBlock" : "LlamaBlock", depth, {b, s, h}, (L - 1) * pc.block.total(),
          static_cast<double>(L - 1) * tokens * fl.layer_forward, true, note);
    }
  };
  if (m.arch == Arch::gpt) {
    row("transformer.wte", "Embedding", 0, {b, s, h}, pc.embedding, 0, true);
    row("transformer.wpe", "Embedding", 0, {s, h}, pc.position, 0, true);
    blocks("transformer.h", 0);
    row("transformer.ln_f", "LayerNorm", 0, {b, s, h}, pc.final_norm, 0, true);
    row("lm_head", "Linear", 0, {b, s, V}, 0, tokens * fl.head_forward, true, "tied: x @ transformer.wte.weight^T");
  } else {
    row("model.embed_tokens", "Embedding", 0, {b, s, h}, pc.embedding, 0, true);
    blocks("model.layers", 0);
    row("model.norm", "RMSNorm", 0, {b, s, h}, pc.final_norm, 0, true);
    row("lm_head", "Linear", 0, {b, s, V}, pc.head, tokens * fl.head_forward, true);
  }
  for (const auto& r : out.rows)
    if (r.leaf) out.total_params += r.params, out.total_flops += r.flops;
  return out;
}

}  // namespace forge::plan
