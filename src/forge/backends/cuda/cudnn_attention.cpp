// cuDNN's fused attention through the cudnn-frontend graph API. Contract in cudnn_attention.h.
//
// Note [cuDNN attention]
// cuDNN (9.x) has a fused scaled-dot-product-attention engine for Hopper and Ampere (the
// one behind PyTorch's SDPA "cuDNN" back-end): forward and backward as single fused kernels
// with wgmma and TMA on sm_90. It is reached through cuDNN's graph API: a graph of one SDPA
// node (forward: q, k, v -> o, stats; backward: q, k, v, o, dO, stats -> dq, dk, dv) is
// described with the tensors' shapes and strides, cuDNN picks an engine by heuristics
// (mode A, then the fallback list), and the built plan is executed with the device
// pointers and a workspace. forge uses NVIDIA's header-only cudnn-frontend for the
// description (third_party/cudnn-frontend, v1.18.0, MIT; compiled without its JSON
// serialisation, CUDNN_FRONTEND_SKIP_JSON_LIB) and links libcudnn.
//
// Graphs are cached per device, keyed by everything a plan depends on: direction, dtype,
// B, H, Hkv, T, S, D, the strides of every tensor, causal, scale, deterministic, and whether
// the plan is tuned (below). In training the keys repeat every step, so a call is one hash
// lookup, cudnnSetStream and one execute of the key's chosen plan (no host synchronisation
// after the key's first call; the workspace comes from the caching allocator on the current
// stream). A key cuDNN refuses is remembered as refused, and the call returns false so the
// caller runs forge's own kernels: the refusal is said once on stderr.
//
// Semantics: softmax(scale * q k^T) v with cuDNN's causal mask as a diagonal band (right
// bound 0) aligned bottom-right, which is forge's convention; with T == S bottom-right and
// top-left coincide and the plain top-left form is used (the one every cuDNN 9 version
// supports). Stats is the per-row logsumexp of the scaled scores in natural-log units, f32
// (B, H, T, 1) with strides (H T, T, 1, 1): forge's lse, byte for byte. I/O bf16 or f16,
// intermediates and compute f32.
//
// Which plan runs. cuDNN's heuristics (mode A, then FALLBACK) rank the engine configurations
// that can run a graph, and their first choice is not always the fastest: on an H200 it picked
// a 64x256 tile for LLaMA's causal GQA forward (3.33 ms a step) where PyTorch's cuDNN SDPA ran a
// 64x128 one (3.22 ms), and the backward differed by ~5%. So with FORGE_CUDNN_PLAN_TUNING=1 (the
// default) a new key builds every configuration the heuristics offer (build_plan_at_index in
// their order, at most kMaxCandidates, one per engine name; those that fail to build are
// skipped; the first that builds is the heuristic's choice), and the first call of the key
// times them on that call's own tensors: per candidate a workspace of its size from the caching
// allocator, one untimed run (lazy module loading), then kTimedRuns runs between CUDA events on
// the current stream, the best run counting. The fastest runs from then on, unless it is less
// than kTuneMargin faster than the heuristic's choice, which then stays; a candidate that fails
// to run, or would need more workspace than the heuristic's choice and kWorkspaceAllowance
// (it would be allocated at every call), is skipped, and if all fail the heuristic's choice
// runs. The chosen index is kept in
// the cache entry, and that call's real execution follows with it, so every result comes from
// the chosen plan. Timing costs a host synchronisation and a few runs per candidate, once per
// key and process. cudnn_attention_plan_report() lists what was timed and chosen.
//   - The timing runs write the call's outputs (O and Stats; dQ, dK, dV) from unchanged inputs:
//     SDPA plans overwrite their outputs rather than accumulate into them (every later call
//     relies on that too), and the backward's dQ accumulator lives in the frontend's part of the
//     workspace, which the frontend clears itself before each execution for cuDNN < 9.6
//     (run_auxiliary_kernels, a memset; cudnn_frontend/node/scaled_dot_product_flash_attention.h)
//     and cuDNN's own kernels clear from 9.6 on. Each execution gets a fresh copy of the variant
//     pack: execute_plan_at_index adds the workspace's pointers to the map it is handed, and an
//     entry left from another candidate's workspace would win.
//   - No timing during a CUDA graph capture (cudaStreamIsCapturing on the current stream; a
//     synchronisation there is refused, and a replay would re-run every candidate): an untuned
//     key runs the heuristic's choice and stays untuned, so its first call outside a capture
//     tunes it; a captured graph keeps the plan it captured. forge train captures at step 2,
//     after step 1 tuned every key.
//   - Plans may differ in the last bits. The choice is fixed per key for the life of the process
//     (the cache), so a run is consistent with itself, but another process may time another
//     winner. Hence deterministic mode (run.deterministic: deterministic_attention(), or a
//     deterministic backward) never times: like its GEMMs (Note [GEMM algorithm tuning]) it runs
//     the heuristic's choice, which depends on the shapes alone, and reruns give the same bits.
//   - FORGE_CUDNN_PLAN_TUNING is read at every call and is part of the key, so both settings
//     can run in one process (the tests do); 0 builds the heuristic's first plan only, as
//     before.
#include "forge/backends/cuda/cudnn_attention.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iomanip>
#include <memory>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "forge/backends/cuda/attention.h"
#include "forge/backends/cuda/blaslt.h"
#include "forge/backends/cuda/flash_attention.h"
#include "forge/backends/cuda/graph.h"
#include "forge/backends/cuda/runtime.h"
#include "forge/backends/cuda/stream.h"
#include "forge/core/env.h"

