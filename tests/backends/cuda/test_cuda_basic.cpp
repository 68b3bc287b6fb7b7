// The first CUDA backend against the CPU backend: copies (every dtype, every direction,
// non-contiguous both sides), conversions, fill/arange, the Philox streams, every unary
// op (forward and backward) and binary op, where, and the allocator's counters.
//
// Every check runs the same inputs through both backends and compares by
// ||out - ref|| / ||ref|| with tolerances by dtype (f32 1e-5, bf16/f16 1e-2, f64 1e-12),
// or exactly where the result is exact (copies, conversions, comparisons, integers).
// Inputs are random and never zero; non-contiguous inputs are views taken on each device
// (moving a view to the GPU makes it contiguous, so the view is applied after the move).
//
// Without a GPU every test reports SKIPPED (never passed): CTest's label is `cuda`.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "forge/backends/cpu/unary.h"
#include "forge/backends/cuda/elementwise.h"
#include "forge/backends/cuda/memory.h"
#include "forge/backends/cuda/tensor_kernels.h"
#include "forge/forge.h"
#include "backends/cuda/cuda_testing.h"

namespace forge {

// Readable parameter values in test listings.
void PrintTo(UnaryOp op, std::ostream* os) { *os << unary_name(op); }
void PrintTo(BinaryOp op, std::ostream* os) { *os << binary_name(op); }

namespace {

using namespace cuda_testing;

// ---- runtime and memory ---------------------------------------------------------------

TEST(CudaRuntime, DevicesAndSynchronize) {
  FORGE_SKIP_WITHOUT_GPU();
  EXPECT_EQ(cuda::device_count(), cuda_device_count());
  EXPECT_NO_THROW(cuda::synchronize(0));
  EXPECT_THROW(empty({4}, {.device = Device::cuda(cuda_device_count())}), Error);
  EXPECT_THROW(cuda::synchronize(cuda_device_count()), Error);
}

TEST(CudaMemory, StatsGoUpAndBackDown) {
  FORGE_SKIP_WITHOUT_GPU();
  cuda::synchronize(0);
  const MemoryStats before = cuda::memory_stats(0);
  const int64_t bytes = int64_t{4} << 20;
  {
    Tensor t = empty({bytes / 4}, {.dtype = DType::f32, .device = kGpu});
    const MemoryStats during = cuda::memory_stats(0);
    // The caching allocator counts whole blocks: a large block may keep up to 1 MiB of
    // slack when it is cut from a bigger cached one (Note [caching allocator]).
    EXPECT_GE(during.allocated - before.allocated, bytes);
    EXPECT_LE(during.allocated - before.allocated, bytes + (int64_t{1} << 20));
    EXPECT_GE(during.reserved, during.allocated);
    EXPECT_GE(during.peak_allocated, during.allocated);
    EXPECT_EQ(during.num_allocs, before.num_allocs + 1);
  }
  const MemoryStats after = cuda::memory_stats(0);
  EXPECT_EQ(after.allocated, before.allocated);
  EXPECT_GE(after.peak_allocated, before.allocated + bytes);
  cuda::reset_peak_memory_stats(0);
  EXPECT_EQ(cuda::memory_stats(0).peak_allocated, after.allocated);
}

// ---- copy and conversion --------------------------------------------------------------

// Values every dtype holds exactly: small integers (0/1 for bool).
Tensor exact_values(const Shape& shape, DType dtype, uint64_t seed) {
  Generator gen(seed);
  const int64_t hi = dtype == DType::boolean ? 2 : (dtype == DType::u8 ? 250 : 100);
  const int64_t lo = (dtype == DType::boolean || dtype == DType::u8) ? 0 : -100;
  return randint(lo, hi, shape, {.dtype = DType::i64}, &gen).to(dtype);
}

TEST(CudaCopy, RoundTripEveryDtypeNonContiguous) {
  FORGE_SKIP_WITHOUT_GPU();
  const std::vector<std::pair<const char*, std::function<Tensor(const Tensor&)>>> views = {
      {"contiguous", [](const Tensor& t) { return t; }},
      {"permuted", [](const Tensor& t) { return t.permute({2, 0, 1}); }},
      {"step-2 slice", [](const Tensor& t) { return t.slice(1, 1, 10, 2); }},
      {"broadcast", [](const Tensor& t) { return t.narrow(0, 2, 1).expand({6, 10, 7}); }},
      {"offset narrow", [](const Tensor& t) { return t.narrow(2, 1, 5); }},
  };
  for (DType dt : kAllDTypes) {
    const Tensor base = exact_values({6, 10, 7}, dt, 11);
    const Tensor base_gpu = base.to(kGpu);
    for (const auto& [name, view] : views) {
      const std::string what = std::string(dtype_name(dt)) + " " + name;
      const Tensor src = view(base);
      // host view -> GPU -> host
      Tensor up = src.to(kGpu);
      EXPECT_TRUE(up.is_cuda() && up.is_contiguous()) << what;
      expect_equal(up.to(Device::cpu()), src, what + " host->gpu->host");
      // GPU view -> host
      expect_equal(view(base_gpu).to(Device::cpu()), src, what + " gpu view->host");
      // GPU view -> GPU (same device, same dtype: the strided kernel)
      expect_equal(view(base_gpu).contiguous().to(Device::cpu()), src, what + " gpu view->gpu");
    }
    // Strided destinations on both sides.
    Tensor dst_gpu = zeros({7, 6, 10}, {.dtype = dt, .device = kGpu});
    Tensor dst_view = dst_gpu.permute({1, 2, 0});
    dst_view.copy_(base);  // host contiguous -> GPU strided
    expect_equal(dst_gpu.to(Device::cpu()), base.permute({2, 0, 1}), std::string(dtype_name(dt)) + " into gpu view");
    Tensor dst_host = zeros({6, 20, 7}, {.dtype = dt});
    Tensor host_view = dst_host.slice(1, 0, 20, 2);
    host_view.copy_(base_gpu);  // GPU contiguous -> host strided
    expect_equal(host_view, base, std::string(dtype_name(dt)) + " into host view");
  }
  // A sparse view of a large host buffer (staged by a host gather, not by its span).
  const Tensor wide = exact_values({4, 1000}, DType::f32, 12);
  const Tensor sparse = wide.slice(1, 0, 1000, 100);
  expect_equal(sparse.to(kGpu).to(Device::cpu()), sparse, "sparse host slice");
}

TEST(CudaCopy, DtypeConversionMatchesCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  for (DType from : kAllDTypes) {
    for (DType to : kAllDTypes) {
      // Fractions and (where the target is signed) negatives; u8 only sees [0, 250).
      Generator gen(21);
      const bool unsigned_side = from == DType::u8 || to == DType::u8;
      Tensor f = unsigned_side ? uniform({33, 17}, 0.0, 250.0, {}, &gen) : ops::mul(randn({33, 17}, {}, &gen), 40.0);
      const Tensor src = f.to(from);
      const Tensor ref = src.to(to);
      const std::string what = std::string(dtype_name(from)) + " -> " + dtype_name(to);
      const Tensor src_gpu = src.to(kGpu);
      expect_equal(src_gpu.to(to).to(Device::cpu()), ref, what + " on the GPU");
      expect_equal(src.t().to(kGpu, to).to(Device::cpu()), ref.t(), what + " host strided -> GPU");
      expect_equal(src_gpu.t().to(Device::cpu(), to), ref.t(), what + " GPU strided -> host");
    }
  }
}

TEST(CudaCopy, PeerCopyBetweenGpus) {
  FORGE_SKIP_WITHOUT_GPU();
  if (forge::cuda_device_count() < 2) GTEST_SKIP() << "needs two CUDA devices";
  const Tensor base = exact_values({16, 24}, DType::f32, 31);
  const Tensor on0 = base.to(Device::cuda(0));
  expect_equal(on0.to(Device::cuda(1)).to(Device::cpu()), base, "cuda:0 -> cuda:1");
  expect_equal(on0.t().to(Device::cuda(1)).to(Device::cpu()), base.t(), "strided cuda:0 -> cuda:1");
  expect_equal(on0.to(Device::cuda(1), DType::bf16).to(Device::cpu()), base.to(DType::bf16), "cuda:0 f32 -> cuda:1 bf16");
}

TEST(CudaCopy, TooManyDimsIsAClearError) {
  FORGE_SKIP_WITHOUT_GPU();
  // Nine dims of size 2 in reverse order: no two neighbours merge.
  Tensor t = arange(512, {.dtype = DType::f32, .device = kGpu}).view({2, 2, 2, 2, 2, 2, 2, 2, 2});
  Tensor r = t.permute({8, 7, 6, 5, 4, 3, 2, 1, 0});
  try {
    (void)r.contiguous();
    ADD_FAILURE() << "expected forge::Error for a 9-dim strided copy";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dims"), std::string::npos) << e.what();
  }
}

// ---- fill, arange, random -------------------------------------------------------------

TEST(CudaCreation, FillAndArangeMatchCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  for (DType dt : kAllDTypes) {
    const std::string what = dtype_name(dt);
    expect_equal(full({5, 77}, 3.25, {.dtype = dt, .device = kGpu}), full({5, 77}, 3.25, {.dtype = dt}), what + " full");
    Tensor g = zeros({6, 8}, {.dtype = dt, .device = kGpu}), c = zeros({6, 8}, {.dtype = dt});
    Tensor gv = g.slice(1, 1, 8, 2), cv = c.slice(1, 1, 8, 2);
    gv.fill_(1.0);
    cv.fill_(1.0);
    expect_equal(g, c, what + " fill_ of a strided view");
    if (dt == DType::boolean) continue;
    expect_equal(arange(0.0, 250.0, 0.5, {.dtype = dt, .device = kGpu}), arange(0.0, 250.0, 0.5, {.dtype = dt}),
                 what + " arange");
  }
}

TEST(CudaRandom, UniformMatchesCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    for (int64_t n : {int64_t{1}, int64_t{1001}, (int64_t{1} << 22) + 3}) {
      Generator gc(1234), gg(1234);
      (void)rand({3}, {.dtype = dt}, &gc);  // a non-zero, odd stream offset
      (void)rand({3}, {.dtype = dt, .device = kGpu}, &gg);
      const Tensor c = uniform({n}, -2.0, 3.0, {.dtype = dt}, &gc);
      const Tensor g = uniform({n}, -2.0, 3.0, {.dtype = dt, .device = kGpu}, &gg);
      EXPECT_EQ(gc.offset(), gg.offset());
      const auto cv = host_values(c), gv = host_values(g);
      double worst = 0;
      for (size_t i = 0; i < cv.size(); ++i) worst = std::max(worst, std::abs(cv[i] - gv[i]));
      EXPECT_LE(worst, 1e-6) << dtype_name(dt) << " n=" << n;
    }
  }
}

TEST(CudaRandom, NormalMatchesCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    for (int64_t n : {int64_t{2}, int64_t{1001}, (int64_t{1} << 22) + 3}) {
      Generator gc(99), gg(99);
      (void)randn({5}, {.dtype = dt}, &gc);
      (void)randn({5}, {.dtype = dt, .device = kGpu}, &gg);
      const Tensor c = normal({n}, 0.5, 2.0, {.dtype = dt}, &gc);
      const Tensor g = normal({n}, 0.5, 2.0, {.dtype = dt, .device = kGpu}, &gg);
      const double tol = (dt == DType::f32 || dt == DType::f64) ? 1e-5 : 1e-2;
      EXPECT_LE(rel_err(g, c), tol) << dtype_name(dt) << " n=" << n;
    }
  }
  // randint goes through uniform (f64), a conversion and an integer add on the device.
  Generator gc(5), gg(5);
  expect_equal(randint(-5, 7, {999}, {.dtype = DType::i64, .device = kGpu}, &gg),
               randint(-5, 7, {999}, {.dtype = DType::i64}, &gc), "randint");
}

