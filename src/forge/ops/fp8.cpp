// FP8 recipes emulated on the CPU (contracts and Note [FP8 recipes] in fp8.h).
#include "forge/ops/fp8.h"

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
#include "forge/ops/copy.h"
#include "forge/ops/dispatch_device.h"
#include "forge/ops/binary.h"
#include "forge/ops/creation.h"
#include "forge/ops/matmul.h"
#include "forge/ops/reduce.h"
#include "forge/ops/view.h"

namespace forge::fp8 {

Recipe recipe_from_name(const std::string& name) {
  if (name == "tensorwise") return Recipe::tensorwise;
  if (name == "rowwise") return Recipe::rowwise;
  if (name == "blockwise") return Recipe::blockwise;
  FORGE_THROW("run.fp8 = '", name, "' is not an FP8 recipe; use \"tensorwise\", \"rowwise\" or \"blockwise\" (or \"off\")");
}

const char* recipe_name(Recipe r) {
  switch (r) {
    case Recipe::tensorwise: return "tensorwise";
    case Recipe::rowwise: return "rowwise";
    case Recipe::blockwise: return "blockwise";
  }
  return "?";
}

Format format_of(Recipe r, Operand op) {
  if (op == Operand::gradient && r != Recipe::blockwise) return Format::e5m2;
  return Format::e4m3;
}

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The group (row of the scale table, column of it) of element (i, j).
struct Groups {
  Recipe recipe;
  Operand operand;
  int64_t rows, cols;
  Shape shape() const {
    switch (recipe) {
      case Recipe::tensorwise: return {1};
      case Recipe::rowwise: return {rows};
      case Recipe::blockwise:
        return operand == Operand::weight ? Shape{ceil_div(rows, kBlock), ceil_div(cols, kBlock)}
                                          : Shape{rows, ceil_div(cols, kBlock)};
    }
    return {1};
  }
  int64_t index(int64_t i, int64_t j) const {
    switch (recipe) {
      case Recipe::tensorwise: return 0;
      case Recipe::rowwise: return i;
      case Recipe::blockwise:
        return operand == Operand::weight ? (i / kBlock) * ceil_div(cols, kBlock) + j / kBlock
                                          : i * ceil_div(cols, kBlock) + j / kBlock;
    }
    return 0;
  }
};

Groups groups_of(const Quantized& q) {
  return {q.recipe, q.operand, q.codes.size(0), q.codes.size(1)};
}

}  // namespace

namespace {
using AllMax = std::function<void(std::vector<float>&)>;
// quantize(), with a tensorwise amax given (delayed scaling) instead of measured when `given` >= 0,
// and the groups' amaxes maxed over a tensor-parallel group when `reduce` is given (Note [FP8
// under tensor parallelism]).
Quantized quantize_with(const Tensor& x, Format format, Recipe recipe, Operand operand, float given,
                        const AllMax* reduce = nullptr);
}  // namespace

Quantized quantize(const Tensor& x, Format format, Recipe recipe, Operand operand) {
  return quantize_with(x, format, recipe, operand, -1.0f);
}

