// FP8 (e4m3) GEMM through cuBLASLt (backends/cuda/gemm_fp8.h): D bf16 = sa sb A B_t^T against a
// CPU reference in f64 from the decoded e4m3 values; the e4m3 decoder; random e4m3 inputs;
// argument checks.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "cuda_testing.h"
#include "forge/backends/cuda/gemm_fp8.h"
#include "forge/core/fp8.h"

namespace forge {
namespace {

using cuda_testing::kGpu;

#define FORGE_SKIP_WITHOUT_FP8()                                                           \
  do {                                                                                     \
    if (!cuda::fp8_gemm_supported(0)) GTEST_SKIP() << "cuda:0 has no FP8 GEMMs (needs sm_89+)"; \
  } while (0)

TEST(CudaGemmFp8, DecodeE4m3) {
  // Host code: runs wherever the CUDA build does (no GPU needed), but keeps the file's rule.
  FORGE_SKIP_WITHOUT_GPU();
  EXPECT_EQ(cuda::e4m3_to_float(0x00), 0.0f);
  EXPECT_EQ(cuda::e4m3_to_float(0x80), 0.0f);
  EXPECT_TRUE(std::signbit(cuda::e4m3_to_float(0x80)));
  EXPECT_EQ(cuda::e4m3_to_float(0x38), 1.0f);            // 0 0111 000
  EXPECT_EQ(cuda::e4m3_to_float(0xb8), -1.0f);
  EXPECT_EQ(cuda::e4m3_to_float(0x3c), 1.5f);            // 0 0111 100
  EXPECT_EQ(cuda::e4m3_to_float(0x40), 2.0f);            // 0 1000 000
  EXPECT_EQ(cuda::e4m3_to_float(0x7e), 448.0f);          // the largest finite value
  EXPECT_EQ(cuda::e4m3_to_float(0x78), 256.0f);          // exponent 15 is finite in e4m3
  EXPECT_EQ(cuda::e4m3_to_float(0x77), 240.0f);
  EXPECT_EQ(cuda::e4m3_to_float(0x08), std::ldexp(1.0f, -6));   // smallest normal
  EXPECT_EQ(cuda::e4m3_to_float(0x01), std::ldexp(1.0f, -9));   // smallest subnormal
  EXPECT_EQ(cuda::e4m3_to_float(0x07), std::ldexp(7.0f, -9));   // largest subnormal
  EXPECT_TRUE(std::isnan(cuda::e4m3_to_float(0x7f)));
  EXPECT_TRUE(std::isnan(cuda::e4m3_to_float(0xff)));
  int nans = 0;
  for (int b = 0; b < 256; ++b) nans += std::isnan(cuda::e4m3_to_float(static_cast<uint8_t>(b))) ? 1 : 0;
  EXPECT_EQ(nans, 2);
  // The host codec of the FP8 recipes (core/fp8.h) reads every code as the GEMM's decoder does.
  for (int b = 0; b < 256; ++b) {
    const float c = cuda::e4m3_to_float(static_cast<uint8_t>(b));
    const double h = fp8::decode(static_cast<uint8_t>(b), fp8::Format::e4m3);
    if (std::isnan(c)) {
      EXPECT_TRUE(std::isnan(h)) << b;
    } else {
      EXPECT_EQ(static_cast<double>(c), h) << b;
    }
  }
}

TEST(CudaGemmFp8, RandomInputs) {
  FORGE_SKIP_WITHOUT_GPU();
  const Tensor t = cuda::random_e4m3(0, {64, 96}, 7);
  EXPECT_TRUE(t.is_cuda());
  EXPECT_EQ(t.dtype(), DType::u8);
  EXPECT_EQ(t.shape(), (Shape{64, 96}));
  const auto bits = t.to_vector<uint8_t>();
  EXPECT_EQ(bits, cuda::random_e4m3(0, {64, 96}, 7).to_vector<uint8_t>());  // deterministic
  EXPECT_NE(bits, cuda::random_e4m3(0, {64, 96}, 8).to_vector<uint8_t>());
  std::set<uint8_t> distinct(bits.begin(), bits.end());
  double mean_abs = 0;
  int negative = 0;
  for (uint8_t b : bits) {
    const float v = cuda::e4m3_to_float(b);
    ASSERT_TRUE(std::isfinite(v)) << int(b);
    ASSERT_LE(std::fabs(v), 2.0f) << int(b);
    mean_abs += std::fabs(v);
    negative += v < 0 ? 1 : 0;
  }
  mean_abs /= static_cast<double>(bits.size());
  EXPECT_NEAR(mean_abs, 1.0, 0.1);  // uniform [-2, 2): E|x| = 1
  EXPECT_NEAR(negative, 64 * 96 / 2, 300);
  EXPECT_GT(distinct.size(), 80u);  // 129 e4m3 patterns lie in [-2, 2]; all but the rarest tiny ones appear
}

// d (m, n) = sa * sb * a (m, k) b_t (n, k)^T in bf16 against the f64 reference.
//
// Bound per element: |d - ref| <= 2^-8 |ref| + 1e-3 * sa sb sum_k |a_ik b_jk|.
//  * The products of two e4m3 values (4 significant bits each) are exact in f32; cuBLASLt
//    accumulates them in f32 (with Hopper's periodic promotion of the tensor cores' partial
//    sums), so the accumulation error is at most a few units of the partial sums' precision
//    times sum_k |a b|; 1e-3 leaves a wide margin above f32 (k * 2^-24 ~ 3e-5 at k = 512) and
//    above a reduced-precision (~2^-13) tensor-core partial sum.
//  * The final rounding to bf16 (8 significant bits) is at most 2^-9 |d|: 2^-8 |ref| covers it.
//  A wrong layout, transpose or ignored scale gives errors of the order of |ref| itself
//  (~ sqrt(k) * 4/3, against sum_k |a b| * 1e-3 ~ k * 1e-3 here), so the bound still catches them.
void check_gemm(int64_t m, int64_t n, int64_t k, float sa, float sb, uint64_t seed) {
  SCOPED_TRACE("m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k));
  const Tensor a = cuda::random_e4m3(0, {m, k}, seed);
  const Tensor b_t = cuda::random_e4m3(0, {n, k}, seed + 1);
  const Tensor scale_a = full({1}, sa, {.dtype = DType::f32, .device = kGpu});
  const Tensor scale_b = full({1}, sb, {.dtype = DType::f32, .device = kGpu});
  Tensor d = full({m, n}, 12345.0, {.dtype = DType::bf16, .device = kGpu});  // must be overwritten
  cuda::fp8_gemm_bf16_out(a, b_t, scale_a, scale_b, d);
  const auto got = d.to_vector<double>();
  const auto ab = a.to_vector<uint8_t>(), bb = b_t.to_vector<uint8_t>();
  std::vector<double> av(ab.size()), bv(bb.size());
  for (size_t i = 0; i < ab.size(); ++i) av[i] = cuda::e4m3_to_float(ab[i]);
  for (size_t i = 0; i < bb.size(); ++i) bv[i] = cuda::e4m3_to_float(bb[i]);
  const double s = static_cast<double>(sa) * static_cast<double>(sb);
  int64_t bad = 0;
  double ref_norm = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double dot = 0, mag = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double t = av[static_cast<size_t>(i * k + p)] * bv[static_cast<size_t>(j * k + p)];
        dot += t;
        mag += std::fabs(t);
      }
      const double ref = s * dot;
      const double g = got[static_cast<size_t>(i * n + j)];
      ref_norm += ref * ref;
      const double bound = std::ldexp(1.0, -8) * std::fabs(ref) + 1e-3 * s * mag;
      if (!(std::fabs(g - ref) <= bound) && bad++ < 5)
        ADD_FAILURE() << "d[" << i << ", " << j << "] = " << g << ", reference " << ref << " (bound " << bound << ")";
    }
  }
  EXPECT_EQ(bad, 0) << "elements outside the bound, of " << m * n;
  EXPECT_GT(ref_norm, 0);  // the inputs are not degenerate
}

