#include "forge/bench/gemm.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <functional>
#include <optional>

#include "forge/autograd/grad_mode.h"
#include "forge/bench/host_info.h"
#include "forge/core/error.h"
#include "forge/ops/creation.h"
#include "forge/ops/matmul.h"
#include "forge/plan/gpu_catalog.h"
#include "forge/telemetry/mfu.h"

#ifdef FORGE_WITH_CUDA
#include "forge/backends/cuda/event_timer.h"
#include "forge/backends/cuda/fp8.h"
#include "forge/backends/cuda/gemm_fp8.h"
#include "forge/backends/cuda/matmul.h"
#endif

namespace forge::bench {

namespace {

constexpr const char* kFp8CpuReason = "fp8 (e4m3) GEMMs run on CUDA GPUs only (cuBLASLt)";
constexpr const char* kFp8GpuReason =
    "fp8 (e4m3) GEMMs need compute capability >= 8.9 (Ada, Hopper) and cuBLASLt >= 11.8";

// fp8 (tensorwise: one scale per operand), fp8-rowwise (one per row of each operand) and
// fp8-blockwise (DeepSeek-V3's 1 x 128 tiles of A by 128 x 128 blocks of B): the FP8 training
// recipes' forward GEMMs (Note [FP8 GEMM scales] in backends/cuda/fp8.h).
bool is_fp8(const std::string& dtype) { return dtype.rfind("fp8", 0) == 0; }

// Why `device` cannot run the fp8 GEMM of `dtype` ("" when it can).
std::string fp8_unsupported_reason(Device device, [[maybe_unused]] const std::string& dtype) {
  if (device.is_cpu()) return kFp8CpuReason;
#ifdef FORGE_WITH_CUDA
  const auto mode = dtype == "fp8-rowwise"     ? cuda::Fp8ScaleMode::outer
                    : dtype == "fp8-blockwise" ? cuda::Fp8ScaleMode::vec128
                                               : cuda::Fp8ScaleMode::scalar;
  if (cuda::fp8_scale_mode_supported(device.index, mode)) return "";
  if (mode != cuda::Fp8ScaleMode::scalar && cuda::fp8_gemm_supported(device.index))
    return dtype + " needs compute capability 9.0 (Hopper) and cuBLASLt >= 12.9 (outer-vector and block scales)";
#endif
  return kFp8GpuReason;
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t p = s.find(sep, start);
    out.push_back(trim(s.substr(start, p == std::string::npos ? std::string::npos : p - start)));
    if (p == std::string::npos) break;
    start = p + 1;
  }
  return out;
}

// A positive integer (at most 2^31, far beyond any GEMM that fits a GPU), or nullopt.
std::optional<int64_t> parse_positive(const std::string& s) {
  if (s.empty() || s.size() > 10 || !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  const int64_t v = std::stoll(s);
  if (v <= 0 || v > (int64_t{1} << 31)) return std::nullopt;
  return v;
}

bool is_pow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

std::string shape_str(const GemmShape& s) {
  return std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k);
}

double elapsed_ms(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

#ifdef FORGE_WITH_CUDA
// Sets cuda::allow_tf32 for its scope and restores the previous value.
class Tf32Guard {
 public:
  explicit Tf32Guard(bool on) : prev_(cuda::allow_tf32()) { cuda::set_allow_tf32(on); }
  ~Tf32Guard() { cuda::set_allow_tf32(prev_); }
  Tf32Guard(const Tf32Guard&) = delete;
  Tf32Guard& operator=(const Tf32Guard&) = delete;

 private:
  bool prev_;
};

// Sets cuda::gemm_tuning for its scope and restores the previous value.
class TuningGuard {
 public:
  explicit TuningGuard(bool on) : prev_(cuda::gemm_tuning()) { cuda::set_gemm_tuning(on); }
  ~TuningGuard() { cuda::set_gemm_tuning(prev_); }
  TuningGuard(const TuningGuard&) = delete;
  TuningGuard& operator=(const TuningGuard&) = delete;

 private:
  bool prev_;
};
#endif

DType storage_dtype(const std::string& name) {
  if (name == "f32" || name == "tf32") return DType::f32;
  if (name == "bf16") return DType::bf16;
  if (name == "f16") return DType::f16;
  if (is_fp8(name)) return DType::u8;  // e4m3 bit patterns (forge has no fp8 dtype)
  return DType::f64;
}

double peak_for(const plan::GpuSpec* gpu, const std::string& dtype) {
  if (gpu == nullptr) return 0;
  if (dtype == "f32") return gpu->fp32_tflops;
  if (dtype == "tf32") return gpu->tf32_tflops;
  if (dtype == "bf16") return gpu->bf16_tflops;
  if (dtype == "f16") return gpu->fp16_tflops;
  if (is_fp8(dtype)) return gpu->fp8_tflops;
  return 0;
}

// Times one (dtype, shape): warm-up, then opt.repeats timed runs; fills the times of `r`.
void measure(const GemmOptions& opt, GemmResult& r) {
  const DType dt = storage_dtype(r.dtype);
  const GemmShape& s = r.shape;
  const TensorOptions to{.dtype = dt, .device = opt.device};
  // Rotate among up to 3 (A, B) pairs when they take at most 2 GiB together, so that small
  // sizes are not timed on operands left in cache by the previous run.
  const double set_bytes = static_cast<double>(s.m * s.k + s.k * s.n) * static_cast<double>(element_size(dt));
  const int sets = opt.device.is_cuda() && 3 * set_bytes <= 2.0 * (1 << 30) ? 3 : 1;
  const bool fp8 = is_fp8(r.dtype);
  Generator gen(1234);  // its own stream: the benchmark leaves the default generator alone
  std::vector<Tensor> as, bs;
  for (int i = 0; i < sets; ++i) {
    if (fp8) {
#ifdef FORGE_WITH_CUDA
      // e4m3 of uniform [-2, 2) values; B stored transposed, (N, K) (Note [FP8 GEMM layout]).
      as.push_back(cuda::random_e4m3(opt.device.index, {s.m, s.k}, 2 * static_cast<uint64_t>(i) + 1));
      bs.push_back(cuda::random_e4m3(opt.device.index, {s.n, s.k}, 2 * static_cast<uint64_t>(i) + 2));
#endif
    } else {
      as.push_back(randn({s.m, s.k}, to, &gen));
      bs.push_back(randn({s.k, s.n}, to, &gen));
    }
  }
  r.input_sets = sets;
  int next = 0;
  std::vector<double> ms;
  if (opt.device.is_cuda()) {
#ifdef FORGE_WITH_CUDA
    const int dev = opt.device.index;
    Tf32Guard tf32(r.dtype == "tf32");
    Tensor out = empty({s.m, s.n}, fp8 ? TensorOptions{.dtype = DType::bf16, .device = opt.device} : to);
    const Tensor scale = ones({1}, {.dtype = DType::f32, .device = opt.device});  // per-tensor scales of 1
    // fp8-rowwise / fp8-blockwise: factors of 1 in the recipe's layout (Note [FP8 GEMM scales]).
    const auto mode_a = r.dtype == "fp8-rowwise"     ? cuda::Fp8ScaleMode::outer
                        : r.dtype == "fp8-blockwise" ? cuda::Fp8ScaleMode::vec128
                                                     : cuda::Fp8ScaleMode::scalar;
    const auto mode_b = r.dtype == "fp8-blockwise" ? cuda::Fp8ScaleMode::blk128 : mode_a;
    const auto factors = [&](cuda::Fp8ScaleMode m, int64_t rows) { return cuda::fp8_factor_count(m, rows, s.k); };
    const Tensor fa = fp8 ? ones({factors(mode_a, s.m)}, {.dtype = DType::f32, .device = opt.device}) : Tensor();
    const Tensor fb = fp8 ? ones({factors(mode_b, s.n)}, {.dtype = DType::f32, .device = opt.device}) : Tensor();
    const std::function<void()> run = [&] {
      if (fp8 && r.dtype != "fp8") {
        const cuda::Fp8Operand a{as[static_cast<size_t>(next)], fa, fp8::Format::e4m3, mode_a};
        const cuda::Fp8Operand b{bs[static_cast<size_t>(next)], fb, fp8::Format::e4m3, mode_b};
        cuda::fp8_scaled_gemm(a, b, out);
      } else if (fp8) {
        cuda::fp8_gemm_bf16_out(as[static_cast<size_t>(next)], bs[static_cast<size_t>(next)], scale, scale, out);
      } else {
        cuda::matmul(as[static_cast<size_t>(next)], bs[static_cast<size_t>(next)], out);
      }
      next = (next + 1) % sets;
    };
    // Warm-up (where a new shape is tuned, untimed), then the timed runs.
    const auto time_runs = [&] {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < opt.warmup_runs || elapsed_ms(t0) < opt.warmup_ms; ++i) {
        run();
        cuda::synchronize_current_stream(dev);
      }
      return cuda::time_with_events(dev, opt.repeats, run);
    };
    if (opt.compare_tuning && !fp8) {
      {
        TuningGuard heuristic(false);
        r.heuristic_median_ms = median(time_runs());
      }
      TuningGuard tuned(true);
      ms = time_runs();
    } else {
      ms = time_runs();
    }
#endif
  } else {
    const auto run = [&] {
      Tensor out = ops::matmul(as[static_cast<size_t>(next)], bs[static_cast<size_t>(next)]);
      next = (next + 1) % sets;
    };
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < opt.warmup_runs || elapsed_ms(t0) < opt.warmup_ms; ++i) run();
    for (int i = 0; i < opt.repeats; ++i) {
      const auto t = std::chrono::steady_clock::now();
      run();
      ms.push_back(elapsed_ms(t));
    }
  }
  r.median_ms = median(ms);
  r.min_ms = ms.empty() ? 0 : *std::min_element(ms.begin(), ms.end());
  r.max_ms = ms.empty() ? 0 : *std::max_element(ms.begin(), ms.end());
  r.tflops = r.median_ms > 0 ? r.flops / (r.median_ms * 1e-3) / 1e12 : 0;
  r.peak_pct = r.peak_tflops > 0 ? 100.0 * r.tflops / r.peak_tflops : 0;
}

}  // namespace