// ---- unary ----------------------------------------------------------------------------

constexpr UnaryOp kUnaryOps[] = {UnaryOp::neg,  UnaryOp::abs,     UnaryOp::exp,  UnaryOp::log,  UnaryOp::sqrt,
                                 UnaryOp::rsqrt, UnaryOp::sin,    UnaryOp::cos,  UnaryOp::tanh, UnaryOp::sigmoid,
                                 UnaryOp::relu, UnaryOp::gelu,    UnaryOp::gelu_tanh, UnaryOp::silu};

Domain unary_domain(UnaryOp op) {
  switch (op) {
    case UnaryOp::log:
    case UnaryOp::sqrt:
    case UnaryOp::rsqrt: return Domain::positive;
    case UnaryOp::abs:
    case UnaryOp::relu: return Domain::away_from_zero;  // the kink at 0
    default: return Domain::real;
  }
}

Tensor apply_unary(UnaryOp op, const Tensor& x) {
  switch (op) {
    case UnaryOp::neg: return ops::neg(x);
    case UnaryOp::abs: return ops::abs(x);
    case UnaryOp::exp: return ops::exp(x);
    case UnaryOp::log: return ops::log(x);
    case UnaryOp::sqrt: return ops::sqrt(x);
    case UnaryOp::rsqrt: return ops::rsqrt(x);
    case UnaryOp::sin: return ops::sin(x);
    case UnaryOp::cos: return ops::cos(x);
    case UnaryOp::tanh: return ops::tanh(x);
    case UnaryOp::sigmoid: return ops::sigmoid(x);
    case UnaryOp::relu: return ops::relu(x);
    case UnaryOp::gelu: return ops::gelu(x, false);
    case UnaryOp::gelu_tanh: return ops::gelu(x, true);
    case UnaryOp::silu: return ops::silu(x);
  }
  return {};
}

