#include "testing/gradcheck.h"

namespace forge::testing {

std::vector<GradCase> index_grad_cases() {
  using namespace forge::ops;
  std::vector<GradCase> c;
  auto i64 = [](std::vector<int64_t> v, Shape s) { return from_vector<int64_t>(v, s, {.dtype = DType::i64}); };
  auto i32 = [](std::vector<int64_t> v, Shape s) { return from_vector<int64_t>(v, s, {.dtype = DType::i32}); };

  // index_select (repeated indices: the gradient must accumulate)
  c.push_back({"index_select", "[5,3] dim 0, repeated {4,0,4,2}", [] { return TensorList{arg({5, 3}, 81)}; },
               [=](const TensorList& in) { return index_select(in[0], 0, i64({4, 0, 4, 2}, {4})); }});
  c.push_back({"index_select", "[3,4] dim 1, i32 {3,3,1}", [] { return TensorList{arg({3, 4}, 82)}; },
               [=](const TensorList& in) { return index_select(in[0], 1, i32({3, 3, 1}, {3})); }});
  c.push_back({"index_select", "[2,4,3] dim 1, {1,1,3,0,1}", [] { return TensorList{arg({2, 4, 3}, 83)}; },
               [=](const TensorList& in) { return index_select(in[0], -2, i64({1, 1, 3, 0, 1}, {5})); }});
  c.push_back({"index_select", "transposed [4,3] dim 0, {2,2}", [] { return TensorList{arg_transposed({4, 3}, 84)}; },
               [=](const TensorList& in) { return index_select(in[0], 0, i64({2, 2}, {2})); }});
  c.push_back({"index_select", "strided [3,4] dim 1", [] { return TensorList{arg_strided({3, 4}, 85)}; },
               [=](const TensorList& in) { return index_select(in[0], 1, i64({0, 3, 0}, {3})); }});

  // gather
  c.push_back({"gather", "[3,4] dim 1, index [3,3] with repeats", [] { return TensorList{arg({3, 4}, 86)}; },
               [=](const TensorList& in) {
                 return gather(in[0], 1, i64({0, 0, 3, 1, 2, 1, 3, 3, 3}, {3, 3}));
               }});
  c.push_back({"gather", "[3,4] dim 0, index [4,2] (longer along dim, narrower elsewhere)",
               [] { return TensorList{arg({3, 4}, 87)}; },
               [=](const TensorList& in) { return gather(in[0], 0, i32({2, 0, 2, 2, 1, 0, 2, 1}, {4, 2})); }});
  c.push_back({"gather", "[2,3,2] dim -1", [] { return TensorList{arg({2, 3, 2}, 88)}; },
               [=](const TensorList& in) {
                 return gather(in[0], -1, i64({1, 1, 0, 1, 0, 0, 1, 0, 1, 1, 0, 0}, {2, 3, 2}));
               }});
  c.push_back({"gather", "transposed [4,3] dim 1", [] { return TensorList{arg_transposed({4, 3}, 89)}; },
               [=](const TensorList& in) { return gather(in[0], 1, i64({2, 2, 0, 1, 1, 1, 0, 2}, {4, 2})); }});

  // scatter_add (both x and src differentiable; repeated targets accumulate)
  c.push_back({"scatter_add", "x [3,4], src [2,4] dim 0, repeated rows",
               [] { return TensorList{arg({3, 4}, 90), arg({2, 4}, 91)}; },
               [=](const TensorList& in) {
                 return scatter_add(in[0], 0, i64({2, 0, 2, 2, 2, 2, 1, 2}, {2, 4}), in[1]);
               }});
  c.push_back({"scatter_add", "x [2,3], src [2,5] dim 1, many hits per element",
               [] { return TensorList{arg({2, 3}, 92), arg({2, 5}, 93)}; },
               [=](const TensorList& in) {
                 return scatter_add(in[0], 1, i64({0, 0, 0, 2, 1, 1, 2, 1, 1, 0}, {2, 5}), in[1]);
               }});
  c.push_back({"scatter_add", "src [3,4] larger than index [2,2]",
               [] { return TensorList{arg({3, 3}, 94), arg({3, 4}, 95)}; },
               [=](const TensorList& in) { return scatter_add(in[0], 1, i64({2, 2, 0, 1}, {2, 2}), in[1]); }});
  c.push_back({"scatter_add", "transposed x, strided src, i32 index",
               [] { return TensorList{arg_transposed({3, 2}, 96), arg_strided({3, 2}, 97)}; },
               [=](const TensorList& in) { return scatter_add(in[0], 0, i32({1, 0, 1, 1, 0, 0}, {3, 2}), in[1]); }});
  c.push_back({"scatter_add", "gather then scatter_add (both backward paths chained)",
               [] { return TensorList{arg({3, 4}, 98)}; },
               [=](const TensorList& in) {
                 Tensor idx = i64({0, 2, 2, 1, 1, 0}, {2, 3});
                 return scatter_add(zeros({3, 4}, {.dtype = DType::f64}), 0, idx, gather(in[0], 0, idx));
               }});
  return c;
}

}  // namespace forge::testing
