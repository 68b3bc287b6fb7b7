// Op-table cases for the views and copies. Each result is multiplied by a constant positive
// input of its shape, so every position's gradient differs.
#include "testing/op_table.h"

namespace forge::testing {

std::vector<OpCase> view_cases() {
  using namespace forge::ops;
  std::vector<OpCase> c;
  auto add = [&c](const char* op, const char* label, Input x, const Shape& out,
                  std::function<Tensor(const Tensor&)> f) {
    c.push_back({op, label, {std::move(x), positive(out, 24).constant()}, [f](const TensorList& in) {
                   return mul(f(in[0]), in[1]);
                 }});
  };
  // A tensor of the other floating dtype than t's (f64 -> f32, else f64): a cast and back.
  auto cast_and_back = [](const Tensor& t) {
    const DType other = t.dtype() == DType::f64 ? DType::f32 : DType::f64;
    return to(mul(to(t, other), 1.0), t.dtype());
  };

  add("reshape", "[2,3,4] -> [4,-1]", real({2, 3, 4}, 21), {4, 6}, [](const Tensor& x) { return reshape(x, {4, -1}); });
  add("reshape", "transposed [4,3] -> [12] (copies)", real({4, 3}, 22).transposed(), {12},
      [](const Tensor& x) { return reshape(x, {12}); });
  add("view", "[6,2] -> [3,2,2]", real({6, 2}, 21), {3, 2, 2}, [](const Tensor& x) { return view(x, {3, 2, 2}); });
  add("flatten", "[2,3,4] dims 1..2", real({2, 3, 4}, 21), {2, 12}, [](const Tensor& x) { return flatten(x, 1); });
  add("transpose", "[2,3,4] (0,2)", real({2, 3, 4}, 21), {4, 3, 2}, [](const Tensor& x) { return transpose(x, 0, 2); });
  add("permute", "[2,3,4] (1,2,0)", real({2, 3, 4}, 21), {3, 4, 2}, [](const Tensor& x) {
    return permute(x, {1, 2, 0});
  });
  add("narrow", "[5,3] dim 0 [1,4)", real({5, 3}, 21), {3, 3}, [](const Tensor& x) { return narrow(x, 0, 1, 3); });
  add("slice", "[4,7] dim 1 step 2", real({4, 7}, 21), {4, 3}, [](const Tensor& x) { return slice(x, 1, 1, 7, 2); });
  add("slice", "transposed [4,3] dim 0 [-3:]", real({4, 3}, 22).transposed(), {3, 3},
      [](const Tensor& x) { return slice(x, 0, -3, 4); });
  add("select", "[3,4] dim 1 index -1", real({3, 4}, 21), {3}, [](const Tensor& x) { return select(x, 1, -1); });
  add("expand", "[3,1] -> [2,3,4]", real({3, 1}, 21), {2, 3, 4}, [](const Tensor& x) { return expand(x, {2, 3, 4}); });
  add("squeeze", "[3,1,2] dim 1", real({3, 1, 2}, 21), {3, 2}, [](const Tensor& x) { return squeeze(x, 1); });
  add("squeeze", "[1,3,1] all", real({1, 3, 1}, 21), {3}, [](const Tensor& x) { return squeeze(x); });
  add("unsqueeze", "[3,2] dim -1", real({3, 2}, 21), {3, 2, 1}, [](const Tensor& x) { return unsqueeze(x, -1); });
  add("contiguous", "transposed [4,3]", real({4, 3}, 22).transposed(), {4, 3},
      [](const Tensor& x) { return contiguous(x); });
  add("clone", "strided [3,4]", real({3, 4}, 23).strided(), {3, 4}, [](const Tensor& x) { return clone(x); });
  add("to", "f64 -> f32 -> f64 (gradient flows through both casts; f32 -> f64 -> f32 on the device)", real({3, 3}, 21),
      {3, 3}, cast_and_back);
  // f32 rounding (~6e-8 relative) needs a large step; the function is linear so that is exact.
  c.back().gradcheck_tolerance(1e-2, 1e-6, 1e-4);

  // Larger 3-D views of a [4,6,5] tensor.
  const Shape s3{4, 6, 5};
  add("reshape", "[4,6,5] -> [24,5] of a transposed view", real(s3, 25), {24, 5}, [](const Tensor& x) {
    return x.transpose(0, 1).reshape({24, 5});
  });
  add("view", "[4,6,5] -> [4,30]", real(s3, 25), {4, 30}, [](const Tensor& x) { return x.view({4, 30}); });
  add("flatten", "[4,6,5] dims 1..2", real(s3, 25), {4, 30}, [](const Tensor& x) { return x.flatten(1, 2); });
  add("transpose", "[4,6,5] (0,2)", real(s3, 25), {5, 6, 4}, [](const Tensor& x) { return x.transpose(0, 2); });
  add("permute", "[4,6,5] (2,0,1)", real(s3, 25), {5, 4, 6}, [](const Tensor& x) { return x.permute({2, 0, 1}); });
  add("narrow", "[4,6,5] narrow(1, 2, 3)", real(s3, 25), {4, 3, 5}, [](const Tensor& x) { return x.narrow(1, 2, 3); });
  add("slice", "[4,6,5] slice(2, 1, 5, step 2)", real(s3, 25), {4, 6, 2},
      [](const Tensor& x) { return x.slice(2, 1, 5, 2); });
  add("select", "[4,6,5] select(1, 4)", real(s3, 25), {4, 5}, [](const Tensor& x) { return x.select(1, 4); });
  add("expand", "[4,1,5] -> [4,6,5]", real({4, 1, 5}, 25), s3, [](const Tensor& x) { return x.expand({4, 6, 5}); });
  add("squeeze", "squeeze dim 1 of [4,1,5]", real({4, 1, 5}, 25), {4, 5}, [](const Tensor& x) { return x.squeeze(1); });
  add("unsqueeze", "[4,6,5] unsqueeze(1)", real(s3, 25), {4, 1, 6, 5}, [](const Tensor& x) { return x.unsqueeze(1); });
  add("contiguous", "contiguous of a permuted [4,6,5] view", real(s3, 25), {6, 5, 4}, [](const Tensor& x) {
    return x.permute({1, 2, 0}).contiguous();
  });
  add("clone", "clone of a sliced [4,6,5] view", real(s3, 25), {3, 6, 5},
      [](const Tensor& x) { return x.slice(0, 1, 4).clone(); });
  add("to", "[4,6,5] to the other dtype and back", real(s3, 25), s3, cast_and_back);
  c.back().gradcheck_tolerance(1e-2, 1e-6, 1e-4);
  return c;
}

}  // namespace forge::testing
