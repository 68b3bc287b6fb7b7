#include "testing/gradcheck.h"

namespace forge::testing {

std::vector<GradCase> view_grad_cases() {
  using namespace forge::ops;
  std::vector<GradCase> c;
  auto one = [](Shape s) { return [s] { return TensorList{arg(s, 21)}; }; };
  auto tr = [](Shape s) { return [s] { return TensorList{arg_transposed(s, 22)}; }; };
  // Each view is followed by a multiply with a fixed pattern so that positions matter.
  auto weighted = [](Tensor t) { return mul(t, arange(0.5, 0.5 + double(t.numel()), 1.0, {.dtype = DType::f64}).reshape(t.shape())); };
  c.push_back({"reshape", "[2,3,4] -> [4,-1]", one({2, 3, 4}), [=](const TensorList& in) { return weighted(reshape(in[0], {4, -1})); }});
  c.push_back({"reshape", "transposed [4,3] -> [12] (copies)", tr({4, 3}), [=](const TensorList& in) { return weighted(reshape(in[0], {12})); }});
  c.push_back({"view", "[6,2] -> [3,2,2]", one({6, 2}), [=](const TensorList& in) { return weighted(view(in[0], {3, 2, 2})); }});
  c.push_back({"flatten", "[2,3,4] dims 1..2", one({2, 3, 4}), [=](const TensorList& in) { return weighted(flatten(in[0], 1)); }});
  c.push_back({"transpose", "[2,3,4] (0,2)", one({2, 3, 4}), [=](const TensorList& in) { return weighted(transpose(in[0], 0, 2)); }});
  c.push_back({"permute", "[2,3,4] (1,2,0)", one({2, 3, 4}), [=](const TensorList& in) { return weighted(permute(in[0], {1, 2, 0})); }});
  c.push_back({"narrow", "[5,3] dim 0 [1,4)", one({5, 3}), [=](const TensorList& in) { return weighted(narrow(in[0], 0, 1, 3)); }});
  c.push_back({"slice", "[4,7] dim 1 step 2", one({4, 7}), [=](const TensorList& in) { return weighted(slice(in[0], 1, 1, 7, 2)); }});
  c.push_back({"slice", "transposed [4,3] dim 0 [-3:]", tr({4, 3}), [=](const TensorList& in) { return weighted(slice(in[0], 0, -3, 4)); }});
  c.push_back({"select", "[3,4] dim 1 index -1", one({3, 4}), [=](const TensorList& in) { return weighted(select(in[0], 1, -1)); }});
  c.push_back({"expand", "[3,1] -> [2,3,4]", one({3, 1}), [=](const TensorList& in) { return weighted(expand(in[0], {2, 3, 4})); }});
  c.push_back({"squeeze", "[3,1,2] dim 1", one({3, 1, 2}), [=](const TensorList& in) { return weighted(squeeze(in[0], 1)); }});
  c.push_back({"squeeze", "[1,3,1] all", one({1, 3, 1}), [=](const TensorList& in) { return weighted(squeeze(in[0])); }});
  c.push_back({"unsqueeze", "[3,2] dim -1", one({3, 2}), [=](const TensorList& in) { return weighted(unsqueeze(in[0], -1)); }});
  c.push_back({"contiguous", "transposed [4,3]", tr({4, 3}), [=](const TensorList& in) { return weighted(contiguous(in[0])); }});
  c.push_back({"clone", "strided [3,4]", [] { return TensorList{arg_strided({3, 4}, 23)}; }, [=](const TensorList& in) { return weighted(clone(in[0])); }});
  c.push_back({"to", "f64 -> f32 -> f64 (gradient flows through both casts)", one({3, 3}),
               [=](const TensorList& in) { return weighted(to(mul(to(in[0], DType::f32), 1.0), DType::f64)); },
               // f32 rounding (~6e-8 relative) needs a large step; the function is linear so that is exact
               1e-2, 1e-6, 1e-4});
  return c;
}

}  // namespace forge::testing
