// cuBLASLt handles, workspaces and the plan cache, the row-major GEMM call (Note [row-major
// GEMMs on cuBLASLt] in blaslt.h), algorithm tuning with its cache file and the reported
// fallbacks (Note [GEMM algorithm tuning]). Host code only.
#include "forge/backends/cuda/blaslt.h"

#include <cublasLt.h>
#include <cublas_v2.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <unordered_map>
#include <utility>
#include <vector>

#include "forge/backends/cuda/cublas_check.h"
#include "forge/backends/cuda/device_info.h"
#include "forge/backends/cuda/gemm_graph_timing.h"
#include "forge/backends/cuda/matmul.h"
#include "forge/backends/cuda/graph.h"
#include "forge/backends/cuda/runtime.h"
#include "forge/backends/cuda/stream.h"
#include "forge/backends/cuda/tensor_kernels.h"
#include "forge/backends/gemm_tuning_cache.h"
#include "forge/core/env.h"
#include "forge/core/storage.h"

namespace forge::cuda {

namespace {

// Starts as FORGE_ALLOW_TF32 (core/env.h); set_allow_tf32 changes it.
std::atomic<bool>& tf32_flag() {
  static std::atomic<bool> flag{env::flag("FORGE_ALLOW_TF32")};
  return flag;
}

// Starts as FORGE_GEMM_TUNING (core/env.h); set_gemm_tuning changes it.
std::atomic<bool>& tuning_flag() {
  static std::atomic<bool> flag{env::string("FORGE_GEMM_TUNING") == "cached"};
  return flag;
}

// gemm_tuning_stats(): process-wide, over every device.
struct TuningCounters {
  std::atomic<int64_t> tuned{0}, timed{0}, changed{0}, loaded{0}, stale{0}, capture_skips{0}, failed{0},
      fallback_shapes{0}, fallback_calls{0}, tuning_us{0}, file_writes{0}, graph_timed{0}, graph_refused{0},
      memset_first{0}, memset_chosen{0};
};
TuningCounters& counters() {
  static auto* c = new TuningCounters;  // never destroyed: a GEMM may run during static destruction
  return *c;
}

}  // namespace

void set_allow_tf32(bool on) { tf32_flag().store(on); }
bool allow_tf32() { return tf32_flag().load(std::memory_order_relaxed); }

void set_gemm_tuning(bool on) { tuning_flag().store(on); }
bool gemm_tuning() { return tuning_flag().load(std::memory_order_relaxed); }

GemmTuningStats gemm_tuning_stats() {
  const TuningCounters& c = counters();
  GemmTuningStats s;
  s.tuned = c.tuned.load();
  s.timed = c.timed.load();
  s.changed = c.changed.load();
  s.loaded = c.loaded.load();
  s.stale = c.stale.load();
  s.capture_skips = c.capture_skips.load();
  s.failed = c.failed.load();
  s.fallback_shapes = c.fallback_shapes.load();
  s.fallback_calls = c.fallback_calls.load();
  s.tuning_ms = static_cast<double>(c.tuning_us.load()) / 1e3;
  s.file_writes = c.file_writes.load();
  s.graph_timed = c.graph_timed.load();
  s.graph_refused = c.graph_refused.load();
  s.memset_first = c.memset_first.load();
  s.memset_chosen = c.memset_chosen.load();
  return s;
}

namespace blas {
namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;
// Note [GEMM algorithm tuning] (blaslt.h): the heuristic's candidates timed per plan, how long
// each measurement lasts, the most one plan's timing may take, and how much faster than the
// heuristic's first choice another candidate must be to replace it.
constexpr int kHeuristicResults = 16;
constexpr double kTuneTargetMs = 0.25;
constexpr int kTuneMaxRuns = 10;
constexpr double kTuneBudgetMs = 200;
constexpr double kTuneMargin = 0.01;

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
//   v: dtype, compute type, m, n, k, batch, A (ld, trans, batch stride), B (ld, trans, batch
//   stride), C (ld, batch stride), cuBLASLt epilogue, aux_ld, alignment of A, B, C, the bias
//   (or bias gradient) and aux, FORGE_GEMM_SM_TARGET.
struct PlanKey {
  int64_t v[22];
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

const char* compute_name(int64_t ct) {
  switch (static_cast<cublasComputeType_t>(ct)) {
    case CUBLAS_COMPUTE_32F: return "acc32f";
    case CUBLAS_COMPUTE_32F_FAST_TF32: return "tf32";
    case CUBLAS_COMPUTE_64F: return "acc64f";
    default: return "acc?";
  }
}

const char* epilogue_name(int64_t e) {
  switch (static_cast<cublasLtEpilogue_t>(e)) {
    case CUBLASLT_EPILOGUE_DEFAULT: return "none";
    case CUBLASLT_EPILOGUE_BIAS: return "bias";
    case CUBLASLT_EPILOGUE_GELU_AUX: return "gelu_aux";
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: return "gelu_aux_bias";
    case CUBLASLT_EPILOGUE_BGRADB: return "bgrad_a";
    case CUBLASLT_EPILOGUE_DGELU_BGRAD: return "dgelu_bgrad";
    default: return "?";
  }
}

// The key as text, in our (row-major) terms: the tuning cache file's key and the log's name
// of a shape, e.g. "bf16 acc32f m=16384 n=50304 k=768 batch=1 A=N,ld768 B=T,ld768 C=ld50304
// epilogue=none align=256,256,256 sm=0". Batch strides, aux_ld and the epilogue pointers'
// alignment appear only where they matter.
std::string key_text(const PlanKey& key) {
  const int64_t* v = key.v;
  std::ostringstream os;
  os << dtype_name(static_cast<DType>(v[0])) << ' ' << compute_name(v[1]) << " m=" << v[2] << " n=" << v[3]
     << " k=" << v[4] << " batch=" << v[5] << " A=" << (v[7] ? 'T' : 'N') << ",ld" << v[6];
  if (v[5] > 1) os << ",bs" << v[8];
  os << " B=" << (v[10] ? 'T' : 'N') << ",ld" << v[9];
  if (v[5] > 1) os << ",bs" << v[11];
  os << " C=ld" << v[12];
  if (v[5] > 1) os << ",bs" << v[13];
  os << " epilogue=" << epilogue_name(v[14]);
  if (v[15] != 0) os << " aux_ld=" << v[15];
  os << " align=" << v[16] << ',' << v[17] << ',' << v[18];
  if (static_cast<cublasLtEpilogue_t>(v[14]) != CUBLASLT_EPILOGUE_DEFAULT) os << ",epi" << v[19] << ',' << v[20];
  os << " sm=" << v[21];
  return os.str();
}

// A cached matmul descriptor with its layouts (cuBLASLt's A, B and C = D) and algorithms:
// the heuristic's first choice, and (once chosen) the tuned one (Note [GEMM algorithm tuning]).
struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};  // the heuristic's first choice
  bool has_algo = false;
  std::vector<cublasLtMatmulAlgo_t> candidates;  // the heuristic's usable results, best first (until tuned)
  cublasLtMatmulAlgo_t tuned{};                  // runs while tuning is on, once tuned_ready
  bool tuned_ready = false;
  bool capture_noted = false;   // first used during a stream capture (counted once)
  std::string no_algo_reason;   // !has_algo: why cuBLASLt offered none
  bool fallback_noted = false;  // the fallback was reported (once per plan)

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {  // when creating a plan failed half-way, or reset_gemm_plans (descriptors are host objects)
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
  // The tuning cache (Note [GEMM algorithm tuning]): read at the first plan tuned after start-up
  // or reset_gemm_plans, from FORGE_GEMM_TUNE_CACHE; `entries` holds what was read and what
  // this process tuned since.
  bool cache_read = false;
  std::optional<std::filesystem::path> cache_file;  // nullopt: no file
  gemm_tuning::Identity identity;
  gemm_tuning::Entries entries;
  bool cache_write_failed = false;  // reported once; no further writes
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
    case Epilogue::dgelu_bgrad: return CUBLASLT_EPILOGUE_DGELU_BGRAD;
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
    case Epilogue::dgelu_bgrad:
      set_desc(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias_grad);
      set_desc(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<const void*>(g.aux));
      break;
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
    if (g.epilogue == Epilogue::gelu_aux || g.epilogue == Epilogue::dgelu_bgrad)
      set_desc(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, g.aux_ld);
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
  // NOT_SUPPORTED (or any refusal) leaves the plan without an algorithm: the fallback runs,
  // and says so once (gemm()).
  if (st == CUBLAS_STATUS_SUCCESS) {
    for (int i = 0; i < found; ++i)
      if (results[i].state == CUBLAS_STATUS_SUCCESS && results[i].workspaceSize <= kWorkspaceBytes)
        plan->candidates.push_back(results[i].algo);
  }
  if (!plan->candidates.empty()) {
    plan->algo = plan->candidates.front();
    plan->has_algo = true;
  } else if (st != CUBLAS_STATUS_SUCCESS) {
    plan->no_algo_reason = std::string("cublasLtMatmulAlgoGetHeuristic returned ") + cublasGetStatusName(st);
  } else if (found == 0) {
    plan->no_algo_reason = "cublasLtMatmulAlgoGetHeuristic found no algorithm";
  } else {
    plan->no_algo_reason = "none of the heuristic's " + std::to_string(found) +
                           " algorithms fits the 32 MiB workspace";
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
    case Epilogue::dgelu_bgrad:
      FORGE_CHECK(g.bias_grad && g.aux && g.aux_ld >= g.n && g.aux_ld % 8 == 0,
                  "cuda gemm: the GELU-gradient epilogue needs the pre-activation (aux, row stride >= n and a multiple "
                  "of 8) and a bias-gradient output, got aux_ld=",
                  g.aux_ld, " n=", g.n);
      break;
  }
  FORGE_CHECK(g.epilogue == Epilogue::none || g.batch == 1, "cuda gemm: epilogues are single (unbatched) GEMMs here");
}

// ---- tuning (Note [GEMM algorithm tuning] in blaslt.h) -------------------------------------

void warn(const std::string& message) { std::fprintf(stderr, "forge: %s\n", message.c_str()); }

gemm_tuning::AlgoData algo_data(const cublasLtMatmulAlgo_t& a) {
  static_assert(sizeof(a.data) == sizeof(gemm_tuning::AlgoData), "cublasLtMatmulAlgo_t is 8 uint64");
  gemm_tuning::AlgoData d;
  std::memcpy(d.data(), a.data, sizeof(a.data));
  return d;
}

cublasLtMatmulAlgo_t lt_algo(const gemm_tuning::AlgoData& d) {
  cublasLtMatmulAlgo_t a{};
  std::memcpy(a.data, d.data(), sizeof(a.data));
  return a;
}

// Reads `device`'s section of the tuning cache file, once per reset (s.mu held).
void read_cache(DeviceState& s, int device) {
  if (s.cache_read) return;
  s.cache_read = true;
  const DeviceProperties p = device_properties(device);
  s.identity = {p.name, p.major, p.minor, p.sm_count, static_cast<int64_t>(cublasLtGetVersion()),
                env::flag("FORGE_GEMM_TUNE_IN_GRAPH")};
  s.cache_file = gemm_tuning::cache_path();
  if (!s.cache_file) return;
  gemm_tuning::Loaded loaded = gemm_tuning::load(*s.cache_file, s.identity);
  if (!loaded.warning.empty()) warn(loaded.warning);
  s.entries = std::move(loaded.entries);
}

// Writes s.entries to the cache file. Never fatal: the first failure is reported (once per
// process) and later writes are skipped.
void write_cache(DeviceState& s) {
  if (!s.cache_file || s.cache_write_failed) return;
  try {
    gemm_tuning::save(*s.cache_file, s.identity, s.entries);
    counters().file_writes.fetch_add(1);
  } catch (const std::exception& e) {
    s.cache_write_failed = true;
    static std::atomic<bool> reported{false};
    if (!reported.exchange(true))
      warn(std::string("the GEMM tuning cache is not written (") + e.what() +
           "); tuned GEMM algorithms are kept for this process only (FORGE_GEMM_TUNE_CACHE names another file, "
           "none switches the file off)");
  }
}

// Times plan's candidates on the current stream and returns the fastest as a cache entry
// (candidates = 1, untimed, when the heuristic offered one). Only scratch buffers are written
// where the real call's results could be harmed: C when beta != 0 (it is read, so repeated
// runs would accumulate), the aux output of gelu_aux and the bias gradient of bgrad_a. With
// beta = 0 the runs write C, which the real call then overwrites. Synchronises the host with
// the stream; throws on an error of the heuristic's own choice (a failing other candidate is
// skipped).
gemm_tuning::Entry time_candidates(DeviceState& s, const Plan& plan, const Gemm& g, int device, const void* alpha,
                                   const void* beta, void* ws) {
  const std::vector<cublasLtMatmulAlgo_t>& cand = plan.candidates;
  gemm_tuning::Entry e;
  e.algo = algo_data(plan.algo);
  e.candidates = 1;
  if (cand.size() < 2) return e;

  const Stream stream = Stream::current(device);
  const size_t elt = element_size(g.dtype);
  Gemm t = g;
  Tensor c_scratch, aux_scratch, bgrad_scratch;
  if (g.beta != 0) {
    const auto bytes = static_cast<size_t>((g.batch - 1) * g.c_batch_stride + (g.m - 1) * g.ldc + g.n) * elt;
    c_scratch = empty_bytes(device, bytes);
    FORGE_CUDA_CHECK(cudaMemsetAsync(c_scratch.data_ptr(), 0, bytes, stream.handle()));
    t.c = c_scratch.data_ptr();
  }
  if (g.epilogue == Epilogue::gelu_aux) {
    aux_scratch = empty_bytes(device, static_cast<size_t>(g.m * g.aux_ld) * elt);
    t.aux = aux_scratch.data_ptr();
  }
  if (g.epilogue == Epilogue::bgrad_a) {
    bgrad_scratch = empty_bytes(device, static_cast<size_t>(g.m) * elt);
    t.bias_grad = bgrad_scratch.data_ptr();
  }
  if (g.epilogue == Epilogue::dgelu_bgrad) {  // its bias gradient has n entries (aux is only read)
    bgrad_scratch = empty_bytes(device, static_cast<size_t>(g.n) * elt);
    t.bias_grad = bgrad_scratch.data_ptr();
  }
  set_epilogue_pointers(plan.op, t);  // gemm() sets the real ones again before its call
  const auto run_on = [&](const cublasLtMatmulAlgo_t& algo, cudaStream_t on) {
    return cublasLtMatmul(s.lt, plan.op, alpha, g.b.data, plan.a, g.a.data, plan.b, beta, t.c, plan.c, t.c, plan.c,
                          &algo, ws, kWorkspaceBytes, on);
  };
  const auto run = [&](const cublasLtMatmulAlgo_t& algo) { return run_on(algo, stream.handle()); };

  // The heuristic's choice once to warm up (lazy module loading), once timed: how many runs
  // make a measurement of ~kTuneTargetMs, and how many candidates fit kTuneBudgetMs.
  Event p0(true), p1(true);
  FORGE_CUBLAS_CHECK(run(cand[0]));
  p0.record(stream);
  FORGE_CUBLAS_CHECK(run(cand[0]));
  p1.record(stream);
  p1.synchronize();
  const double probe = std::max(static_cast<double>(p0.elapsed_ms(p1)), 1e-3);
  const int runs = std::clamp(static_cast<int>(std::ceil(kTuneTargetMs / probe)), 1, kTuneMaxRuns);
  const size_t n = std::clamp(static_cast<size_t>(kTuneBudgetMs / (2.0 * runs * probe)), size_t{2}, cand.size());

  std::vector<char> ok(n, 1);
  // Note [GEMM timing in CUDA graphs] (gemm_graph_timing.cpp): with the identity's graph_timed (FORGE_GEMM_TUNE_IN_GRAPH
  // when the cache was read), each candidate's `runs` calls are captured once into a graph, and
  // the timing launches that graph, so a candidate is charged what it costs in the replayed step.
  GraphRuns graphs;
  if (s.identity.graph_timed) {
    graphs = capture_runs(cand, n, runs, ok, run_on, stream.handle());
    counters().graph_timed.fetch_add(graphs.used ? 1 : 0);
    counters().graph_refused.fetch_add(graphs.used ? 0 : 1);
  }

  // Two passes (the second in reverse order), each candidate's `runs` runs between two events;
  // a candidate's time is the smaller of its two means. The first pass also warms up.
  std::vector<Event> start, stop;
  for (size_t i = 0; i < n; ++i) {
    start.emplace_back(true);
    stop.emplace_back(true);
  }
  std::vector<double> ms(n, std::numeric_limits<double>::infinity());
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t j = 0; j < n; ++j) {
      const size_t i = pass == 0 ? j : n - 1 - j;
      if (!ok[i]) continue;
      start[i].record(stream);
      if (graphs.used) {
        FORGE_CUDA_CHECK(cudaGraphLaunch(graphs.exec[i], stream.handle()));
      } else {
        for (int r = 0; r < runs && ok[i]; ++r) ok[i] = run(cand[i]) == CUBLAS_STATUS_SUCCESS;
      }
      stop[i].record(stream);
    }
    Event end;
    end.record(stream);
    end.synchronize();
    for (size_t i = 0; i < n; ++i)
      if (ok[i]) ms[i] = std::min(ms[i], static_cast<double>(start[i].elapsed_ms(stop[i])) / runs);
  }
  FORGE_CHECK(ok[0], "cuBLASLt refused its own first choice while timing it");
  size_t best = 0;
  for (size_t i = 1; i < n; ++i)
    if (ok[i] && ms[i] < ms[best]) best = i;
  if (ms[best] > (1.0 - kTuneMargin) * ms[0]) best = 0;  // not clearly faster: keep the heuristic's
  if (graphs.used) {  // what the step's graph will hold: the first choice's memsets, and the winner's
    counters().memset_first.fetch_add(graphs.memsets[0] > 0 ? 1 : 0);
    counters().memset_chosen.fetch_add(graphs.memsets[best] > 0 ? 1 : 0);
  }
  e.algo = algo_data(cand[best]);
  e.tuned_ms = ms[best];
  e.heuristic_ms = ms[0];
  e.candidates = static_cast<int>(std::count(ok.begin(), ok.end(), 1));
  return e;
}

