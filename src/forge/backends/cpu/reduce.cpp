#include "forge/backends/cpu/reduce.h"

#include <type_traits>

#include "forge/backends/cpu/loops.h"
#include "forge/core/convert.h"
#include "forge/core/dispatch.h"

namespace forge::cpu {

void reduce_rows(RowReduce op, const Tensor& x, Tensor& out) {
  const int64_t rows = x.shape()[0], cols = x.shape()[1];
  dispatch_all(x.dtype(), "reduce", [&]<class T>() {
    constexpr bool kFloat = std::is_floating_point_v<acc_t<T>>;
    using Acc = std::conditional_t<kFloat, double, int64_t>;
    auto load = [](T v) -> Acc {
      if constexpr (kFloat) return convert<double>(v);
      else return static_cast<Acc>(v);
    };
    const T* in = x.data<T>();
    dispatch_all(out.dtype(), "reduce", [&]<class O>() {
      O* o = out.data<O>();
#pragma omp parallel for if (rows * cols >= kParallelGrain && rows > 1)
      for (int64_t r = 0; r < rows; ++r) {
        const T* row = in + r * cols;
        Acc acc = 0;
        if (op == RowReduce::sum || op == RowReduce::mean) {
          for (int64_t c = 0; c < cols; ++c) acc += load(row[c]);
          if (op == RowReduce::mean) acc = static_cast<Acc>(static_cast<double>(acc) / static_cast<double>(cols));
        } else {
          const bool is_max = op == RowReduce::amax;
          acc = load(row[0]);
          for (int64_t c = 1; c < cols; ++c) {
            const Acc v = load(row[c]);
            if constexpr (kFloat) {
              if (v != v) {  // NaN propagates
                acc = v;
                break;
              }
            }
            if (is_max ? v > acc : v < acc) acc = v;
          }
        }
        o[r] = convert<O>(acc);
      }
    });
  });
}

}  // namespace forge::cpu
