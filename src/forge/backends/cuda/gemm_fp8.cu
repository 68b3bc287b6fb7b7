// FP8 (e4m3) GEMMs through cuBLASLt and random e4m3 inputs (contract and Note [FP8 GEMM
// layout] in gemm_fp8.h).
#include "forge/backends/cuda/gemm_fp8.h"

#include <cublasLt.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "forge/backends/cuda/blaslt.h"
#include "forge/backends/cuda/fp8.h"
#include "forge/backends/cuda/cublas_check.h"
#include "forge/backends/cuda/runtime.h"
#include "forge/backends/cuda/tensor_kernels.h"

namespace forge::cuda {

namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;
constexpr int kHeuristicResults = 8;
constexpr int kThreads = 256;

// ---- random e4m3 ----------------------------------------------------------------------------

__host__ __device__ inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// out[i] = e4m3(uniform in [-max_abs, max_abs)) from hash(seed, i), grid-stride.
__global__ void random_e4m3_kernel(uint8_t* __restrict__ out, int64_t n, uint64_t seed, float max_abs) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const uint64_t key = splitmix64(seed);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const uint64_t h = splitmix64(key ^ static_cast<uint64_t>(i));
    const float u = static_cast<float>(h >> 40) * (1.0f / 16777216.0f);  // [0, 1), 24 bits
    const float x = (2.0f * u - 1.0f) * max_abs;
    out[i] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
  }
}

// ---- cuBLASLt state -----------------------------------------------------------------------------

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {  // only runs when creating a plan failed half-way (cached plans live forever)
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// device, m, n, k, fast_accum, alignment of a, b_t, d; formats of a and b_t, their scale modes, d's dtype
using PlanKey = std::tuple<int, int64_t, int64_t, int64_t, bool, int64_t, int64_t, int64_t, int, int, int, int, int>;

// Everything, for every device, under one mutex (held from the plan lookup to the launch, as
// the scale pointers are set on the shared descriptor). Never destroyed: the workspaces must
// not be freed during static destruction.
struct State {
  std::mutex mu;
  std::map<int, cublasLtHandle_t> handles;
  std::vector<std::tuple<int, cudaStream_t, Tensor>> workspaces;
  std::map<PlanKey, std::unique_ptr<Plan>> plans;
};

State& state() {
  static State* s = new State();
  return *s;
}

// s.mu held, device current.
cublasLtHandle_t handle(State& s, int device) {
  auto it = s.handles.find(device);
  if (it != s.handles.end()) return it->second;
  cublasLtHandle_t h = nullptr;
  FORGE_CUBLAS_CHECK(cublasLtCreate(&h));
  s.handles.emplace(device, h);
  return h;
}

// s.mu held.
void* workspace(State& s, int device, cudaStream_t stream) {
  for (auto& [dev, st, ws] : s.workspaces)
    if (dev == device && st == stream) return ws.data_ptr();
  s.workspaces.emplace_back(device, stream, blas::device_empty(device, {static_cast<int64_t>(kWorkspaceBytes)}, DType::u8));
  return std::get<2>(s.workspaces.back()).data_ptr();
}

// The largest power of two (at most 256) dividing the address.
int64_t alignment(const void* p) {
  const uint64_t bits = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p)) | 256u;
  return static_cast<int64_t>(bits & (~bits + 1));
}

template <class V> void set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const V& value) {
  FORGE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &value, sizeof(value)));
}
template <class V>
void set_pref(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr, const V& value) {
  FORGE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(p, attr, &value, sizeof(value)));
}

// What a plan is made for (PlanKey's fields).
struct GemmSpec {
  int64_t m = 0, n = 0, k = 0;
  bool fast_accum = false;
  int64_t align_a = 16, align_b = 16, align_d = 16;
  Format fa = Format::e4m3, fb = Format::e4m3;  // a's and b_t's
  Fp8ScaleMode ma = Fp8ScaleMode::scalar, mb = Fp8ScaleMode::scalar;
  DType d = DType::bf16;
  PlanKey key(int device) const {
    return {device, m, n, k, fast_accum, align_a, align_b, align_d, static_cast<int>(fa), static_cast<int>(fb),
            static_cast<int>(ma), static_cast<int>(mb), static_cast<int>(d)};
  }
};

cudaDataType_t fp8_type(Format f) { return f == Format::e4m3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; }

const char* mode_name(Fp8ScaleMode m) {
  switch (m) {
    case Fp8ScaleMode::scalar: return "scalar";
    case Fp8ScaleMode::outer: return "outer";
    case Fp8ScaleMode::vec128: return "vec128";
    case Fp8ScaleMode::blk128: return "blk128";
  }
  return "?";
}