TEST(CudaGemmFp8, MatchesReference) {
  FORGE_SKIP_WITHOUT_GPU();
  FORGE_SKIP_WITHOUT_FP8();
  check_gemm(64, 128, 256, 0.5f, 3.0f, 11);   // either scale ignored would be off by 2x or 3x
  check_gemm(256, 64, 512, 2.0f, 0.25f, 21);
  check_gemm(256, 64, 512, 2.0f, 0.25f, 21);  // the cached plan
  check_gemm(16, 16, 16, 1.0f, 1.0f, 31);     // the smallest shape
}

TEST(CudaGemmFp8, FastAccumulationRuns) {
  FORGE_SKIP_WITHOUT_GPU();
  FORGE_SKIP_WITHOUT_FP8();
  const Tensor a = cuda::random_e4m3(0, {128, 256}, 41);
  const Tensor b_t = cuda::random_e4m3(0, {64, 256}, 42);
  const Tensor one = full({1}, 1.0, {.dtype = DType::f32, .device = kGpu});
  Tensor d = empty({128, 64}, {.dtype = DType::bf16, .device = kGpu});
  Tensor d_fast = empty({128, 64}, {.dtype = DType::bf16, .device = kGpu});
  cuda::fp8_gemm_bf16_out(a, b_t, one, one, d);
  cuda::fp8_gemm_bf16_out(a, b_t, one, one, d_fast, /*fast_accum=*/true);
  // Fast accumulation skips the f32 promotion of the tensor cores' partial sums: at k = 256 its
  // relative error is ~1e-3; 2e-2 (normwise) only asks that it computes the same product.
  cuda_testing::expect_close(d_fast, d, 2e-2, "fp8 gemm, fast accumulation");
}