using UnaryParam = std::tuple<UnaryOp, DType>;
std::string unary_param_name(const ::testing::TestParamInfo<UnaryParam>& info) {
  return std::string(unary_name(std::get<0>(info.param))) + "_" + dtype_name(std::get<1>(info.param));
}

class CudaUnary : public ::testing::TestWithParam<UnaryParam> {};

TEST_P(CudaUnary, ForwardMatchesCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  const auto [op, dt] = GetParam();
  for (Layout layout : kLayouts) {
    const Pair x = make_operand(layout, unary_domain(op), dt, 7);
    expect_close(apply_unary(op, x.gpu), apply_unary(op, x.cpu), tolerance(dt),
                 std::string(unary_name(op)) + " " + layout_name(layout));
  }
}

TEST_P(CudaUnary, BackwardMatchesCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  const auto [op, dt] = GetParam();
  for (Layout layout : {Layout::contiguous, Layout::transposed, Layout::unaligned, Layout::large}) {
    // g contiguous with a contiguous x (the vectorised path), strided otherwise.
    const Layout g_layout = layout == Layout::large || layout == Layout::contiguous ? layout : Layout::strided;
    const Pair x = make_operand(layout, unary_domain(op), dt, 8);
    const Pair g = make_operand(g_layout, Domain::real, dt, 9);
    Tensor y_cpu = empty(x.cpu.shape(), {.dtype = dt});
    cpu::unary(op, x.cpu, y_cpu);
    const Pair y = on_both(y_cpu);
    Tensor ref = empty(x.cpu.shape(), {.dtype = dt});
    Tensor got = empty(x.cpu.shape(), {.dtype = dt, .device = kGpu});
    cpu::unary_backward(op, g.cpu, x.cpu, y.cpu, ref);
    cuda::unary_backward(op, g.gpu, x.gpu, y.gpu, got);
    expect_close(got, ref, tolerance(dt), std::string(unary_name(op)) + " backward " + layout_name(layout));
  }
}

