// cuBLASLt handles, workspaces and the plan cache, and the row-major GEMM call
// (Note [row-major GEMMs on cuBLASLt] in blaslt.h). Host code only.
#include "forge/backends/cuda/blaslt.h"

#include <cublasLt.h>
#include <cublas_v2.h>

#include <atomic>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "forge/backends/cuda/matmul.h"
#include "forge/backends/cuda/cublas_check.h"
#include "forge/backends/cuda/runtime.h"
#include "forge/backends/cuda/tensor_kernels.h"
#include "forge/core/env.h"
#include "forge/core/storage.h"

namespace forge::cuda {

namespace {

// Starts as FORGE_ALLOW_TF32 (core/env.h); set_allow_tf32 changes it.
std::atomic<bool>& tf32_flag() {
  static std::atomic<bool> flag{env::flag("FORGE_ALLOW_TF32")};
  return flag;
}

}  // namespace

void set_allow_tf32(bool on) { tf32_flag().store(on); }
bool allow_tf32() { return tf32_flag().load(std::memory_order_relaxed); }

namespace blas {
namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;
constexpr int kHeuristicResults = 8;

cudaDataType_t data_type(DType t) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::f64: return CUDA_R_64F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    default: FORGE_THROW("cuda gemm: unsupported dtype ", dtype_name(t), " (expected f32, f64, bf16 or f16)");
  }
}

cublasComputeType_t compute_type(DType t) {
  if (t == DType::f64) return CUBLAS_COMPUTE_64F;
  if (t == DType::f32 && allow_tf32()) return CUBLAS_COMPUTE_32F_FAST_TF32;
  return CUBLAS_COMPUTE_32F;  // f32, and bf16/f16 with f32 accumulation
}

// The largest power of two (at most 256) that divides the address of every matrix of the
// batch: the base pointer and, for batched calls, the batch stride in bytes.
int64_t alignment(const void* p, int64_t batch_stride, int64_t batch, size_t elt) {
  uint64_t bits = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p)) | 256u;
  if (batch > 1 && batch_stride != 0) bits |= static_cast<uint64_t>(batch_stride) * elt;
  return static_cast<int64_t>(bits & (~bits + 1));
}

// Everything a plan depends on. Pointers enter only through their alignment.
struct PlanKey {
  int64_t v[21];
  bool operator==(const PlanKey& o) const { return std::memcmp(v, o.v, sizeof v) == 0; }
};

struct PlanKeyHash {
  size_t operator()(const PlanKey& k) const {
    uint64_t h = 0x9e3779b97f4a7c15ull;
    for (int64_t x : k.v) {
      h ^= static_cast<uint64_t>(x) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    }
    return static_cast<size_t>(h);
  }
};

// A cached matmul descriptor with its layouts (cuBLASLt's A, B and C = D) and algorithm.
struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool has_algo = false;

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {  // only runs when creating a plan failed half-way (cached plans live forever)
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

struct DeviceState {
  std::mutex mu;  // guards everything below, and each plan from lookup to launch
  cublasLtHandle_t lt = nullptr;
  cublasHandle_t fallback = nullptr;  // created on first use
  std::vector<std::pair<cudaStream_t, Tensor>> workspaces;
  std::unordered_map<PlanKey, std::unique_ptr<Plan>, PlanKeyHash> plans;
};

Tensor empty_bytes(int device, size_t nbytes) {
  auto storage = std::make_shared<Storage>(nbytes, allocator(device));
  return Tensor::make(std::move(storage), {static_cast<int64_t>(nbytes)}, {1}, 0, DType::u8);
}

// One state per device, created on first use and never destroyed (like the allocators:
// its workspaces must not be freed during static destruction).
DeviceState& device_state(int device) {
  struct Registry {
    std::unique_ptr<std::once_flag[]> once;
    std::vector<std::unique_ptr<DeviceState>> states;
  };
  static Registry* registry = [] {
    auto* r = new Registry();
    const int n = device_count();
    r->once = std::make_unique<std::once_flag[]>(static_cast<size_t>(n));
    r->states.resize(static_cast<size_t>(n));
    return r;
  }();
  check_device(device, "gemm");
  const auto d = static_cast<size_t>(device);
  std::call_once(registry->once[d], [&] {
    auto s = std::make_unique<DeviceState>();
    DeviceGuard guard(device);
    FORGE_CUBLAS_CHECK(cublasLtCreate(&s->lt));
    registry->states[d] = std::move(s);
  });
  return *registry->states[d];
}

// The workspace of (device, stream); s.mu held.
void* workspace(DeviceState& s, int device, cudaStream_t stream) {
  for (auto& [st, ws] : s.workspaces)
    if (st == stream) return ws.data_ptr();
  s.workspaces.emplace_back(stream, empty_bytes(device, kWorkspaceBytes));
  return s.workspaces.back().second.data_ptr();
}

template <class V> void set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const V& value) {
  FORGE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &value, sizeof(value)));
}
template <class V> void set_layout(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr, const V& value) {
  FORGE_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, attr, &value, sizeof(value)));
}
template <class V>
void set_pref(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr, const V& value) {
  FORGE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(p, attr, &value, sizeof(value)));
}

