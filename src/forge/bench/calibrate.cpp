// forge bench calibrate: an efficiency profile from microbenchmarks (contract in calibrate.h).
#include "forge/bench/calibrate.h"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <sstream>

#include "forge/bench/attention.h"
#include "forge/bench/gpu_info.h"
#include "forge/bench/memory.h"
#include "forge/core/error.h"
#include "forge/plan/gpu_catalog.h"

namespace forge::bench {

std::vector<GemmShape> calibrate_gemm_shapes(bool quick) {
  std::vector<GemmShape> v;
  const std::vector<int64_t> squares = quick ? std::vector<int64_t>{1024, 4096} : std::vector<int64_t>{1024, 2048, 4096, 8192, 16384};
  for (int64_t s : squares) v.push_back({s, s, s});
  const std::vector<int64_t> widths = quick ? std::vector<int64_t>{768, 3072}
                                            : std::vector<int64_t>{768, 1024, 2048, 3072, 4096, 8192, 16384};
  const std::vector<int64_t> tokens = quick ? std::vector<int64_t>{4096} : std::vector<int64_t>{4096, 16384};
  for (int64_t m : tokens)
    for (int64_t n : widths)
      for (int64_t k : widths) v.push_back({m, n, k});
  // Weight gradients: (out x in) from a contraction over the tokens.
  for (int64_t m : widths)
    for (int64_t n : widths)
      if (!quick || m == n) v.push_back({m, n, tokens.back()});
  return v;
}

namespace {

std::string today() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d", &tm);
  return buf;
}

}  // namespace

plan::GpuProfile calibrate(const CalibrateOptions& opt, const std::string& gpu_override) {
  FORGE_CHECK(opt.device.is_cuda(), "bench calibrate: efficiency profiles describe GPUs; the CPU is planned with "
                                    "`forge plan --gpu cpu` (its f32 peak measured) and --mfu");
  const GpuSystemInfo sys = gpu_info();
  FORGE_CHECK(opt.device.index >= 0 && opt.device.index < static_cast<int>(sys.gpus.size()), "bench calibrate: ",
              opt.device.str(), " is not a CUDA device of this machine (", sys.gpus.size(), " visible)");
  const GpuInfo& g = sys.gpus[static_cast<size_t>(opt.device.index)];
  const std::string entry = !gpu_override.empty() ? plan::find_gpu(gpu_override).name : g.catalogue;
  FORGE_CHECK(!entry.empty(), "bench calibrate: '", g.name, "' is not in forge plan's GPU catalogue; name the entry "
              "it is with --gpu (forge plan --list-gpus)");
  plan::GpuProfile p;
  p.gpu = entry;
  p.measured_on = g.name;
  p.sms = g.sm_count;
  std::ostringstream src;
  src << "measured by forge bench calibrate (forge " << FORGE_VERSION << ") on " << g.name << " (" << g.sm_count
      << " SMs), " << today() << ":";

  // GEMMs.
  GemmOptions go;
  go.device = opt.device;
  go.shapes = calibrate_gemm_shapes(opt.quick);
  go.shapes.insert(go.shapes.end(), opt.extra.begin(), opt.extra.end());
  go.repeats = opt.repeats;
  // Each shape warmed up for 300 ms of back-to-back products before it is timed: a training step
  // keeps the card at its power limit, and a short burst of a small product would be timed at
  // boost clocks it never sees in a step (the clock settles within tens of milliseconds).
  go.warmup_ms = opt.quick ? 20 : 300;
  go.dtypes = {"bf16"};
  if (g.cc_major * 10 + g.cc_minor >= 89) go.dtypes.push_back("fp8");
  const GemmReport gr = run_gemm(go);
  for (const std::string& dt : go.dtypes) {
    std::vector<plan::GemmPoint> pts;
    for (const auto& r : gr.results)
      if (r.dtype == dt && r.tflops > 0) pts.push_back({r.shape.m, r.shape.n, r.shape.k, r.tflops});
    if (pts.empty()) continue;
    // Hopper's cuBLASLt kernels mostly tile 128 x 256; Ampere's and Ada's 128 x 128.
    const int64_t tile_n = g.cc_major >= 9 ? 256 : 128;
    // (bounded by the catalogue's dense peak of the precision: plan::fit_gemm)
    const plan::Precision prec = dt == "fp8" ? plan::Precision::fp8 : plan::Precision::bf16;
    const plan::GemmEfficiency e =
        plan::fit_gemm(pts, g.sm_count, 128, tile_n, plan::find_gpu(entry).peak_flops(prec) / 1e12);
    p.gemm[dt == "fp8" ? plan::Precision::fp8 : plan::Precision::bf16] = e;
    src << " " << dt << " GEMMs (" << pts.size() << " shapes: sustained " << e.sustained_tflops
        << " TFLOP/s, k_half " << e.k_half << ");";
  }
  FORGE_CHECK(p.gemm.count(plan::Precision::bf16) > 0, "bench calibrate: no bf16 GEMM could be timed on ", g.name);

  // Attention: the back-end training takes (auto: cuDNN, else flash), per shape.
  AttentionOptions ao;
  ao.device = opt.device;
  ao.shapes = default_attention_shapes(opt.device);
  if (opt.quick) ao.shapes.resize(std::min<size_t>(ao.shapes.size(), 2));
  ao.backends = default_attention_backends(opt.device);
  ao.repeats = opt.repeats;
  ao.layout = "bshd";  // as forge's models hand it q, k and v
  const AttentionReport ar = run_attention(ao);
  std::vector<std::pair<int64_t, int64_t>> seen;
  for (const std::string want : {"cudnn", "flash"})
    for (const auto& r : ar.results) {
      if (r.backend != want || !r.skipped.empty() || r.fwd_tflops <= 0 || r.bwd_tflops <= 0) continue;
      const std::pair<int64_t, int64_t> key{r.shape.seq, r.shape.head_dim};
      if (std::find(seen.begin(), seen.end(), key) != seen.end()) continue;  // (cuDNN's kept)
      seen.push_back(key);
      p.attention.push_back({r.shape.seq, r.shape.head_dim, r.fwd_tflops, r.bwd_tflops});
    }
  FORGE_CHECK(!p.attention.empty(), "bench calibrate: no attention shape could be timed on ", g.name);
  src << " attention (" << p.attention.size() << " causal shapes, cuDNN where it runs, else flash);";

  // Copies.
  MemoryOptions mo;
  mo.device = opt.device;
  mo.sizes = {opt.quick ? int64_t{16} << 20 : int64_t{256} << 20};
  mo.host = false;
  mo.peer = false;
  mo.repeats = opt.repeats;
  const MemoryReport mr = run_memory(mo);
  for (const auto& r : mr.results)
    if (r.kernel == "copy") p.memory_gbs = std::max(p.memory_gbs, r.gbs);
  FORGE_CHECK(p.memory_gbs > 0, "bench calibrate: the copy bandwidth could not be measured on ", g.name);
  src << " copies " << p.memory_gbs << " GB/s (" << mo.sizes.front() << " f32 elements)";
  p.source = src.str();
  return p;
}

}  // namespace forge::bench