namespace {
Quantized quantize_with(const Tensor& x, Format format, Recipe recipe, Operand operand, float given,
                        const AllMax* reduce) {
  FORGE_CHECK(x.defined() && x.dim() == 2 && x.is_cpu() && is_floating(x.dtype()),
              "fp8::quantize: expected a 2-D floating-point CPU matrix, got ", x.defined() ? x.shape() : Shape{});
  const int64_t rows = x.size(0), cols = x.size(1);
  const Groups g{recipe, operand, rows, cols};
  const Shape sshape = g.shape();
  int64_t ngroups = 1;
  for (int64_t d : sshape) ngroups *= d;
  // Values as the GPU sees them: the matrix's own dtype widened to f32.
  const std::vector<float> v = x.to(DType::f32).contiguous().to_vector<float>();
  std::vector<float> amax(static_cast<size_t>(ngroups), 0.0f);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      float& a = amax[static_cast<size_t>(g.index(i, j))];
      const float e = std::fabs(v[static_cast<size_t>(i * cols + j)]);
      a = std::isnan(e) || std::isnan(a) ? NAN : std::max(a, e);
    }
  if (given >= 0.0f && recipe == Recipe::tensorwise && std::isfinite(amax[0])) amax[0] = given;
  if (reduce && *reduce) {  // NaN as +inf (a max over ranks of NaN is not defined); non-finite either way
    for (float& a : amax) a = std::isnan(a) ? INFINITY : a;
    (*reduce)(amax);
  }
  const auto fmax = static_cast<float>(info(format).max);
  std::vector<float> scale(static_cast<size_t>(ngroups));
  for (size_t k = 0; k < scale.size(); ++k)
    scale[k] = amax[k] == 0.0f ? 1.0f : std::isfinite(amax[k]) ? fmax / amax[k] : NAN;
  std::vector<uint8_t> codes(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      const size_t at = static_cast<size_t>(i * cols + j);
      const float scaled = v[at] * scale[static_cast<size_t>(g.index(i, j))];  // in f32, as the GPU scales
      codes[at] = encode(static_cast<double>(scaled), format);
    }
  Quantized q;
  q.codes = from_vector(codes, {rows, cols});
  q.scales = from_vector(scale, sshape);
  q.format = format;
  q.recipe = recipe;
  q.operand = operand;
  return q;
}
}  // namespace

Tensor dequantize(const Quantized& q) {
  const Groups g = groups_of(q);
  const std::vector<uint8_t> codes = q.codes.contiguous().to_vector<uint8_t>();
  const std::vector<float> scale = q.scales.contiguous().to_vector<float>();
  std::vector<float> out(codes.size());
  for (int64_t i = 0; i < g.rows; ++i)
    for (int64_t j = 0; j < g.cols; ++j) {
      const size_t at = static_cast<size_t>(i * g.cols + j);
      out[at] = static_cast<float>(decode(codes[at], q.format) / scale[static_cast<size_t>(g.index(i, j))]);
    }
  return from_vector(out, {g.rows, g.cols});
}

Tensor scaled_matmul(const Tensor& x, const Tensor& w, Recipe recipe) {
  FORGE_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "fp8::scaled_matmul: expected x (m, k) and w (n, k), got ",
              x.shape(), " and ", w.shape());
  const Quantized qx = quantize(x, Format::e4m3, recipe, Operand::activation);
  const Quantized qw = quantize(w, Format::e4m3, recipe, Operand::weight);
  const Groups gx = groups_of(qx), gw = groups_of(qw);
  const int64_t m = x.size(0), n = w.size(0), k = x.size(1);
  const std::vector<uint8_t> cx = qx.codes.to_vector<uint8_t>(), cw = qw.codes.to_vector<uint8_t>();
  const std::vector<float> sx = qx.scales.to_vector<float>(), sw = qw.scales.to_vector<float>();
  std::vector<double> dx(cx.size()), dw(cw.size());
  for (size_t i = 0; i < cx.size(); ++i) dx[i] = decode(cx[i], Format::e4m3);
  for (size_t i = 0; i < cw.size(); ++i) dw[i] = decode(cw[i], Format::e4m3);
  std::vector<float> out(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      // The fp8 products of one tile pair summed, then scaled by the pair's scales: the GEMM's
      // promotion to f32 every 128 products (one pair for tensorwise and rowwise).
      double acc = 0;
      for (int64_t t0 = 0; t0 < k; t0 += kBlock) {
        double part = 0;
        const int64_t t1 = std::min(k, t0 + kBlock);
        for (int64_t t = t0; t < t1; ++t) part += dx[static_cast<size_t>(i * k + t)] * dw[static_cast<size_t>(j * k + t)];
        const double s = static_cast<double>(sx[static_cast<size_t>(gx.index(i, t0))]) *
                         static_cast<double>(sw[static_cast<size_t>(gw.index(j, t0))]);
        acc += part / s;
      }
      out[static_cast<size_t>(i * n + j)] = static_cast<float>(acc);
    }
  return from_vector(out, {m, n});
}