int32_t lt_mode(Fp8ScaleMode m) {
  switch (m) {
    case Fp8ScaleMode::scalar: return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    case Fp8ScaleMode::outer: return CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    case Fp8ScaleMode::vec128: return CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    case Fp8ScaleMode::blk128: return CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  }
  return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
}

// Note [FP8 GEMM layout]: cuBLASLt's A = our b_t (col-major (k, n), op T), its B = our a
// (col-major (k, m), op N), its C = D = our d (col-major (n, m)).
std::unique_ptr<Plan> make_plan(cublasLtHandle_t lt, const GemmSpec& g, const void* scale_a, const void* scale_b) {
  auto plan = std::make_unique<Plan>();
  FORGE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  set_desc(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
  set_desc(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  set_desc(plan->op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, static_cast<int8_t>(g.fast_accum ? 1 : 0));
  // cuBLASLt's A is our b_t, its B our a.
  set_desc(plan->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, scale_b);
  set_desc(plan->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, scale_a);
  if (g.mb != Fp8ScaleMode::scalar) set_desc(plan->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, lt_mode(g.mb));
  if (g.ma != Fp8ScaleMode::scalar) set_desc(plan->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, lt_mode(g.ma));
  const auto u = [](int64_t v) { return static_cast<uint64_t>(v); };
  const cudaDataType_t dt = g.d == DType::f32 ? CUDA_R_32F : CUDA_R_16BF;
  FORGE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->a, fp8_type(g.fb), u(g.k), u(g.n), g.k));
  FORGE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->b, fp8_type(g.fa), u(g.k), u(g.m), g.k));
  FORGE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->d, dt, u(g.n), u(g.m), g.n));
  cublasLtMatmulPreference_t pref = nullptr;
  FORGE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  cublasLtMatmulHeuristicResult_t results[kHeuristicResults] = {};
  int found = 0;
  cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
  try {
    set_pref(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(kWorkspaceBytes));
    set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, static_cast<uint32_t>(g.align_b));
    set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, static_cast<uint32_t>(g.align_a));
    set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, static_cast<uint32_t>(g.align_d));
    set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, static_cast<uint32_t>(g.align_d));
    st = cublasLtMatmulAlgoGetHeuristic(lt, plan->op, plan->a, plan->b, plan->d, plan->d, pref, kHeuristicResults,
                                        results, &found);
  } catch (...) {
    cublasLtMatmulPreferenceDestroy(pref);
    throw;
  }
  cublasLtMatmulPreferenceDestroy(pref);
  bool have = false;
  if (st == CUBLAS_STATUS_SUCCESS) {
    for (int i = 0; i < found && !have; ++i) {
      if (results[i].state == CUBLAS_STATUS_SUCCESS && results[i].workspaceSize <= kWorkspaceBytes) {
        plan->algo = results[i].algo;
        have = true;
      }
    }
  }
  FORGE_CHECK(have, "fp8 gemm: cuBLASLt has no algorithm for ", fp8::format_name(g.fa), " (", mode_name(g.ma), " scales) x ",
              fp8::format_name(g.fb), " (", mode_name(g.mb), " scales) -> ", dtype_name(g.d), " with m=", g.m, " n=", g.n,
              " k=", g.k, g.fast_accum ? " (fast accumulation)" : "", " (heuristic status ", cublasGetStatusName(st),
              ", ", found, " candidates)");
  return plan;
}

void check_operand(const char* name, const Tensor& t, DType dtype, int device) {
  FORGE_CHECK(t.defined() && t.is_cuda() && t.device().index == device, "fp8 gemm: ", name,
              " must be a tensor on cuda:", device);
  FORGE_CHECK(t.dtype() == dtype, "fp8 gemm: ", name, " must be ", dtype_name(dtype), ", got ", dtype_name(t.dtype()));
  FORGE_CHECK(t.is_contiguous(), "fp8 gemm: ", name, " must be contiguous");
}

// d = a b_t^T on the current stream of `device` through the cached plan for g.
void run_gemm(int device, const GemmSpec& g, const void* a, const void* scale_a, const void* b_t, const void* scale_b,
              void* d) {
  DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(device);
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  const cublasLtHandle_t lt = handle(s, device);
  const PlanKey key = g.key(device);
  auto it = s.plans.find(key);
  if (it == s.plans.end()) it = s.plans.emplace(key, make_plan(lt, g, scale_a, scale_b)).first;
  const Plan& plan = *it->second;
  set_desc(plan.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, scale_b);
  set_desc(plan.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, scale_a);
  void* ws = workspace(s, device, stream);
  const float alpha = 1.0f, beta = 0.0f;
  FORGE_CUBLAS_CHECK(cublasLtMatmul(lt, plan.op, &alpha, b_t, plan.a, a, plan.b, &beta, d, plan.d, d, plan.d,
                                    &plan.algo, ws, kWorkspaceBytes, stream));
}

}  // namespace

