// Efficiency profiles (contracts in gpu_profile.h, Note [efficiency profiles]).
#include "forge/plan/gpu_profile.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>

#include "forge/core/error.h"

namespace forge::plan {

namespace {

double ceil_div(int64_t a, int64_t b) { return std::ceil(static_cast<double>(a) / static_cast<double>(b)); }

double element_bytes(Precision p) {
  switch (p) {
    case Precision::fp32: case Precision::tf32: return 4;
    case Precision::bf16: case Precision::fp16: return 2;
    case Precision::fp8: return 1;
  }
  return 2;
}

// The formula of Note [efficiency profiles], without measured points.
double model_seconds(const GemmEfficiency& g, int64_t sms, double mem_bps, Precision p, int64_t m, int64_t n,
                     int64_t k) {
  const double tiles = ceil_div(m, g.tile_m) * ceil_div(n, g.tile_n);
  const double slots = static_cast<double>(std::max<int64_t>(1, sms));
  const double waves = tiles / (std::ceil(tiles / slots) * slots);
  const double kd = static_cast<double>(k);
  const double rate = g.sustained_tflops * 1e12 * waves * kd / (kd + g.k_half);
  const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * kd;
  const double bytes = element_bytes(p) * (static_cast<double>(m) * kd + kd * static_cast<double>(n)) +
                       2.0 * static_cast<double>(m) * static_cast<double>(n);  // (16-bit out; fp8 too)
  return std::max(flops / rate, mem_bps > 0 ? bytes / mem_bps : 0.0) + g.fixed_us * 1e-6;
}

GemmEfficiency gemm(double tflops, int64_t tile_m, int64_t tile_n, double k_half, std::vector<GemmPoint> points = {}) {
  GemmEfficiency g;
  g.sustained_tflops = tflops;
  g.tile_m = tile_m;
  g.tile_n = tile_n;
  g.k_half = k_half;
  g.fixed_us = 1;
  g.points = std::move(points);
  return g;
}

// forge bench attention on an H200 (benchmarks/results/attention_NVIDIA_H200.md: cuDNN's fused
// attention, forge's default back-end, bf16, causal), scaled by `factor` for another GPU.
std::vector<AttentionPoint> measured_attention(double factor) {
  const std::vector<AttentionPoint> h200 = {
      {1024, 64, 286, 228},  {2048, 64, 365, 299},  {4096, 64, 426, 358},  {8192, 64, 468, 405},
      {1024, 128, 481, 295}, {2048, 128, 557, 385}, {4096, 128, 605, 466}, {8192, 128, 632, 478}};
  std::vector<AttentionPoint> out = h200;
  for (auto& a : out) a.fwd_tflops *= factor, a.bwd_tflops *= factor;
  return out;
}

// A GPU forge has not measured: the vendor's dense peaks (gpu_catalog) times the fractions forge
// measured on the H100 SXM (GEMM 740 / 989 = 0.748 of bf16's peak; copies 3029 / 3352 = 0.904 of
// the memory's), attention scaled by the bf16 peaks' ratio.
GpuProfile derived(const std::string& gpu, int64_t sms, int64_t tile_n) {
  const GpuSpec& spec = find_gpu(gpu);
  GpuProfile p;
  p.gpu = spec.name;
  p.sms = sms;
  const double f = 740.1 / 989.4;
  p.gemm[Precision::bf16] = gemm(spec.bf16_tflops * f, 128, tile_n, 64);
  if (spec.tf32_tflops > 0) p.gemm[Precision::tf32] = gemm(spec.tf32_tflops * f, 128, tile_n, 64);
  p.gemm[Precision::fp32] = gemm(spec.fp32_tflops * 52.1 / 66.9, 128, 128, 64);
  if (spec.fp8_tflops > 0) p.gemm[Precision::fp8] = gemm(spec.fp8_tflops * f, 128, tile_n, 64);
  p.attention = measured_attention(spec.bf16_tflops / 989.4);
  p.memory_gbs = spec.memory_bw_gbs * 3029.0 / 3352.0;
  p.source = "derived, not measured: the vendor's dense peaks (" + spec.source +
             ") times the fractions forge measured on an H100 SXM (GEMM 0.748 of the bf16 peak, copies 0.904 of the "
             "memory bandwidth), attention scaled from an H200's by the bf16 peaks; run `forge bench calibrate` on "
             "this GPU for its own";
  return p;
}

std::vector<GpuProfile> make_shipped() {
  std::vector<GpuProfile> v;
  {
    GpuProfile p;
    p.gpu = "H100 SXM";
    p.measured_on = "NVIDIA H100 80GB HBM3";
    p.sms = 132;
    // forge bench gemm, 2026-11-22 (benchmarks/results/bench_gemm_NVIDIA_H100_80GB_HBM3.md): square
    // products (forge bench calibrate measures transformer shapes too: the profile to replace this one).
    p.gemm[Precision::bf16] = fit_gemm({{1024, 1024, 1024, 164.1}, {2048, 2048, 2048, 648.4}, {4096, 4096, 4096, 771.0},
                                        {8192, 8192, 8192, 681.5}, {16384, 16384, 16384, 740.1}},
                                       132, 128, 256);
    p.gemm[Precision::tf32] = gemm(371.5, 128, 256, 64);
    p.gemm[Precision::fp32] = gemm(52.1, 128, 128, 64);
    p.gemm[Precision::fp8] = gemm(1978.9 * 740.1 / 989.4, 128, 256, 64);  // (derived: bf16's fraction)
    p.attention = measured_attention(1.0);
    p.memory_gbs = 3029;
    p.source =
        "measured by forge bench on an NVIDIA H100 80GB HBM3: GEMMs (bf16: the model fitted to the squares 1024..16384, "
        "164-771 TFLOP/s; tf32 371.5 and f32 52.1, the median of 4096..16384) in benchmarks/results/bench_gemm_NVIDIA_H100_80GB_HBM3.md, "
        "copies 3029 GB/s (1G elements, memcpy) in bench_NVIDIA_H100_80GB_HBM3.md; attention: cuDNN's on an H200 "
        "(the same GH100 SMs and clocks; attention is compute-bound), attention_NVIDIA_H200.md; fp8: 0.748 of the "
        "FP8 peak (derived, as bf16's fraction)";
    v.push_back(std::move(p));
  }
  {
    GpuProfile p = v.front();
    p.gpu = "H200 SXM";
    p.measured_on = "NVIDIA H200";
    p.memory_gbs = 4800.0 * 3029.0 / 3352.0;
    p.source =
        "attention measured by forge bench on an NVIDIA H200 (attention_NVIDIA_H200.md); GEMMs the H100 SXM's "
        "measurement (the same GH100 compute and 700 W limit); copies derived: 0.904 of 4.8 TB/s, the fraction "
        "measured on the H100";
    v.push_back(std::move(p));
  }
  v.push_back(derived("A100 SXM 80GB", 108, 128));
  v.push_back(derived("A100 SXM 40GB", 108, 128));
  v.push_back(derived("RTX 4090", 128, 128));
  v.push_back(derived("RTX 3090 Ti", 84, 128));
  return v;
}

double positive(const nlohmann::json& j, const char* key, const std::string& where) {
  FORGE_CHECK(j.is_object() && j.contains(key) && j[key].is_number(), where, ": '", key,
              "' is missing or not a number");
  const double v = j[key].get<double>();
  FORGE_CHECK(std::isfinite(v) && v > 0, where, ": '", key, "' must be a positive number, got ", v);
  return v;
}

int64_t positive_int(const nlohmann::json& j, const char* key, const std::string& where) {
  const double v = positive(j, key, where);
  FORGE_CHECK(v == std::floor(v) && v < 1e12, where, ": '", key, "' must be a positive integer, got ", v);
  return static_cast<int64_t>(v);
}

}  // namespace

const std::vector<GpuProfile>& shipped_profiles() {
  static const std::vector<GpuProfile> v = make_shipped();
  return v;
}

const GpuProfile* shipped_profile(const GpuSpec& gpu) {
  for (const auto& p : shipped_profiles())
    if (p.gpu == gpu.name) return &p;
  return nullptr;
}

nlohmann::json to_json(const GpuProfile& p) {
  nlohmann::json j = {{"gpu", p.gpu}, {"measured_on", p.measured_on}, {"source", p.source}, {"sms", p.sms},
                      {"memory_gbs", p.memory_gbs}};
  nlohmann::json g = nlohmann::json::object();
  for (const auto& [prec, e] : p.gemm) {
    nlohmann::json pts = nlohmann::json::array();
    for (const auto& x : e.points) pts.push_back({{"m", x.m}, {"n", x.n}, {"k", x.k}, {"tflops", x.tflops}});
    g[precision_name(prec)] = {{"sustained_tflops", e.sustained_tflops}, {"tile_m", e.tile_m}, {"tile_n", e.tile_n},
                               {"k_half", e.k_half}, {"fixed_us", e.fixed_us}, {"points", pts}};
  }
  j["gemm"] = g;
  nlohmann::json a = nlohmann::json::array();
  for (const auto& x : p.attention)
    a.push_back({{"seq", x.seq}, {"head_dim", x.head_dim}, {"fwd_tflops", x.fwd_tflops}, {"bwd_tflops", x.bwd_tflops}});
  j["attention"] = a;
  return j;
}

GpuProfile profile_from_json(const nlohmann::json& j, const std::string& where) {
  FORGE_CHECK(j.is_object(), where, ": an efficiency profile must be a JSON object (forge bench calibrate writes one)");
  GpuProfile p;
  FORGE_CHECK(j.contains("gpu") && j["gpu"].is_string(), where, ": 'gpu' (the catalogue name) is missing");
  p.gpu = j["gpu"].get<std::string>();
  if (j.contains("measured_on") && j["measured_on"].is_string()) p.measured_on = j["measured_on"].get<std::string>();
  if (j.contains("source") && j["source"].is_string()) p.source = j["source"].get<std::string>();
  p.sms = positive_int(j, "sms", where);
  p.memory_gbs = positive(j, "memory_gbs", where);
  FORGE_CHECK(j.contains("gemm") && j["gemm"].is_object() && !j["gemm"].empty(), where,
              ": 'gemm' must map precisions (bf16, fp8, tf32, fp32, fp16) to their rates");
  for (const auto& [name, e] : j["gemm"].items()) {
    const std::string w = where + ": gemm." + name;
    Precision prec = Precision::bf16;
    try {
      prec = parse_precision(name);
    } catch (const Error& e) {
      FORGE_THROW(w, ": ", e.what());
    }
    GemmEfficiency g;
    g.sustained_tflops = positive(e, "sustained_tflops", w);
    g.tile_m = positive_int(e, "tile_m", w);
    g.tile_n = positive_int(e, "tile_n", w);
    FORGE_CHECK(e.contains("k_half") && e["k_half"].is_number() && e["k_half"].get<double>() >= 0 &&
                    e["k_half"].get<double>() <= 1e6,
                w, ": 'k_half' must be a number in [0, 1e6]");
    g.k_half = e["k_half"].get<double>();
    FORGE_CHECK(e.contains("fixed_us") && e["fixed_us"].is_number() && e["fixed_us"].get<double>() >= 0 &&
                    e["fixed_us"].get<double>() <= 1e6,
                w, ": 'fixed_us' must be a number in [0, 1e6]");
    g.fixed_us = e["fixed_us"].get<double>();
    if (e.contains("points")) {
      FORGE_CHECK(e["points"].is_array(), w, ": 'points' must be an array of {m, n, k, tflops}");
      for (const auto& x : e["points"])
        g.points.push_back({positive_int(x, "m", w + ".points"), positive_int(x, "n", w + ".points"),
                            positive_int(x, "k", w + ".points"), positive(x, "tflops", w + ".points")});
    }
    p.gemm[prec] = std::move(g);
  }
  FORGE_CHECK(j.contains("attention") && j["attention"].is_array() && !j["attention"].empty(), where,
              ": 'attention' must list {seq, head_dim, fwd_tflops, bwd_tflops}");
  for (const auto& x : j["attention"])
    p.attention.push_back({positive_int(x, "seq", where + ": attention"), positive_int(x, "head_dim", where + ": attention"),
                           positive(x, "fwd_tflops", where + ": attention"), positive(x, "bwd_tflops", where + ": attention")});
  return p;
}

GpuProfile read_profile(const std::filesystem::path& file) {
  std::ifstream in(file);
  FORGE_CHECK(in.good(), "--profile: cannot read '", file.string(), "'");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    FORGE_THROW("--profile: '", file.string(), "' is not JSON (", e.what(), "); forge bench calibrate --out writes one");
  }
  return profile_from_json(j, "--profile '" + file.string() + "'");
}