#ifdef FORGE_WITH_CUDNN
#include <cudnn.h>
#include <cudnn_frontend.h>
#endif

namespace forge::cuda {
namespace {

std::atomic<int64_t> g_calls{0};
std::atomic<int64_t> g_graphs{0};

// The layout both fused back-ends read and write in place (unit last stride, other strides
// multiples of 8 elements, 16-byte aligned).
bool layout_ok(const Tensor& t) { return flash_attention_layout_ok(t); }

}  // namespace

int64_t cudnn_attention_calls() { return g_calls.load(); }
int64_t cudnn_attention_graphs_built() { return g_graphs.load(); }

bool cudnn_attention_applies(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool causal) {
  if (!cudnn_attention_available() || mask.defined()) return false;
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4) return false;
  if (q.dtype() != k.dtype() || q.dtype() != v.dtype()) return false;
  if (q.dtype() != DType::bf16 && q.dtype() != DType::f16) return false;
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3), Hkv = k.size(1), S = k.size(2);
  if (D % 8 != 0 || D <= 0 || D > 128) return false;
  if (k.size(3) != D || v.size(3) != D || k.size(0) != B || v.size(0) != B || v.size(1) != Hkv || v.size(2) != S)
    return false;
  if (Hkv <= 0 || H % Hkv != 0 || B <= 0 || T <= 0 || S <= 0) return false;
  if (causal && T > S) return false;
  if (T == 1 && S == 1) return false;  // cuDNN's backward refuses s_q = s_kv = 1
  // A few queries after a KV cache (decoding): S grows by one every call, so each call would
  // build a new cuDNN graph (milliseconds each: 13 ms a token for GPT-2 124M on an H200). The
  // flash kernels, or the composed ones, need no plan (Note [cuDNN attention]).
  if (T < S && T <= kDecodeQueries) return false;
  return layout_ok(q) && layout_ok(k) && layout_ok(v);
}

#ifndef FORGE_WITH_CUDNN

bool cudnn_attention_available() { return false; }
std::string cudnn_version_string() { return "not built with cuDNN"; }
bool cudnn_attention_forward(const Tensor&, const Tensor&, const Tensor&, bool, double, Tensor&, Tensor&) {
  return false;
}
bool cudnn_attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                              bool, double, bool, Tensor&, Tensor&, Tensor&) {
  return false;
}
std::vector<CudnnAttentionPlan> cudnn_attention_plans() { return {}; }
std::string cudnn_attention_plan_report() { return ""; }

#else

namespace fe = cudnn_frontend;