bool fp8_gemm_supported(int device) {
  if (device < 0 || device >= device_count()) return false;
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  // cublasLtGetVersion: major * 10000 + minor * 100 + patch; FP8 matmuls since 11.8.
  return (major > 8 || (major == 8 && minor >= 9)) && cublasLtGetVersion() >= 110800;
}

void fp8_gemm_bf16_out(const Tensor& a, const Tensor& b_t, const Tensor& scale_a, const Tensor& scale_b, Tensor& d,
                       bool fast_accum) {
  FORGE_CHECK(a.defined() && a.is_cuda(), "fp8 gemm: a must be a CUDA tensor");
  const int device = a.device().index;
  check_operand("a", a, DType::u8, device);
  check_operand("b_t", b_t, DType::u8, device);
  check_operand("d", d, DType::bf16, device);
  check_operand("scale_a", scale_a, DType::f32, device);
  check_operand("scale_b", scale_b, DType::f32, device);
  FORGE_CHECK(a.dim() == 2 && b_t.dim() == 2 && d.dim() == 2, "fp8 gemm: a, b_t and d must be 2-D, got a ",
              a.shape(), " b_t ", b_t.shape(), " d ", d.shape());
  const int64_t m = a.size(0), k = a.size(1), n = b_t.size(0);
  FORGE_CHECK(b_t.size(1) == k && d.size(0) == m && d.size(1) == n, "fp8 gemm: expected a (m, k), b_t (n, k), d (m, n), got a ",
              a.shape(), " b_t ", b_t.shape(), " d ", d.shape());
  FORGE_CHECK(scale_a.numel() == 1 && scale_b.numel() == 1, "fp8 gemm: scales must have one element, got ",
              scale_a.numel(), " and ", scale_b.numel());
  FORGE_CHECK(m > 0 && n > 0 && k > 0 && m % 16 == 0 && n % 16 == 0 && k % 16 == 0,
              "fp8 gemm: m, n, k must be positive multiples of 16 (cuBLASLt FP8), got m=", m, " n=", n, " k=", k);
  constexpr int64_t kInt = std::numeric_limits<int32_t>::max();
  FORGE_CHECK(m <= kInt && n <= kInt && k <= kInt, "fp8 gemm: sizes exceed cuBLASLt's 32-bit range: m=", m,
              " n=", n, " k=", k);
  const int64_t align_a = alignment(a.data_ptr()), align_b = alignment(b_t.data_ptr()),
                align_d = alignment(d.data_ptr());
  FORGE_CHECK(align_a >= 16 && align_b >= 16 && align_d >= 16,
              "fp8 gemm: a, b_t and d must be 16-byte aligned (alignments ", align_a, ", ", align_b, ", ", align_d, ")");
  FORGE_CHECK(fp8_gemm_supported(device), "fp8 gemm: cuda:", device,
              " does not support FP8 GEMMs (needs compute capability >= 8.9 and cuBLASLt >= 11.8)");

  GemmSpec g;
  g.m = m;
  g.n = n;
  g.k = k;
  g.fast_accum = fast_accum;
  g.align_a = align_a;
  g.align_b = align_b;
  g.align_d = align_d;
  run_gemm(device, g, a.data_ptr(), scale_a.data_ptr(), b_t.data_ptr(), scale_b.data_ptr(), d.data_ptr());
}

bool fp8_scale_mode_supported(int device, Fp8ScaleMode mode) {
  if (!fp8_gemm_supported(device)) return false;
  if (mode == Fp8ScaleMode::scalar) return true;
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return major == 9 && cublasLtGetVersion() >= 120900;  // outer and block scales: Hopper, cuBLASLt 12.9
}