double gemm_seconds(const GpuProfile& prof, Precision p, int64_t m, int64_t n, int64_t k) {
  if (m <= 0 || n <= 0 || k <= 0) return 0;
  const GemmEfficiency& g = gemm_efficiency(prof, p);
  for (const auto& x : g.points)
    if (x.m == m && x.n == n && x.k == k)
      return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) / (x.tflops * 1e12);
  return model_seconds(g, prof.sms, memory_bytes_per_s(prof), p, m, n, k);
}

AttentionRate attention_rate(const GpuProfile& prof, int64_t seq, int64_t head_dim) {
  FORGE_CHECK(!prof.attention.empty(), "plan: the efficiency profile of ", prof.gpu, " has no attention rates");
  int64_t best = prof.attention.front().head_dim;
  for (const auto& a : prof.attention)
    if (std::llabs(a.head_dim - head_dim) < std::llabs(best - head_dim)) best = a.head_dim;
  std::vector<AttentionPoint> pts;
  for (const auto& a : prof.attention)
    if (a.head_dim == best) pts.push_back(a);
  std::sort(pts.begin(), pts.end(), [](const AttentionPoint& a, const AttentionPoint& b) { return a.seq < b.seq; });
  const double x = std::log2(static_cast<double>(std::max<int64_t>(1, seq)));
  if (x <= std::log2(static_cast<double>(pts.front().seq))) return {pts.front().fwd_tflops * 1e12, pts.front().bwd_tflops * 1e12};
  if (x >= std::log2(static_cast<double>(pts.back().seq))) return {pts.back().fwd_tflops * 1e12, pts.back().bwd_tflops * 1e12};
  for (size_t i = 1; i < pts.size(); ++i) {
    const double x0 = std::log2(static_cast<double>(pts[i - 1].seq)), x1 = std::log2(static_cast<double>(pts[i].seq));
    if (x > x1) continue;
    const double w = x1 > x0 ? (x - x0) / (x1 - x0) : 0.0;
    return {((1 - w) * pts[i - 1].fwd_tflops + w * pts[i].fwd_tflops) * 1e12,
            ((1 - w) * pts[i - 1].bwd_tflops + w * pts[i].bwd_tflops) * 1e12};
  }
  return {pts.back().fwd_tflops * 1e12, pts.back().bwd_tflops * 1e12};
}

