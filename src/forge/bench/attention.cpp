#include "forge/bench/attention.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <sstream>

#include "forge/autograd/grad_mode.h"
#include "forge/backends/cpu/attention.h"
#include "forge/bench/gemm.h"
#include "forge/bench/host_info.h"
#include "forge/core/error.h"
#include "forge/ops/creation.h"
#include "forge/telemetry/mfu.h"

#ifdef FORGE_WITH_CUDA
#include "forge/backends/cuda/attention.h"
#include "forge/backends/cuda/cudnn_attention.h"
#include "forge/backends/cuda/event_timer.h"
#include "forge/backends/cuda/flash_attention.h"
#endif

namespace forge::bench {

namespace {

constexpr const char* kFormat = "BxHxHKVxTxD[,full], e.g. 4x32x8x2048x128";

std::vector<std::string> split_on(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep)) out.push_back(item);
  return out;
}

// Median milliseconds of `repeats` runs of fn after `warmup` untimed ones.
double time_ms(Device device, int warmup, int repeats, const std::function<void()>& fn) {
  for (int i = 0; i < warmup; ++i) fn();
#ifdef FORGE_WITH_CUDA
  if (device.is_cuda()) {
    cuda::synchronize_current_stream(device.index);
    return median(cuda::time_with_events(device.index, repeats, fn));
  }
#endif
  (void)device;
  std::vector<double> ms;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return median(ms);
}

}  // namespace

AttentionShape parse_attention_shape(const std::string& spec) {
  std::vector<std::string> parts = split_on(spec, ',');
  FORGE_CHECK(!parts.empty() && parts.size() <= 2, "bench attention: shape '", spec, "' is not ", kFormat);
  AttentionShape s;
  if (parts.size() == 2) {
    FORGE_CHECK(parts[1] == "full" || parts[1] == "causal", "bench attention: shape '", spec, "': after the comma ",
                "use 'full' (not causal) or 'causal'; format ", kFormat);
    s.causal = parts[1] == "causal";
  }
  const std::vector<std::string> dims = split_on(parts[0], 'x');
  FORGE_CHECK(dims.size() == 5, "bench attention: shape '", spec, "' is not ", kFormat);
  int64_t v[5];
  for (size_t i = 0; i < 5; ++i) {
    size_t used = 0;
    try {
      v[i] = std::stoll(dims[i], &used);
    } catch (const std::exception&) {
      used = 0;
    }
    FORGE_CHECK(used == dims[i].size() && used > 0 && v[i] > 0, "bench attention: shape '", spec,
                "': every size must be a positive integer; format ", kFormat);
  }
  s.batch = v[0], s.heads = v[1], s.kv_heads = v[2], s.seq = v[3], s.head_dim = v[4];
  FORGE_CHECK(s.heads % s.kv_heads == 0, "bench attention: shape '", spec, "': kv heads (", s.kv_heads,
              ") must divide heads (", s.heads, ")");
  return s;
}

std::string shape_str(const AttentionShape& s) {
  return std::to_string(s.batch) + "x" + std::to_string(s.heads) + "x" + std::to_string(s.kv_heads) + "x" +
         std::to_string(s.seq) + "x" + std::to_string(s.head_dim) + (s.causal ? "" : ",full");
}

std::vector<AttentionShape> default_attention_shapes(Device device) {
  if (device.is_cpu()) return {{1, 4, 2, 256, 64, true}};
  std::vector<AttentionShape> out;
  for (int64_t T : {1024, 2048, 4096, 8192}) out.push_back({16384 / T, 12, 12, T, 64, true});
  for (int64_t T : {1024, 2048, 4096, 8192}) out.push_back({16384 / T, 16, 4, T, 64, true});
  for (int64_t T : {1024, 2048, 4096, 8192}) out.push_back({16384 / T, 32, 8, T, 128, true});
  return out;
}

std::vector<std::string> default_attention_backends(Device device) {
  if (device.is_cpu()) return {"cpu"};
  return {"cudnn", "flash"};
}

std::vector<std::string> parse_attention_backends(const std::string& spec, Device device) {
  const std::vector<std::string> known =
      device.is_cpu() ? std::vector<std::string>{"cpu"}
                      : std::vector<std::string>{"cudnn", "cudnn-det", "flash", "composed"};
  std::vector<std::string> out;
  for (const std::string& b : split_on(spec, ',')) {
    FORGE_CHECK(std::find(known.begin(), known.end(), b) != known.end(), "bench attention: back-end '", b,
                "' is not one of ", device.is_cpu() ? "cpu (on the CPU)" : "cudnn, cudnn-det, flash, composed");
    if (std::find(out.begin(), out.end(), b) == out.end()) out.push_back(b);
  }
  FORGE_CHECK(!out.empty(), "bench attention: --backends is empty");
  return out;
}