cublasLtEpilogue_t lt_epilogue(const Gemm& g) {
  switch (g.epilogue) {
    case Epilogue::none: return CUBLASLT_EPILOGUE_DEFAULT;
    case Epilogue::bias: return CUBLASLT_EPILOGUE_BIAS;
    case Epilogue::gelu_aux: return g.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    case Epilogue::bgrad_a: return CUBLASLT_EPILOGUE_BGRADB;  // cuBLASLt's B is our A
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

// The epilogue's pointers on the descriptor (per call: plans are shared by every call of
// their shape).
void set_epilogue_pointers(cublasLtMatmulDesc_t op, const Gemm& g) {
  switch (g.epilogue) {
    case Epilogue::none: break;
    case Epilogue::bias: set_desc(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias); break;
    case Epilogue::gelu_aux:
      if (g.bias) set_desc(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias);
      set_desc(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g.aux);
      break;
    case Epilogue::bgrad_a: set_desc(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias_grad); break;
  }
}

std::unique_ptr<Plan> make_plan(DeviceState& s, const Gemm& g, cublasComputeType_t ct, const int64_t (&align)[3]) {
  auto plan = std::make_unique<Plan>();
  const cudaDataType_t type = data_type(g.dtype);
  const cudaDataType_t scale = g.dtype == DType::f64 ? CUDA_R_64F : CUDA_R_32F;
  FORGE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->op, ct, scale));
  // Note [row-major GEMMs on cuBLASLt]: cuBLASLt's A is our B, its B our A.
  const cublasOperation_t op_a = g.b.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = g.a.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  // FORGE_GEMM_SM_TARGET=N (core/env.h, docs/dist.md): plan every GEMM for N SMs
  // (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET), leaving the rest to a concurrent stream (NCCL).
  if (const int64_t sm_target = env::integer("FORGE_GEMM_SM_TARGET"); sm_target > 0)
    set_desc(plan->op, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, static_cast<int32_t>(sm_target));
  set_desc(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, op_a);
  set_desc(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, op_b);
  if (g.epilogue != Epilogue::none) {
    set_desc(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE, lt_epilogue(g));
    if (g.epilogue == Epilogue::gelu_aux) set_desc(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, g.aux_ld);
    // The heuristic reads these pointers' alignment.
    set_epilogue_pointers(plan->op, g);
  }
  const auto u = [](int64_t v) { return static_cast<uint64_t>(v); };
  // Layouts as stored (before the op): our B is (n, k) column-major, or (k, n) when transposed.
  FORGE_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&plan->a, type, u(g.b.trans ? g.k : g.n), u(g.b.trans ? g.n : g.k), g.b.ld));
  FORGE_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&plan->b, type, u(g.a.trans ? g.m : g.k), u(g.a.trans ? g.k : g.m), g.a.ld));
  FORGE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->c, type, u(g.n), u(g.m), g.ldc));
  if (g.batch > 1) {
    const auto count = static_cast<int32_t>(g.batch);
    const std::pair<cublasLtMatrixLayout_t, int64_t> layouts[] = {
        {plan->a, g.b.batch_stride}, {plan->b, g.a.batch_stride}, {plan->c, g.c_batch_stride}};
    for (const auto& [layout, stride] : layouts) {
      set_layout(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, count);
      set_layout(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, stride);
    }
  }
  cublasLtMatmulPreference_t pref = nullptr;
  FORGE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  cublasLtMatmulHeuristicResult_t results[kHeuristicResults] = {};
  int found = 0;
  cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
  try {
    set_pref(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(kWorkspaceBytes));
    // align: our A, our B, C (= D).
    set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, static_cast<uint32_t>(align[1]));
    set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, static_cast<uint32_t>(align[0]));
    set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, static_cast<uint32_t>(align[2]));
    set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, static_cast<uint32_t>(align[2]));
    st = cublasLtMatmulAlgoGetHeuristic(s.lt, plan->op, plan->a, plan->b, plan->c, plan->c, pref, kHeuristicResults,
                                        results, &found);
  } catch (...) {
    cublasLtMatmulPreferenceDestroy(pref);
    throw;
  }
  cublasLtMatmulPreferenceDestroy(pref);
  // NOT_SUPPORTED (or any refusal) leaves the plan without an algorithm: the fallback runs.
  if (st == CUBLAS_STATUS_SUCCESS) {
    for (int i = 0; i < found; ++i) {
      if (results[i].state == CUBLAS_STATUS_SUCCESS && results[i].workspaceSize <= kWorkspaceBytes) {
        plan->algo = results[i].algo;
        plan->has_algo = true;
        break;
      }
    }
  }
  return plan;
}