double memory_bytes_per_s(const GpuProfile& prof) { return prof.memory_gbs * 1e9; }

const GemmEfficiency& gemm_efficiency(const GpuProfile& prof, Precision p) {
  auto it = prof.gemm.find(p);
  if (it == prof.gemm.end() && p == Precision::fp16) it = prof.gemm.find(Precision::bf16);  // the same tensor cores
  FORGE_CHECK(it != prof.gemm.end() && it->second.sustained_tflops > 0, "plan: the efficiency profile of ", prof.gpu,
              " has no ", precision_name(p), " GEMM rate; measure one with `forge bench calibrate` or plan with --mfu");
  return it->second;
}


GemmEfficiency fit_gemm(const std::vector<GemmPoint>& points, int64_t sms, int64_t tile_m, int64_t tile_n,
                        double peak_tflops) {
  FORGE_CHECK(!points.empty(), "fit_gemm: no measured GEMMs");
  GemmEfficiency g;
  g.tile_m = tile_m;
  g.tile_n = tile_n;
  g.fixed_us = 1;
  // For each k_half the best rate in log space is exp(mean(log measured - log model at 1 TFLOP/s));
  // the pair with the least squared log-error wins. (The fixed time makes the model not exactly
  // proportional to the rate: two refinements of the rate suffice.)
  double best = std::numeric_limits<double>::infinity(), best_kh = 0, best_rate = 0;
  for (double kh = 0; kh <= 1024; kh += 8) {
    g.k_half = kh;
    double rate = 1.0;
    double err = 0;
    for (int pass = 0; pass < 4; ++pass) {
      g.sustained_tflops = rate;
      double sum = 0;
      err = 0;
      std::vector<double> d;
      for (const auto& x : points) {
        const double t = model_seconds(g, sms, 0.0, Precision::bf16, x.m, x.n, x.k);
        const double r = 2.0 * static_cast<double>(x.m) * static_cast<double>(x.n) * static_cast<double>(x.k) / t / 1e12;
        d.push_back(std::log(x.tflops / r));
        sum += d.back();
      }
      const double mean = sum / static_cast<double>(d.size());
      // (the last pass only measures the error of the rate the one before chose)
      const double shift = pass == 3 ? 0.0 : mean;
      for (double v : d) err += (v - shift) * (v - shift);
      if (pass == 3) break;
      rate *= std::exp(mean);
      if (peak_tflops > 0) rate = std::min(rate, peak_tflops);
    }
    if (err < best) best = err, best_kh = kh, best_rate = rate;
  }
  g.k_half = best_kh;
  g.sustained_tflops = best_rate;
  g.points = points;
  return g;
}

}  // namespace forge::plan