double attention_forward_flops(const AttentionShape& s) {
  const double f = 4.0 * static_cast<double>(s.batch) * static_cast<double>(s.heads) * static_cast<double>(s.seq) *
                   static_cast<double>(s.seq) * static_cast<double>(s.head_dim);
  return s.causal ? f / 2 : f;
}

double attention_backward_flops(const AttentionShape& s) { return 2.5 * attention_forward_flops(s); }

namespace {

// Note [attention layouts]: a fused attention kernel reads and writes rows of D elements at any
// row stride, so the same call runs on (B, H, T, D)-contiguous tensors ("bhsd", PyTorch's usual
// layout after a transpose and a copy) and on (B, T, H, D) memory viewed as (B, H, T, D) ("bshd":
// the heads of a token side by side, as a projection writes them; forge's GPT and LLaMA hand
// attention such views and allocate out and the gradients in the same order). The kernels'
// memory access differs between the two (the rows of one head are H x D apart in bshd), and so
// may their speed: `--layout` times either. The CPU kernel reads strided inputs but writes
// contiguous outputs, so there only q, k, v and dout follow the layout.
Tensor bench_tensor(int64_t B, int64_t h, int64_t T, int64_t D, bool bshd, bool random, const TensorOptions& o,
                    Generator* gen) {
  if (!bshd) return random ? randn({B, h, T, D}, o, gen) : empty({B, h, T, D}, o);
  const Tensor t = random ? randn({B, T, h, D}, o, gen) : empty({B, T, h, D}, o);
  return t.transpose(1, 2);
}

// One back-end on one shape: fills fwd_ms / bwd_ms or `skipped`.
void run_one(const AttentionOptions& opt, const AttentionShape& s, AttentionResult& r) {
  const Device dev = opt.device;
  const DType dt = opt.dtype;
  const int64_t B = s.batch, H = s.heads, Hkv = s.kv_heads, T = s.seq, D = s.head_dim;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  Generator gen(1234);
  const TensorOptions o{.dtype = dt, .device = dev};
  const bool bshd = opt.layout == "bshd", out_bshd = bshd && r.backend != "cpu";
  const auto input = [&](int64_t h) { return bench_tensor(B, h, T, D, bshd, true, o, &gen); };
  const auto output = [&](int64_t h) { return bench_tensor(B, h, T, D, out_bshd, false, o, nullptr); };
  const Tensor q = input(H), k = input(Hkv), v = input(Hkv), dout = input(H);
  Tensor out = output(H), lse = empty({B, H, T}, {.dtype = DType::f32, .device = dev});
  Tensor dq = output(H), dk = output(Hkv), dv = output(Hkv);
  std::function<void()> fwd, bwd;
  if (r.backend == "cpu") {
    fwd = [&] { cpu::attention_forward(q, k, v, Tensor(), s.causal, scale, out, lse); };
    bwd = [&] { cpu::attention_backward(dout, q, k, v, Tensor(), out, lse, s.causal, scale, dq, dk, dv); };
  }
#ifdef FORGE_WITH_CUDA
  if (r.backend == "cudnn" || r.backend == "cudnn-det") {
    if (!cuda::cudnn_attention_applies(q, k, v, Tensor(), s.causal)) {
      r.skipped = cuda::cudnn_attention_available() ? "outside cuDNN attention's shapes (head dim <= 128, multiple of 8)"
                                                    : "cuDNN attention unavailable: " + cuda::cudnn_version_string();
      return;
    }
    if (!cuda::cudnn_attention_forward(q, k, v, s.causal, scale, out, lse)) {
      r.skipped = "cuDNN declined the forward graph";
      return;
    }
    const bool det = r.backend == "cudnn-det";
    if (!cuda::cudnn_attention_backward(dout, q, k, v, out, lse, s.causal, scale, det, dq, dk, dv)) {
      r.skipped = det ? "cuDNN has no deterministic backward for this shape" : "cuDNN declined the backward graph";
      return;
    }
    fwd = [&] { cuda::cudnn_attention_forward(q, k, v, s.causal, scale, out, lse); };
    bwd = [&, det] { cuda::cudnn_attention_backward(dout, q, k, v, out, lse, s.causal, scale, det, dq, dk, dv); };
  } else if (r.backend == "flash") {
    if (!cuda::flash_attention_applies(q, k, v, Tensor())) {
      r.skipped = cuda::flash_attention_enabled() ? "outside forge's flash kernels (head dim 64 or 128)"
                                                  : "FORGE_FLASH_ATTENTION=0";
      return;
    }
    fwd = [&] { cuda::flash_attention_forward(q, k, v, s.causal, scale, out, lse); };
    bwd = [&] { cuda::flash_attention_backward(dout, q, k, v, out, lse, s.causal, scale, dq, dk, dv); };
  } else if (r.backend == "composed") {
    fwd = [&] {
      const cuda::AttentionBackend prev = cuda::attention_backend();
      cuda::set_attention_backend(cuda::AttentionBackend::composed);
      cuda::attention_forward(q, k, v, Tensor(), s.causal, scale, out, lse);
      cuda::set_attention_backend(prev);
    };
    bwd = [&] {
      const cuda::AttentionBackend prev = cuda::attention_backend();
      cuda::set_attention_backend(cuda::AttentionBackend::composed);
      cuda::attention_backward(dout, q, k, v, Tensor(), out, lse, s.causal, scale, dq, dk, dv);
      cuda::set_attention_backend(prev);
    };
  }
#endif
  FORGE_CHECK(fwd && bwd, "bench attention: back-end '", r.backend, "' cannot run on ", dev.str());
  fwd();  // out and lse for the backward
  r.fwd_ms = time_ms(dev, opt.warmup_runs, opt.repeats, fwd);
  r.bwd_ms = time_ms(dev, opt.warmup_runs, opt.repeats, bwd);
  r.fwd_tflops = r.fwd_ms > 0 ? attention_forward_flops(s) / (r.fwd_ms * 1e-3) / 1e12 : 0;
  r.bwd_tflops = r.bwd_ms > 0 ? attention_backward_flops(s) / (r.bwd_ms * 1e-3) / 1e12 : 0;
}

}  // namespace