namespace {

enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

void check_cudnn(cudnnStatus_t st, const char* what) {
  FORGE_CHECK(st == CUDNN_STATUS_SUCCESS, "cuDNN: ", what, " failed: ", cudnnGetErrorString(st));
}

// One cuDNN handle per device, created on first use and kept for the process.
cudnnHandle_t handle_for(int device) {
  static std::mutex mu;
  static std::unordered_map<int, cudnnHandle_t> handles;
  std::lock_guard<std::mutex> lock(mu);
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  cudnnHandle_t h = nullptr;
  check_cudnn(cudnnCreate(&h), "cudnnCreate");
  handles.emplace(device, h);
  return h;
}

// The cache key: every number a plan depends on.
struct Key {
  std::vector<int64_t> v;
  bool operator==(const Key& o) const { return v == o.v; }
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = 1469598103934665603ull;
    for (int64_t x : k.v) h = (h ^ static_cast<size_t>(x)) * 1099511628211ull;
    return h;
  }
};

// Plan tuning (Note [cuDNN attention], "Which plan runs"): the most candidates built per key,
// the timed runs per candidate, how much faster than the heuristic's choice another must be to
// replace it, and how much more workspace than the heuristic's choice (or this much, whichever
// is larger) a candidate may take (a plan's workspace is allocated at every call).
constexpr size_t kMaxCandidates = 16;
constexpr int kTimedRuns = 3;
constexpr double kTuneMargin = 0.01;
constexpr int64_t kWorkspaceAllowance = int64_t{256} << 20;

// A cache entry: the graph and its built plans. Shared by the cache and the calls using it.
struct Plan {
  std::shared_ptr<fe::graph::Graph> graph;  // null: cuDNN refused this key
  std::vector<int64_t> candidates;          // indices of the built plans, heuristic order: [0] its choice
  std::vector<int64_t> workspaces;          // their workspace bytes
  std::vector<std::string> names;           // their engine names
  CudnnAttentionPlan info;                  // the problem, for the report
  std::mutex mu;                            // guards what follows (tuning happens under it)
  size_t chosen = 0;                        // the position in `candidates` that runs
  bool tuned = false;
  int64_t timed = 0, capture_skips = 0;
  std::vector<double> ms;                   // per candidate; < 0: not timed (failed, skipped)
};
using PlanPtr = std::shared_ptr<Plan>;

std::mutex g_cache_mu;
std::unordered_map<Key, PlanPtr, KeyHash>& cache() {
  static auto* c = new std::unordered_map<Key, PlanPtr, KeyHash>();  // never destroyed (exit order)
  return *c;
}
std::vector<PlanPtr>& built_in_order() {  // the accepted plans, for the report (under g_cache_mu)
  static auto* v = new std::vector<PlanPtr>();
  return *v;
}

// Whether a new key of this call is built for timing (Note [cuDNN attention]): the switch, read
// at every call, and never in deterministic mode.
bool tuning_wanted(bool deterministic) {
  return env::flag("FORGE_CUDNN_PLAN_TUNING") && !deterministic && !deterministic_attention();
}

void push_tensor(std::vector<int64_t>& v, const Tensor& t) {
  for (int i = 0; i < 4; ++i) v.push_back(t.stride(i));
}

std::vector<int64_t> dims_of(const Tensor& t) { return {t.size(0), t.size(1), t.size(2), t.size(3)}; }
std::vector<int64_t> strides_of(const Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2), t.stride(3)}; }

std::shared_ptr<fe::graph::Tensor_attributes> io_tensor(fe::graph::Graph& g, const char* name, Uid uid,
                                                        const Tensor& t) {
  return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dims_of(t)).set_stride(
      strides_of(t)));
}