void check_args(const Gemm& g) {
  constexpr int64_t kInt = std::numeric_limits<int32_t>::max();
  FORGE_CHECK(g.m >= 1 && g.n >= 1 && g.k >= 1 && g.batch >= 1, "cuda gemm: empty problem m=", g.m, " n=", g.n,
              " k=", g.k, " batch=", g.batch, " (callers handle empty products)");
  FORGE_CHECK(g.m <= kInt && g.n <= kInt && g.k <= kInt && g.batch <= kInt, "cuda gemm: sizes m=", g.m, " n=", g.n,
              " k=", g.k, " batch=", g.batch, " exceed cuBLASLt's 32-bit range");
  FORGE_CHECK(g.a.ld >= (g.a.trans ? g.m : g.k) && g.b.ld >= (g.b.trans ? g.k : g.n) && g.ldc >= g.n,
              "cuda gemm: leading dimensions too small: m=", g.m, " n=", g.n, " k=", g.k, " lda=", g.a.ld,
              (g.a.trans ? " (A transposed)" : ""), " ldb=", g.b.ld, (g.b.trans ? " (B transposed)" : ""),
              " ldc=", g.ldc);
  FORGE_CHECK(g.a.batch_stride >= 0 && g.b.batch_stride >= 0 && g.c_batch_stride >= 0,
              "cuda gemm: negative batch stride");
  FORGE_CHECK(g.a.data && g.b.data && g.c, "cuda gemm: null operand");
  switch (g.epilogue) {
    case Epilogue::none: break;
    case Epilogue::bias: FORGE_CHECK(g.bias, "cuda gemm: bias epilogue without a bias"); break;
    case Epilogue::gelu_aux:
      FORGE_CHECK(g.aux && g.aux_ld >= g.n && g.aux_ld % 8 == 0,
                  "cuda gemm: the GELU epilogue needs an aux buffer with a row stride >= n and a multiple of 8, got "
                  "aux_ld=",
                  g.aux_ld, " n=", g.n);
      break;
    case Epilogue::bgrad_a: FORGE_CHECK(g.bias_grad, "cuda gemm: bias-gradient epilogue without an output"); break;
  }
  FORGE_CHECK(g.epilogue == Epilogue::none || g.batch == 1, "cuda gemm: epilogues are single (unbatched) GEMMs here");
}

}  // namespace

