// PyTorch-style printing: Tensor::to_string() and operator<<.
//
// The output follows torch's repr for strided tensors with its default print options
// (precision 4, threshold 1000, edge items 3, line width 80):
//
//   tensor([[1., 2.],
//           [3., 4.]])
//   tensor([0.1000, 2.5000], dtype=bf16, device='cuda:0', requires_grad=True)
//   tensor([1.0000e-05, 3.0000e+00], grad_fn=<MulBackward>)
//
// Floating values: one format for the whole tensor, chosen from its finite nonzero
// values (of the summarised data when the tensor is summarised):
//   - all integral            -> `1.` (scientific when max/min > 1000 or max > 1e8);
//   - otherwise               -> fixed, 4 decimals (scientific `1.0000e+10` when
//                                max/min > 1000, max > 1e8 or min < 1e-4);
// and every element right-aligned to the width of the widest finite nonzero one (nan,
// inf and zeros are padded to it but never widen it, as in torch). Integers print plain,
// bool as True/False. A tensor of more than 1000 elements prints only the first and last
// 3 entries of every dim longer than 6, with `...` between them. Dtype suffixes use forge's
// names (f64, bf16, f16, i32, u8) and are left out for the defaults f32, i64 and bool,
// except that an empty tensor shows any dtype other than f32 (torch does the same).
// grad_fn prints as the recorded op's name in PyTorch's spelling: "mul" -> MulBackward.
//
// Only the printed elements are copied to the host: a summarised tensor is read as at
// most 2^ndim narrowed blocks, not in full.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "forge/autograd/node.h"
#include "forge/core/tensor.h"
#include "forge/ops/view.h"

namespace forge {
namespace {

constexpr int64_t kThreshold = 1000;  // more elements than this: summarise
constexpr int64_t kEdgeItems = 3;     // entries kept at each end of a summarised dim
constexpr int64_t kLineWidth = 80;
constexpr int kPrecision = 4;

// The elements that get printed, row-major over `shape` (the summarised shape: a dim
// with cut[d] holds its first and last kEdgeItems entries only).
template <class T> struct PrintData {
  Shape shape;
  std::vector<bool> cut;
  std::vector<T> values;
};

// Reads `t` (detached, any device) into host memory, keeping only the edge items of
// long dims when `summarize`.
template <class T> PrintData<T> read_print_data(const Tensor& t, bool summarize) {
  PrintData<T> p;
  const int64_t nd = t.dim();
  p.shape = t.shape();
  p.cut.assign(static_cast<size_t>(nd), false);
  bool any_cut = false;
  if (summarize) {
    for (int64_t d = 0; d < nd; ++d) {
      if (t.shape()[d] > 2 * kEdgeItems) {
        p.cut[d] = true;
        p.shape[d] = 2 * kEdgeItems;
        any_cut = true;
      }
    }
  }
  if (!any_cut) {
    p.values = t.to_vector<T>();
    return p;
  }
  p.values.resize(static_cast<size_t>(shape_numel(p.shape)));
  const Strides out_strides = contiguous_strides(p.shape);
  // One block per combination of (head, tail) over the cut dims: bit k of the block
  // number selects the tail of the k-th cut dim.
  std::vector<int64_t> cut_dims;
  for (int64_t d = 0; d < nd; ++d)
    if (p.cut[d]) cut_dims.push_back(d);
  const int64_t nblocks = int64_t{1} << cut_dims.size();
  for (int64_t b = 0; b < nblocks; ++b) {
    Tensor block = t;
    std::vector<int64_t> base(static_cast<size_t>(nd), 0);  // block origin in p.shape
    for (size_t k = 0; k < cut_dims.size(); ++k) {
      const int64_t d = cut_dims[k];
      const bool tail = (b >> k) & 1;
      const int64_t start = tail ? t.shape()[d] - kEdgeItems : 0;
      block = ops::narrow(block, d, start, kEdgeItems);
      base[d] = tail ? kEdgeItems : 0;
    }
    const std::vector<T> vals = block.to_vector<T>();
    // Scatter the block (row-major over block.shape()) into the summarised buffer.
    std::vector<int64_t> idx(static_cast<size_t>(nd), 0);
    for (const T& v : vals) {
      int64_t pos = 0;
      for (int64_t d = 0; d < nd; ++d) pos += (base[d] + idx[d]) * out_strides[d];
      p.values[static_cast<size_t>(pos)] = v;
      for (int64_t d = nd - 1; d >= 0; --d) {
        if (++idx[d] < block.shape()[d]) break;
        idx[d] = 0;
      }
    }
  }
  return p;
}

// "%.*f" / "%.*e" of a finite value; glibc rounds exactly (to nearest, ties to even on the
// exact binary value), as Python's format() does. 400 bytes hold any double in %f.
std::string format_double(bool scientific, int precision, double v) {
  char buf[400];
  const int n = scientific ? std::snprintf(buf, sizeof buf, "%.*e", precision, v)
                           : std::snprintf(buf, sizeof buf, "%.*f", precision, v);
  return std::string(buf, static_cast<size_t>(std::clamp(n, 0, static_cast<int>(sizeof buf) - 1)));
}

std::string pad_left(std::string s, size_t width) {
  if (s.size() < width) s.insert(0, width - s.size(), ' ');
  return s;
}

// How floating values print: one mode and one width for the whole tensor.
class FloatFormatter {
 public:
  explicit FloatFormatter(const std::vector<double>& values) {
    double lo = 0, hi = 0;
    bool any = false;
    for (double v : values) {
      if (!std::isfinite(v) || v == 0) continue;
      const double a = std::fabs(v);
      lo = any ? std::min(lo, a) : a;
      hi = any ? std::max(hi, a) : a;
      any = true;
      if (v != std::ceil(v)) int_mode_ = false;
    }
    if (!any) return;  // zeros, nan and inf only: `0.` style, width 1
    const bool wide = hi / lo > 1000.0 || hi > 1e8;
    sci_mode_ = int_mode_ ? wide : (wide || lo < 1e-4);
    for (double v : values) {
      if (!std::isfinite(v) || v == 0) continue;
      width_ = std::max(width_, raw(v).size());
    }
  }