std::shared_ptr<fe::graph::Graph> new_graph(DType dtype) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(dtype == DType::bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

template <class Attr>
void set_mask(Attr& a, bool causal, int64_t T, int64_t S) {
  if (!causal) return;
  a.set_diagonal_alignment(T == S ? fe::DiagonalAlignment_t::TOP_LEFT : fe::DiagonalAlignment_t::BOTTOM_RIGHT)
      .set_diagonal_band_right_bound(0);
}

// Validates and lowers `g`, then builds its plans in the heuristics' order: the first that
// builds (the heuristic's choice, as BuildPlanPolicy_t::HEURISTICS_CHOICE), or with `all` every
// one that builds (as BuildPlanPolicy_t::ALL, which also leaves the graph's own candidate at the
// last plan built: forge executes by index). A refused key: no candidates, the reason in `why`.
void build(Plan& p, const std::shared_ptr<fe::graph::Graph>& g, cudnnHandle_t h, bool all, std::string& why) {
  auto step = [&](fe::error_t e, const char* what) {
    if (e.is_good()) return true;
    why = std::string(what) + ": " + e.get_message();
    return false;
  };
  if (!step(g->validate(), "validate")) return;
  if (!step(g->build_operation_graph(h), "build_operation_graph")) return;
  if (!step(g->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}), "create_execution_plans"))
    return;
  if (!step(g->check_support(h), "check_support")) return;
  std::unordered_set<std::string> seen;
  const int64_t n = g->get_execution_plan_count();
  for (int64_t i = 0; i < n && p.candidates.size() < (all ? kMaxCandidates : 1); ++i) {
    std::string name;
    if (!g->get_plan_name_at_index(i, name).is_good()) name = "plan " + std::to_string(i);
    if (all && !seen.insert(name).second) continue;  // modes A and FALLBACK may offer a config twice
    int64_t ws = 0;
    if (!step(g->build_plan_at_index(i), "build_plan_at_index")) continue;
    if (!step(g->get_workspace_size_plan_at_index(i, ws), "get_workspace_size_plan_at_index")) continue;
    p.candidates.push_back(i);
    p.workspaces.push_back(ws);
    p.names.push_back(name);
  }
  if (p.candidates.empty()) {
    if (why.empty()) why = "no execution plan built";
    return;
  }
  p.graph = g;
}

// The cached plan for `key`, built by `make` on first use; null graph when refused.
template <class Make>
PlanPtr plan_for(const Key& key, int device, const CudnnAttentionPlan& info, const Make& make) {
  {
    std::lock_guard<std::mutex> lock(g_cache_mu);
    auto it = cache().find(key);
    if (it != cache().end()) return it->second;
  }
  std::string why;
  auto p = std::make_shared<Plan>();
  p->info = info;
  build(*p, make(), handle_for(device), info.tuning, why);
  ++g_graphs;
  if (!p->graph)
    std::fprintf(stderr, "forge: cuDNN attention %s declined a problem (%s); forge's own kernels run it instead\n",
                 info.backward ? "backward" : "forward", why.c_str());
  std::lock_guard<std::mutex> lock(g_cache_mu);
  auto [it, fresh] = cache().emplace(key, p);  // another thread may have built it meanwhile
  if (fresh && it->second->graph) built_in_order().push_back(it->second);
  return it->second;
}

// A workspace of `bytes` from the caching allocator on the current stream (undefined for 0).
Tensor workspace(int device, int64_t bytes) {
  return bytes > 0 ? blas::device_empty(device, {bytes}, DType::u8) : Tensor();
}

// Runs candidate `i` of `p` once on `pack`'s tensors; false when cuDNN refuses (its error
// cleared, when the launch's was not sticky).
bool run_candidate(const Plan& p, size_t i, cudnnHandle_t h, const std::unordered_map<int64_t, void*>& pack,
                   void* ws) {
  auto vp = pack;  // execute_plan_at_index adds the workspace's tensors to the map it is given
  if (p.graph->execute_plan_at_index(h, vp, ws, p.candidates[i]).is_good()) return true;
  (void)cudaGetLastError();
  return false;
}

