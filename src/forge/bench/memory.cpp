#include "forge/bench/memory.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>

#include "forge/autograd/grad_mode.h"
#include "forge/bench/gemm.h"
#include "forge/bench/host_info.h"
#include "forge/core/error.h"
#include "forge/ops/creation.h"
#include "forge/telemetry/mfu.h"

#ifdef FORGE_WITH_CUDA
#include "forge/backends/binary_functors.h"
#include "forge/backends/cuda/bench_kernels.h"
#include "forge/backends/cuda/elementwise.h"
#include "forge/backends/cuda/event_timer.h"
#endif

namespace forge::bench {

namespace {

constexpr int64_t kK = 1024, kM = kK * kK, kG = kM * kK;
constexpr int64_t kHostMax = 64 * kM;  // host/peer copies: the largest size up to 64M elements

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

std::optional<int64_t> count_or_null(const std::string& raw) {
  std::string s = trim(raw);
  if (s.empty()) return std::nullopt;
  int64_t mult = 1;
  const char last = static_cast<char>(std::toupper(static_cast<unsigned char>(s.back())));
  if (last == 'K' || last == 'M' || last == 'G') {
    mult = last == 'K' ? kK : last == 'M' ? kM : kG;
    s.pop_back();
  }
  if (s.empty() || s.size() > 12 || !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  const int64_t v = std::stoll(s);
  if (v <= 0 || v > (int64_t{1} << 40) / mult) return std::nullopt;
  return v * mult;
}

bool is_pow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

double elapsed_ms(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Warm-up, then opt.repeats timed runs of `run` (CUDA events on `dev`'s current stream when
// cuda, else steady_clock); the milliseconds of each.
std::vector<double> time_runs(const MemoryOptions& opt, bool cuda, int dev, const std::function<void()>& run) {
  std::vector<double> ms;
  const auto t0 = std::chrono::steady_clock::now();
  if (cuda) {
#ifdef FORGE_WITH_CUDA
    for (int i = 0; i < opt.warmup_runs || elapsed_ms(t0) < opt.warmup_ms; ++i) {
      run();
      cuda::synchronize_current_stream(dev);
    }
    ms = cuda::time_with_events(dev, opt.repeats, run);
#else
    (void)dev;
#endif
  } else {
    for (int i = 0; i < opt.warmup_runs || elapsed_ms(t0) < opt.warmup_ms; ++i) run();
    for (int i = 0; i < opt.repeats; ++i) {
      const auto t = std::chrono::steady_clock::now();
      run();
      ms.push_back(elapsed_ms(t));
    }
  }
  return ms;
}

MemoryResult make_result(const std::string& kernel, const std::string& dtype, int64_t n, int esize,
                         const std::vector<double>& ms, std::string note = "") {
  MemoryResult r;
  r.kernel = kernel;
  r.dtype = dtype;
  r.elements = n;
  r.bytes = memory_bytes(kernel, n, esize);
  r.flops = memory_flops(kernel, n);
  r.median_ms = median(ms);
  r.min_ms = ms.empty() ? 0 : *std::min_element(ms.begin(), ms.end());
  r.max_ms = ms.empty() ? 0 : *std::max_element(ms.begin(), ms.end());
  r.gbs = r.median_ms > 0 ? r.bytes / (r.median_ms * 1e-3) / 1e9 : 0;
  r.tflops = r.median_ms > 0 ? r.flops / (r.median_ms * 1e-3) / 1e12 : 0;
  r.note = std::move(note);
  return r;
}

// ---- CPU: STREAM copy and triad (f64, OpenMP, static schedule so that each thread touches the
// pages it initialised) --------------------------------------------------------------------------

void run_cpu(const MemoryOptions& opt, MemoryReport& rep) {
  for (int64_t n : opt.sizes) {
    std::unique_ptr<double[]> a(new double[static_cast<size_t>(n)]);
    std::unique_ptr<double[]> b(new double[static_cast<size_t>(n)]);
    std::unique_ptr<double[]> c(new double[static_cast<size_t>(n)]);
    double* pa = a.get();
    double* pb = b.get();
    double* pc = c.get();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      pa[i] = 1.0;
      pb[i] = 2.0;
      pc[i] = 0.5 + static_cast<double>(i % 7);
    }
    const double s = 3.0;
    const auto copy = [&] {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) pc[i] = pa[i];
    };
    const auto triad = [&] {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) pa[i] = pb[i] + s * pc[i];
    };
    rep.results.push_back(make_result("stream_copy", "f64", n, 8, time_runs(opt, false, 0, copy)));
    rep.results.push_back(make_result("stream_triad", "f64", n, 8, time_runs(opt, false, 0, triad)));
  }
}

// ---- GPU ----------------------------------------------------------------------------------------

#ifdef FORGE_WITH_CUDA
void run_gpu(const MemoryOptions& opt, MemoryReport& rep) {
  const int dev = opt.device.index;
  const TensorOptions f32{.dtype = DType::f32, .device = opt.device};
  Generator gen(1234);
  for (int64_t n : opt.sizes) {
    const std::string size = element_count_str(n);
    try {
      Tensor src = randn({n}, f32, &gen);
      Tensor dst = empty({n}, f32);
      const auto k = make_result("copy_kernel", "f32", n, 4,
                                 time_runs(opt, true, dev, [&] { cuda::bench_copy_kernel(src, dst); }));
      const auto m = make_result("copy_memcpy", "f32", n, 4,
                                 time_runs(opt, true, dev, [&] { cuda::bench_copy_memcpy(src, dst); }));
      MemoryResult best = k.median_ms <= m.median_ms ? k : m;
      best.note = best.kernel == "copy_kernel" ? "kernel" : "memcpy";
      best.kernel = "copy";
      rep.results.push_back(best);
      rep.results.push_back(k);
      rep.results.push_back(m);
    } catch (const Error& e) {
      rep.skipped.push_back(MemorySkip{"copy", size, e.what()});
    }
    try {
      Tensor a = randn({n}, f32, &gen), b = randn({n}, f32, &gen);
      Tensor c = empty({n}, f32);
      rep.results.push_back(make_result("multiply", "f32", n, 4, time_runs(opt, true, dev, [&] {
                                          cuda::binary(BinaryOp::mul, a, b, c);
                                        })));
    } catch (const Error& e) {
      rep.skipped.push_back(MemorySkip{"multiply", size, e.what()});
    }
  }
  // Host <-> device and peer copies: one size, the largest of the list up to 64M elements.
  int64_t hn = 0;
  for (int64_t n : opt.sizes)
    if (n <= kHostMax) hn = std::max(hn, n);
  if (hn == 0) return;
  const std::string hsize = element_count_str(hn);
  if (opt.host) {
    try {
      Tensor d = randn({hn}, f32, &gen);
      std::vector<float> pageable(static_cast<size_t>(hn), 1.0f);  // touched: the pages exist
      Tensor pinned = full({hn}, 1.0, {.dtype = DType::f32}).pin_memory();
      const size_t bytes = static_cast<size_t>(hn) * 4;
      rep.results.push_back(make_result("h2d_pageable", "f32", hn, 4, time_runs(opt, true, dev, [&] {
                                          cuda::bench_copy_to_device(pageable.data(), d, bytes);
                                        })));
      rep.results.push_back(make_result("h2d_pinned", "f32", hn, 4, time_runs(opt, true, dev, [&] {
                                          cuda::bench_copy_to_device(pinned.data_ptr(), d, bytes);
                                        })));
      rep.results.push_back(make_result("d2h_pageable", "f32", hn, 4, time_runs(opt, true, dev, [&] {
                                          cuda::bench_copy_to_host(d, pageable.data(), bytes);
                                        })));
      rep.results.push_back(make_result("d2h_pinned", "f32", hn, 4, time_runs(opt, true, dev, [&] {
                                          cuda::bench_copy_to_host(d, pinned.data_ptr(), bytes);
                                        })));
    } catch (const Error& e) {
      rep.skipped.push_back(MemorySkip{"host", hsize, e.what()});
    }
  }
  const int count = cuda_device_count();
  if (opt.peer && count > 1) {
    for (int other = 0; other < count; ++other) {
      if (other == dev) continue;
      for (const auto& [from, to] : {std::pair{dev, other}, std::pair{other, dev}}) {
        const std::string what = std::to_string(from) + "->" + std::to_string(to);
        try {
          const bool p2p = cuda::bench_enable_peer_access(from, to);
          Tensor s = randn({hn}, {.dtype = DType::f32, .device = Device::cuda(from)}, &gen);
          Tensor d = empty({hn}, {.dtype = DType::f32, .device = Device::cuda(to)});
          rep.results.push_back(make_result("peer", "f32", hn, 4,
                                            time_runs(opt, true, from, [&] { cuda::bench_copy_peer(s, d); }),
                                            what + (p2p ? " (peer access)" : " (no peer access: staged)")));
        } catch (const Error& e) {
          rep.skipped.push_back(MemorySkip{"peer " + what, hsize, e.what()});
        }
      }
    }
  }
}
#endif

}  // namespace

int64_t parse_element_count(const std::string& item) {
  const auto v = count_or_null(item);
  FORGE_CHECK(v.has_value(), "bad size '", item, "': expected a positive element count such as 65536, 64K, 16M or 1G");
  return *v;
}

std::vector<int64_t> parse_element_list(const std::string& spec) {
  std::vector<int64_t> out;
  size_t start = 0;
  while (true) {
    const size_t p = spec.find(',', start);
    const std::string item = trim(spec.substr(start, p == std::string::npos ? std::string::npos : p - start));
    const size_t dots = item.find("..");
    if (dots != std::string::npos) {
      const auto lo = count_or_null(item.substr(0, dots));
      const auto hi = count_or_null(item.substr(dots + 2));
      FORGE_CHECK(lo && hi && is_pow2(*lo) && is_pow2(*hi) && *lo <= *hi, "bad size range '", item, "' in '", spec,
                  "': expected LO..HI with powers of two LO <= HI, e.g. 64K..1G");
      for (int64_t v = *lo; v <= *hi; v *= 2) out.push_back(v);
    } else {
      const auto v = count_or_null(item);
      FORGE_CHECK(v.has_value(), "bad size '", item, "' in '", spec,
                  "': expected element counts separated by commas, e.g. 64K,1M,1G (or a range 64K..1G)");
      out.push_back(*v);
    }
    if (p == std::string::npos) break;
    start = p + 1;
  }
  return out;
}

std::string element_count_str(int64_t n) {
  if (n >= kG && n % kG == 0) return std::to_string(n / kG) + "G";
  if (n >= kM && n % kM == 0) return std::to_string(n / kM) + "M";
  if (n >= kK && n % kK == 0) return std::to_string(n / kK) + "K";
  return std::to_string(n);
}

std::vector<int64_t> default_memory_sizes(Device device) {
  std::vector<int64_t> out;
  const int64_t hi = device.is_cpu() ? 64 * kM : kG;
  for (int64_t n = 64 * kK; n <= hi; n *= 4) out.push_back(n);
  return out;
}

double memory_bytes(const std::string& kernel, int64_t n, int element_size) {
  const double ne = static_cast<double>(n) * element_size;
  if (kernel == "copy" || kernel == "copy_kernel" || kernel == "copy_memcpy" || kernel == "stream_copy") return 2 * ne;
  if (kernel == "multiply" || kernel == "stream_triad") return 3 * ne;
  if (kernel == "h2d_pageable" || kernel == "h2d_pinned" || kernel == "d2h_pageable" || kernel == "d2h_pinned" ||
      kernel == "peer")
    return ne;
  FORGE_THROW("memory_bytes: unknown kernel '", kernel, "'");
}

double memory_flops(const std::string& kernel, int64_t n) {
  (void)memory_bytes(kernel, n, 1);  // checks the name
  if (kernel == "multiply") return static_cast<double>(n);
  if (kernel == "stream_triad") return 2.0 * static_cast<double>(n);
  return 0;
}

MemoryReport run_memory(const MemoryOptions& opt) {
  FORGE_CHECK(!opt.sizes.empty(), "bench memory: no sizes to run");
  FORGE_CHECK(opt.repeats >= 1, "bench memory: --repeats must be >= 1, got ", opt.repeats);
  FORGE_CHECK(opt.warmup_runs >= 0, "bench memory: --warmup must be >= 0, got ", opt.warmup_runs);
#ifndef FORGE_WITH_CUDA
  FORGE_CHECK(opt.device.is_cpu(), "bench memory: ", opt.device.str(), " requested but forge was built without CUDA");
#endif
  NoGradGuard no_grad;
  MemoryReport rep;
  rep.options = opt;
  rep.device = opt.device.str();
  if (opt.device.is_cuda()) {
    rep.timer = "cuda events";
    rep.device_name = telemetry::device_name(opt.device);
#ifdef FORGE_WITH_CUDA
    run_gpu(opt, rep);
#endif
  } else {
    rep.timer = "steady_clock";
    rep.device_name = host_info().cpu_model;
    rep.threads = omp_get_max_threads();
    run_cpu(opt, rep);
  }
  return rep;
}

nlohmann::json to_json(const MemoryReport& r) {
  nlohmann::json j;
  j["benchmark"] = "memory";
  j["device"] = r.device;
  j["device_name"] = r.device_name;
  j["method"] = {{"timer", r.timer},
                 {"warmup_runs", r.options.warmup_runs},
                 {"warmup_ms", r.options.warmup_ms},
                 {"repeats", r.options.repeats},
                 {"statistic", "median"},
                 {"bytes", "bytes read + written (copy 2ne, multiply/triad 3ne, host/peer ne)"},
                 {"gbs", "bytes / median time / 1e9"}};
  if (r.device == "cpu") j["threads"] = r.threads;
  nlohmann::json results = nlohmann::json::array();
  for (const MemoryResult& x : r.results)
    results.push_back({{"kernel", x.kernel},       {"dtype", x.dtype},       {"elements", x.elements},
                       {"bytes", x.bytes},         {"flops", x.flops},       {"median_ms", x.median_ms},
                       {"min_ms", x.min_ms},       {"max_ms", x.max_ms},     {"gbs", x.gbs},
                       {"tflops", x.tflops},       {"note", x.note}});
  j["results"] = results;
  nlohmann::json skipped = nlohmann::json::array();
  for (const MemorySkip& s : r.skipped) skipped.push_back({{"kernel", s.kernel}, {"size", s.size}, {"reason", s.reason}});
  j["skipped"] = skipped;
  return j;
}

}  // namespace forge::bench