  size_t width() const { return width_; }
  std::string format(double v) const { return pad_left(raw(v), width_); }

 private:
  std::string raw(double v) const {
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    if (sci_mode_) return format_double(true, kPrecision, v);
    if (int_mode_) return format_double(false, 0, v) + ".";
    return format_double(false, kPrecision, v);
  }

  bool int_mode_ = true;
  bool sci_mode_ = false;
  size_t width_ = 1;
};

// Integers and bools: plain, right-aligned to the widest.
class IntFormatter {
 public:
  IntFormatter(const std::vector<int64_t>& values, bool is_bool) : bool_(is_bool) {
    for (int64_t v : values) width_ = std::max(width_, raw(v).size());
  }
  size_t width() const { return width_; }
  std::string format(int64_t v) const { return pad_left(raw(v), width_); }

 private:
  std::string raw(int64_t v) const { return bool_ ? (v ? "True" : "False") : std::to_string(v); }
  bool bool_;
  size_t width_ = 1;
};

std::string join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string r;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) r += sep;
    r += parts[i];
  }
  return r;
}

// The body ("[...]" nested per dim) of a non-empty tensor with at least one dim.
template <class T, class F>
std::string body_str(const PrintData<T>& p, const F& fmt, int64_t d, int64_t offset, int64_t indent) {
  const int64_t nd = static_cast<int64_t>(p.shape.size());
  const int64_t n = p.shape[d];
  if (d == nd - 1) {
    const int64_t per_line = std::max<int64_t>(1, (kLineWidth - indent) / static_cast<int64_t>(fmt.width() + 2));
    std::vector<std::string> items;
    for (int64_t i = 0; i < n; ++i) {
      if (p.cut[d] && i == kEdgeItems) items.push_back(" ...");
      items.push_back(fmt.format(p.values[static_cast<size_t>(offset + i)]));
    }
    std::vector<std::string> lines;
    for (size_t i = 0; i < items.size(); i += static_cast<size_t>(per_line)) {
      const auto end = std::min(items.size(), i + static_cast<size_t>(per_line));
      lines.push_back(join(std::vector<std::string>(items.begin() + i, items.begin() + end), ", "));
    }
    return "[" + join(lines, ",\n" + std::string(static_cast<size_t>(indent + 1), ' ')) + "]";
  }
  int64_t inner = 1;
  for (int64_t k = d + 1; k < nd; ++k) inner *= p.shape[k];
  std::vector<std::string> slices;
  for (int64_t i = 0; i < n; ++i) {
    if (p.cut[d] && i == kEdgeItems) slices.push_back("...");
    slices.push_back(body_str(p, fmt, d + 1, offset + i * inner, indent + 1));
  }
  const std::string sep = "," + std::string(static_cast<size_t>(nd - d - 1), '\n') +
                          std::string(static_cast<size_t>(indent + 1), ' ');
  return "[" + join(slices, sep) + "]";
}

