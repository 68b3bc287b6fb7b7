#pragma once
// `forge bench memory` (docs/bench.md): memory bandwidth. On a GPU: device-to-device copy (a
// 16-byte vectorised grid-stride kernel and cudaMemcpyAsync, the better reported as "copy") and
// forge's elementwise multiply (c = a * b, f32, the engine every elementwise op uses) over sizes
// from 64 K to 1 G elements; host<->device copies from pageable and pinned memory; GPU<->GPU peer
// copies when there are several GPUs. On the CPU: STREAM-style copy and triad (f64, OpenMP).
// Each (kernel, size): warm-up (>= warmup_runs runs and >= warmup_ms), then `repeats` timed runs
// (CUDA events / steady_clock); the median is reported. GB/s count the bytes read + written.
//
//   bench::MemoryOptions o;
//   o.device = Device::cpu();
//   o.sizes = bench::parse_element_list("64K,1M");
//   bench::MemoryReport r = bench::run_memory(o);   // r.results[i].gbs
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "forge/core/device.h"

namespace forge::bench {

// Element counts: "65536", "64K", "16M", "1G" (K/M/G = 2^10/2^20/2^30), comma-separated;
// "64K..1G" = the powers of two from LO to HI. Throws forge::Error naming the bad item.
int64_t parse_element_count(const std::string& item);
std::vector<int64_t> parse_element_list(const std::string& spec);
// "64K", "1M", "1G", or the plain number when it is no multiple of 1024.
std::string element_count_str(int64_t n);
// GPU: 64K, 256K, ..., 1G (x4 steps; 1G f32 = 4 GiB per buffer); CPU: 64K .. 64M (x4).
std::vector<int64_t> default_memory_sizes(Device device);

// The kernels (the `kernel` field of a result):
//   copy_kernel, copy_memcpy   GPU D2D copy, dst = src (f32)        bytes 2 n e, FLOPs 0
//   copy                        the better of the two at that size (note names it)
//   multiply                    GPU c = a * b (f32)                  bytes 3 n e, FLOPs n
//   h2d_pageable, h2d_pinned, d2h_pageable, d2h_pinned, peer       bytes n e, FLOPs 0
//   stream_copy                 CPU c[i] = a[i] (f64)                bytes 2 n e, FLOPs 0
//   stream_triad                CPU a[i] = b[i] + s c[i] (f64)       bytes 3 n e, FLOPs 2 n
// (e = element size). Bytes are what the kernel must read + write (no write-allocate traffic,
// as STREAM counts). Throws forge::Error for an unknown kernel.
double memory_bytes(const std::string& kernel, int64_t n, int element_size);
double memory_flops(const std::string& kernel, int64_t n);

struct MemoryOptions {
  Device device = Device::cpu();
  std::vector<int64_t> sizes;  // elements
  int warmup_runs = 3;
  double warmup_ms = 50;
  int repeats = 20;
  bool host = true;            // GPU: host<->device copies (at the largest size <= 64M elements)
  bool peer = true;            // GPU: peer copies cuda:N <-> every other GPU (same size)
};

struct MemoryResult {
  std::string kernel;
  std::string dtype;           // "f32" (GPU), "f64" (CPU)
  int64_t elements = 0;
  double bytes = 0, flops = 0;
  double median_ms = 0, min_ms = 0, max_ms = 0;
  double gbs = 0;              // bytes / median time / 1e9
  double tflops = 0;           // flops / median time / 1e12
  std::string note;            // copy: which method; peer: "0->1"; pageable/pinned ...
};

struct MemorySkip {
  std::string kernel;
  std::string size;
  std::string reason;
};

struct MemoryReport {
  std::string device, device_name, timer;
  int threads = 0;             // CPU: OpenMP threads
  MemoryOptions options;
  std::vector<MemoryResult> results;
  std::vector<MemorySkip> skipped;
};

MemoryReport run_memory(const MemoryOptions& opt);
nlohmann::json to_json(const MemoryReport& r);

}  // namespace forge::bench
