#include "forge/backends/cpu/tensor_kernels.h"

#include <cstring>

#include "forge/backends/cpu/loops.h"
#include "forge/core/convert.h"
#include "forge/core/dispatch.h"
#include "forge/core/philox.h"

namespace forge::cpu {

void copy(Tensor& dst, const Tensor& src) {
  FORGE_CHECK(dst.shape() == src.shape(), "copy: destination shape ", dst.shape(), " != source shape ", src.shape());
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    if (dst.data_ptr() != src.data_ptr()) std::memcpy(dst.data_ptr(), src.data_ptr(), dst.nbytes());
    return;
  }
  dispatch_all(dst.dtype(), "copy", [&]<class To>() {
    dispatch_all(src.dtype(), "copy", [&]<class From>() {
      elementwise<To, From>(dst, [](From v) { return convert<To>(v); }, {&src});
    });
  });
}

void fill(Tensor& t, double value) {
  dispatch_all(t.dtype(), "fill", [&]<class T>() {
    const T v = convert<T>(value);
    elementwise<T>(t, [v]() { return v; }, {});
  });
}

void arange(Tensor& t, double start, double step) {
  FORGE_CHECK(t.is_contiguous(), "arange: output must be contiguous");
  dispatch_numeric(t.dtype(), "arange", [&]<class T>() {
    T* p = t.data<T>();
    const int64_t n = t.numel();
#pragma omp parallel for if (n >= kParallelGrain)
    for (int64_t i = 0; i < n; ++i) p[i] = convert<T>(start + static_cast<double>(i) * step);
  });
}

namespace {
template <class Gen>
void random_fill(Tensor& t, const char* op, uint64_t seed, uint64_t block_offset, Gen gen) {
  FORGE_CHECK(t.is_contiguous(), op, ": output must be contiguous");
  dispatch_float(t.dtype(), op, [&]<class T>() {
    T* p = t.data<T>();
    const int64_t n = t.numel();
    const int64_t blocks = (n + 3) / 4;
#pragma omp parallel for if (n >= kParallelGrain)
    for (int64_t b = 0; b < blocks; ++b) {
      const Philox4 r = philox4x32_10(seed, block_offset + static_cast<uint64_t>(b));
      for (int64_t i = 4 * b; i < std::min<int64_t>(n, 4 * b + 4); ++i) p[i] = convert<T>(gen(r, static_cast<int>(i - 4 * b)));
    }
  });
}
}  // namespace

void uniform(Tensor& t, double lo, double hi, uint64_t seed, uint64_t block_offset) {
  random_fill(t, "rand", seed, block_offset, [&](const Philox4& r, int lane) {
    return lo + (hi - lo) * static_cast<double>(philox_uniform(r.v[lane]));
  });
}

void normal(Tensor& t, double mean, double std, uint64_t seed, uint64_t block_offset) {
  random_fill(t, "randn", seed, block_offset, [&](const Philox4& r, int lane) {
    return mean + std * static_cast<double>(philox_normal(r, lane));
  });
}

}  // namespace forge::cpu