// Times every candidate of `p` on the call's tensors and sets p.chosen (Note [cuDNN attention],
// "Which plan runs"). Under p.mu, outside a capture; the handle is on the current stream.
void tune(Plan& p, int device, cudnnHandle_t h, const std::unordered_map<int64_t, void*>& pack) {
  const Stream stream = Stream::current(device);
  const size_t n = p.candidates.size();
  const int64_t ws_limit = std::max(p.workspaces[0], kWorkspaceAllowance);
  p.ms.assign(n, -1.0);
  for (size_t i = 0; i < n; ++i) {
    if (p.workspaces[i] > ws_limit) continue;
    try {
      const Tensor ws = workspace(device, p.workspaces[i]);
      void* wp = ws.defined() ? ws.data_ptr() : nullptr;
      if (!run_candidate(p, i, h, pack, wp)) continue;  // warm-up (lazy module loading)
      std::vector<Event> ev;
      ev.reserve(kTimedRuns + 1);
      for (int r = 0; r <= kTimedRuns; ++r) ev.emplace_back(true);
      ev[0].record(stream);
      bool ok = true;
      for (int r = 0; r < kTimedRuns; ++r) {
        ok = ok && run_candidate(p, i, h, pack, wp);
        ev[r + 1].record(stream);
      }
      ev[kTimedRuns].synchronize();
      if (!ok) continue;
      double best = ev[0].elapsed_ms(ev[1]);
      for (int r = 1; r < kTimedRuns; ++r) best = std::min(best, static_cast<double>(ev[r].elapsed_ms(ev[r + 1])));
      p.ms[i] = best;
      ++p.timed;
    } catch (const std::exception&) {  // a workspace that does not fit: not a candidate
      (void)cudaGetLastError();
    }
  }
  size_t best = n;
  for (size_t i = 0; i < n; ++i)
    if (p.ms[i] >= 0 && (best == n || p.ms[i] < p.ms[best])) best = i;
  if (best == n || (p.ms[0] >= 0 && p.ms[best] > (1.0 - kTuneMargin) * p.ms[0])) best = 0;
  p.chosen = best;
  p.tuned = true;
}

// Executes `p`'s chosen plan on the current stream, tuning the key first where that is due.
void execute(Plan& p, int device, std::unordered_map<int64_t, void*> pack, const char* what) {
  cudnnHandle_t h = handle_for(device);
  const cudaStream_t stream = current_stream(device);
  check_cudnn(cudnnSetStream(h, stream), "cudnnSetStream");
  size_t c = 0;
  {
    std::lock_guard<std::mutex> lock(p.mu);
    if (p.info.tuning && !p.tuned) {
      if (stream_is_capturing(stream))
        ++p.capture_skips;  // the heuristic's choice, untuned: a later uncaptured call tunes
      else
        tune(p, device, h, pack);
    }
    c = p.chosen;
  }
  const Tensor ws = workspace(device, p.workspaces[c]);
  fe::error_t e = p.graph->execute_plan_at_index(h, pack, ws.defined() ? ws.data_ptr() : nullptr, p.candidates[c]);
  FORGE_CHECK(e.is_good(), "cuDNN attention ", what, ": execute failed: ", e.get_message());
}

// The report's description of a problem.
CudnnAttentionPlan describe(bool backward, const Tensor& q, const Tensor& k, bool causal, bool deterministic,
                            bool tuning) {
  CudnnAttentionPlan i;
  i.backward = backward;
  i.B = q.size(0), i.H = q.size(1), i.Hkv = k.size(1), i.T = q.size(2), i.S = k.size(2), i.D = q.size(3);
  i.causal = causal;
  i.deterministic = deterministic;
  i.tuning = tuning;
  std::ostringstream o;
  o << (backward ? "backward " : "forward ") << dtype_name(q.dtype()) << " B=" << i.B << " H=" << i.H
    << " Hkv=" << i.Hkv << " T=" << i.T << " S=" << i.S << " D=" << i.D << (causal ? " causal" : "")
    << (deterministic ? " deterministic" : "");
  i.problem = o.str();
  return i;
}

void* ptr(const Tensor& t) { return const_cast<void*>(t.data_ptr()); }

}  // namespace

bool cudnn_attention_available() {
  static const bool ok = cudnnGetVersion() >= 90000;
  return ok;
}

std::string cudnn_version_string() {
  const size_t v = cudnnGetVersion();
  return std::to_string(v / 10000) + "." + std::to_string((v % 10000) / 100) + "." + std::to_string(v % 100);
}

