// FP8 linear layers on the GPU (Note [FP8 on the GPU] in fp8.h): the casts, the device slots of
// the guardrails and the delayed-scaling histories, the measured GEMM choice. The recipes' CPU
// emulation and the API are ops/fp8.cpp; what both share is ops/fp8_internal.h.
#include <algorithm>
#include <cmath>
#include <mutex>
#include <tuple>
#include <vector>

#include "forge/autograd/grad_mode.h"
#include "forge/autograd/node.h"
#include "forge/backends/cuda/event_timer.h"
#include "forge/backends/cuda/fp8.h"
#include "forge/backends/device_runtime.h"
#include "forge/core/error.h"
#include "forge/ops/binary.h"
#include "forge/ops/copy.h"
#include "forge/ops/creation.h"
#include "forge/ops/dispatch_device.h"
#include "forge/ops/fp8.h"
#include "forge/ops/fp8_internal.h"
#include "forge/ops/matmul.h"
#include "forge/ops/reduce.h"
#include "forge/ops/view.h"

namespace forge::fp8 {

using detail::g_events;
using detail::g_scaling;
using detail::g_histories;
using detail::g_amax_reduce_device;
using detail::record_amax;

// ---- the GPU path (Note [FP8 on the GPU] in fp8.h) ----------------------------------------------

namespace {

// Note [FP8 cast groups] (backends/cuda/fp8.h): a recipe's groups for an operand (R, C), in its own
// layout and for the transposed codes the backward reads, and the factors' layouts.
struct DeviceGroups {
  cuda::Fp8Groups plain, trans;
  cuda::Fp8ScaleMode plain_mode, trans_mode;
};

DeviceGroups device_groups(Recipe r, Operand op, int64_t R, int64_t C) {
  using M = cuda::Fp8ScaleMode;
  switch (r) {
    case Recipe::tensorwise: return {{R, C}, {R, C}, M::scalar, M::scalar};
    case Recipe::rowwise: return {{1, C}, {R, 1}, M::outer, M::outer};
    case Recipe::blockwise:
      if (op == Operand::weight) return {{kBlock, kBlock}, {kBlock, kBlock}, M::blk128, M::blk128};
      return {{1, kBlock}, {kBlock, 1}, M::vec128, M::vec128};
  }
  return {{R, C}, {R, C}, M::scalar, M::scalar};
}

struct DeviceCast {
  cuda::Fp8Operand plain, trans;  // codes (R, C) and (C, R), each when asked for
};

// Note [FP8 cast reuse]: the linears that read one input (LLaMA's q, k and v projections, gate and
// up; GPT's are fused already) would cast it once each. A training forward's activation cast is
// kept (with its source, so that its memory cannot be reused meanwhile) and a linear whose input is
// the same storage, shape and dtype takes its codes instead of casting again. Autograd's inputs are
// never modified in place (forge has no version counters, so nothing may), so the same storage
// holds the same values. The entry is dropped at the next miss, at a backward (it would hold an
// activation through it) and when the step's records are read. The guardrail slot and amax record
// are the first layer's.
struct LastCast {
  Tensor src;
  Recipe recipe = Recipe::tensorwise;
  bool trans = false;
  DeviceCast cast;
};
LastCast g_last_x;

// Note [FP8 guardrails] on the GPU: each training cast maxes its tensor's amax into a slot of a
// device buffer per (layer, operand); the trainer's take_guard_events / take_amax_record read the
// buffer once (a copy to the host, after the step), record what it holds as the CPU path does, and
// clear it. The buffer has a fixed size, so that a CUDA graph that captured the slots' addresses
// stays valid.
constexpr int64_t kDeviceSlots = 3 * 8192;
struct DeviceRecords {
  std::mutex mu;
  Tensor buffer;  // f32 kDeviceSlots, zero-initialised, on one device
  std::map<std::pair<std::string, int>, int64_t> index;
  std::vector<std::pair<std::string, Operand>> names;
  // Note [FP8 delayed scaling] on the GPU: each slot's amax history (h floats) and its {next
  // position, count} (int32), allocated at the first delayed cast; a slot's history is seeded from
  // the host's (a checkpoint's, restore_amax_histories) at its first use.
  Tensor hist, meta;
  int64_t h = 0;
  std::vector<char> seeded;
};
DeviceRecords& device_records() {
  static DeviceRecords* r = new DeviceRecords();
  return *r;
}

// r.mu held.
int64_t slot_index(DeviceRecords& r, const Tensor& like, const std::string& layer, Operand op) {
  if (!r.buffer.defined() || r.buffer.device() != like.device()) {
    r.buffer = zeros({kDeviceSlots}, TensorOptions{.dtype = DType::f32, .device = like.device()});
    r.index.clear();
    r.names.clear();
    r.hist = Tensor();
    r.meta = Tensor();
  }
  auto it = r.index.find({layer, static_cast<int>(op)});
  if (it == r.index.end()) {
    FORGE_CHECK(static_cast<int64_t>(r.names.size()) < kDeviceSlots, "fp8: more than ", kDeviceSlots,
                " (layer, operand) pairs cast on the GPU");
    it = r.index.emplace(std::pair{layer, static_cast<int>(op)}, static_cast<int64_t>(r.names.size())).first;
    r.names.emplace_back(layer, op);
  }
  return it->second;
}

float* device_slot(const Tensor& like, const std::string& layer, Operand op) {
  DeviceRecords& r = device_records();
  std::lock_guard<std::mutex> lock(r.mu);
  const int64_t i = slot_index(r, like, layer, op);  // (first: it allocates the buffer on first use)
  return static_cast<float*>(r.buffer.data_ptr()) + i;
}

// Note [FP8 delayed scaling] on the GPU: a tensorwise cast's history on the device.
struct DelayedCast {
  float* history = nullptr;
  int32_t* meta = nullptr;
  int64_t h = 0;
  bool push = false;  // a training cast: its amax joins the history (an evaluation's does not)
};

DelayedCast device_history(const Tensor& like, const std::string& layer, Operand op, bool push) {
  DeviceRecords& r = device_records();
  std::lock_guard<std::mutex> lock(r.mu);
  const int64_t i = slot_index(r, like, layer, op);
  const int64_t h = g_scaling.history;
  if (!r.hist.defined() || r.h != h) {
    r.hist = zeros({kDeviceSlots * h}, TensorOptions{.dtype = DType::f32, .device = like.device()});
    r.meta = zeros({kDeviceSlots * 2}, TensorOptions{.dtype = DType::i32, .device = like.device()});
    r.h = h;
    r.seeded.assign(static_cast<size_t>(kDeviceSlots), 0);
  }
  if (!r.seeded[static_cast<size_t>(i)]) {  // the host's history of this layer and operand, if any
    r.seeded[static_cast<size_t>(i)] = 1;
    const auto it = g_histories.find(layer);
    if (it != g_histories.end() && !it->second[static_cast<size_t>(op)].empty()) {
      const std::vector<float>& v = it->second[static_cast<size_t>(op)];
      const int64_t n = std::min<int64_t>(h, static_cast<int64_t>(v.size()));
      std::vector<float> vals(static_cast<size_t>(h), 0.0f);
      std::copy(v.end() - n, v.end(), vals.begin());  // oldest first at 0; the next goes to n % h
      Tensor dst = r.hist.narrow(0, i * h, h);
      dst.copy_(from_vector(vals, {h}));
      Tensor meta = r.meta.narrow(0, 2 * i, 2);
      meta.copy_(from_vector(std::vector<int32_t>{static_cast<int32_t>(n % h), static_cast<int32_t>(n)}, {2}));
    }
  }
  return {static_cast<float*>(r.hist.data_ptr()) + i * h, static_cast<int32_t*>(r.meta.data_ptr()) + 2 * i, h, push};
}

// The device histories (oldest first) into `out`, for the registered slots that hold any.
void read_device_histories_impl(AmaxHistories& out) {
  DeviceRecords& r = device_records();
  std::lock_guard<std::mutex> lock(r.mu);
  if (!r.hist.defined()) return;
  const std::vector<float> hist = r.hist.to(Device::cpu()).to_vector<float>();
  const std::vector<int32_t> meta = r.meta.to(Device::cpu()).to_vector<int32_t>();
  for (size_t i = 0; i < r.names.size(); ++i) {
    if (!r.seeded[i]) continue;
    const int64_t pos = meta[2 * i], count = meta[2 * i + 1], h = r.h;
    std::vector<float> v;
    for (int64_t j = 0; j < count; ++j) v.push_back(hist[static_cast<size_t>(static_cast<int64_t>(i) * h + (pos - count + j + h) % h)]);
    const auto& [layer, op] = r.names[i];
    if (!v.empty()) out[layer][static_cast<size_t>(op)] = std::move(v);
  }
}

// Forgets the device histories (a new scaling, or histories restored: seeded again at first use).
void reset_device_histories_impl() {
  DeviceRecords& r = device_records();
  std::lock_guard<std::mutex> lock(r.mu);
  r.hist = Tensor();
  r.meta = Tensor();
  r.h = 0;
  r.seeded.clear();
}



// One operand's casts: its amaxes (one pass; the whole tensor's maxed into `slot` when given), then
// the codes in one pass.
DeviceCast cast_on_device(const Tensor& t, Recipe recipe, Operand op, [[maybe_unused]] bool plain,
                          [[maybe_unused]] bool trans, [[maybe_unused]] float* slot,
                          [[maybe_unused]] const DelayedCast* delayed = nullptr) {
  const int64_t R = t.size(0), C = t.size(1);
  [[maybe_unused]] const DeviceGroups g = device_groups(recipe, op, R, C);
  [[maybe_unused]] const Format f = format_of(recipe, op);
  [[maybe_unused]] const bool shared = g.plain.rows == g.trans.rows && g.plain.cols == g.trans.cols;
  DeviceCast out;
  FORGE_ON_CUDA("fp8 cast", {
    Tensor a0, a1;
    if (shared || !(plain && trans)) {
      const cuda::Fp8Groups gg = plain ? g.plain : g.trans;
      a0 = cuda::fp8_group_amax(t, gg, slot);
      if (delayed && delayed->history) {  // (tensorwise: one group, one table)
        if (delayed->push && g_amax_reduce_device) g_amax_reduce_device(a0);
        cuda::fp8_delayed_amax(a0, delayed->history, delayed->meta, delayed->h, delayed->push);
      }
      a1 = a0;
    } else {
      cuda::fp8_group_amax2(t, g.plain, a0, g.trans, a1, slot);
    }
    if (plain && trans)
      cuda::fp8_cast2(t, f, a0, g.plain, g.plain_mode, out.plain, a1, g.trans, g.trans_mode, out.trans);
    else if (plain)
      out.plain = cuda::fp8_cast(t, f, a0, g.plain, g.plain_mode, false);
    else if (trans)
      out.trans = cuda::fp8_cast(t, f, a1, g.trans, g.trans_mode, true);
  });
  return out;
}

// The slots' values (the first n) into the host's events and amax record.
void record_slots(const DeviceRecords& r, const std::vector<float>& v, size_t n, int64_t step) {
  for (size_t i = 0; i < n && i < r.names.size(); ++i) {
    const auto& [layer, op] = r.names[i];
    if (v[i] == 0.0f) continue;  // (not cast since the last read, or all zeros)
    if (!std::isfinite(v[i])) g_events.push_back({layer, op, static_cast<double>(v[i]), step});
    record_amax(layer, op, v[i]);
  }
}

// Note [FP8 guardrails one step late] (fp8.h): the copies queued by queue_step_records, oldest first.
struct QueuedRecords {
  int64_t step = 0;
  size_t n = 0;
  Tensor host;  // pinned, written by the queued copy
  runtime::Event done;
};
std::vector<QueuedRecords> g_queued;  // (r.mu held)

// Reads the queued copies (all, or all but the newest), waiting for each.
void read_queued(DeviceRecords& r, bool keep_newest) {
  const size_t upto = keep_newest && !g_queued.empty() ? g_queued.size() - 1 : g_queued.size();
  for (size_t q = 0; q < upto; ++q) {
    g_queued[q].done.synchronize();
    record_slots(r, g_queued[q].host.to_vector<float>(), g_queued[q].n, g_queued[q].step);
  }
  g_queued.erase(g_queued.begin(), g_queued.begin() + static_cast<std::ptrdiff_t>(upto));
}

void read_queued_records_impl(bool keep_newest) {
  DeviceRecords& r = device_records();
  std::lock_guard<std::mutex> lock(r.mu);
  read_queued(r, keep_newest);
}

// Reads the device slots into the host's events and amax record, and clears them.
void drain_device_records_impl() {
  DeviceRecords& r = device_records();
  std::lock_guard<std::mutex> lock(r.mu);
  g_last_x = {};  // Note [FP8 cast reuse]: nothing is kept from one step to the next
  read_queued(r, /*keep_newest=*/false);
  if (!r.buffer.defined() || r.names.empty()) return;
  const std::vector<float> v = r.buffer.to(Device::cpu()).to_vector<float>();
  r.buffer.fill_(0.0);
  record_slots(r, v, r.names.size(), 0);
}

}  // namespace

void queue_step_records(int64_t step) {
  DeviceRecords& r = device_records();
  std::lock_guard<std::mutex> lock(r.mu);
  g_last_x = {};  // Note [FP8 cast reuse]: nothing is kept from one step to the next
  if (!r.buffer.defined() || r.names.empty()) return;
  const NoGradGuard no_grad;
  QueuedRecords q;
  q.step = step;
  q.n = r.names.size();
  q.host = r.buffer.narrow(0, 0, static_cast<int64_t>(q.n)).to(Device::cpu(), /*non_blocking=*/true);
  q.done.record(r.buffer.device());
  r.buffer.fill_(0.0);  // (queued behind the copy)
  g_queued.push_back(std::move(q));
}

namespace {

// Note [FP8 GEMM choice]: which linear shapes run in FP8 on the GPU.
Selection g_selection = Selection::measured;
struct Choice {
  bool fp8 = false;
  double bf16_ms = 0, fp8_ms = 0;
  std::string reason;
};
std::map<std::tuple<int64_t, int64_t, int64_t, int, int>, Choice> g_choices;  // (m, n, k, recipe, dtype)

[[maybe_unused]] double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// The three GEMMs of a linear layer of this shape, forward and backward, timed in the layer's
// dtype and through the recipe (casts included), on random data.
void time_choice([[maybe_unused]] Choice& c, [[maybe_unused]] int64_t m, [[maybe_unused]] int64_t n,
                 [[maybe_unused]] int64_t k, [[maybe_unused]] Recipe recipe, [[maybe_unused]] DType dt,
                 [[maybe_unused]] Device dev) {
  FORGE_ON_CUDA("fp8 gemm choice", {
    const TensorOptions o{.dtype = dt, .device = dev};
    const Tensor x = randn({m, k}, o), w = randn({n, k}, o), dy = randn({m, n}, o);
    const auto plain_gemms = [&] {
      (void)ops::matmul(x, ops::transpose(w, 0, 1));
      (void)ops::matmul(dy, w);
      (void)ops::matmul(ops::transpose(dy, 0, 1), x);
    };
    const auto fp8_gemms = [&] {
      const DeviceCast qx = cast_on_device(x, recipe, Operand::activation, true, true, nullptr);
      const DeviceCast qw = cast_on_device(w, recipe, Operand::weight, true, true, nullptr);
      const DeviceCast qd = cast_on_device(dy, recipe, Operand::gradient, true, true, nullptr);
      Tensor y = empty({m, n}, o), dx = empty({m, k}, o), dw = empty({n, k}, o);
      cuda::fp8_scaled_gemm(qx.plain, qw.plain, y);
      cuda::fp8_scaled_gemm(qd.plain, qw.trans, dx);
      cuda::fp8_scaled_gemm(qd.trans, qx.trans, dw);
    };
    const int device = dev.index;
    (void)cuda::time_with_events(device, 3, plain_gemms);  // (plans, tuning, the allocator's blocks)
    (void)cuda::time_with_events(device, 3, fp8_gemms);
    c.bf16_ms = median(cuda::time_with_events(device, 9, plain_gemms));
    c.fp8_ms = median(cuda::time_with_events(device, 9, fp8_gemms));
  });
}

const Choice& choose(int64_t m, int64_t n, int64_t k, Recipe recipe, DType dt, Device dev) {
  const auto key = std::tuple{m, n, k, static_cast<int>(recipe), static_cast<int>(dt)};
  auto it = g_choices.find(key);
  if (it != g_choices.end()) return it->second;
  Choice c;
  const int64_t q = recipe == Recipe::blockwise ? kBlock : 16;
  bool modes = true;
  FORGE_ON_CUDA("fp8 gemm choice", {
    const DeviceGroups g = device_groups(recipe, Operand::weight, n, k);
    modes = cuda::fp8_scale_mode_supported(dev.index, g.plain_mode) &&
            cuda::fp8_scale_mode_supported(dev.index, device_groups(recipe, Operand::activation, m, k).plain_mode);
  });
  if (dt != DType::bf16 && dt != DType::f32) {
    c.reason = std::string("dtype ") + dtype_name(dt) + " (bf16 or f32 only)";
  } else if (m % q != 0 || n % q != 0 || k % q != 0) {
    c.reason = "a dimension not a multiple of " + std::to_string(q);
  } else if (!modes) {
    c.reason = std::string("this GPU has no ") + recipe_name(recipe) + " FP8 GEMM (needs compute capability 8.9+; "
               "rowwise and blockwise 9.0 with cuBLASLt 12.9+)";
  } else if (g_selection == Selection::all) {
    c.fp8 = true;
    c.reason = "run.fp8_select = \"all\"";
  } else {
    bool capturing = false;
    FORGE_ON_CUDA("fp8 gemm choice", capturing = cuda::fp8_capturing(dev.index));
    if (capturing) {  // (no timing inside a graph capture: a shape first met there runs in FP8)
      c.fp8 = true;
      c.reason = "first met inside a CUDA graph capture: not measured";
    } else {
      NoGradGuard no_grad;
      time_choice(c, m, n, k, recipe, dt, dev);
      c.fp8 = c.fp8_ms < c.bf16_ms;
      c.reason = "measured";
    }
  }
  return g_choices.emplace(key, c).first->second;
}

DeviceCast reused_activation_cast(const Tensor& x, const Tensor& x2, Recipe recipe, bool need_trans) {
  const LastCast& c = g_last_x;
  if (!grad_enabled() || !x.requires_grad() || !c.src.defined() || c.recipe != recipe || (need_trans && !c.trans) ||
      c.src.data_ptr() != x2.data_ptr() || c.src.shape() != x2.shape() || c.src.dtype() != x2.dtype())
    return {};
  return c.cast;
}

Tensor linear_on_device_impl(const Tensor& x, const Tensor& w, const Tensor& b, Recipe recipe, const std::string& layer) {
  const int64_t k = w.size(1), n = w.size(0);
  const Tensor x2 = x.detach().reshape({-1, k}).contiguous(), wd = w.detach().contiguous();
  const int64_t m = x2.size(0);
  if (!choose(m, n, k, recipe, x.dtype(), x.device()).fp8) return ops::linear(x, w, b);
  Shape out_shape = x.shape();
  out_shape.back() = n;
  const bool training = grad_enabled();
  const bool need_dx = training && x.requires_grad(), need_dw = training && w.requires_grad();
  // Note [FP8 delayed scaling]: each layer's and operand's history on the device.
  const bool delayed = g_scaling.scaling == Scaling::delayed && recipe == Recipe::tensorwise;
  DelayedCast dx_hist, dw_hist;
  if (delayed) {
    dx_hist = device_history(x2, layer, Operand::activation, training);
    dw_hist = device_history(wd, layer, Operand::weight, training);
  }
  Tensor y;
  DeviceCast qx, qw;
  {
    NoGradGuard no_grad;
    if (!delayed) qx = reused_activation_cast(x, x2, recipe, need_dw);  // (a layer's own history otherwise)
    if (!qx.plain.codes.defined()) {
      qx = cast_on_device(x2, recipe, Operand::activation, true, need_dw,
                          training ? device_slot(x2, layer, Operand::activation) : nullptr, delayed ? &dx_hist : nullptr);
      if (training && !delayed) g_last_x = {x2, recipe, need_dw, qx};
    }
    qw = cast_on_device(wd, recipe, Operand::weight, true, need_dx,
                        training ? device_slot(wd, layer, Operand::weight) : nullptr, delayed ? &dw_hist : nullptr);
    Tensor y2 = empty({m, n}, TensorOptions{.dtype = x.dtype(), .device = x.device()});
    FORGE_ON_CUDA("fp8 linear", cuda::fp8_scaled_gemm(qx.plain, qw.plain, y2));
    if (b.defined()) y2 = ops::add(y2, b.detach().to(x.dtype()));
    y = y2.reshape(out_shape);
  }
  const TensorList inputs = b.defined() ? TensorList{x, w, b} : TensorList{x, w};
  if (!autograd::any_requires_grad(inputs)) return y;
  // Saved for the backward: the transposed FP8 codes of x and w only (a byte an entry: half of a bf16
  // x's bytes; no copy of x itself).
  autograd::record("fp8_linear", y, inputs,
                   [xt = qx.trans, wt = qw.trans, recipe, x_shape = x.shape(), xd = x.dtype(), wdt = w.dtype(),
                    has_bias = b.defined(), bias_dtype = b.defined() ? b.dtype() : DType::f32, m, n, k,
                    layer, delayed](const Tensor& g, const autograd::GradMask& need) {
                     NoGradGuard no_grad;
                     g_last_x = {};  // Note [FP8 cast reuse]
                     const Tensor dy = g.reshape({-1, n}).to(xd).contiguous();
                     const bool dx_needed = need[0] && wt.codes.defined(), dw_needed = need[1] && xt.codes.defined();
                     const DelayedCast dy_hist =
                         delayed ? device_history(dy, layer, Operand::gradient, true) : DelayedCast{};
                     const DeviceCast qd = cast_on_device(dy, recipe, Operand::gradient, dx_needed, dw_needed,
                                                          device_slot(dy, layer, Operand::gradient),
                                                          delayed ? &dy_hist : nullptr);
                     TensorList out(has_bias ? 3 : 2);
                     if (dx_needed) {  // dx (m, k) = dy (m, n) . w (n, k): b_t = w^T (k, n)
                       Tensor dx = empty({m, k}, TensorOptions{.dtype = xd, .device = dy.device()});
                       FORGE_ON_CUDA("fp8 linear backward", cuda::fp8_scaled_gemm(qd.plain, wt, dx));
                       out[0] = dx.reshape(x_shape);
                     }
                     if (dw_needed) {  // dw (n, k) = dy^T (n, m) . x (m, k): b_t = x^T (k, m)
                       Tensor dw = empty({n, k}, TensorOptions{.dtype = wdt == DType::f32 ? DType::f32 : DType::bf16,
                                                               .device = dy.device()});
                       FORGE_ON_CUDA("fp8 linear backward", cuda::fp8_scaled_gemm(qd.trans, xt, dw));
                       out[1] = dw.to(wdt);
                     }
                     if (has_bias && need[2]) out[2] = ops::sum(dy, std::vector<int64_t>{0}).to(bias_dtype);
                     return out;
                   });
  return y;
}

}  // namespace

void set_selection(Selection s) {
  g_selection = s;
  g_choices.clear();
}
Selection selection() { return g_selection; }

std::vector<GemmChoice> gemm_choices() {
  std::vector<GemmChoice> out;
  for (const auto& [key, c] : g_choices) {
    const auto& [m, n, k, r, d] = key;
    out.push_back({m, n, k, static_cast<Recipe>(r), static_cast<DType>(d), c.fp8, c.bf16_ms, c.fp8_ms, c.reason});
  }
  return out;
}

namespace detail {
Tensor linear_on_device(const Tensor& x, const Tensor& w, const Tensor& b, Recipe recipe, const std::string& layer) {
  return linear_on_device_impl(x, w, b, recipe, layer);
}
void drain_device_records() { drain_device_records_impl(); }
void read_queued_records(bool keep_newest) { read_queued_records_impl(keep_newest); }
void read_device_histories(AmaxHistories& out) { read_device_histories_impl(out); }
void reset_device_histories() { reset_device_histories_impl(); }
}  // namespace detail

}  // namespace forge::fp8