void fp8_scaled_gemm(const Fp8Operand& a, const Fp8Operand& b_t, Tensor& d) {
  FORGE_CHECK(a.codes.defined() && a.codes.is_cuda(), "fp8 gemm: a must be a CUDA tensor");
  const int device = a.codes.device().index;
  check_operand("a", a.codes, DType::u8, device);
  check_operand("b_t", b_t.codes, DType::u8, device);
  check_operand("a's factors", a.inv_scales, DType::f32, device);
  check_operand("b_t's factors", b_t.inv_scales, DType::f32, device);
  FORGE_CHECK(d.defined() && d.is_cuda() && d.device().index == device && d.is_contiguous() &&
                  (d.dtype() == DType::bf16 || d.dtype() == DType::f32),
              "fp8 gemm: d must be a contiguous bf16 or f32 tensor on cuda:", device);
  FORGE_CHECK(a.codes.dim() == 2 && b_t.codes.dim() == 2 && d.dim() == 2, "fp8 gemm: a, b_t and d must be 2-D, got a ",
              a.codes.shape(), " b_t ", b_t.codes.shape(), " d ", d.shape());
  const int64_t m = a.codes.size(0), k = a.codes.size(1), n = b_t.codes.size(0);
  FORGE_CHECK(b_t.codes.size(1) == k && d.size(0) == m && d.size(1) == n, "fp8 gemm: expected a (m, k), b_t (n, k), d (m, n), got a ",
              a.codes.shape(), " b_t ", b_t.codes.shape(), " d ", d.shape());
  FORGE_CHECK(m > 0 && n > 0 && k > 0 && m % 16 == 0 && n % 16 == 0 && k % 16 == 0,
              "fp8 gemm: m, n, k must be positive multiples of 16 (cuBLASLt FP8), got m=", m, " n=", n, " k=", k);
  FORGE_CHECK(!(a.format == Format::e5m2 && b_t.format == Format::e5m2), "fp8 gemm: e5m2 x e5m2 has no tensor-core GEMM; "
              "one operand must be e4m3");
  constexpr int64_t kInt = std::numeric_limits<int32_t>::max();
  FORGE_CHECK(m <= kInt && n <= kInt && k <= kInt, "fp8 gemm: sizes exceed cuBLASLt's 32-bit range: m=", m, " n=", n,
              " k=", k);
  // Note [FP8 GEMM scales]: the factors each mode reads.
  const auto factors = [&](const Fp8Operand& o, int64_t rows) { return fp8_factor_count(o.mode, rows, k); };
  FORGE_CHECK(a.inv_scales.numel() == factors(a, m) && b_t.inv_scales.numel() == factors(b_t, n),
              "fp8 gemm: a's ", mode_name(a.mode), " factors must number ", factors(a, m), " (got ", a.inv_scales.numel(),
              ") and b_t's ", mode_name(b_t.mode), " ", factors(b_t, n), " (got ", b_t.inv_scales.numel(), ")");
  for (const Fp8Operand* o : {&a, &b_t})
    FORGE_CHECK(fp8_scale_mode_supported(device, o->mode), "fp8 gemm: cuda:", device, " cannot run ", mode_name(o->mode),
                " scales (scalar: compute capability >= 8.9; the others: 9.0 with cuBLASLt >= 12.9)");
  GemmSpec g;
  g.m = m;
  g.n = n;
  g.k = k;
  g.align_a = alignment(a.codes.data_ptr());
  g.align_b = alignment(b_t.codes.data_ptr());
  g.align_d = alignment(d.data_ptr());
  FORGE_CHECK(g.align_a >= 16 && g.align_b >= 16 && g.align_d >= 16, "fp8 gemm: a, b_t and d must be 16-byte aligned");
  g.fa = a.format;
  g.fb = b_t.format;
  g.ma = a.mode;
  g.mb = b_t.mode;
  g.d = d.dtype();
  run_gemm(device, g, a.codes.data_ptr(), a.inv_scales.data_ptr(), b_t.codes.data_ptr(), b_t.inv_scales.data_ptr(),
           d.data_ptr());
}

Tensor random_e4m3(int device, const Shape& shape, uint64_t seed, float max_abs) {
  FORGE_CHECK(max_abs > 0 && max_abs <= 448.0f, "random_e4m3: max_abs must be in (0, 448], got ", max_abs);
  check_device(device, "random_e4m3");
  DeviceGuard guard(device);
  Tensor t = blas::device_empty(device, shape, DType::u8);
  const int64_t n = t.numel();
  if (n == 0) return t;
  const int64_t max_blocks = static_cast<int64_t>(multiprocessor_count(device)) * 8;
  const auto blocks = static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((n + kThreads - 1) / kThreads, max_blocks)));
  random_e4m3_kernel<<<blocks, kThreads, 0, current_stream(device)>>>(static_cast<uint8_t*>(t.data_ptr()), n, seed,
                                                                      max_abs);
  FORGE_CUDA_LAUNCH_CHECK("random_e4m3 ", shape);
  return t;
}

float e4m3_to_float(uint8_t bits) {
  const bool neg = (bits & 0x80u) != 0;
  const int exp = (bits >> 3) & 0xf;
  const int man = bits & 0x7;
  float v = 0;
  if (exp == 0xf && man == 0x7) {
    v = std::numeric_limits<float>::quiet_NaN();
  } else if (exp == 0) {
    v = std::ldexp(static_cast<float>(man) / 8.0f, -6);  // subnormal: 0.mmm x 2^-6
  } else {
    v = std::ldexp(1.0f + static_cast<float>(man) / 8.0f, exp - 7);
  }
  return neg ? -v : v;
}

}  // namespace forge::cuda