bool cudnn_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale, Tensor& out,
                             Tensor& lse) {
  FORGE_CHECK(cudnn_attention_applies(q, k, v, Tensor(), causal) && layout_ok(out) && out.dtype() == q.dtype() &&
                  out.shape() == q.shape() && lse.dtype() == DType::f32 && lse.is_contiguous(),
              "cudnn_attention_forward: unsupported problem q ", q.shape(), " k ", k.shape(), " out ", out.shape());
  const int device = q.device().index;
  DeviceGuard guard(device);
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), S = k.size(2);
  const auto fscale = static_cast<float>(scale);
  Key key;
  key.v = {0, static_cast<int64_t>(q.dtype()), device, B, H, k.size(1), T, S, q.size(3), causal, 0};
  int32_t scale_bits;
  std::memcpy(&scale_bits, &fscale, sizeof scale_bits);
  key.v.push_back(scale_bits);
  for (const Tensor* t : {&q, &k, &v, static_cast<const Tensor*>(&out)}) push_tensor(key.v, *t);
  const bool tuning = tuning_wanted(false);
  key.v.push_back(tuning);
  const PlanPtr p = plan_for(key, device, describe(false, q, k, causal, false, tuning), [&] {
    auto g = new_graph(q.dtype());
    auto Q = io_tensor(*g, "Q", kQ, q), K = io_tensor(*g, "K", kK, k), V = io_tensor(*g, "V", kV, v);
    auto attr = fe::graph::SDPA_attributes().set_name("forge_sdpa").set_generate_stats(true).set_attn_scale(fscale);
    set_mask(attr, causal, T, S);
    auto [O, Stats] = g->sdpa(Q, K, V, attr);
    O->set_output(true).set_uid(kO).set_dim(dims_of(out)).set_stride(strides_of(out));
    Stats->set_output(true).set_uid(kStats).set_data_type(fe::DataType_t::FLOAT).set_dim({B, H, T, 1}).set_stride(
        {H * T, T, 1, 1});
    return g;
  });
  if (!p->graph) return false;
  std::unordered_map<int64_t, void*> pack = {
      {kQ, ptr(q)}, {kK, ptr(k)}, {kV, ptr(v)}, {kO, ptr(out)}, {kStats, ptr(lse)}};
  execute(*p, device, std::move(pack), "forward");
  ++g_calls;
  return true;
}

