#pragma once
// Shared by the CUDA test files: comparing a CUDA result against the CPU backend's.
//
//   FORGE_SKIP_WITHOUT_GPU();                       // first line of every CUDA test
//   Pair x = on_both(host_input({4, 8}, Domain::real, DType::bf16, 1));
//   expect_close(ops::exp(x.gpu), ops::exp(x.cpu), tolerance(DType::bf16), "exp");
//
// Comparisons are ||out - ref|| / ||ref|| read back in f64 on the host, with tolerances by
// dtype (f32 1e-5, bf16/f16 1e-2, f64 1e-12). Inputs are random and never zero.
#include <gtest/gtest.h>

#include <cmath>
#include <exception>
#include <functional>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "forge/forge.h"
#include "forge/parallel/nccl_group.h"

// Without a GPU the test reports SKIPPED (never passed).
#define FORGE_SKIP_WITHOUT_GPU() \
  do { if (::forge::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device"; } while (0)

namespace forge {

// Readable dtype parameters in test listings.
inline void PrintTo(DType t, std::ostream* os) { *os << dtype_name(t); }

}  // namespace forge

namespace forge::cuda_testing {

inline const Device kGpu = Device::cuda(0);

inline constexpr DType kAllDTypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16,
                                DType::i32, DType::i64, DType::u8,   DType::boolean};
inline constexpr DType kFloatDTypes[] = {DType::f32, DType::bf16, DType::f16, DType::f64};

inline double tolerance(DType t) {
  switch (t) {
    case DType::f64: return 1e-12;
    case DType::f32: return 1e-5;
    default: return 1e-2;  // bf16, f16
  }
}

inline std::vector<double> host_values(const Tensor& t) { return t.to_vector<double>(); }

// ||got - ref|| / ||ref||, both read back as f64 on the host.
inline double rel_err(const Tensor& got, const Tensor& ref) {
  const auto g = host_values(got), r = host_values(ref);
  double num = 0, den = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    num += (g[i] - r[i]) * (g[i] - r[i]);
    den += r[i] * r[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

inline void expect_close(const Tensor& got, const Tensor& ref, double tol, const std::string& what) {
  ASSERT_TRUE(got.is_cuda()) << what;
  ASSERT_EQ(got.shape(), ref.shape()) << what;
  ASSERT_EQ(got.dtype(), ref.dtype()) << what;
  EXPECT_LE(rel_err(got, ref), tol) << what << " (" << dtype_name(ref.dtype()) << ")";
}

// Equal values element by element; a NaN matches a NaN at the same place (a skipped update leaves
// a NaN gradient as it was on both sides).
inline void expect_equal(const Tensor& got, const Tensor& ref, const std::string& what) {
  ASSERT_EQ(got.shape(), ref.shape()) << what;
  ASSERT_EQ(got.dtype(), ref.dtype()) << what;
  const auto g = host_values(got), r = host_values(ref);
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < r.size(); ++i)
    if (g[i] != r[i] && !(std::isnan(g[i]) && std::isnan(r[i])) && bad++ == 0) first = i;  // NaN matches NaN
  EXPECT_EQ(bad, 0u) << what << " (" << dtype_name(ref.dtype()) << "): " << bad << " of " << r.size()
                     << " elements differ, first at " << first << ": " << (bad ? g[first] : 0) << " vs "
                     << (bad ? r[first] : 0);
}

// ---- inputs ---------------------------------------------------------------------------

enum class Domain { real, positive, away_from_zero, integral };

// A contiguous CPU tensor of `dtype` with values from `domain` (f32 draws, then rounded).
inline Tensor host_input(const Shape& shape, Domain domain, DType dtype, uint64_t seed) {
  Generator gen(seed);
  Tensor v;
  switch (domain) {
    case Domain::real: v = randn(shape, {}, &gen); break;
    case Domain::positive: v = uniform(shape, 0.5, 2.0, {}, &gen); break;  // [0.5, 2)
    case Domain::away_from_zero: {
      Tensor mag = uniform(shape, 0.25, 1.5, {}, &gen);
      v = ops::where(ops::gt(rand(shape, {}, &gen), 0.5), mag, ops::neg(mag));
      break;
    }
    case Domain::integral: v = randint(-3, 4, shape, {.dtype = DType::f32}, &gen); break;
  }
  return v.to(dtype);
}

// The same values on both devices, viewed the same way on each.
struct Pair {
  Tensor cpu, gpu;
};

inline Pair on_both(const Tensor& host) { return {host, host.to(kGpu)}; }
inline Pair view_both(const Pair& p, const std::function<Tensor(const Tensor&)>& view) { return {view(p.cpu), view(p.gpu)}; }

// Layouts of a [M, N] operand (M = 37, N = 129: not multiples of any vector width).
enum class Layout { contiguous, transposed, strided, unaligned, broadcast, large };
inline constexpr Layout kLayouts[] = {Layout::contiguous, Layout::transposed, Layout::strided,
                               Layout::unaligned,  Layout::broadcast,  Layout::large};
inline constexpr int64_t kM = 37, kN = 129;

inline const char* layout_name(Layout l) {
  switch (l) {
    case Layout::contiguous: return "contiguous";
    case Layout::transposed: return "transposed";
    case Layout::strided: return "every-other-column";
    case Layout::unaligned: return "unaligned (offset 1)";
    case Layout::broadcast: return "broadcast row";
    case Layout::large: return "large 1-D";
  }
  return "?";
}

inline Pair make_operand(Layout layout, Domain domain, DType dtype, uint64_t seed) {
  switch (layout) {
    case Layout::contiguous: return on_both(host_input({kM, kN}, domain, dtype, seed));
    case Layout::transposed:
      return view_both(on_both(host_input({kN, kM}, domain, dtype, seed)), [](const Tensor& t) { return t.t(); });
    case Layout::strided:
      return view_both(on_both(host_input({kM, 2 * kN}, domain, dtype, seed)),
                       [](const Tensor& t) { return t.slice(1, 0, 2 * kN, 2); });
    case Layout::unaligned:
      return view_both(on_both(host_input({kM * kN + 1}, domain, dtype, seed)),
                       [](const Tensor& t) { return t.narrow(0, 1, kM * kN).view({kM, kN}); });
    case Layout::broadcast:
      return view_both(on_both(host_input({1, kN}, domain, dtype, seed)),
                       [](const Tensor& t) { return t.expand({kM, kN}); });
    case Layout::large: return on_both(host_input({(int64_t{1} << 21) + 5}, domain, dtype, seed));
  }
  return {};
}

// Runs fn(rank, group) for ranks 0 and 1 of a new NCCL group, each on its own thread and GPU (as
// two processes would), and waits for both. An exception on a rank is a test failure naming it.
// The caller skips first when fewer than two GPUs are visible.
inline void on_two_gpus(const std::function<void(int rank, const parallel::ProcessGroupPtr& group)>& fn) {
  const std::string id = parallel::new_nccl_id_hex();
  auto rank_main = [&](int r) {
    try {
      fn(r, parallel::make_nccl_group(id, r, 2, r));
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << ": " << e.what();
    }
  };
  std::thread t0(rank_main, 0), t1(rank_main, 1);
  t0.join();
  t1.join();
}

}  // namespace forge::cuda_testing