std::vector<int64_t> powers_of_two(int64_t lo, int64_t hi) {
  FORGE_CHECK(is_pow2(lo) && is_pow2(hi) && lo <= hi, "powers_of_two: expected powers of two lo <= hi, got ", lo,
              " and ", hi);
  std::vector<int64_t> out;
  for (int64_t v = lo; v <= hi; v *= 2) out.push_back(v);
  return out;
}

std::vector<int64_t> parse_size_list(const std::string& spec) {
  std::vector<int64_t> out;
  for (const std::string& item : split(spec, ',')) {
    const size_t dots = item.find("..");
    if (dots != std::string::npos) {
      const auto lo = parse_positive(trim(item.substr(0, dots)));
      const auto hi = parse_positive(trim(item.substr(dots + 2)));
      FORGE_CHECK(lo && hi && is_pow2(*lo) && is_pow2(*hi) && *lo <= *hi, "bad size range '", item, "' in '", spec,
                  "': expected LO..HI with powers of two LO <= HI, e.g. 128..2048");
      for (int64_t v : powers_of_two(*lo, *hi)) out.push_back(v);
    } else {
      const auto v = parse_positive(item);
      FORGE_CHECK(v.has_value(), "bad size '", item, "' in '", spec,
                  "': expected positive integers separated by commas, e.g. 128,1024 (or a range 128..2048)");
      out.push_back(*v);
    }
  }
  return out;
}