namespace {
// quantized_matmul with tensorwise amaxes given for a and b_t (-1: measured).
Tensor quantized_matmul_with(const Tensor& a, Operand a_role, float a_amax, const Tensor& b_t, Operand b_role,
                             float b_amax, Recipe recipe, const AllMax* a_reduce = nullptr,
                             const AllMax* b_reduce = nullptr) {
  FORGE_CHECK(a.dim() == 2 && b_t.dim() == 2 && a.size(1) == b_t.size(1), "fp8::quantized_matmul: expected a (m, r) and "
              "b_t (n, r), got ", a.shape(), " and ", b_t.shape());
  const Tensor aq = dequantize(quantize_with(a, format_of(recipe, a_role), recipe, a_role, a_amax, a_reduce));
  const Tensor bq = dequantize(quantize_with(b_t, format_of(recipe, b_role), recipe, b_role, b_amax, b_reduce));
  return ops::matmul(aq, ops::transpose(bq, 0, 1));
}
}  // namespace

Tensor quantized_matmul(const Tensor& a, Operand a_role, const Tensor& b_t, Operand b_role, Recipe recipe) {
  return quantized_matmul_with(a, a_role, -1.0f, b_t, b_role, -1.0f, recipe);
}

namespace {
std::vector<GuardEvent> g_events;

// Note [FP8 guardrails]: records the first non-finite scale of a cast.
void guard(const Tensor& m, Operand op, Recipe recipe, const std::string& layer) {
  const Quantized q = quantize(m, format_of(recipe, op), recipe, op);
  for (float s : q.scales.to_vector<float>())
    if (!std::isfinite(s)) {
      g_events.push_back({layer, op, static_cast<double>(s)});
      return;
    }
}

// Note [FP8 delayed scaling]: the histories and the telemetry record.
ScalingOptions g_scaling;
AmaxHistories g_histories;
std::map<std::string, std::array<double, 3>> g_amax_record;
AllMax g_amax_reduce;

// telemetry.fp8_amax: a training cast's amax joins its layer's and operand's record (finite only).
void record_amax(const std::string& layer, Operand op, float amax) {
  auto& rec = g_amax_record.try_emplace(layer, std::array<double, 3>{-1, -1, -1}).first->second;
  double& r = rec[static_cast<size_t>(op)];
  if (std::isfinite(amax)) r = std::max(r, static_cast<double>(amax));
}

void drain_device_records();  // (the GPU path's slots and histories: below)
void read_queued_records(bool keep_newest);
void read_device_histories(AmaxHistories& out);
void reset_device_histories();
std::function<void(Tensor&)> g_amax_reduce_device;  // Note [FP8 delayed scaling] on the GPU, under data parallelism

float tensor_amax(const Tensor& m) {
  const std::vector<float> v = m.to(DType::f32).contiguous().to_vector<float>();
  float a = 0.0f;
  for (float e : v) a = std::isnan(e) || std::isnan(a) ? NAN : std::max(a, std::fabs(e));
  return a;
}

// The amax a cast of `m` (layer, operand) is scaled by: -1 (measure it: current scaling, or a
// recipe with more than one group) or the delayed amax; a training cast (`training`: not an
// evaluation's or a sample's forward) records its own amax and joins its history.
float cast_amax(const Tensor& m, Operand op, Recipe recipe, const std::string& layer, bool training) {
  const bool delayed = g_scaling.scaling == Scaling::delayed && recipe == Recipe::tensorwise;
  if (!training) {
    if (!delayed) return -1.0f;
    const auto it = g_histories.find(layer);
    if (it == g_histories.end() || it->second[static_cast<size_t>(op)].empty()) return -1.0f;
    const std::vector<float>& h = it->second[static_cast<size_t>(op)];
    return *std::max_element(h.begin(), h.end());
  }
  float current = tensor_amax(m);
  if (delayed && g_amax_reduce) {  // NaN as +inf (a max over ranks of NaN is not defined)
    std::vector<float> v{std::isnan(current) ? INFINITY : current};
    g_amax_reduce(v);
    current = v[0];
  }
  record_amax(layer, op, current);
  if (!delayed) return -1.0f;
  std::vector<float>& h = g_histories[layer][static_cast<size_t>(op)];
  float used = current;
  if (!h.empty()) used = *std::max_element(h.begin(), h.end());
  if (std::isfinite(current)) {
    h.push_back(current);
    if (static_cast<int64_t>(h.size()) > g_scaling.history) h.erase(h.begin());
  }
  return std::isfinite(current) ? used : -1.0f;  // a non-finite tensor: its own (NaN) scale, for the guard
}
}  // namespace