template <class T, class F> std::string values_str(const PrintData<T>& p, const F& fmt, int64_t indent) {
  if (p.shape.empty()) return fmt.format(p.values.at(0));
  return body_str(p, fmt, 0, 0, indent);
}

std::string tensor_values_str(const Tensor& t, int64_t indent) {
  const Tensor d = t.detach();
  const bool summarize = t.numel() > kThreshold;
  if (is_floating(t.dtype())) {
    const PrintData<double> p = read_print_data<double>(d, summarize);
    return values_str(p, FloatFormatter(p.values), indent);
  }
  const PrintData<int64_t> p = read_print_data<int64_t>(d, summarize);
  return values_str(p, IntFormatter(p.values, t.dtype() == DType::boolean), indent);
}

// The recorded node's name in PyTorch's spelling: "mulBackward" -> "MulBackward",
// "log_softmaxBackward" -> "LogSoftmaxBackward" (a bare "mul" gets the suffix too).
std::string grad_fn_name(const std::string& node_name) {
  const std::string suffix = "Backward";
  std::string base = node_name;
  if (base.size() >= suffix.size() && base.compare(base.size() - suffix.size(), suffix.size(), suffix) == 0)
    base.resize(base.size() - suffix.size());
  std::string r;
  bool upper = true;
  for (char c : base) {
    if (c == '_') {
      upper = true;
      continue;
    }
    r += upper ? static_cast<char>(std::toupper(static_cast<unsigned char>(c))) : c;
    upper = false;
  }
  return r + suffix;
}

// Appends ", suffix" to the text, or ",\n" + indent + suffix where the line would pass
// the line width (torch's rule, including its count of the last line's length).
std::string add_suffixes(const std::string& text, const std::vector<std::string>& suffixes, int64_t indent) {
  std::string r = text;
  const size_t nl = text.rfind('\n');
  int64_t last_line_len = static_cast<int64_t>(text.size()) - (nl == std::string::npos ? -1 : static_cast<int64_t>(nl)) + 1;
  for (const std::string& s : suffixes) {
    const auto len = static_cast<int64_t>(s.size());
    if (last_line_len + len + 2 > kLineWidth) {
      r += ",\n" + std::string(static_cast<size_t>(indent), ' ') + s;
      last_line_len = indent + len;
    } else {
      r += ", " + s;
      last_line_len += len + 2;
    }
  }
  return r + ")";
}

}  // namespace

std::string Tensor::to_string() const {
  if (!defined()) return "tensor(undefined)";
  const std::string prefix = "tensor(";
  const auto indent = static_cast<int64_t>(prefix.size());
  std::vector<std::string> suffixes;
  if (is_cuda()) suffixes.push_back("device='" + device().str() + "'");
  const std::string dtype_suffix = std::string("dtype=") + dtype_name(dtype());
  std::string body;
  if (numel() == 0) {
    if (dim() != 1) {
      std::string size = "size=(";
      for (int64_t d = 0; d < dim(); ++d) size += (d ? ", " : "") + std::to_string(shape()[d]);
      suffixes.push_back(size + ")");
    }
    if (dtype() != DType::f32) suffixes.push_back(dtype_suffix);
    body = "[]";
  } else {
    if (dtype() != DType::f32 && dtype() != DType::i64 && dtype() != DType::boolean) suffixes.push_back(dtype_suffix);
    body = tensor_values_str(*this, indent);
  }
  if (grad_fn()) suffixes.push_back("grad_fn=<" + grad_fn_name(grad_fn()->name()) + ">");
  else if (requires_grad()) suffixes.push_back("requires_grad=True");
  return add_suffixes(prefix + body, suffixes, indent);
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.to_string(); }

}  // namespace forge
