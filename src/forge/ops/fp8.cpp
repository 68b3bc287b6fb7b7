// FP8 recipes emulated on the CPU (contracts and Note [FP8 recipes] in fp8.h).
#include "forge/ops/fp8.h"
#include "forge/ops/fp8_internal.h"

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

namespace detail {
std::vector<GuardEvent> g_events;
ScalingOptions g_scaling;
AmaxHistories g_histories;
std::function<void(Tensor&)> g_amax_reduce_device;  // Note [FP8 delayed scaling] on the GPU, under data parallelism
std::map<std::string, std::array<double, 3>> g_amax_record;

// telemetry.fp8_amax: a training cast's amax joins its layer's and operand's record (finite only).
void record_amax(const std::string& layer, Operand op, float amax) {
  auto& rec = g_amax_record.try_emplace(layer, std::array<double, 3>{-1, -1, -1}).first->second;
  double& r = rec[static_cast<size_t>(op)];
  if (std::isfinite(amax)) r = std::max(r, static_cast<double>(amax));
}
}  // namespace detail

using namespace detail;

namespace {

// Note [FP8 guardrails]: records the first non-finite scale of a cast.
void guard(const Tensor& m, Operand op, Recipe recipe, const std::string& layer) {
  const Quantized q = quantize(m, format_of(recipe, op), recipe, op);
  for (float s : q.scales.to_vector<float>())
    if (!std::isfinite(s)) {
      g_events.push_back({layer, op, static_cast<double>(s)});
      return;
    }
}

// Note [FP8 delayed scaling]: the host's reduction of an amax over the data-parallel ranks.
AllMax g_amax_reduce;

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