void set_training_scaling(ScalingOptions o) {
  FORGE_CHECK(o.history >= 1, "run.fp8_amax_history must be >= 1, got ", o.history);
  g_scaling = o;
  g_histories.clear();
  reset_device_histories();
  g_amax_record.clear();
}
ScalingOptions training_scaling() { return g_scaling; }
AmaxHistories amax_histories() {
  AmaxHistories h = g_histories;
  read_device_histories(h);  // (a GPU run's are on the device)
  return h;
}
void set_amax_reduce(std::function<void(std::vector<float>&)> all_max) { g_amax_reduce = std::move(all_max); }
void set_amax_reduce_device(std::function<void(Tensor&)> all_max) { g_amax_reduce_device = std::move(all_max); }
void restore_amax_histories(const AmaxHistories& h) {
  g_histories = h;
  reset_device_histories();  // (seeded again from these at each slot's next use)
}
std::map<std::string, std::array<double, 3>> take_amax_record() {
  drain_device_records();
  std::map<std::string, std::array<double, 3>> out;
  out.swap(g_amax_record);
  return out;
}

std::vector<GuardEvent> take_guard_events() {
  drain_device_records();
  std::vector<GuardEvent> out;
  out.swap(g_events);
  return out;
}

std::vector<GuardEvent> take_queued_guard_events() {
  read_queued_records(/*keep_newest=*/true);
  std::vector<GuardEvent> out;
  out.swap(g_events);
  return out;
}