INSTANTIATE_TEST_SUITE_P(AllOps, CudaUnary, ::testing::Combine(::testing::ValuesIn(kUnaryOps), ::testing::ValuesIn(kFloatDTypes)),
                         unary_param_name);

TEST(CudaUnaryIntegers, NegAbsReluKeepIntegers) {
  FORGE_SKIP_WITHOUT_GPU();
  for (DType dt : {DType::i32, DType::i64}) {
    const Pair x = on_both(exact_values({kM, kN}, dt, 41));
    for (UnaryOp op : {UnaryOp::neg, UnaryOp::abs, UnaryOp::relu})
      expect_equal(apply_unary(op, x.gpu.t()), apply_unary(op, x.cpu.t()), std::string(unary_name(op)));
  }
}

TEST(CudaAutograd, UnaryAndMulBackwardOnTheGpu) {
  FORGE_SKIP_WITHOUT_GPU();
  const Tensor xh = host_input({kM, kN}, Domain::real, DType::f32, 51);
  const Tensor wh = host_input({kM, kN}, Domain::real, DType::f32, 52);
  const Tensor gh = host_input({kM, kN}, Domain::real, DType::f32, 53);
  auto run = [&](Device d) {
    Tensor x = xh.to(d).detach();  // a fresh leaf (to() returns xh itself on the CPU)
    x.requires_grad_();
    Tensor y = ops::mul(ops::tanh(ops::silu(x)), wh.to(d));
    y.backward(gh.to(d));
    return x.grad();
  };
  expect_close(run(kGpu), run(Device::cpu()), 1e-5, "d/dx tanh(silu(x)) * w");
}

