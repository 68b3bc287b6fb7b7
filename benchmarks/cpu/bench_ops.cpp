// CPU micro-benchmarks of forge ops (Google Benchmark). Built and run by `make bench`,
// never in CI; tests never assert timings (DESIGN.md, Performance).
//
//   ./build/benchmarks/cpu/forge_cpu_bench --benchmark_min_time=0.05
//
// matmul: f32 square GEMMs through ops::matmul (OpenBLAS), reported as GFLOP/s with
// 2*M*N*K floating-point operations per product.
// Elementwise: add, mul (two inputs, one output) and gelu, exp (one in, one out) on
// contiguous f32 tensors of 1M and 16M elements, reported as bytes/s of memory traffic
// (every input read once, the output written once).
// Kernels run on several threads (OpenMP, OpenBLAS), so rates are per wall-clock second
// (UseRealTime), not per second of the calling thread's CPU time.
#include <benchmark/benchmark.h>

#include <cstdint>

#include "forge/forge.h"

namespace {

using forge::DType;
using forge::Generator;
using forge::Tensor;

Tensor random_f32(const forge::Shape& shape, uint64_t seed) {
  Generator g(seed);
  return forge::randn(shape, {.dtype = DType::f32}, &g);
}

void BM_MatmulF32(benchmark::State& state) {
  const int64_t n = state.range(0);
  const Tensor a = random_f32({n, n}, 1), b = random_f32({n, n}, 2);
  for (auto _ : state) {
    Tensor c = forge::ops::matmul(a, b);
    benchmark::DoNotOptimize(c.data_ptr());
    benchmark::ClobberMemory();
  }
  const double flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9 * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_MatmulF32)->RangeMultiplier(2)->Range(64, 1024)->Unit(benchmark::kMillisecond)->UseRealTime();

// Binary elementwise: reads 2 * n floats, writes n.
template <Tensor (*Op)(const Tensor&, const Tensor&)>
void BM_Binary(benchmark::State& state) {
  const int64_t n = state.range(0);
  const Tensor a = random_f32({n}, 3), b = random_f32({n}, 4);
  for (auto _ : state) {
    Tensor c = Op(a, b);
    benchmark::DoNotOptimize(c.data_ptr());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 3 * n * static_cast<int64_t>(sizeof(float)));
}

Tensor add_op(const Tensor& a, const Tensor& b) { return forge::ops::add(a, b); }
Tensor mul_op(const Tensor& a, const Tensor& b) { return forge::ops::mul(a, b); }

BENCHMARK(BM_Binary<add_op>)
    ->Name("BM_AddF32")
    ->Arg(1 << 20)
    ->Arg(1 << 24)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
BENCHMARK(BM_Binary<mul_op>)
    ->Name("BM_MulF32")
    ->Arg(1 << 20)
    ->Arg(1 << 24)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// Unary elementwise: reads n floats, writes n.
template <Tensor (*Op)(const Tensor&)>
void BM_Unary(benchmark::State& state) {
  const int64_t n = state.range(0);
  const Tensor a = random_f32({n}, 5);
  for (auto _ : state) {
    Tensor c = Op(a);
    benchmark::DoNotOptimize(c.data_ptr());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 2 * n * static_cast<int64_t>(sizeof(float)));
}

Tensor gelu_op(const Tensor& a) { return forge::ops::gelu(a); }
Tensor exp_op(const Tensor& a) { return forge::ops::exp(a); }

BENCHMARK(BM_Unary<gelu_op>)
    ->Name("BM_GeluF32")
    ->Arg(1 << 20)
    ->Arg(1 << 24)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
BENCHMARK(BM_Unary<exp_op>)
    ->Name("BM_ExpF32")
    ->Arg(1 << 20)
    ->Arg(1 << 24)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

}  // namespace