bool cudnn_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                              const Tensor& lse, bool causal, double scale, bool deterministic, Tensor& dq, Tensor& dk,
                              Tensor& dv) {
  FORGE_CHECK(cudnn_attention_applies(q, k, v, Tensor(), causal) && layout_ok(dout) && layout_ok(out) &&
                  layout_ok(dq) && layout_ok(dk) && layout_ok(dv) && lse.dtype() == DType::f32 && lse.is_contiguous(),
              "cudnn_attention_backward: unsupported problem q ", q.shape(), " k ", k.shape());
  if (!dq.defined() && !dk.defined() && !dv.defined()) return true;
  const int device = q.device().index;
  DeviceGuard guard(device);
  // cuDNN writes all three gradients: a missing one goes to a dense scratch tensor.
  auto or_scratch = [&](const Tensor& t, const Tensor& like) {
    return t.defined() ? t : blas::device_empty(device, like.shape(), like.dtype());
  };
  const Tensor gq = or_scratch(dq, q), gk = or_scratch(dk, k), gv = or_scratch(dv, v);
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), S = k.size(2);
  const auto fscale = static_cast<float>(scale);
  Key key;
  key.v = {1, static_cast<int64_t>(q.dtype()), device, B, H, k.size(1), T, S, q.size(3), causal, deterministic};
  int32_t scale_bits;
  std::memcpy(&scale_bits, &fscale, sizeof scale_bits);
  key.v.push_back(scale_bits);
  for (const Tensor* t : {&q, &k, &v, &out, &dout, &gq, &gk, &gv}) push_tensor(key.v, *t);
  const bool tuning = tuning_wanted(deterministic);
  key.v.push_back(tuning);
  const PlanPtr p = plan_for(key, device, describe(true, q, k, causal, deterministic, tuning), [&] {
    auto g = new_graph(q.dtype());
    auto Q = io_tensor(*g, "Q", kQ, q), K = io_tensor(*g, "K", kK, k), V = io_tensor(*g, "V", kV, v);
    auto O = io_tensor(*g, "O", kO, out), dO = io_tensor(*g, "dO", kDO, dout);
    auto Stats = g->tensor(fe::graph::Tensor_attributes()
                               .set_name("Stats")
                               .set_uid(kStats)
                               .set_dim({B, H, T, 1})
                               .set_stride({H * T, T, 1, 1})
                               .set_data_type(fe::DataType_t::FLOAT));
    auto attr = fe::graph::SDPA_backward_attributes().set_name("forge_sdpa_backward").set_attn_scale(fscale);
    if (deterministic) attr.set_deterministic_algorithm(true);
    set_mask(attr, causal, T, S);
    auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, Stats, attr);
    dQ->set_output(true).set_uid(kDQ).set_dim(dims_of(gq)).set_stride(strides_of(gq));
    dK->set_output(true).set_uid(kDK).set_dim(dims_of(gk)).set_stride(strides_of(gk));
    dV->set_output(true).set_uid(kDV).set_dim(dims_of(gv)).set_stride(strides_of(gv));
    return g;
  });
  if (!p->graph) return false;
  std::unordered_map<int64_t, void*> pack = {{kQ, ptr(q)},       {kK, ptr(k)},   {kV, ptr(v)},
                                             {kO, ptr(out)},     {kDO, ptr(dout)}, {kStats, ptr(lse)},
                                             {kDQ, ptr(gq)},     {kDK, ptr(gk)}, {kDV, ptr(gv)}};
  execute(*p, device, std::move(pack), "backward");
  ++g_calls;
  return true;
}

std::vector<CudnnAttentionPlan> cudnn_attention_plans() {
  std::vector<PlanPtr> plans;
  {
    std::lock_guard<std::mutex> lock(g_cache_mu);
    plans = built_in_order();
  }
  std::vector<CudnnAttentionPlan> out;
  for (const PlanPtr& p : plans) {
    std::lock_guard<std::mutex> lock(p->mu);
    CudnnAttentionPlan i = p->info;
    i.tuned = p->tuned;
    i.candidates = static_cast<int64_t>(p->candidates.size());
    i.timed = p->timed;
    i.capture_skips = p->capture_skips;
    i.chosen = p->names[p->chosen];
    i.heuristic = p->names[0];
    if (p->tuned) {
      i.chosen_ms = std::max(p->ms[p->chosen], 0.0);
      i.heuristic_ms = std::max(p->ms[0], 0.0);
    }
    out.push_back(std::move(i));
  }
  return out;
}

std::string cudnn_attention_plan_report() {
  std::ostringstream o;
  o << std::fixed << std::setprecision(4);
  for (const CudnnAttentionPlan& i : cudnn_attention_plans()) {
    o << "cudnn plan: " << i.problem << ": ";
    if (!i.tuning) {
      o << i.chosen << ", the heuristic's choice (not timed: FORGE_CUDNN_PLAN_TUNING=0 or deterministic)";
    } else if (!i.tuned) {
      o << i.chosen << ", the heuristic's choice (not timed yet: " << i.capture_skips
        << " call(s) during a CUDA graph capture)";
    } else {
      o << i.chosen << " " << i.chosen_ms << " ms, chosen of " << i.timed << " timed (" << i.candidates
        << " built)";
      if (i.chosen != i.heuristic) {
        o << "; the heuristic's choice " << i.heuristic << " ";
        if (i.heuristic_ms > 0)
          o << i.heuristic_ms << " ms";
        else
          o << "failed";
      } else {
        o << "; the heuristic's choice";
      }
    }
    o << "\n";
  }
  return o.str();
}

#endif  // FORGE_WITH_CUDNN

}  // namespace forge::cuda