// Makes plan.tuned ready (tuning on, plan.has_algo): the cache file's algorithm when cuBLASLt
// still accepts it (cublasLtMatmulAlgoCheck; a refused one is dropped), else the fastest
// candidate by time_candidates, recorded in the file. Inside a stream capture nothing is
// timed and plan.tuned stays unready: the heuristic's choice runs, and the plan is tuned at
// its first use outside a capture. A timing that fails leaves the heuristic's choice.
void choose_algorithm(DeviceState& s, Plan& plan, const PlanKey& key, const Gemm& g, int device, const void* alpha,
                      const void* beta, void* ws) {
  read_cache(s, device);
  const std::string text = key_text(key);
  if (const auto it = s.entries.find(text); it != s.entries.end()) {
    const cublasLtMatmulAlgo_t algo = lt_algo(it->second.algo);
    set_epilogue_pointers(plan.op, g);
    cublasLtMatmulHeuristicResult_t check{};
    if (cublasLtMatmulAlgoCheck(s.lt, plan.op, plan.a, plan.b, plan.c, plan.c, &algo, &check) ==
            CUBLAS_STATUS_SUCCESS &&
        check.state == CUBLAS_STATUS_SUCCESS && check.workspaceSize <= kWorkspaceBytes) {
      plan.tuned = algo;
      plan.tuned_ready = true;
      plan.candidates = {};
      counters().loaded.fetch_add(1);
      return;
    }
    s.entries.erase(it);  // stale: timed again below and overwritten in the file
    counters().stale.fetch_add(1);
  }
  if (stream_is_capturing(current_stream(device))) {
    if (!plan.capture_noted) {
      plan.capture_noted = true;
      counters().capture_skips.fetch_add(1);
      static std::atomic<bool> reported{false};
      if (!reported.exchange(true))
        warn("GEMM tuning: a GEMM shape first used during CUDA graph capture runs cuBLASLt's heuristic choice "
             "(timing would synchronise the host), in the graph too; it is tuned at its first use outside a capture");
    }
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  gemm_tuning::Entry e;
  try {
    e = time_candidates(s, plan, g, device, alpha, beta, ws);
  } catch (const std::exception& ex) {
    counters().failed.fetch_add(1);
    warn("GEMM tuning failed for " + text + " (" + ex.what() + "); cuBLASLt's heuristic choice runs");
    plan.tuned = plan.algo;
    plan.tuned_ready = true;
    plan.candidates = {};
    return;
  }
  counters().tuning_us.fetch_add(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count());
  counters().tuned.fetch_add(1);
  if (e.candidates > 1) counters().timed.fetch_add(1);
  if (e.algo != algo_data(plan.algo)) counters().changed.fetch_add(1);
  plan.tuned = lt_algo(e.algo);
  plan.tuned_ready = true;
  plan.candidates = {};
  s.entries[text] = e;
  write_cache(s);
}

// A plan without a cuBLASLt algorithm is used: count the call, and report the shape once.
void note_fallback(Plan& plan, const PlanKey& key, const Gemm& g) {
  counters().fallback_calls.fetch_add(1);
  if (plan.fallback_noted) return;
  plan.fallback_noted = true;
  counters().fallback_shapes.fetch_add(1);
  warn("GEMM fallback: cuBLASLt has no algorithm for " + key_text(key) + " (" + plan.no_algo_reason + "); " +
       (g.epilogue == Epilogue::none
            ? "cublasGemmStridedBatchedEx runs it instead"
            : "the caller runs the unfused sequence instead (the GEMM, then a separate kernel for the epilogue)"));
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
                     alignment(g.epilogue == Epilogue::bgrad_a || g.epilogue == Epilogue::dgelu_bgrad ? g.bias_grad
                                                                                                     : g.bias,
                               0, 1, elt),
                     alignment(g.aux, 0, 1, elt), env::integer("FORGE_GEMM_SM_TARGET")}};

  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.plans.find(key);
  if (it == s.plans.end()) it = s.plans.emplace(key, make_plan(s, g, ct, align)).first;
  Plan& plan = *it->second;
  if (!plan.has_algo) {
    note_fallback(plan, key, g);
    if (g.epilogue != Epilogue::none) return false;
  }

  void* ws = workspace(s, device, stream);
  const float alpha_f = static_cast<float>(g.alpha), beta_f = static_cast<float>(g.beta);
  const bool f64 = g.dtype == DType::f64;
  const void* alpha = f64 ? static_cast<const void*>(&g.alpha) : static_cast<const void*>(&alpha_f);
  const void* beta = f64 ? static_cast<const void*>(&g.beta) : static_cast<const void*>(&beta_f);
  if (plan.has_algo) {
    const cublasLtMatmulAlgo_t* algo = &plan.algo;
    if (gemm_tuning()) {
      if (!plan.tuned_ready) choose_algorithm(s, plan, key, g, device, alpha, beta, ws);
      if (plan.tuned_ready) algo = &plan.tuned;
    }
    set_epilogue_pointers(plan.op, g);
    FORGE_CUBLAS_CHECK(cublasLtMatmul(s.lt, plan.op, alpha, g.b.data, plan.a, g.a.data, plan.b, beta, g.c, plan.c,
                                      g.c, plan.c, algo, ws, kWorkspaceBytes, stream));
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

void reset_plans(int device) {
  DeviceState& s = device_state(device);
  std::lock_guard<std::mutex> lock(s.mu);
  s.plans.clear();  // descriptors are host objects: GEMMs already queued with them are unaffected
  s.cache_read = false;
  s.cache_file.reset();
  s.entries.clear();
  s.cache_write_failed = false;
}

int64_t plans_cached(int device) {
  DeviceState& s = device_state(device);
  std::lock_guard<std::mutex> lock(s.mu);
  return static_cast<int64_t>(s.plans.size());
}

Tensor device_empty(int device, const Shape& shape, DType dtype) {
  auto storage = std::make_shared<Storage>(checked_nbytes(shape, element_size(dtype)),
                                           allocator(device));
  return Tensor::make(std::move(storage), shape, contiguous_strides(shape), 0, dtype);
}

}  // namespace blas
}  // namespace forge::cuda
