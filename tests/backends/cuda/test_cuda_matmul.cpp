// cuBLASLt GEMMs against the CPU backend: matmul (all four transpose combinations through
// views, odd sizes, misaligned and non-GEMM-able layouts, batched, broadcast batch dims,
// 1-D operands, empty sums), its backward, TF32, the plan cache, and linear / linear_gelu
// forward and backward (bias epilogue, bias-gradient epilogue, GELU epilogue, and their
// fallbacks).
//
// Every check runs the same (rounded) inputs through both backends; the CPU reference
// computes in f32 (f64 for f64) from the GPU's inputs converted exactly, and the GPU result
// is compared by ||out - ref|| / ||ref|| (f32 1e-5, bf16/f16 1e-2, f64 1e-12; TF32 1e-3).
#include <gtest/gtest.h>

#include <tuple>

#include <functional>
#include <string>
#include <vector>

#include "backends/cuda/cuda_testing.h"
#include "forge/backends/cpu/unary.h"
#include "forge/backends/cuda/elementwise.h"
#include "forge/backends/cuda/matmul.h"
#include "forge/core/env.h"
#include "forge/forge.h"
#include "forge/nn/llama.h"
#include "forge/nn/layers.h"

namespace forge {
namespace {

using namespace cuda_testing;

DType ref_dtype(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

// The CPU reference operand: the same values, exactly, in the reference dtype.
Tensor ref_of(const Tensor& cpu) { return cpu.to(ref_dtype(cpu.dtype())); }

void expect_matches(const Tensor& gpu, const Tensor& ref, double tol, const std::string& what) {
  expect_close(gpu.to(ref.dtype()), ref, tol, what);
}

// An (r, c) operand on both devices: stored as (r, c), or as the transpose of a stored (c, r).
Pair operand(int64_t r, int64_t c, bool transposed, DType dt, uint64_t seed) {
  if (!transposed) return on_both(host_input({r, c}, Domain::real, dt, seed));
  return view_both(on_both(host_input({c, r}, Domain::real, dt, seed)), [](const Tensor& t) { return t.t(); });
}

class CudaMatmul : public ::testing::TestWithParam<DType> {};

TEST_P(CudaMatmul, AllTransposeCombinationsOddSizes) {
  FORGE_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const int64_t M = 37, K = 61, N = 129;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const Pair a = operand(M, K, ta, dt, 1), b = operand(K, N, tb, dt, 2);
      const std::string what = std::string("matmul ") + (ta ? "A^T" : "A") + (tb ? " B^T" : " B");
      expect_matches(ops::matmul(a.gpu, b.gpu), ops::matmul(ref_of(a.cpu), ref_of(b.cpu)), tolerance(dt), what);
    }
  }
}

TEST_P(CudaMatmul, MisalignedAndNonGemmLayouts) {
  FORGE_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const int64_t M = 37, K = 61, N = 129;
  const Pair b = operand(K, N, false, dt, 3);
  // Offset by one element: the data pointer is only element-aligned.
  const Pair a_off = view_both(on_both(host_input({M * K + 1}, Domain::real, dt, 4)),
                               [&](const Tensor& t) { return t.narrow(0, 1, M * K).view({M, K}); });
  expect_matches(ops::matmul(a_off.gpu, b.gpu), ops::matmul(ref_of(a_off.cpu), ref_of(b.cpu)), tolerance(dt),
                 "misaligned A");
  // Every other column: neither row- nor column-major, copied before the GEMM.
  const Pair a_str = view_both(on_both(host_input({M, 2 * K}, Domain::real, dt, 5)),
                               [&](const Tensor& t) { return t.slice(1, 0, 2 * K, 2); });
  expect_matches(ops::matmul(a_str.gpu, b.gpu), ops::matmul(ref_of(a_str.cpu), ref_of(b.cpu)), tolerance(dt),
                 "strided A");
  // A padded row stride (leading dimension 70 > K) read in place.
  const Pair a_pad = view_both(on_both(host_input({M, 70}, Domain::real, dt, 6)),
                               [&](const Tensor& t) { return t.narrow(1, 0, K); });
  expect_matches(ops::matmul(a_pad.gpu, b.gpu), ops::matmul(ref_of(a_pad.cpu), ref_of(b.cpu)), tolerance(dt),
                 "padded A");
  // A broadcast row (stride-0 rows: copied).
  const Pair a_bc = view_both(on_both(host_input({1, K}, Domain::real, dt, 7)),
                              [&](const Tensor& t) { return t.expand({M, K}); });
  expect_matches(ops::matmul(a_bc.gpu, b.gpu), ops::matmul(ref_of(a_bc.cpu), ref_of(b.cpu)), tolerance(dt),
                 "broadcast rows of A");
}

TEST_P(CudaMatmul, BatchedAndBroadcastBatches) {
  FORGE_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const int64_t M = 37, K = 61, N = 29;
  struct Case {
    const char* what;
    Shape a, b;
    std::function<Tensor(const Tensor&)> va, vb;
  };
  const auto id = [](const Tensor& t) { return t; };
  const std::vector<Case> cases = {
      {"[3,M,K] x [3,K,N]", {3, M, K}, {3, K, N}, id, id},
      {"[2,1,M,K] x [3,K,N] (broadcast both)", {2, 1, M, K}, {3, K, N}, id, id},
      {"[M,K] x [4,K,N] (A broadcast, batch stride 0)", {M, K}, {4, K, N}, id, id},
      {"[4,M,K] x [K,N] (folded into one GEMM)", {4, M, K}, {K, N}, id, id},
      {"[3,K,M]^T x [3,N,K]^T", {3, K, M}, {3, N, K}, [](const Tensor& t) { return t.transpose(1, 2); },
       [](const Tensor& t) { return t.transpose(1, 2); }},
      {"[2,3,M,K] from [2,1,M,K] x [2,3,K,N] (batch dims that do not coalesce)", {2, 1, M, K}, {2, 3, K, N},
       [&](const Tensor& t) { return t.expand({2, 3, M, K}); }, id},
      {"[2,3,M,K] x [3,2,K,N] permuted batch of B", {2, 3, M, K}, {3, 2, K, N}, id,
       [](const Tensor& t) { return t.transpose(0, 1); }},
  };
  uint64_t seed = 10;
  for (const Case& c : cases) {
    const Pair a = view_both(on_both(host_input(c.a, Domain::real, dt, seed++)), c.va);
    const Pair b = view_both(on_both(host_input(c.b, Domain::real, dt, seed++)), c.vb);
    expect_matches(ops::matmul(a.gpu, b.gpu), ops::matmul(ref_of(a.cpu), ref_of(b.cpu)), tolerance(dt), c.what);
  }
  // bmm with an expanded (stride-0) batch of B.
  const Pair a = on_both(host_input({3, M, K}, Domain::real, dt, 30));
  const Pair b = view_both(on_both(host_input({1, K, N}, Domain::real, dt, 31)),
                           [](const Tensor& t) { return t.expand({3, K, N}); });
  expect_matches(ops::bmm(a.gpu, b.gpu), ops::bmm(ref_of(a.cpu), ref_of(b.cpu)), tolerance(dt), "bmm stride-0 B");
}

TEST_P(CudaMatmul, VectorOperandsAndEmptySums) {
  FORGE_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const int64_t M = 37, K = 61, N = 29;
  struct Case {
    const char* what;
    Shape a, b;
  };
  const std::vector<Case> cases = {{"[K].[K]", {K}, {K}},           {"[K] x [K,N]", {K}, {K, N}},
                                   {"[M,K] x [K]", {M, K}, {K}},     {"[2,M,K] x [K]", {2, M, K}, {K}},
                                   {"[K] x [2,K,N]", {K}, {2, K, N}}, {"[1,K] x [K,1]", {1, K}, {K, 1}}};
  uint64_t seed = 40;
  for (const Case& c : cases) {
    const Pair a = on_both(host_input(c.a, Domain::real, dt, seed++));
    const Pair b = on_both(host_input(c.b, Domain::real, dt, seed++));
    expect_matches(ops::matmul(a.gpu, b.gpu), ops::matmul(ref_of(a.cpu), ref_of(b.cpu)), tolerance(dt), c.what);
  }
  // K == 0: zeros; M == 0: empty.
  const TensorOptions on_gpu{.dtype = dt, .device = kGpu};
  const Tensor z = ops::matmul(empty({M, 0}, on_gpu), empty({0, N}, on_gpu));
  ASSERT_EQ(z.shape(), (Shape{M, N}));
  for (double x : z.to_vector<double>()) ASSERT_EQ(x, 0.0);
  EXPECT_EQ(ops::matmul(empty({0, K}, on_gpu), empty({K, N}, on_gpu)).shape(), (Shape{0, N}));
}

TEST_P(CudaMatmul, Backward) {
  FORGE_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  struct Case {
    const char* what;
    Shape a, b;
  };
  // The broadcast case sums gradients over batch dims (ops::sum_to: CUDA reductions).
  const std::vector<Case> cases = {{"[2,37,61] x [61,29]", {2, 37, 61}, {61, 29}},
                                   {"[2,1,37,61] x [3,61,29]", {2, 1, 37, 61}, {3, 61, 29}},
                                   {"[61] x [61,29]", {61}, {61, 29}}};
  uint64_t seed = 60;
  for (const Case& c : cases) {
    const Pair a = on_both(host_input(c.a, Domain::real, dt, seed++));
    const Pair b = on_both(host_input(c.b, Domain::real, dt, seed++));
    Tensor ag = a.gpu.detach().requires_grad_(), bg = b.gpu.detach().requires_grad_();
    Tensor ac = ref_of(a.cpu).requires_grad_(), bc = ref_of(b.cpu).requires_grad_();
    Tensor yg = ops::matmul(ag, bg), yc = ops::matmul(ac, bc);
    const Pair g = on_both(host_input(yc.shape(), Domain::real, dt, seed++));
    yg.backward(g.gpu);
    yc.backward(ref_of(g.cpu));
    expect_matches(yg, yc, tolerance(dt), std::string(c.what) + " forward");
    expect_matches(ag.grad(), ac.grad(), tolerance(dt), std::string(c.what) + " grad a");
    expect_matches(bg.grad(), bc.grad(), tolerance(dt), std::string(c.what) + " grad b");
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaMatmul, ::testing::Values(DType::f32, DType::bf16, DType::f16, DType::f64));

TEST(CudaMatmulTf32, FlagSwitchesComputeAndStaysAccurate) {
  FORGE_SKIP_WITHOUT_GPU();
  const bool before = cuda::allow_tf32();
  const Pair a = on_both(host_input({256, 320}, Domain::real, DType::f32, 70));
  const Pair b = on_both(host_input({320, 192}, Domain::real, DType::f32, 71));
  const Tensor ref = ops::matmul(a.cpu, b.cpu);
  cuda::set_allow_tf32(true);
  EXPECT_TRUE(cuda::allow_tf32());
  expect_close(ops::matmul(a.gpu, b.gpu), ref, 1e-3, "tf32 matmul");  // TF32 keeps 10 mantissa bits
  cuda::set_allow_tf32(false);
  EXPECT_FALSE(cuda::allow_tf32());
  expect_close(ops::matmul(a.gpu, b.gpu), ref, 1e-5, "f32 matmul");
  cuda::set_allow_tf32(before);
}

TEST(CudaMatmulPlans, RepeatedShapesReuseTheirPlan) {
  FORGE_SKIP_WITHOUT_GPU();
  const Tensor a = randn({45, 77}, {.device = kGpu}), b = randn({77, 53}, {.device = kGpu});
  (void)ops::matmul(a, b);
  const int64_t after_first = cuda::gemm_plans_cached(0);
  for (int i = 0; i < 3; ++i) (void)ops::matmul(a, b);
  const Tensor a2 = randn({45, 77}, {.device = kGpu});  // another buffer of the same shape
  (void)ops::matmul(a2, b);
  EXPECT_EQ(cuda::gemm_plans_cached(0), after_first);
  (void)ops::matmul(b.t(), a.t());  // a new shape: one more plan
  EXPECT_EQ(cuda::gemm_plans_cached(0), after_first + 1);
}

TEST(CudaMatmulErrors, IntegerMatmulHasNoCudaKernel) {
  FORGE_SKIP_WITHOUT_GPU();
  const Tensor a = zeros({2, 3}, {.dtype = DType::i64, .device = kGpu});
  EXPECT_THROW(ops::matmul(a, zeros({3, 2}, {.dtype = DType::i64, .device = kGpu})), Error);
}

// ---- linear / linear_gelu ------------------------------------------------------------------

struct LinearCase {
  const char* what;
  Shape x;
  int64_t out;
  bool bias;
};

// Forward and all three gradients of op (linear or linear_gelu) against the CPU in f32.
void check_linear(DType dt, const LinearCase& c, bool gelu, uint64_t seed, double fwd_tol) {
  const int64_t in = c.x.back();
  const Pair x = on_both(host_input(c.x, Domain::real, dt, seed));
  // Weights scaled like a trained layer's so the GELU sees inputs of order 1.
  const Pair w = on_both(ops::mul(host_input({c.out, in}, Domain::real, DType::f32, seed + 1), 0.2).to(dt));
  const Pair b = on_both(host_input({c.out}, Domain::real, dt, seed + 2));
  Tensor xg = x.gpu.detach().requires_grad_(), wg = w.gpu.detach().requires_grad_();
  Tensor bg = c.bias ? b.gpu.detach().requires_grad_() : Tensor();
  Tensor xc = ref_of(x.cpu).requires_grad_(), wc = ref_of(w.cpu).requires_grad_();
  Tensor bc = c.bias ? ref_of(b.cpu).requires_grad_() : Tensor();
  Tensor yg = gelu ? ops::linear_gelu(xg, wg, bg) : ops::linear(xg, wg, bg);
  Tensor yc = gelu ? ops::linear_gelu(xc, wc, bc) : ops::linear(xc, wc, bc);
  const std::string what = std::string(gelu ? "linear_gelu " : "linear ") + c.what;
  expect_matches(yg, yc, fwd_tol, what + " forward");
  const Pair g = on_both(host_input(yc.shape(), Domain::real, dt, seed + 3));
  yg.backward(g.gpu);
  yc.backward(ref_of(g.cpu));
  const double tol = tolerance(dt);
  expect_matches(xg.grad(), xc.grad(), tol, what + " dx");
  expect_matches(wg.grad(), wc.grad(), tol, what + " dw");
  if (c.bias) expect_matches(bg.grad(), bc.grad(), tol, what + " dbias");
}

const std::vector<LinearCase>& linear_cases() {
  static const std::vector<LinearCase> cases = {
      {"odd sizes [37,61] -> 129, bias", {37, 61}, 129, true},
      {"aligned [64,96] -> 256, bias (epilogue path)", {64, 96}, 256, true},
      {"3-D [2,37,64] -> 128, bias", {2, 37, 64}, 128, true},
      {"no bias [37,61] -> 40", {37, 61}, 40, false},
      {"1-D input [61] -> 24, bias", {61}, 24, true},
  };
  return cases;
}

class CudaLinear : public ::testing::TestWithParam<DType> {};

TEST_P(CudaLinear, ForwardAndBackward) {
  FORGE_SKIP_WITHOUT_GPU();
  uint64_t seed = 100;
  for (const LinearCase& c : linear_cases()) check_linear(GetParam(), c, false, seed += 10, tolerance(GetParam()));
}

TEST_P(CudaLinear, GeluForwardAndBackward) {
  FORGE_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  // cuBLASLt's GELU epilogue evaluates its own tanh approximation: in f32 it differs from
  // forge's gelu_tanh in the last bits (about 1e-6 absolute), hence 1e-4 for that forward.
  const double fwd_tol = dt == DType::f32 ? 1e-4 : tolerance(dt);
  uint64_t seed = 200;
  for (const LinearCase& c : linear_cases()) check_linear(dt, c, true, seed += 10, fwd_tol);
}

TEST_P(CudaLinear, OnlyTheBiasNeedsAGradient) {
  FORGE_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const Pair x = on_both(host_input({37, 61}, Domain::real, dt, 300));
  const Pair w = on_both(host_input({48, 61}, Domain::real, dt, 301));
  const Pair b = on_both(host_input({48}, Domain::real, dt, 302));
  Tensor bg = b.gpu.detach().requires_grad_(), bc = ref_of(b.cpu).requires_grad_();
  Tensor yg = ops::linear(x.gpu, w.gpu, bg), yc = ops::linear(ref_of(x.cpu), ref_of(w.cpu), bc);
  const Pair g = on_both(host_input(yc.shape(), Domain::real, dt, 303));
  yg.backward(g.gpu);
  yc.backward(ref_of(g.cpu));
  expect_matches(bg.grad(), bc.grad(), tolerance(dt), "dbias alone (column sums)");
}

TEST_P(CudaLinear, NonContiguousInputs) {
  FORGE_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const Pair x = view_both(on_both(host_input({61, 37}, Domain::real, dt, 310)), [](const Tensor& t) { return t.t(); });
  const Pair w = view_both(on_both(host_input({64, 122}, Domain::real, dt, 311)),
                           [](const Tensor& t) { return t.slice(1, 0, 122, 2); });
  const Pair b = view_both(on_both(host_input({128}, Domain::real, dt, 312)),
                           [](const Tensor& t) { return t.slice(0, 0, 128, 2); });
  expect_matches(ops::linear(x.gpu, w.gpu, b.gpu), ops::linear(ref_of(x.cpu), ref_of(w.cpu), ref_of(b.cpu)),
                 tolerance(dt), "linear of views");
}

// Note [GELU gradient in the GEMM]: gelu_mlp on CUDA (the DGELU_BGRAD epilogue where cuBLASLt has
// it: hidden a multiple of 8, not f64; the unfused steps elsewhere) against the CPU, all five
// gradients, with and without biases.
TEST_P(CudaLinear, GeluMlpForwardAndBackward) {
  FORGE_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  uint64_t seed = 600;
  for (const auto& [M, in, hidden, out, bias] :
       {std::tuple{64, 96, 256, 96, true}, std::tuple{37, 61, 129, 40, true}, std::tuple{2 * 33, 64, 128, 64, false}}) {
    const std::string what = "gelu_mlp M=" + std::to_string(M) + " hidden=" + std::to_string(hidden) +
                             (bias ? "" : " no bias") + " [" + dtype_name(dt) + "]";
    const Pair x = on_both(host_input({M, in}, Domain::real, dt, seed += 10));
    const Pair w1 = on_both(host_input({hidden, in}, Domain::real, dt, seed + 1));
    const Pair b1 = on_both(host_input({hidden}, Domain::real, dt, seed + 2));
    const Pair w2 = on_both(host_input({out, hidden}, Domain::real, dt, seed + 3));
    const Pair b2 = on_both(host_input({out}, Domain::real, dt, seed + 4));
    auto leaves = [&](bool gpu) {
      auto pick = [&](const Pair& p) { return (gpu ? p.gpu : ref_of(p.cpu)).detach().requires_grad_(); };
      return TensorList{pick(x), pick(w1), bias ? pick(b1) : Tensor(), pick(w2), bias ? pick(b2) : Tensor()};
    };
    TensorList lg = leaves(true), lc = leaves(false);
    Tensor yg = ops::gelu_mlp(lg[0], lg[1], lg[2], lg[3], lg[4]);
    Tensor yc = ops::gelu_mlp(lc[0], lc[1], lc[2], lc[3], lc[4]);
    const double tol = tolerance(dt) * (dt == DType::f32 ? 100 : 2);  // f32: the GELU epilogue's last bits
    expect_matches(yg, yc, tol, what + " forward");
    const Pair g = on_both(host_input(yc.shape(), Domain::real, dt, seed + 5));
    yg.backward(g.gpu);
    yc.backward(ref_of(g.cpu));
    const char* names[] = {"dx", "dw_fc", "db_fc", "dw_proj", "db_proj"};
    for (size_t i = 0; i < 5; ++i)
      if (lc[i].defined()) expect_matches(lg[i].grad(), lc[i].grad(), tol, what + " " + names[i]);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaLinear, ::testing::Values(DType::f32, DType::bf16, DType::f16, DType::f64));

// A fresh leaf with the values of `p` on `d` (the GPU's, or the CPU reference's in f32).
Tensor leaf_on(const Pair& p, Device d) { return (d.is_cuda() ? p.gpu : ref_of(p.cpu)).detach().clone().requires_grad_(); }

// Gives w and b gradient buffers in one flat tensor of stale values (7): w's view at 0, b's
// after a gap of kGap elements, as DDP's bucket views. Returns the flat tensor.
constexpr int64_t kGap = 32;
Tensor attach_grad_buffers(const Tensor& w, const Tensor& b) {
  const int64_t nw = w.numel();
  Tensor flat = full({nw + kGap + b.numel()}, 7.0, {.dtype = w.dtype(), .device = w.device()});
  w.set_grad_buffer(flat.narrow(0, 0, nw).view(w.shape()));
  b.set_grad_buffer(flat.narrow(0, nw + kGap, b.numel()));
  return flat;
}

// Note [claimed grad buffer] on the GPU: the weight-gradient GEMM (with its bias-gradient
// epilogue) and the embedding backward write into pre-allocated gradient buffers (DDP's
// bucket views); a weight used as tied embedding and head gets the sum there. Compared with
// the CPU backend on the same inputs, in bf16 (the training dtype) and f32.
TEST(CudaLinearGradBuffers, WeightAndBiasGradientsLandInTheBuffers) {
  FORGE_SKIP_WITHOUT_GPU();
  for (DType dt : {DType::f32, DType::bf16}) {
    const Pair x = on_both(host_input({64, 96}, Domain::real, dt, 330));
    const Pair r1 = on_both(host_input({64, 128}, Domain::real, dt, 331));
    const Pair r2 = on_both(host_input({40, 96}, Domain::real, dt, 332));
    const Pair w = on_both(host_input({128, 96}, Domain::real, dt, 333));
    const Pair b = on_both(host_input({128}, Domain::real, dt, 334));
    std::vector<int64_t> idv(40);
    for (size_t i = 0; i < idv.size(); ++i) idv[i] = static_cast<int64_t>((i * 37) % 128);
    const Tensor ids_cpu = from_vector<int64_t>(idv, {40});
    auto grads = [&](Device d, bool buffers) {
      const bool gpu = d.is_cuda();
      const Tensor wl = leaf_on(w, d), bl = leaf_on(b, d);
      const Tensor flat = buffers ? attach_grad_buffers(wl, bl) : Tensor();
      const Tensor xi = gpu ? x.gpu : ref_of(x.cpu), a = gpu ? r1.gpu : ref_of(r1.cpu), c = gpu ? r2.gpu : ref_of(r2.cpu);
      (ops::sum(ops::mul(ops::linear(xi, wl, bl), a)) + ops::sum(ops::mul(ops::embedding(wl, ids_cpu.to(d)), c)))
          .backward();
      if (buffers) {
        EXPECT_TRUE(wl.grad().storage() == flat.storage() && bl.grad().storage() == flat.storage());
        EXPECT_EQ(flat.narrow(0, 128 * 96, kGap).to(DType::f64).to_vector<double>(), std::vector<double>(kGap, 7.0))
            << "between the views";
      }
      return std::make_pair(wl.grad(), bl.grad());
    };
    const auto ref = grads(Device::cpu(), false);
    const auto plain = grads(kGpu, false), buffered = grads(kGpu, true);
    expect_matches(buffered.first, ref.first, tolerance(dt), std::string("weight grad in the buffer, ") + dtype_name(dt));
    expect_matches(buffered.second, ref.second, tolerance(dt), std::string("bias grad in the buffer, ") + dtype_name(dt));
    expect_matches(buffered.first, plain.first.to(ref.first.dtype()), tolerance(dt), "buffered vs plain GPU weight grad");
  }
}

// The same for layer_norm and rms_norm's weight (and bias) gradients on the GPU.
TEST(CudaLinearGradBuffers, NormGradientsLandInTheBuffers) {
  FORGE_SKIP_WITHOUT_GPU();
  for (DType dt : {DType::f32, DType::bf16}) {
    const Pair x = on_both(host_input({64, 96}, Domain::real, dt, 340));
    const Pair r = on_both(host_input({64, 96}, Domain::real, dt, 341));
    const Pair w = on_both(host_input({96}, Domain::real, dt, 342));
    const Pair b = on_both(host_input({96}, Domain::real, dt, 343));
    auto grads = [&](Device d, bool buffers) {
      const bool gpu = d.is_cuda();
      const Tensor wl = leaf_on(w, d), bl = leaf_on(b, d);
      const Tensor flat = buffers ? attach_grad_buffers(wl, bl) : Tensor();
      const Tensor xi = gpu ? x.gpu : ref_of(x.cpu), ri = gpu ? r.gpu : ref_of(r.cpu);
      (ops::sum(ops::mul(ops::layer_norm(xi, wl, bl), ri)) + ops::sum(ops::mul(ops::rms_norm(xi, wl), ri))).backward();
      if (buffers) {
        EXPECT_TRUE(wl.grad().storage() == flat.storage() && bl.grad().storage() == flat.storage());
      }
      return std::make_pair(wl.grad(), bl.grad());
    };
    const auto ref = grads(Device::cpu(), false), buffered = grads(kGpu, true);
    expect_matches(buffered.first, ref.first, tolerance(dt), std::string("norm weight grad, ") + dtype_name(dt));
    expect_matches(buffered.second, ref.second, tolerance(dt), std::string("norm bias grad, ") + dtype_name(dt));
  }
}

TEST(CudaLinearModules, MlpMatchesTheCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  manual_seed(5);
  nn::MLP cpu_mlp(64, 256);
  nn::MLP gpu_mlp(64, 256);
  gpu_mlp.load_state_dict(cpu_mlp.state_dict());
  gpu_mlp.to(kGpu);
  const Pair x = on_both(host_input({2, 17, 64}, Domain::real, DType::f32, 320));
  Tensor yg = gpu_mlp.forward(x.gpu), yc = cpu_mlp.forward(x.cpu);
  expect_close(yg, yc, 1e-4, "MLP forward (the GELU epilogue's last bits, see above)");
  const Pair g = on_both(host_input(yc.shape(), Domain::real, DType::f32, 321));
  yg.backward(g.gpu);
  yc.backward(g.cpu);
  expect_close(gpu_mlp.c_fc->weight.grad(), cpu_mlp.c_fc->weight.grad(), 1e-4, "MLP c_fc.weight grad");
  expect_close(gpu_mlp.c_fc->bias.grad(), cpu_mlp.c_fc->bias.grad(), 1e-4, "MLP c_fc.bias grad");
  expect_close(gpu_mlp.c_proj->weight.grad(), cpu_mlp.c_proj->weight.grad(), 1e-4, "MLP c_proj.weight grad");
  expect_close(gpu_mlp.c_proj->bias.grad(), cpu_mlp.c_proj->bias.grad(), 1e-4, "MLP c_proj.bias grad");
}

// Note [input gradient accumulated in the GEMM]: one activation into three linears (LLaMA's q, k,
// v projections): the second and third add their dy W into the first's gradient with beta = 1;
// x's gradient matches the CPU, also when a gradient the engine holds must not be overwritten
// (the activation also feeds an add, whose backward hands the same tensor to both its inputs).
TEST(CudaLinearModules, SharedInputLinearsAccumulateTheirInputGradient) {
  FORGE_SKIP_WITHOUT_GPU();
  for (bool with_residual : {false, true}) {
    for (DType dt : {DType::f32, DType::bf16}) {
      const Pair x = on_both(host_input({2, 33, 64}, Domain::real, dt, 400));
      Pair w[3] = {on_both(host_input({48, 64}, Domain::real, dt, 401)),
                   on_both(host_input({16, 64}, Domain::real, dt, 402)),
                   on_both(host_input({16, 64}, Domain::real, dt, 403))};
      auto run = [&](bool gpu) {
        Tensor xl = (gpu ? x.gpu : ref_of(x.cpu)).detach().requires_grad_();
        Tensor h = ops::mul(xl, 1.5);  // a non-leaf: its gradient accumulates in the engine
        Tensor total;
        for (int i = 0; i < 3; ++i) {
          const Tensor wi = gpu ? w[i].gpu : ref_of(w[i].cpu);
          const Tensor y = ops::sum(ops::mul(ops::linear(h, wi), ops::linear(h, wi)));
          total = total.defined() ? ops::add(total, y) : y;
        }
        if (with_residual) total = ops::add(total, ops::sum(ops::mul(ops::add(h, h), 0.25)));
        total.backward();
        return xl.grad();
      };
      const Tensor gg = run(true), gc = run(false);
      expect_matches(gg, gc, tolerance(dt) * 4,
                     std::string("shared-input linears dx [") + dtype_name(dt) + (with_residual ? ", residual]" : "]"));
    }
  }
}

// A small LLaMA (GQA, head dim 64: cuDNN or flash attention, rope in the projections' memory
// order, fused SwiGLU, RMSNorm with the residual gradient, shared-input linears) on the GPU in
// f32 against the CPU: loss and every parameter's gradient. With FORGE_PACKED_QKV=1 too: q, k, v
// as one GEMM and ops::qkv_rope_attention on the GPU (Note [packed LLaMA attention]).
TEST(CudaLinearModules, TinyLlamaMatchesTheCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  nn::LlamaConfig c;
  c.vocab_size = 96;
  c.block_size = 64;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.dim = 256;
  c.ffn_hidden = 320;
  for (const char* packed : {"0", "1"})
  for (DType dt : {DType::f32, DType::bf16}) {
    const env::Override packed_qkv("FORGE_PACKED_QKV", std::string(packed));
    nn::Llama cpu_model(c, 7), gpu_model(c, 7);
    gpu_model.to(kGpu);
    gpu_model.to(dt);
    const Tensor idx = randint(0, c.vocab_size, {2, 48}, {.dtype = DType::i64});
    const Tensor tgt = randint(0, c.vocab_size, {2, 48}, {.dtype = DType::i64});
    Tensor lg = gpu_model.loss(idx.to(kGpu), tgt.to(kGpu)), lc = cpu_model.loss(idx, tgt);
    const double tol = dt == DType::f32 ? 2e-4 : 5e-2;
    EXPECT_NEAR(lg.to(DType::f64).item(), lc.to(DType::f64).item(), tol * 10) << dtype_name(dt);
    lg.backward();
    lc.backward();
    const auto gp = gpu_model.named_parameters(), cp = cpu_model.named_parameters();
    ASSERT_EQ(gp.size(), cp.size());
    for (size_t i = 0; i < gp.size(); ++i)
      expect_close(gp[i].second.grad().to(DType::f32), cp[i].second.grad().to(kGpu), tol,
                   gp[i].first + " grad [" + dtype_name(dt) + (packed[0] == '1' ? ", packed q/k/v]" : "]"));
  }
}

}  // namespace
}  // namespace forge

namespace forge {
namespace {

// cuda::column_sums (the bias gradient without the GEMM epilogue, FORGE_BGRAD_EPILOGUE=0): the
// 16-byte path (whole vectors per row) and the scalar one (odd widths, strided or misaligned rows)
// against the CPU's sums in f64, on fresh random inputs.
TEST(CudaColumnSums, MatchTheCpuOnEveryPath) {
  FORGE_SKIP_WITHOUT_GPU();
  struct Case {
    int64_t M, N;
    DType dtype;
    bool transposed;  // dy as the transpose of an (N, M) tensor: column stride != 1
    int64_t skip;     // dy starts `skip` elements into its storage (misaligned for skip % 8 != 0)
  };
  const Case cases[] = {{16384, 768, DType::bf16, false, 0}, {1000, 2304, DType::bf16, false, 0},
                        {37, 24, DType::f32, false, 0},      {5, 1, DType::f32, false, 0},
                        {300, 770, DType::bf16, false, 0},   {64, 96, DType::f16, true, 0},
                        {129, 64, DType::bf16, false, 3},    {1, 4096, DType::f64, false, 0}};
  uint64_t seed = 8100;
  for (const Case& c : cases) {
    const Tensor all = host_input({c.M * c.N + c.skip}, Domain::real, c.dtype, ++seed);
    Tensor dy_cpu = ops::narrow(all, 0, c.skip, c.M * c.N);
    dy_cpu = c.transposed ? ops::transpose(ops::reshape(dy_cpu, {c.N, c.M}), 0, 1) : ops::reshape(dy_cpu, {c.M, c.N});
    const Tensor dy_gpu = c.transposed ? ops::transpose(ops::reshape(ops::narrow(all.to(kGpu), 0, c.skip, c.M * c.N), {c.N, c.M}), 0, 1)
                                       : ops::reshape(ops::narrow(all.to(kGpu), 0, c.skip, c.M * c.N), {c.M, c.N});
    Tensor out = empty({c.N}, {.dtype = c.dtype, .device = kGpu});
    cuda::column_sums(dy_gpu, out);
    const Tensor want = dy_cpu.to(DType::f64).sum({0});
    const double tol = c.dtype == DType::f64 ? 1e-12 : c.dtype == DType::f32 ? 1e-5 : 1e-2;
    expect_close(out.to(DType::f64), want, tol,
                 "column sums of " + shape_str({c.M, c.N}) + " " + dtype_name(c.dtype));
  }
}

// Note [GELU and bias gradients in one pass]: cuda::gelu_backward_column_sums writes the same bits
// as the two steps it replaces (the elementwise GELU backward, then cuda::column_sums of its
// result), on fresh random inputs of GPT-2's MLP width and of a narrow f32 one; and both against
// the CPU. Where rows do not allow 16-byte loads it declines, having written nothing.
TEST(CudaGeluBiasGrad, OnePassIsTheTwoStepsBitForBit) {
  FORGE_SKIP_WITHOUT_GPU();
  struct Case {
    int64_t M, N;
    DType dtype;
  };
  uint64_t seed = 8200;
  for (const Case& c : {Case{4096, 3072, DType::bf16}, Case{300, 256, DType::f16}, Case{77, 12, DType::f32}}) {
    const std::string what = "GELU backward of " + shape_str({c.M, c.N}) + " " + dtype_name(c.dtype);
    const Pair g = on_both(host_input({c.M, c.N}, Domain::real, c.dtype, ++seed));
    const Pair pre = on_both(ops::mul(host_input({c.M, c.N}, Domain::real, DType::f32, ++seed), 3.0).to(c.dtype));
    const TensorOptions o{.dtype = c.dtype, .device = kGpu};
    ASSERT_TRUE(cuda::gelu_backward_column_sums_fit(g.gpu, pre.gpu)) << what;
    Tensor dpre = empty({c.M, c.N}, o), db = empty({c.N}, o);
    ASSERT_TRUE(cuda::gelu_backward_column_sums(g.gpu, pre.gpu, dpre, db)) << what;
    Tensor dpre2 = empty({c.M, c.N}, o), db2 = empty({c.N}, o);
    cuda::unary_backward(UnaryOp::gelu_tanh, g.gpu, pre.gpu, pre.gpu, dpre2);
    cuda::column_sums(dpre2, db2);
    expect_equal(dpre, dpre2, what + ": dpre against the elementwise kernel");
    expect_equal(db, db2, what + ": dbias against column_sums");
    Tensor want = empty({c.M, c.N}, {.dtype = c.dtype});
    cpu::unary_backward(UnaryOp::gelu_tanh, g.cpu, pre.cpu, pre.cpu, want);
    expect_matches(dpre, want, tolerance(c.dtype), what + ": dpre against the CPU");
    expect_close(db.to(DType::f64), dpre.to(Device::cpu()).to(DType::f64).sum({0}), c.dtype == DType::f32 ? 1e-5 : 1e-2,
                 what + ": dbias against the CPU's sums of dpre");
  }
  // 12 bf16 columns are not whole 16-byte vectors; a column slice is not contiguous.
  const Tensor odd = host_input({9, 12}, Domain::real, DType::bf16, 8210).to(kGpu);
  EXPECT_FALSE(cuda::gelu_backward_column_sums_fit(odd, odd));
  const Tensor wide = host_input({9, 32}, Domain::real, DType::bf16, 8211).to(kGpu);
  EXPECT_FALSE(cuda::gelu_backward_column_sums_fit(wide.slice(1, 0, 16), wide.slice(1, 0, 16)));
}

// Note [fast GELU gradient for 16-bit data] (FORGE_GELU_FAST=1): the one-pass kernel's dpre for
// bf16 and f16 within the dtype's tolerance of the exact kernel and of the CPU, over pre from -9 to
// 9 (the tails where tanh is near -1 and 1 included), dbias the sums of the dpre it stored; f32
// keeps the exact kernel's bits.
TEST(CudaGeluBiasGrad, FastGradientMatchesTheExactOne) {
  FORGE_SKIP_WITHOUT_GPU();
  uint64_t seed = 8300;
  for (DType dt : {DType::bf16, DType::f16, DType::f32}) {
    const int64_t M = 2048, N = 3072;
    const std::string what = "fast GELU backward of " + shape_str({M, N}) + " " + dtype_name(dt);
    const Pair g = on_both(host_input({M, N}, Domain::real, dt, ++seed));
    const Pair pre = on_both(ops::mul(host_input({M, N}, Domain::real, DType::f32, ++seed), 9.0).to(dt));
    const TensorOptions o{.dtype = dt, .device = kGpu};
    auto run = [&](const char* fast) {
      env::Override ov("FORGE_GELU_FAST", fast);
      Tensor dpre = empty({M, N}, o), db = empty({N}, o);
      EXPECT_TRUE(cuda::gelu_backward_column_sums(g.gpu, pre.gpu, dpre, db)) << what;
      return std::make_pair(dpre, db);
    };
    const auto [exact, db_exact] = run("0");
    const auto [fast, db_fast] = run("1");
    if (dt == DType::f32) {
      expect_equal(fast, exact, what + ": f32 dpre unchanged");
      expect_equal(db_fast, db_exact, what + ": f32 dbias unchanged");
      continue;
    }
    expect_close(fast, exact, tolerance(dt), what + ": dpre against the exact kernel");
    Tensor want = empty({M, N}, {.dtype = dt});
    cpu::unary_backward(UnaryOp::gelu_tanh, g.cpu, pre.cpu, pre.cpu, want);
    expect_matches(fast, want, tolerance(dt), what + ": dpre against the CPU");
    expect_close(db_fast.to(DType::f64), fast.to(Device::cpu()).to(DType::f64).sum({0}), 1e-2,
                 what + ": dbias against the sums of the dpre it stored");
  }
}

}  // namespace
}  // namespace forge