TEST(CudaGemmFp8, ArgumentErrors) {
  FORGE_SKIP_WITHOUT_GPU();
  const TensorOptions f32{.dtype = DType::f32, .device = kGpu};
  const Tensor one = full({1}, 1.0, f32);
  const Tensor a = cuda::random_e4m3(0, {32, 48}, 1);
  const Tensor b_t = cuda::random_e4m3(0, {16, 48}, 2);
  Tensor d = empty({32, 16}, {.dtype = DType::bf16, .device = kGpu});
  const auto error_of = [](const auto& fn) -> std::string {
    try {
      fn();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  // k = 40 is not a multiple of 16.
  const Tensor a40 = cuda::random_e4m3(0, {32, 40}, 3), b40 = cuda::random_e4m3(0, {16, 40}, 4);
  EXPECT_NE(error_of([&] { cuda::fp8_gemm_bf16_out(a40, b40, one, one, d); }).find("multiples of 16"),
            std::string::npos);
  // b_t given as (k, n) instead of (n, k).
  const Tensor b_kn = cuda::random_e4m3(0, {48, 16}, 5);
  EXPECT_NE(error_of([&] { cuda::fp8_gemm_bf16_out(a, b_kn, one, one, d); }).find("b_t (n, k)"), std::string::npos);
  // Wrong dtypes.
  Tensor d32 = empty({32, 16}, f32);
  EXPECT_NE(error_of([&] { cuda::fp8_gemm_bf16_out(a, b_t, one, one, d32); }).find("d must be bf16"),
            std::string::npos);
  const Tensor a_f32 = ones({32, 48}, f32);
  EXPECT_NE(error_of([&] { cuda::fp8_gemm_bf16_out(a_f32, b_t, one, one, d); }).find("a must be u8"),
            std::string::npos);
  // Not 16-byte aligned.
  const Tensor big = cuda::random_e4m3(0, {32 * 48 + 1}, 6);
  const Tensor a_off = big.narrow(0, 1, 32 * 48).view({32, 48});
  EXPECT_NE(error_of([&] { cuda::fp8_gemm_bf16_out(a_off, b_t, one, one, d); }).find("16-byte aligned"),
            std::string::npos);
  if (!cuda::fp8_gemm_supported(0)) {
    EXPECT_NE(error_of([&] { cuda::fp8_gemm_bf16_out(a, b_t, one, one, d); }).find("does not support FP8"),
              std::string::npos);
  }
  EXPECT_FALSE(cuda::fp8_gemm_supported(-1));
  EXPECT_FALSE(cuda::fp8_gemm_supported(1 << 20));
}

}  // namespace
}  // namespace forge
