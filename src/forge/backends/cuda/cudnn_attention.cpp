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
// B, H, Hkv, T, S, D, the strides of every tensor, causal, scale, deterministic. In training
// the keys repeat every step, so a call is one hash lookup, cudnnSetStream and one execute
// (no host synchronisation; the workspace comes from the caching allocator on the current
// stream). A key cuDNN refuses is remembered as refused, and the call returns false so the
// caller runs forge's own kernels: the refusal is said once on stderr.
//
// Semantics: softmax(scale * q k^T) v with cuDNN's causal mask as a diagonal band (right
// bound 0) aligned bottom-right, which is forge's convention; with T == S bottom-right and
// top-left coincide and the plain top-left form is used (the one every cuDNN 9 version
// supports). Stats is the per-row logsumexp of the scaled scores in natural-log units, f32
// (B, H, T, 1) with strides (H T, T, 1, 1): forge's lse, byte for byte. I/O bf16 or f16,
// intermediates and compute f32.
#include "forge/backends/cuda/cudnn_attention.h"

#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "forge/backends/cuda/blaslt.h"
#include "forge/backends/cuda/flash_attention.h"
#include "forge/backends/cuda/runtime.h"

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

struct Plan {
  std::shared_ptr<fe::graph::Graph> graph;  // null: cuDNN refused this key
  int64_t workspace = 0;
};

std::mutex g_cache_mu;
std::unordered_map<Key, Plan, KeyHash>& cache() {
  static auto* c = new std::unordered_map<Key, Plan, KeyHash>();  // never destroyed (exit order)
  return *c;
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

// Validates, lowers and builds `g`; the plan, or a refused one with the reason in `why`.
Plan build(const std::shared_ptr<fe::graph::Graph>& g, cudnnHandle_t h, std::string& why) {
  Plan p;
  auto step = [&](fe::error_t e, const char* what) {
    if (e.is_good()) return true;
    why = std::string(what) + ": " + e.get_message();
    return false;
  };
  if (!step(g->validate(), "validate")) return p;
  if (!step(g->build_operation_graph(h), "build_operation_graph")) return p;
  if (!step(g->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}), "create_execution_plans"))
    return p;
  if (!step(g->check_support(h), "check_support")) return p;
  if (!step(g->build_plans(h, fe::BuildPlanPolicy_t::HEURISTICS_CHOICE), "build_plans")) return p;
  int64_t ws = 0;
  if (!step(g->get_workspace_size(ws), "get_workspace_size")) return p;
  p.graph = g;
  p.workspace = ws;
  return p;
}

// The cached plan for `key`, built by `make` on first use; null graph when refused.
template <class Make>
Plan plan_for(const Key& key, int device, const char* direction, const Make& make) {
  {
    std::lock_guard<std::mutex> lock(g_cache_mu);
    auto it = cache().find(key);
    if (it != cache().end()) return it->second;
  }
  std::string why;
  Plan p = build(make(), handle_for(device), why);
  ++g_graphs;
  if (!p.graph)
    std::fprintf(stderr, "forge: cuDNN attention %s declined a problem (%s); forge's own kernels run it instead\n",
                 direction, why.c_str());
  std::lock_guard<std::mutex> lock(g_cache_mu);
  cache().emplace(key, p);
  return p;
}

void execute(const Plan& p, int device, std::unordered_map<int64_t, void*>& pack, const char* what) {
  cudnnHandle_t h = handle_for(device);
  check_cudnn(cudnnSetStream(h, current_stream(device)), "cudnnSetStream");
  Tensor ws;
  void* wp = nullptr;
  if (p.workspace > 0) {
    ws = blas::device_empty(device, {p.workspace}, DType::u8);
    wp = ws.data_ptr();
  }
  fe::error_t e = p.graph->execute(h, pack, wp);
  FORGE_CHECK(e.is_good(), "cuDNN attention ", what, ": execute failed: ", e.get_message());
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
  const Plan p = plan_for(key, device, "forward", [&] {
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
  if (!p.graph) return false;
  std::unordered_map<int64_t, void*> pack = {
      {kQ, ptr(q)}, {kK, ptr(k)}, {kV, ptr(v)}, {kO, ptr(out)}, {kStats, ptr(lse)}};
  execute(p, device, pack, "forward");
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
  const Plan p = plan_for(key, device, "backward", [&] {
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
  if (!p.graph) return false;
  std::unordered_map<int64_t, void*> pack = {{kQ, ptr(q)},       {kK, ptr(k)},   {kV, ptr(v)},
                                             {kO, ptr(out)},     {kDO, ptr(dout)}, {kStats, ptr(lse)},
                                             {kDQ, ptr(gq)},     {kDK, ptr(gk)}, {kDV, ptr(gv)}};
  execute(p, device, pack, "backward");
  ++g_calls;
  return true;
}

#endif  // FORGE_WITH_CUDNN

}  // namespace forge::cuda