// ---- binary and where -----------------------------------------------------------------

constexpr BinaryOp kBinaryOps[] = {BinaryOp::add, BinaryOp::sub, BinaryOp::mul, BinaryOp::div, BinaryOp::pow,
                                   BinaryOp::maximum, BinaryOp::minimum, BinaryOp::eq, BinaryOp::ne,
                                   BinaryOp::lt, BinaryOp::le, BinaryOp::gt, BinaryOp::ge};

Tensor apply_binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  switch (op) {
    case BinaryOp::add: return ops::add(a, b, 0.75);  // alpha
    case BinaryOp::sub: return ops::sub(a, b);
    case BinaryOp::mul: return ops::mul(a, b);
    case BinaryOp::div: return ops::div(a, b);
    case BinaryOp::pow: return ops::pow(a, b);
    case BinaryOp::maximum: return ops::maximum(a, b);
    case BinaryOp::minimum: return ops::minimum(a, b);
    case BinaryOp::eq: return ops::eq(a, b);
    case BinaryOp::ne: return ops::ne(a, b);
    case BinaryOp::lt: return ops::lt(a, b);
    case BinaryOp::le: return ops::le(a, b);
    case BinaryOp::gt: return ops::gt(a, b);
    case BinaryOp::ge: return ops::ge(a, b);
  }
  return {};
}

using BinaryParam = std::tuple<BinaryOp, DType>;
std::string binary_param_name(const ::testing::TestParamInfo<BinaryParam>& info) {
  return std::string(binary_name(std::get<0>(info.param))) + "_" + dtype_name(std::get<1>(info.param));
}

class CudaBinary : public ::testing::TestWithParam<BinaryParam> {};