GemmShape parse_mnk(const std::string& spec) {
  std::string s = trim(spec);
  std::replace(s.begin(), s.end(), 'X', 'x');
  const std::vector<std::string> parts = split(s, 'x');
  std::optional<int64_t> v[3];
  if (parts.size() == 3)
    for (int i = 0; i < 3; ++i) v[i] = parse_positive(parts[static_cast<size_t>(i)]);
  FORGE_CHECK(parts.size() == 3 && v[0] && v[1] && v[2], "bad GEMM shape '", spec,
              "': expected MxNxK with positive integers, e.g. 4096x4096x1024");
  return GemmShape{*v[0], *v[1], *v[2]};
}

std::vector<GemmShape> square_shapes(const std::vector<int64_t>& sizes) {
  std::vector<GemmShape> out;
  for (int64_t n : sizes) out.push_back(GemmShape{n, n, n});
  return out;
}

double gemm_flops(const GemmShape& s) {
  return 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k);
}

std::vector<std::string> default_dtypes(Device device) {
  if (device.is_cpu()) return {"f32", "f64"};
  return {"f32", "tf32", "bf16", "f16", "fp8"};
}

std::vector<int64_t> default_sizes(Device device) {
  return device.is_cpu() ? powers_of_two(128, 2048) : powers_of_two(128, 16384);
}