bool gemm(int device, const Gemm& g) {
  check_args(g);
  DeviceGuard guard(device);
  DeviceState& s = device_state(device);
  const cudaStream_t stream = current_stream(device);
  const size_t elt = element_size(g.dtype);
  const cublasComputeType_t ct = compute_type(g.dtype);
  const bool batched = g.batch > 1;
  const int64_t align[3] = {alignment(g.a.data, g.a.batch_stride, g.batch, elt),
                            alignment(g.b.data, g.b.batch_stride, g.batch, elt),
                            alignment(g.c, g.c_batch_stride, g.batch, elt)};
  const PlanKey key{{static_cast<int64_t>(g.dtype), static_cast<int64_t>(ct), g.m, g.n, g.k, g.batch, g.a.ld,
                     g.a.trans, batched ? g.a.batch_stride : 0, g.b.ld, g.b.trans, batched ? g.b.batch_stride : 0,
                     g.ldc, batched ? g.c_batch_stride : 0, static_cast<int64_t>(lt_epilogue(g)), g.aux_ld, align[0],
                     align[1], align[2],
                     alignment(g.epilogue == Epilogue::bgrad_a ? g.bias_grad : g.bias, 0, 1, elt),
                     alignment(g.aux, 0, 1, elt)}};

  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.plans.find(key);
  if (it == s.plans.end()) it = s.plans.emplace(key, make_plan(s, g, ct, align)).first;
  const Plan& plan = *it->second;
  if (!plan.has_algo && g.epilogue != Epilogue::none) return false;

  void* ws = workspace(s, device, stream);
  const float alpha_f = static_cast<float>(g.alpha), beta_f = static_cast<float>(g.beta);
  const bool f64 = g.dtype == DType::f64;
  const void* alpha = f64 ? static_cast<const void*>(&g.alpha) : static_cast<const void*>(&alpha_f);
  const void* beta = f64 ? static_cast<const void*>(&g.beta) : static_cast<const void*>(&beta_f);
  if (plan.has_algo) {
    set_epilogue_pointers(plan.op, g);
    FORGE_CUBLAS_CHECK(cublasLtMatmul(s.lt, plan.op, alpha, g.b.data, plan.a, g.a.data, plan.b, beta, g.c, plan.c,
                                      g.c, plan.c, &plan.algo, ws, kWorkspaceBytes, stream));
    return true;
  }
  // No cuBLASLt algorithm for this plain GEMM: cuBLAS takes any layout and alignment.
  if (s.fallback == nullptr) FORGE_CUBLAS_CHECK(cublasCreate(&s.fallback));
  FORGE_CUBLAS_CHECK(cublasSetStream(s.fallback, stream));
  FORGE_CUBLAS_CHECK(cublasSetWorkspace(s.fallback, ws, kWorkspaceBytes));
  const cudaDataType_t type = data_type(g.dtype);
  FORGE_CUBLAS_CHECK(cublasGemmStridedBatchedEx_64(
      s.fallback, g.b.trans ? CUBLAS_OP_T : CUBLAS_OP_N, g.a.trans ? CUBLAS_OP_T : CUBLAS_OP_N, g.n, g.m, g.k, alpha,
      g.b.data, type, g.b.ld, g.b.batch_stride, g.a.data, type, g.a.ld, g.a.batch_stride, beta, g.c, type, g.ldc,
      g.c_batch_stride, g.batch, ct, CUBLAS_GEMM_DEFAULT));
  return true;
}

int64_t plans_cached(int device) {
  DeviceState& s = device_state(device);
  std::lock_guard<std::mutex> lock(s.mu);
  return static_cast<int64_t>(s.plans.size());
}

Tensor device_empty(int device, const Shape& shape, DType dtype) {
  auto storage = std::make_shared<Storage>(static_cast<size_t>(shape_numel(shape)) * element_size(dtype),
                                           allocator(device));
  return Tensor::make(std::move(storage), shape, contiguous_strides(shape), 0, dtype);
}

}  // namespace blas
}  // namespace forge::cuda