const char* operand_name(Operand op) {
  return op == Operand::activation ? "activation" : op == Operand::weight ? "weight" : "gradient";
}

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
  return static_cast<float*>(r.buffer.data_ptr()) + slot_index(r, like, layer, op);
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
void read_device_histories(AmaxHistories& out) {
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
void reset_device_histories() {
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

void read_queued_records(bool keep_newest) {
  DeviceRecords& r = device_records();
  std::lock_guard<std::mutex> lock(r.mu);
  read_queued(r, keep_newest);
}

// Reads the device slots into the host's events and amax record, and clears them.
void drain_device_records() {
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

Tensor linear_on_device(const Tensor& x, const Tensor& w, const Tensor& b, Recipe recipe, const std::string& layer) {
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

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b, Recipe recipe, const std::string& layer,
              const Split& split) {
  if (x.is_cuda()) {
    FORGE_CHECK(x.dim() >= 1 && w.dim() == 2 && x.shape().back() == w.size(1) && w.device() == x.device(),
                "fp8::linear: input ", x.shape(), " and weight ", w.shape(), " do not fit");
    FORGE_CHECK(!split.k && !split.n, "run.fp8 under tensor parallelism runs in the CPU emulation only so far (issue "
                "39); on GPUs use dist.tp = 1 with run.fp8, or run.fp8 = \"off\"");
    return linear_on_device(x, w, b, recipe, layer);
  }
  FORGE_CHECK(x.is_cpu() && w.is_cpu(), "fp8::linear: input and weight must be on one device");
  FORGE_CHECK(x.dim() >= 1 && w.dim() == 2 && x.shape().back() == w.size(1), "fp8::linear: input ", x.shape(),
              " and weight ", w.shape(), " do not fit");
  const int64_t k = w.size(1), n = w.size(0);
  Shape out_shape = x.shape();
  out_shape.back() = n;
  Tensor y;
  const Tensor x2 = x.detach().reshape({-1, k}), wd = w.detach();
  float ax = -1.0f, aw = -1.0f;
  const bool training = grad_enabled();  // (an evaluation's forward leaves the histories alone)
  {
    NoGradGuard no_grad;
    guard(x2, Operand::activation, recipe, layer);
    guard(wd, Operand::weight, recipe, layer);
    // Note [FP8 delayed scaling]: the x and w casts' amaxes (measured, or from their histories).
    ax = cast_amax(x2, Operand::activation, recipe, layer, training);
    aw = cast_amax(wd, Operand::weight, recipe, layer, training);
    // Note [FP8 under tensor parallelism]: which casts' amaxes are maxed over the group.
    const bool tw = recipe == Recipe::tensorwise, rw = recipe == Recipe::rowwise;
    const AllMax* x_red = (tw || rw) && split.k ? &split.all_max : nullptr;
    const AllMax* w_red = (tw && (split.k || split.n)) || (rw && split.k) ? &split.all_max : nullptr;
    Tensor y2 = quantized_matmul_with(x2, Operand::activation, ax, wd, Operand::weight, aw, recipe, x_red, w_red);
    if (b.defined()) y2 = ops::add(y2, b.detach().to(DType::f32));
    y = y2.to(x.dtype()).reshape(out_shape);
  }
  const TensorList inputs = b.defined() ? TensorList{x, w, b} : TensorList{x, w};
  if (!autograd::any_requires_grad(inputs)) return y;
  const Shape x_shape = x.shape();
  const DType xd = x.dtype(), wdt = w.dtype();
  // The forward's amaxes serve the backward's casts of x and w too (the GPU casts them once, in
  // the forward); dy's cast is scaled once for both of its GEMMs.
  autograd::record("fp8_linear", y, inputs,
                   [x2, wd, recipe, x_shape, xd, wdt, has_bias = b.defined(), bias_dtype = b.defined() ? b.dtype() : DType::f32,
                    n, layer, ax, aw, split](const Tensor& g, const autograd::GradMask& need) {
                     NoGradGuard no_grad;
                     const Tensor dy = g.reshape({-1, n}).to(DType::f32).contiguous();
                     guard(dy, Operand::gradient, recipe, layer);
                     const float ag = cast_amax(dy, Operand::gradient, recipe, layer, true);
                     TensorList out(has_bias ? 3 : 2);
                     const bool tw = recipe == Recipe::tensorwise, rw = recipe == Recipe::rowwise;
                     const AllMax* along_n = (tw || rw) && split.n ? &split.all_max : nullptr;
                     const AllMax* wt_red = (tw && (split.k || split.n)) || (rw && split.n) ? &split.all_max : nullptr;
                     const AllMax* dyt_red = tw && split.n ? &split.all_max : nullptr;
                     const AllMax* xt_red = tw && split.k ? &split.all_max : nullptr;
                     if (need[0])  // dx = dy w: dy by (w^T) grouped along n
                       out[0] = quantized_matmul_with(dy, Operand::gradient, ag, ops::transpose(wd, 0, 1).contiguous(),
                                                      Operand::weight, aw, recipe, along_n, wt_red)
                                    .to(xd)
                                    .reshape(x_shape);
                     if (need[1])  // dw = dy^T x: dy^T by x^T, both grouped along the tokens
                       out[1] = quantized_matmul_with(ops::transpose(dy, 0, 1).contiguous(), Operand::gradient, ag,
                                                      ops::transpose(x2, 0, 1).contiguous(), Operand::activation, ax,
                                                      recipe, dyt_red, xt_red)
                                    .to(wdt);
                     if (has_bias && need[2]) out[2] = ops::sum(dy, std::vector<int64_t>{0}).to(bias_dtype);
                     return out;
                   });
  return y;
}

namespace {
std::optional<Recipe> g_recipe;
}  // namespace

void set_training_recipe(std::optional<Recipe> recipe) { g_recipe = recipe; }
std::optional<Recipe> training_recipe() { return g_recipe; }

}  // namespace forge::fp8
