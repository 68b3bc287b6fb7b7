#include "forge/bench/layer.h"

#include <chrono>
#include <functional>

#include "forge/autograd/engine.h"
#include "forge/bench/gemm.h"
#include "forge/bench/host_info.h"
#include "forge/core/env.h"
#include "forge/core/error.h"
#include "forge/nn/gpt.h"
#include "forge/nn/layers.h"
#include "forge/ops/attention.h"
#include "forge/ops/binary.h"
#include "forge/ops/creation.h"
#include "forge/ops/join.h"
#include "forge/ops/matmul.h"
#include "forge/ops/norm.h"
#include "forge/ops/unary.h"
#include "forge/ops/view.h"
#include "forge/telemetry/mfu.h"

#ifdef FORGE_WITH_CUDA
#include "forge/backends/cuda/bench_kernels.h"
#include "forge/backends/cuda/event_timer.h"
#endif

namespace forge::bench {

namespace {

double elapsed_ms(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// nn::MLP's switch (nn::Linear::forward_gelu, src/forge/nn/linear.cpp): on CUDA the
// up-projection and GELU are one GEMM unless FORGE_GELU_FUSION=0.
bool gelu_fused_on(Device d) {
  return d.is_cuda() && env::flag("FORGE_GELU_FUSION");
}

LayerPart gemm_part(const std::string& name, double m, double k, double n, double e) {
  LayerPart p{name, "gemm"};
  p.flops_fwd = 2 * m * k * n;
  p.flops_bwd = 2 * p.flops_fwd;                // dX = dY W and dW = dY^T X
  p.bytes_fwd = (m * k + k * n + m * n) * e;    // read X, W; write Y
  p.bytes_bwd = 2 * p.bytes_fwd;                // each backward GEMM moves as much
  p.op_flops_fwd = p.flops_fwd;
  p.op_flops_bwd = p.flops_bwd;
  return p;
}

LayerPart memory_part(const std::string& name, const std::string& kind, double bytes_fwd, double bytes_bwd,
                      double op_fwd, double op_bwd) {
  LayerPart p{name, kind};
  p.bytes_fwd = bytes_fwd;
  p.bytes_bwd = bytes_bwd;
  p.op_flops_fwd = op_fwd;
  p.op_flops_bwd = op_bwd;
  return p;
}

// One part (or the whole block) made runnable: forward from its leaves, the upstream gradients
// of its outputs.
struct Runner {
  std::function<TensorList()> forward;
  TensorList grads;             // one per output of forward
  std::vector<Tensor> leaves;   // their .grad is dropped before each run
};

LayerTiming time_runner(const LayerOptions& opt, Runner& r, nn::Module& block) {
  const auto run_once = [&](const std::function<void()>& after_fwd, const std::function<void()>& after_bwd) {
    for (Tensor& t : r.leaves) t.zero_grad();
    block.zero_grad();
    TensorList out = r.forward();
    after_fwd();
    autograd::backward(out, r.grads);
    after_bwd();
  };
  std::vector<double> fwd, bwd;
  const auto t0 = std::chrono::steady_clock::now();
  if (opt.device.is_cuda()) {
#ifdef FORGE_WITH_CUDA
    const int dev = opt.device.index;
    for (int i = 0; i < opt.warmup_runs || elapsed_ms(t0) < opt.warmup_ms; ++i) {
      run_once([] {}, [] {});
      cuda::synchronize_current_stream(dev);
    }
    cuda::EventMarks ev(dev);
    for (int i = 0; i < opt.repeats; ++i) {
      ev.mark();
      run_once([&] { ev.mark(); }, [&] { ev.mark(); });
    }
    ev.synchronize();
    for (int i = 0; i < opt.repeats; ++i) {
      fwd.push_back(ev.ms(3 * i, 3 * i + 1));
      bwd.push_back(ev.ms(3 * i + 1, 3 * i + 2));
    }
#endif
  } else {
    for (int i = 0; i < opt.warmup_runs || elapsed_ms(t0) < opt.warmup_ms; ++i) run_once([] {}, [] {});
    for (int i = 0; i < opt.repeats; ++i) {
      std::chrono::steady_clock::time_point a = std::chrono::steady_clock::now(), b;
      run_once([&] { b = std::chrono::steady_clock::now(); }, [] {});
      fwd.push_back(std::chrono::duration<double, std::milli>(b - a).count());
      bwd.push_back(elapsed_ms(b));
    }
  }
  return LayerTiming{median(fwd), median(bwd)};
}

}  // namespace

LayerConfig default_layer_config(Device device) {
  if (device.is_cuda()) return LayerConfig{16, 1024, 768, 12, DType::bf16};
  return LayerConfig{2, 64, 128, 4, DType::f32};
}

void validate(const LayerConfig& c) {
  FORGE_CHECK(c.batch > 0 && c.seq > 0 && c.width > 0 && c.heads > 0, "bench layer: batch, seq, width and heads must be ",
              "positive, got ", c.batch, ", ", c.seq, ", ", c.width, ", ", c.heads);
  FORGE_CHECK(c.width % c.heads == 0, "bench layer: heads = ", c.heads, " must divide width = ", c.width);
  FORGE_CHECK(is_floating(c.dtype), "bench layer: expected a floating dtype, got ", dtype_name(c.dtype));
}

double layer_ffn_flops(const LayerConfig& c) {
  const double b = static_cast<double>(c.batch), s = static_cast<double>(c.seq), h = static_cast<double>(c.width);
  return 16 * b * s * h * h;
}

double layer_attention_flops(const LayerConfig& c) {
  const double b = static_cast<double>(c.batch), s = static_cast<double>(c.seq), h = static_cast<double>(c.width);
  return 8 * b * s * h * h + 4 * b * s * s * h;
}

double layer_forward_flops(const LayerConfig& c) { return layer_ffn_flops(c) + layer_attention_flops(c); }
double layer_training_flops(const LayerConfig& c) { return 3 * layer_forward_flops(c); }

std::vector<LayerPart> layer_parts(const LayerConfig& c, bool fused_gelu) {
  const double b = static_cast<double>(c.batch), s = static_cast<double>(c.seq), h = static_cast<double>(c.width);
  const double e = static_cast<double>(element_size(c.dtype));
  const double tokens = b * s, n = tokens * h;  // n: elements of one (b, s, h) activation
  std::vector<LayerPart> parts;
  // layer_norm: read x, write y; backward reads dy and x, writes dx. ~8 / 12 FLOPs per element.
  parts.push_back(memory_part("ln_1", "norm", 2 * n * e, 3 * n * e, 8 * n, 12 * n));
  parts.push_back(gemm_part("qkv", tokens, h, 3 * h, e));
  LayerPart attn{"attention", "attention"};
  attn.flops_fwd = 4 * b * s * s * h;  // q k^T and p v, 2 b s^2 h each
  attn.flops_bwd = 2 * attn.flops_fwd;
  attn.bytes_fwd = 4 * n * e;          // read q, k, v; write o (flash attention: no s x s matrix)
  attn.bytes_bwd = 8 * n * e;          // read q, k, v, o, do; write dq, dk, dv
  attn.op_flops_fwd = attn.flops_fwd;
  attn.op_flops_bwd = attn.flops_bwd;
  parts.push_back(attn);
  parts.push_back(gemm_part("attn_proj", tokens, h, h, e));
  // add_layer_norm: read x, r; write h, y. Backward: read dy, dh, h; write the gradient of x and r.
  parts.push_back(memory_part("residual_ln_2", "norm", 4 * n * e, 4 * n * e, 9 * n, 13 * n));
  if (fused_gelu) {
    LayerPart fc = gemm_part("mlp_fc_gelu", tokens, h, 4 * h, e);
    fc.bytes_fwd += 4 * n * e;       // writes the pre-activation too
    fc.bytes_bwd += 3 * 4 * n * e;   // the GELU backward: read g, pre; write
    parts.push_back(fc);
  } else {
    parts.push_back(gemm_part("mlp_fc", tokens, h, 4 * h, e));
    // gelu (tanh): read x, write y; backward reads g and x, writes dx. ~10 / 15 FLOPs per element.
    parts.push_back(memory_part("gelu", "activation", 2 * 4 * n * e, 3 * 4 * n * e, 10 * 4 * n, 15 * 4 * n));
  }
  parts.push_back(gemm_part("mlp_proj", tokens, 4 * h, h, e));
  // residual add: read a, b, write; the backward passes the gradient through unchanged.
  parts.push_back(memory_part("residual", "residual", 3 * n * e, 0, n, 0));
  return parts;
}

LayerReport run_layer(const LayerOptions& opt) {
  const LayerConfig& c = opt.config;
  validate(c);
  FORGE_CHECK(opt.repeats >= 1, "bench layer: --repeats must be >= 1, got ", opt.repeats);
  FORGE_CHECK(opt.warmup_runs >= 0, "bench layer: --warmup must be >= 0, got ", opt.warmup_runs);
#ifndef FORGE_WITH_CUDA
  FORGE_CHECK(opt.device.is_cpu(), "bench layer: ", opt.device.str(), " requested but forge was built without CUDA");
#endif
  LayerReport rep;
  rep.options = opt;
  rep.device = opt.device.str();
  rep.timer = opt.device.is_cuda() ? "cuda events" : "steady_clock";
  rep.device_name = opt.device.is_cuda() ? telemetry::device_name(opt.device) : host_info().cpu_model;
  rep.fused_gelu = gelu_fused_on(opt.device);

  nn::GPTConfig gc;
  gc.n_embd = c.width;
  gc.n_head = c.heads;
  gc.block_size = c.seq;
  gc.dropout = 0.0;
  gc.bias = true;
  nn::GPTBlock block(gc);
  block.to(opt.device, c.dtype);
  block.train(true);

  const int64_t B = c.batch, T = c.seq, C = c.width, H = c.heads, D = C / H;
  const TensorOptions to{.dtype = c.dtype, .device = opt.device};
  Generator gen(4321);
  const auto leaf = [&](const Shape& s) {
    Tensor t = randn(s, to, &gen);
    t.requires_grad_(true);
    return t;
  };
  const auto grad = [&](const Shape& s) { return randn(s, to, &gen); };
  const Shape bth{B, T, C}, bt3h{B, T, 3 * C}, bt4h{B, T, 4 * C};

  // The whole block, as the model runs it.
  {
    Tensor x = leaf(bth);
    Runner r{[&] { return TensorList{block.forward(x)}; }, {grad(bth)}, {x}};
    rep.block = time_runner(opt, r, block);
  }
  rep.block_flops = layer_training_flops(c);
  rep.block_tflops = rep.block.total_ms() > 0 ? rep.block_flops / (rep.block.total_ms() * 1e-3) / 1e12 : 0;

  for (const LayerPart& p : layer_parts(c, rep.fused_gelu)) {
    Runner r;
    if (p.name == "ln_1") {
      Tensor x = leaf(bth);
      r = {[&, x] { return TensorList{ops::layer_norm(x, block.ln_1->weight, block.ln_1->bias, block.ln_1->eps)}; },
           {grad(bth)}, {x}};
    } else if (p.name == "qkv") {
      Tensor x = leaf(bth);
      r = {[&, x] { return TensorList{ops::linear(x, block.attn->c_attn->weight, block.attn->c_attn->bias)}; },
           {grad(bt3h)}, {x}};
    } else if (p.name == "attention") {
      // The layout of CausalSelfAttention::forward: q, k, v are strided head views of the
      // (B, T, 3C) projection; the output goes back to (B, T, C).
      Tensor qkv = leaf(bt3h);
      r = {[&, qkv] {
             TensorList s = ops::split(qkv, C, -1);
             auto heads = [&](const Tensor& t) { return ops::transpose(ops::reshape(t, {B, T, H, D}), 1, 2); };
             Tensor y = ops::scaled_dot_product_attention(heads(s[0]), heads(s[1]), heads(s[2]), true);
             return TensorList{ops::reshape(ops::transpose(y, 1, 2), {B, T, C})};
           },
           {grad(bth)}, {qkv}};
    } else if (p.name == "attn_proj") {
      Tensor x = leaf(bth);
      r = {[&, x] { return TensorList{ops::linear(x, block.attn->c_proj->weight, block.attn->c_proj->bias)}; },
           {grad(bth)}, {x}};
    } else if (p.name == "residual_ln_2") {
      Tensor x = leaf(bth), res = leaf(bth);
      r = {[&, x, res] {
             ops::AddLayerNorm o = ops::add_layer_norm(x, res, block.ln_2->weight, block.ln_2->bias, block.ln_2->eps);
             return TensorList{o.h, o.y};
           },
           {grad(bth), grad(bth)}, {x, res}};
    } else if (p.name == "mlp_fc_gelu") {
      Tensor x = leaf(bth);
      r = {[&, x] { return TensorList{ops::linear_gelu(x, block.mlp->c_fc->weight, block.mlp->c_fc->bias)}; },
           {grad(bt4h)}, {x}};
    } else if (p.name == "mlp_fc") {
      Tensor x = leaf(bth);
      r = {[&, x] { return TensorList{ops::linear(x, block.mlp->c_fc->weight, block.mlp->c_fc->bias)}; },
           {grad(bt4h)}, {x}};
    } else if (p.name == "gelu") {
      Tensor x = leaf(bt4h);
      r = {[x] { return TensorList{ops::gelu(x, true)}; }, {grad(bt4h)}, {x}};
    } else if (p.name == "mlp_proj") {
      Tensor x = leaf(bt4h);
      r = {[&, x] { return TensorList{ops::linear(x, block.mlp->c_proj->weight, block.mlp->c_proj->bias)}; },
           {grad(bth)}, {x}};
    } else if (p.name == "residual") {
      Tensor a = leaf(bth), b = leaf(bth);
      r = {[a, b] { return TensorList{ops::add(a, b)}; }, {grad(bth)}, {a, b}};
    } else {
      FORGE_THROW("bench layer: no runner for part '", p.name, "'");
    }
    LayerPartResult pr;
    pr.part = p;
    pr.time = time_runner(opt, r, block);
    const double secs = pr.time.total_ms() * 1e-3;
    pr.tflops = secs > 0 ? (p.flops_fwd + p.flops_bwd) / secs / 1e12 : 0;
    pr.gbs = secs > 0 ? (p.bytes_fwd + p.bytes_bwd) / secs / 1e9 : 0;
    pr.share = rep.block.total_ms() > 0 ? pr.time.total_ms() / rep.block.total_ms() : 0;
    rep.parts_ms += pr.time.total_ms();
    rep.parts.push_back(pr);
  }
  return rep;
}

nlohmann::json to_json(const LayerReport& r) {
  const LayerConfig& c = r.options.config;
  nlohmann::json j;
  j["benchmark"] = "layer";
  j["device"] = r.device;
  j["device_name"] = r.device_name;
  j["config"] = {{"batch", c.batch}, {"seq", c.seq}, {"width", c.width}, {"heads", c.heads}, {"dtype", dtype_name(c.dtype)}};
  j["method"] = {{"timer", r.timer},
                 {"warmup_runs", r.options.warmup_runs},
                 {"warmup_ms", r.options.warmup_ms},
                 {"repeats", r.options.repeats},
                 {"statistic", "median (forward and backward separately)"},
                 {"flops", "forward: ffn 16bsh^2 + attention 8bsh^2 + 4bs^2h; backward 2x forward"},
                 {"fused_gelu", r.fused_gelu}};
  j["block"] = {{"fwd_ms", r.block.fwd_ms},
                {"bwd_ms", r.block.bwd_ms},
                {"total_ms", r.block.total_ms()},
                {"flops", r.block_flops},
                {"tflops", r.block_tflops}};
  j["parts_ms"] = r.parts_ms;
  nlohmann::json parts = nlohmann::json::array();
  for (const LayerPartResult& p : r.parts)
    parts.push_back({{"name", p.part.name},
                     {"kind", p.part.kind},
                     {"flops_fwd", p.part.flops_fwd},
                     {"flops_bwd", p.part.flops_bwd},
                     {"bytes_fwd", p.part.bytes_fwd},
                     {"bytes_bwd", p.part.bytes_bwd},
                     {"op_flops_fwd", p.part.op_flops_fwd},
                     {"op_flops_bwd", p.part.op_flops_bwd},
                     {"fwd_ms", p.time.fwd_ms},
                     {"bwd_ms", p.time.bwd_ms},
                     {"total_ms", p.time.total_ms()},
                     {"tflops", p.tflops},
                     {"gbs", p.gbs},
                     {"share", p.share}});
  j["parts"] = parts;
  return j;
}

}  // namespace forge::bench
