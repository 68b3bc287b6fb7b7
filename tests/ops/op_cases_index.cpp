// Op-table cases for index_select, gather and scatter_add: repeated indices (the gradient
// must accumulate), i32 and i64 indices, negative dims, non-contiguous inputs.
#include "testing/op_table.h"

namespace forge::testing {

std::vector<OpCase> index_cases() {
  using namespace forge::ops;
  std::vector<OpCase> c;
  auto i32 = [](std::vector<int64_t> v, Shape s) { return ids(std::move(v), s, DType::i32); };

  // index_select (repeated indices: the gradient must accumulate)
  const OpFn select0 = [](const TensorList& in) { return index_select(in[0], 0, in[1]); };
  const OpFn select1 = [](const TensorList& in) { return index_select(in[0], 1, in[1]); };
  c.push_back({"index_select", "[5,3] dim 0, repeated {4,0,4,2}", {real({5, 3}, 81), ids({4, 0, 4, 2}, {4})}, select0});
  c.push_back({"index_select", "[3,4] dim 1, i32 {3,3,1}", {real({3, 4}, 82), i32({3, 3, 1}, {3})}, select1});
  c.push_back({"index_select",
               "[2,4,3] dim 1, {1,1,3,0,1}",
               {real({2, 4, 3}, 83), ids({1, 1, 3, 0, 1}, {5})},
               [](const TensorList& in) { return index_select(in[0], -2, in[1]); }});
  c.push_back(
      {"index_select", "transposed [4,3] dim 0, {2,2}", {real({4, 3}, 84).transposed(), ids({2, 2}, {2})}, select0});
  c.push_back({"index_select", "strided [3,4] dim 1", {real({3, 4}, 85).strided(), ids({0, 3, 0}, {3})}, select1});

  // gather
  c.push_back({"gather",
               "[3,4] dim 1, index [3,3] with repeats",
               {real({3, 4}, 86), ids({0, 0, 3, 1, 2, 1, 3, 3, 3}, {3, 3})},
               [](const TensorList& in) { return gather(in[0], 1, in[1]); }});
  c.push_back({"gather",
               "[3,4] dim 0, index [4,2] (longer along dim, narrower elsewhere)",
               {real({3, 4}, 87), i32({2, 0, 2, 2, 1, 0, 2, 1}, {4, 2})},
               [](const TensorList& in) { return gather(in[0], 0, in[1]); }});
  c.push_back({"gather",
               "[2,3,2] dim -1",
               {real({2, 3, 2}, 88), ids({1, 1, 0, 1, 0, 0, 1, 0, 1, 1, 0, 0}, {2, 3, 2})},
               [](const TensorList& in) { return gather(in[0], -1, in[1]); }});
  c.push_back({"gather",
               "transposed [4,3] dim 1",
               {real({4, 3}, 89).transposed(), ids({2, 2, 0, 1, 1, 1, 0, 2}, {4, 2})},
               [](const TensorList& in) { return gather(in[0], 1, in[1]); }});

  // scatter_add (both x and src differentiable; repeated targets accumulate)
  c.push_back({"scatter_add",
               "x [3,4], src [2,4] dim 0, repeated rows",
               {real({3, 4}, 90), real({2, 4}, 91), ids({2, 0, 2, 2, 2, 2, 1, 2}, {2, 4})},
               [](const TensorList& in) { return scatter_add(in[0], 0, in[2], in[1]); }});
  c.push_back({"scatter_add",
               "x [2,3], src [2,5] dim 1, many hits per element",
               {real({2, 3}, 92), real({2, 5}, 93), ids({0, 0, 0, 2, 1, 1, 2, 1, 1, 0}, {2, 5})},
               [](const TensorList& in) { return scatter_add(in[0], 1, in[2], in[1]); }});
  c.push_back({"scatter_add",
               "src [3,4] larger than index [2,2]",
               {real({3, 3}, 94), real({3, 4}, 95), ids({2, 2, 0, 1}, {2, 2})},
               [](const TensorList& in) { return scatter_add(in[0], 1, in[2], in[1]); }});
  c.push_back({"scatter_add",
               "transposed x, strided src, i32 index",
               {real({3, 2}, 96).transposed(), real({3, 2}, 97).strided(), i32({1, 0, 1, 1, 0, 0}, {3, 2})},
               [](const TensorList& in) { return scatter_add(in[0], 0, in[2], in[1]); }});
  c.push_back({"scatter_add",
               "gather then scatter_add (both backward paths chained)",
               {real({3, 4}, 98), ids({0, 2, 2, 1, 1, 0}, {2, 3})},
               [](const TensorList& in) {
                 const Tensor base = zeros({3, 4}, {.dtype = in[0].dtype(), .device = in[0].device()});
                 return scatter_add(base, 0, in[1], gather(in[0], 0, in[1]));
               }});
  return c;
}

}  // namespace forge::testing