TEST_P(CudaBinary, MatchesCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  const auto [op, dt] = GetParam();
  const bool cmp = binary_is_comparison(op);
  // Comparisons see small integers (so ties happen); pow a positive base; div a divisor
  // away from zero.
  const Domain da = cmp ? Domain::integral : (op == BinaryOp::pow ? Domain::positive : Domain::real);
  const Domain db = cmp ? Domain::integral : (op == BinaryOp::div ? Domain::away_from_zero : Domain::real);
  struct Case {
    const char* name;
    Pair a, b;
  };
  std::vector<Case> cases = {
      {"same shape", make_operand(Layout::contiguous, da, dt, 60), make_operand(Layout::contiguous, db, dt, 61)},
      {"transposed a", make_operand(Layout::transposed, da, dt, 60), make_operand(Layout::contiguous, db, dt, 61)},
      {"strided a, unaligned b", make_operand(Layout::strided, da, dt, 60), make_operand(Layout::unaligned, db, dt, 61)},
      {"b row [N]", make_operand(Layout::contiguous, da, dt, 60), on_both(host_input({kN}, db, dt, 63))},
      {"b column [M,1]", make_operand(Layout::contiguous, da, dt, 60), on_both(host_input({kM, 1}, db, dt, 62))},
      {"outer [M,1] x [1,N]", on_both(host_input({kM, 1}, da, dt, 64)), on_both(host_input({1, kN}, db, dt, 65))},
      {"b scalar", make_operand(Layout::transposed, da, dt, 60), on_both(host_input({}, db, dt, 66))},
      {"large", make_operand(Layout::large, da, dt, 67), make_operand(Layout::large, db, dt, 68)},
  };
  for (const Case& c : cases) {
    const std::string what = std::string(binary_name(op)) + " " + c.name;
    const Tensor got = apply_binary(op, c.a.gpu, c.b.gpu), ref = apply_binary(op, c.a.cpu, c.b.cpu);
    if (cmp) {
      ASSERT_TRUE(got.is_cuda());
      expect_equal(got, ref, what);
    } else {
      expect_close(got, ref, tolerance(dt), what);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllOps, CudaBinary,
                         ::testing::Combine(::testing::ValuesIn(kBinaryOps), ::testing::ValuesIn(kFloatDTypes)),
                         binary_param_name);

TEST(CudaBinaryIntegers, MatchCpuExactly) {
  FORGE_SKIP_WITHOUT_GPU();
  for (DType dt : {DType::i32, DType::i64, DType::u8}) {
    const Pair a = on_both(exact_values({kM, kN}, dt, 71));
    const Pair b = on_both(exact_values({kN}, dt, 72));
    for (BinaryOp op : {BinaryOp::add, BinaryOp::sub, BinaryOp::mul, BinaryOp::maximum, BinaryOp::minimum,
                        BinaryOp::eq, BinaryOp::lt, BinaryOp::ge}) {
      expect_equal(apply_binary(op, a.gpu, b.gpu), apply_binary(op, a.cpu, b.cpu),
                   std::string(binary_name(op)) + " " + dtype_name(dt));
    }
  }
}

TEST(CudaInPlace, AddAndMulMatchCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  for (DType dt : {DType::f32, DType::bf16}) {
    Pair a = make_operand(Layout::contiguous, Domain::real, dt, 81);
    Pair ta = view_both(on_both(host_input({kN, kM}, Domain::real, dt, 82)), [](const Tensor& t) { return t.t(); });
    const Pair b = on_both(host_input({kN}, Domain::real, dt, 83));
    for (Pair* p : {&a, &ta}) {
      p->gpu.add_(b.gpu, -1.5).mul_(0.25);
      p->cpu.add_(b.cpu, -1.5).mul_(0.25);
      expect_close(p->gpu, p->cpu, tolerance(dt), "add_ then mul_");
    }
  }
}

TEST(CudaWhere, MatchesCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  for (DType dt : kAllDTypes) {
    Generator gen(91);
    const Pair cond = on_both(ops::gt(rand({kM, 1}, {}, &gen), 0.5));
    const Pair cond_full = on_both(ops::gt(rand({kM, kN}, {}, &gen), 0.5));
    const Pair a = view_both(on_both(exact_values({kN, kM}, dt, 92)), [](const Tensor& t) { return t.t(); });
    const Pair b = on_both(exact_values({kN}, dt, 93));
    const std::string what = std::string("where ") + dtype_name(dt);
    expect_equal(ops::where(cond.gpu, a.gpu, b.gpu), ops::where(cond.cpu, a.cpu, b.cpu), what + " broadcast cond");
    expect_equal(ops::where(cond_full.gpu, a.gpu, b.gpu), ops::where(cond_full.cpu, a.cpu, b.cpu), what);
  }
}

}  // namespace
}  // namespace forge