std::vector<std::string> parse_dtype_list(const std::string& spec, Device device) {
  static const std::vector<std::string> known = {"f32", "tf32", "bf16", "f16", "fp8", "fp8-rowwise", "fp8-blockwise", "f64"};
  std::vector<std::string> out;
  for (std::string item : split(spec, ',')) {
    std::transform(item.begin(), item.end(), item.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (item == "e4m3" || item == "fp8_e4m3" || item == "fp8-tensorwise") item = "fp8";
    FORGE_CHECK(std::find(known.begin(), known.end(), item) != known.end(), "unknown dtype '", item, "' in '", spec,
                "': expected a comma-separated list of f32, tf32, bf16, f16, fp8 (tensorwise), fp8-rowwise, fp8-blockwise, f64");
    // fp8 passes on the CPU too: run_gemm reports it as skipped, with the reason.
    FORGE_CHECK(!device.is_cpu() || item == "f32" || item == "f64" || is_fp8(item), "dtype '", item,
                "' is not benchmarked on the CPU (OpenBLAS): use f32 or f64");
    if (std::find(out.begin(), out.end(), item) == out.end()) out.push_back(item);
  }
  return out;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

GemmReport run_gemm(const GemmOptions& opt) {
  FORGE_CHECK(!opt.shapes.empty(), "bench gemm: no sizes to run");
  FORGE_CHECK(!opt.dtypes.empty(), "bench gemm: no dtypes to run");
  FORGE_CHECK(opt.repeats >= 1, "bench gemm: --repeats must be >= 1, got ", opt.repeats);
  FORGE_CHECK(opt.warmup_runs >= 0, "bench gemm: --warmup must be >= 0, got ", opt.warmup_runs);
#ifndef FORGE_WITH_CUDA
  FORGE_CHECK(opt.device.is_cpu(), "bench gemm: ", opt.device.str(), " requested but forge was built without CUDA");
#endif
  NoGradGuard no_grad;
  GemmReport rep;
  rep.options = opt;
  rep.device = opt.device.str();
  const plan::GpuSpec* gpu = nullptr;
  if (opt.device.is_cuda()) {
    rep.timer = "cuda events";
    rep.device_name = telemetry::device_name(opt.device);
#ifdef FORGE_WITH_CUDA
    rep.gemm_tuning = opt.compare_tuning ? "compare" : cuda::gemm_tuning() ? "cached" : "off";
#endif
    if (const auto cat = telemetry::catalogue_name(rep.device_name)) {
      rep.catalogue = *cat;
      gpu = &plan::find_gpu(*cat);
    }
  } else {
    rep.timer = "steady_clock";
    rep.device_name = host_info().cpu_model;
  }
  for (const std::string& dtype : opt.dtypes) {
    if (is_fp8(dtype)) {
      const std::string why = fp8_unsupported_reason(opt.device, dtype);
      if (!why.empty()) {
        rep.skipped.push_back(GemmSkip{dtype, "", why});
        continue;
      }
    }
    for (const GemmShape& s : opt.shapes) {
      GemmResult r;
      r.dtype = dtype;
      r.shape = s;
      r.flops = gemm_flops(s);
      r.peak_tflops = peak_for(gpu, dtype);
      if (is_fp8(dtype) && (s.m % 16 != 0 || s.n % 16 != 0 || s.k % 16 != 0)) {
        rep.skipped.push_back(GemmSkip{dtype, shape_str(s), "fp8 GEMMs need M, N, K multiples of 16 (cuBLASLt)"});
        continue;
      }
      if (dtype == "fp8-blockwise" && (s.m % 128 != 0 || s.n % 128 != 0 || s.k % 128 != 0)) {
        rep.skipped.push_back(GemmSkip{dtype, shape_str(s), "fp8-blockwise measures M, N, K multiples of 128 (whole tiles and blocks)"});
        continue;
      }
      try {
        measure(opt, r);
      } catch (const Error& e) {  // out of memory at the largest sizes, most likely
        rep.skipped.push_back(GemmSkip{dtype, shape_str(s), e.what()});
        continue;
      }
      rep.results.push_back(r);
    }
  }
#ifdef FORGE_WITH_CUDA
  if (opt.device.is_cuda()) rep.gemm_fallback_shapes = cuda::gemm_tuning_stats().fallback_shapes;
#endif
  return rep;
}

nlohmann::json to_json(const GemmReport& r) {
  nlohmann::json j;
  j["benchmark"] = "gemm";
  j["device"] = r.device;
  j["device_name"] = r.device_name;
  j["catalogue"] = r.catalogue;
  j["method"] = {{"timer", r.timer},
                 {"warmup_runs", r.options.warmup_runs},
                 {"warmup_ms", r.options.warmup_ms},
                 {"repeats", r.options.repeats},
                 {"statistic", "median"},
                 {"flops", "2*M*N*K"},
                 {"layout", "C(MxN) = A(MxK) B(KxN), row-major, C contiguous"},
                 {"inputs", "randn"},
                 {"path", r.device == "cpu" ? "ops::matmul (OpenBLAS)" : "cuda::matmul (cuBLASLt)"}};
  if (r.device != "cpu") {
    j["method"]["gemm_tuning"] = r.gemm_tuning;
    j["gemm_fallback_shapes"] = r.gemm_fallback_shapes;
    j["method"]["fp8"] = {{"path", "cuda::fp8_gemm_bf16_out (cuBLASLt)"},
                          {"layout", "D(MxN) bf16 = A(MxK) B_t(NxK)^T, A and B_t e4m3 row-major (cuBLASLt TN)"},
                          {"inputs", "e4m3 of uniform [-2, 2)"},
                          {"scales", "per-tensor f32 scale_a = scale_b = 1, from device memory; fp8-rowwise: one "
                                     "f32 factor per row of A and of B_t (outer vectors); fp8-blockwise: one per "
                                     "1 x 128 tile of A and per 128 x 128 block of B_t (cuda::fp8_scaled_gemm)"},
                          {"accumulation", "f32 (fast accumulation off)"}};
  }
  nlohmann::json results = nlohmann::json::array();
  for (const GemmResult& x : r.results) {
    nlohmann::json e = {{"dtype", x.dtype},         {"m", x.shape.m},
                        {"n", x.shape.n},           {"k", x.shape.k},
                        {"flops", x.flops},         {"median_ms", x.median_ms},
                        {"min_ms", x.min_ms},       {"max_ms", x.max_ms},
                        {"tflops", x.tflops},       {"gflops", x.tflops * 1e3},
                        {"input_sets", x.input_sets}};
    e["peak_tflops"] = x.peak_tflops > 0 ? nlohmann::json(x.peak_tflops) : nlohmann::json(nullptr);
    e["peak_pct"] = x.peak_tflops > 0 ? nlohmann::json(x.peak_pct) : nlohmann::json(nullptr);
    if (x.heuristic_median_ms > 0) e["heuristic_median_ms"] = x.heuristic_median_ms;
    results.push_back(e);
  }
  j["results"] = results;
  nlohmann::json skipped = nlohmann::json::array();
  for (const GemmSkip& s : r.skipped) skipped.push_back({{"dtype", s.dtype}, {"shape", s.shape}, {"reason", s.reason}});
  j["skipped"] = skipped;
  return j;
}

}  // namespace forge::bench