AttentionReport run_attention(const AttentionOptions& opt) {
  FORGE_CHECK(!opt.shapes.empty(), "bench attention: no shapes to run");
  FORGE_CHECK(!opt.backends.empty(), "bench attention: no back-ends to run");
  FORGE_CHECK(opt.repeats >= 1, "bench attention: --repeats must be >= 1, got ", opt.repeats);
  FORGE_CHECK(opt.warmup_runs >= 0, "bench attention: --warmup must be >= 0, got ", opt.warmup_runs);
  FORGE_CHECK(opt.layout == "bhsd" || opt.layout == "bshd", "bench attention: --layout is bhsd or bshd, got '",
              opt.layout, "'");
#ifndef FORGE_WITH_CUDA
  FORGE_CHECK(opt.device.is_cpu(), "bench attention: ", opt.device.str(),
              " requested but forge was built without CUDA");
#endif
  if (opt.device.is_cuda())
    FORGE_CHECK(opt.dtype == DType::bf16 || opt.dtype == DType::f16, "bench attention: --dtype ",
                dtype_name(opt.dtype), " on a GPU: use bf16 or f16 (the fused kernels' dtypes)");
  else
    FORGE_CHECK(opt.dtype == DType::f32 || opt.dtype == DType::f64, "bench attention: --dtype ",
                dtype_name(opt.dtype), " on the CPU: use f32 or f64");
  NoGradGuard no_grad;
  AttentionReport rep;
  rep.options = opt;
  rep.device = opt.device.str();
  if (opt.device.is_cuda()) {
    rep.timer = "cuda events";
    rep.device_name = telemetry::device_name(opt.device);
#ifdef FORGE_WITH_CUDA
    rep.cudnn_version = cuda::cudnn_version_string();
#endif
  } else {
    rep.timer = "steady_clock";
    rep.device_name = host_info().cpu_model;
  }
  for (const AttentionShape& s : opt.shapes)
    for (const std::string& b : opt.backends) {
      AttentionResult r;
      r.shape = s;
      r.backend = b;
      run_one(opt, s, r);
      rep.results.push_back(r);
    }
  return rep;
}

nlohmann::json to_json(const AttentionReport& r) {
  nlohmann::json j;
  j["bench"] = "attention";
  j["device"] = r.device;
  j["device_name"] = r.device_name;
  j["cudnn_version"] = r.cudnn_version;
  j["dtype"] = dtype_name(r.options.dtype);
  j["layout"] = r.options.layout;
  j["method"] = {{"timer", r.timer},
                 {"statistic", "median"},
                 {"repeats", r.options.repeats},
                 {"warmup_runs", r.options.warmup_runs},
                 {"flops", "forward 4 B H T S D (halved when causal), backward 2.5 x forward"}};
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& x : r.results) {
    nlohmann::json row = {{"shape", shape_str(x.shape)}, {"batch", x.shape.batch},   {"heads", x.shape.heads},
                          {"kv_heads", x.shape.kv_heads}, {"seq", x.shape.seq},     {"head_dim", x.shape.head_dim},
                          {"causal", x.shape.causal},     {"backend", x.backend}};
    if (!x.skipped.empty()) {
      row["skipped"] = x.skipped;
    } else {
      row["fwd_ms"] = x.fwd_ms;
      row["bwd_ms"] = x.bwd_ms;
      row["fwd_tflops"] = x.fwd_tflops;
      row["bwd_tflops"] = x.bwd_tflops;
    }
    rows.push_back(row);
  }
  j["results"] = rows;
  return j;
}

}  // namespace forge::bench
