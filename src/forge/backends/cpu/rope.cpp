// CPU rotary position embedding. See rope.h for the math and the memory contract.
#include "forge/backends/cpu/rope.h"

#include <cmath>
#include <vector>

#include "forge/backends/cpu/loops.h"
#include "forge/core/convert.h"
#include "forge/core/dispatch.h"

namespace forge::cpu {

void rope(const Tensor& x, Tensor& out, int64_t position_offset, double theta, const fn::RopeScaling& scaling,
          bool inverse, const Tensor& positions, int64_t position_limit) {
  FORGE_CHECK(x.dim() == 4 && out.shape() == x.shape() && out.dtype() == x.dtype() && out.is_contiguous() &&
                  x.size(3) % 2 == 0,
              "cpu::rope: expected x (B, H, T, D) with D even and a contiguous output of its shape, got ", x.shape(),
              " -> ", out.shape());
  if (x.numel() == 0) return;
  const int64_t len = x.size(2), D = x.size(3), half = D / 2;  // len: T of (B, H, T, D)
  // positions (B, T) i64: row b's position t is pos[b * len + t]; the tables cover [0, limit).
  const int64_t* pos = nullptr;
  int64_t table_len = len;
  if (positions.defined()) {
    FORGE_CHECK(positions.dtype() == DType::i64 && positions.is_contiguous() &&
                    positions.shape() == Shape({x.size(0), len}) && position_limit > 0,
                "cpu::rope: positions must be contiguous i64 (B, T) = (", x.size(0), ", ", len,
                ") below a positive limit, got ", positions.shape(), " and limit ", position_limit);
    pos = positions.data<int64_t>();
    for (int64_t i = 0; i < positions.numel(); ++i)
      FORGE_CHECK(pos[i] >= 0 && pos[i] < position_limit, "rope: position ", pos[i], " (index ", i,
                  " of positions ", positions.shape(), ") is outside [0, ", position_limit, ")");
    table_len = position_limit;
    position_offset = 0;
  }
  // cos/sin of angle_pi = (offset + p) * freq_i (backends/rope_functors.h), (table_len, half) row-major.
  std::vector<double> cs(static_cast<size_t>(table_len * half)), sn(static_cast<size_t>(table_len * half));
  {
    std::vector<double> freq(static_cast<size_t>(half));
    for (int64_t i = 0; i < half; ++i)
      freq[static_cast<size_t>(i)] = fn::rope_frequency(i, D, theta, scaling);
    const double sign = inverse ? -1.0 : 1.0;
#pragma omp parallel for if (table_len * half >= kParallelGrain / 8)
    for (int64_t t = 0; t < table_len; ++t)
      for (int64_t i = 0; i < half; ++i) {
        const double a = static_cast<double>(position_offset + t) * freq[static_cast<size_t>(i)];
        cs[static_cast<size_t>(t * half + i)] = std::cos(a);
        sn[static_cast<size_t>(t * half + i)] = sign * std::sin(a);
      }
  }
  dispatch_float(x.dtype(), "rope", [&]<class T>() {
    const T* xp = x.data<T>();
    T* op = out.data<T>();
    const int64_t H = x.size(1), rows = x.size(0) * H * len;
    const int64_t sb = x.stride(0), sh = x.stride(1), st = x.stride(2), sd = x.stride(3);
#pragma omp parallel for if (x.numel() >= kParallelGrain && rows > 1)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = r % len, bh = r / len;
      const T* xr = xp + (bh / H) * sb + (bh % H) * sh + t * st;
      T* orow = op + r * D;
      const int64_t p = pos ? pos[(bh / H) * len + t] : t;  // the row's entry of the tables
      const double* c = cs.data() + p * half;
      const double* s = sn.data() + p * half;
      for (int64_t i = 0; i < half; ++i) {
        const double x1 = convert<double>(xr[i * sd]), x2 = convert<double>(xr[(i + half) * sd]);
        orow[i] = convert<T>(x1 * c[i] - x2 * s[i]);
        orow[i + half] = convert<T>(x2 * c[i] + x1 * s[i]);
      }
    }
  });
}

}  // namespace forge::cpu
