// CPU rotary position embedding. See rope.h for the math and the memory contract.
#include "forge/backends/cpu/rope.h"

#include <cmath>
#include <vector>

#include "forge/backends/cpu/loops.h"
#include "forge/core/convert.h"
#include "forge/core/dispatch.h"

namespace forge::cpu {

void rope(const Tensor& x, Tensor& out, int64_t position_offset, double theta, const fn::RopeScaling& scaling,
          bool inverse) {
  FORGE_CHECK(x.dim() == 4 && out.shape() == x.shape() && out.dtype() == x.dtype() && out.is_contiguous() &&
                  x.size(3) % 2 == 0,
              "cpu::rope: expected x (B, H, T, D) with D even and a contiguous output of its shape, got ", x.shape(),
              " -> ", out.shape());
  if (x.numel() == 0) return;
  const int64_t len = x.size(2), D = x.size(3), half = D / 2;  // len: T of (B, H, T, D)
  // cos/sin of angle_ti = (offset + t) * freq_i (backends/rope_functors.h), (T, half) row-major.
  std::vector<double> cs(static_cast<size_t>(len * half)), sn(static_cast<size_t>(len * half));
  {
    std::vector<double> freq(static_cast<size_t>(half));
    for (int64_t i = 0; i < half; ++i)
      freq[static_cast<size_t>(i)] = fn::rope_frequency(i, D, theta, scaling);
    const double sign = inverse ? -1.0 : 1.0;
#pragma omp parallel for if (len * half >= kParallelGrain / 8)
    for (int64_t t = 0; t < len; ++t)
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
      const double* c = cs.data() + t * half;
      const double* s = sn.data() + t * half;
      for (int64_t i = 0; i < half; ++i) {
        const double x1 = convert<double>(xr[i * sd]), x2 = convert<double>(xr[(i + half) * sd]);
        orow[i] = convert<T>(x1 * c[i] - x2 * s[i]);
        orow[i + half] = convert<T>(x2 * c[i] + x1 * s[i]);
      }
    }
  });
}

}  // namespace forge::cpu
