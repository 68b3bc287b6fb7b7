// FP8 recipes emulated on the CPU (contracts and Note [FP8 recipes] in fp8.h).
#include "forge/ops/fp8.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "forge/core/error.h"
#include "forge/ops/creation.h"

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

Quantized quantize(const Tensor& x, Format format, Recipe recipe, Operand operand) {
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

}  // namespace forge::fp8
