// Op-table cases for the reduction family and softmax: all dims, one dim, several
// dims, keepdim, negative dims, 0-d inputs and non-contiguous (transposed / strided) inputs.
// max/min/amax/amin take random normal inputs, which have no ties.
#include <string>
#include <utility>

#include "testing/op_table.h"

namespace forge::testing {

std::vector<OpCase> reduce_cases() {
  using namespace forge::ops;
  std::vector<OpCase> c;
  auto one = [](Shape s) { return std::vector<Input>{real(s, 31)}; };
  auto tr = [](Shape s) { return std::vector<Input>{real(s, 32).transposed()}; };
  auto st = [](Shape s) { return std::vector<Input>{real(s, 33).strided()}; };

  // Shape/dims layouts shared by the dims-list reductions.
  struct Layout {
    const char* label;
    std::vector<Input> make;
    Dims dims;
    bool keepdim;
  };
  const Layout layouts[] = {
      {"[3,4] all dims", one({3, 4}), {}, false},
      {"[3,4] all dims keepdim", one({3, 4}), {}, true},
      {"[2,3,4] dim 1", one({2, 3, 4}), {1}, false},
      {"[2,3,4] dims {0,2} keepdim", one({2, 3, 4}), {0, 2}, true},
      {"[2,3,4] dims {-1,-3}", one({2, 3, 4}), {-1, -3}, false},
      {"[2,3,4] dim -1 keepdim", one({2, 3, 4}), {-1}, true},
      {"0-d", one({}), {}, false},
      {"transposed [4,3] dim 0", tr({4, 3}), {0}, false},
      {"strided [3,4] dim -1 keepdim", st({3, 4}), {-1}, true},
  };
  using DimsFn = Tensor (*)(const Tensor&, const Dims&, bool);
  const std::pair<const char*, DimsFn> dims_ops[] = {
      {"sum", [](const Tensor& x, const Dims& d, bool k) { return sum(x, d, k); }},
      {"mean", [](const Tensor& x, const Dims& d, bool k) { return mean(x, d, k); }},
      {"amax", [](const Tensor& x, const Dims& d, bool k) { return amax(x, d, k); }},
      {"amin", [](const Tensor& x, const Dims& d, bool k) { return amin(x, d, k); }},
  };
  for (const auto& [name, fn] : dims_ops)
    for (const Layout& l : layouts) {
      const Dims dims = l.dims;
      const bool keep = l.keepdim;
      c.push_back({name, l.label, l.make, [fn, dims, keep](const TensorList& in) { return fn(in[0], dims, keep); }});
    }

  // var: the same layouts with correction 1 (default); 0-d only with correction 0 (else NaN).
  for (const Layout& l : layouts) {
    const Dims dims = l.dims;
    const bool keep = l.keepdim;
    const int64_t corr = std::string(l.label) == "0-d" ? 0 : 1;
    c.push_back({"var", std::string(l.label) + " correction " + std::to_string(corr), l.make,
                 [dims, keep, corr](const TensorList& in) { return var(in[0], dims, keep, corr); }});
  }
  c.push_back({"var", "[2,5,3] dim 1 correction 0", one({2, 5, 3}),
               [](const TensorList& in) { return var(in[0], {1}, false, 0); }});
  c.push_back({"var", "[3,6] dim -1 keepdim correction 2", one({3, 6}),
               [](const TensorList& in) { return var(in[0], {-1}, true, 2); }});
  c.push_back(OpCase{"var", "[4,5] dims {0,1} of a shifted input (1e3 + x)", one({4, 5}),
                     [](const TensorList& in) {
                       return var(add(in[0], 1e3), {0, 1});
                     }}
                  .gradcheck_tolerance(1e-6, 1e-6, 1e-5)
                  .dtypes({DType::f32}, "1e3 + x in 16 bits keeps 2-3 bits of x")
                  .tolerance32(1e-4,
                               "f32: 1e3 + x keeps ~4 digits of x, so the order of the Welford updates "
                               "and merges moves the variance by ~1e-5"));

  // max / min along one dim: the values (the indices carry no gradient).
  struct DimCase {
    const char* label;
    std::vector<Input> make;
    int64_t dim;
    bool keepdim;
  };
  const DimCase dim_cases[] = {
      {"[3,5] dim 1", one({3, 5}), 1, false},
      {"[3,5] dim 0 keepdim", one({3, 5}), 0, true},
      {"[2,3,4] dim -2", one({2, 3, 4}), -2, false},
      {"[7] dim 0", one({7}), 0, false},
      {"0-d dim 0", one({}), 0, false},
      {"transposed [4,3] dim 1 keepdim", tr({4, 3}), 1, true},
      {"strided [3,4] dim -1", st({3, 4}), -1, false},
  };
  for (const char* name : {"max", "min"})
    for (const DimCase& d : dim_cases) {
      const bool is_max = std::string(name) == "max";
      const int64_t dim = d.dim;
      const bool keep = d.keepdim;
      c.push_back({name, d.label, d.make, [is_max, dim, keep](const TensorList& in) {
                     return is_max ? max(in[0], dim, keep).values : min(in[0], dim, keep).values;
                   }});
    }

  // softmax / log_softmax: last dim (rows), inner dims (inner > 1, also more problems than
  // one lane block holds), 0-d, non-contiguous inputs.
  const DimCase soft_cases[] = {
      {"[3,5] dim -1", one({3, 5}), -1, false},
      {"[4,3] dim 0", one({4, 3}), 0, false},
      {"[2,3,4] dim 1", one({2, 3, 4}), 1, false},
      {"[2,3,20] dim 1 (20 problems per outer index)", one({2, 3, 20}), 1, false},
      {"[6] dim 0", one({6}), 0, false},
      {"0-d dim -1", one({}), -1, false},
      {"transposed [4,3] dim 1", tr({4, 3}), 1, false},
      {"strided [3,4] dim -1", st({3, 4}), -1, false},
  };
  for (const char* name : {"softmax", "log_softmax"})
    for (const DimCase& d : soft_cases) {
      const bool log = std::string(name) == "log_softmax";
      const int64_t dim = d.dim;
      c.push_back({name, d.label, d.make,
                   [log, dim](const TensorList& in) { return log ? log_softmax(in[0], dim) : softmax(in[0], dim); }});
    }
  // Larger [7,33] inputs (the former CUDA table's rows).
  const Shape m{7, 33};
  c.push_back({"max", "[7,33] dim 1", {real(m, 34)}, [](const TensorList& in) { return max(in[0], 1).values; }});
  c.push_back(
      {"min", "[7,33] dim 0 keepdim", {real(m, 34)}, [](const TensorList& in) { return min(in[0], 0, true).values; }});
  c.push_back({"amin", "[7,33] dim 1", {real(m, 34)}, [](const TensorList& in) { return amin(in[0], {1}); }});
  c.push_back(
      {"log_softmax", "[7,33] dim 0", {real(m, 34)}, [](const TensorList& in) { return log_softmax(in[0], 0); }});
  // Large logits: the stable form must give finite, correct gradients.
  for (const char* name : {"softmax", "log_softmax"}) {
    const bool log = std::string(name) == "log_softmax";
    c.push_back(OpCase{name, "[2,4] dim 1 shifted by 500", one({2, 4}),
                       [log](const TensorList& in) {
                         const Tensor x = add(in[0], 500.0);
                         return log ? log_softmax(x, 1) : softmax(x, 1);
                       }}
                    .gradcheck_tolerance(1e-6, 1e-6, 1e-5)
                    .dtypes({DType::f32}, "500 + x in 16 bits keeps 0-1 bits of x"));
  }
  return c;
}

}  // namespace forge::testing
