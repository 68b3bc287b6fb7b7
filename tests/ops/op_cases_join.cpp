#include "testing/op_table.h"

namespace forge::testing {

std::vector<OpCase> join_cases() {
  using namespace forge::ops;
  std::vector<OpCase> c;
  // Pieces scaled by 1, 2, 3, ... and joined again, so every piece's gradient differs.
  auto rejoin = [](const TensorList& pieces, int64_t dim) {
    TensorList scaled;
    for (size_t i = 0; i < pieces.size(); ++i) scaled.push_back(mul(pieces[i], double(i + 1)));
    return cat(scaled, dim);
  };

  // cat
  c.push_back({"cat", "dim 0 [2,3]+[4,3]", {real({2, 3}, 51), real({4, 3}, 52)}, [](const TensorList& in) {
                 return cat({in[0], in[1]}, 0);
               }});
  c.push_back({"cat",
               "dim 1 of three [2,1]+[2,3]+[2,2]",
               {real({2, 1}, 53), real({2, 3}, 54), real({2, 2}, 55)},
               [](const TensorList& in) { return cat(in, 1); }});
  c.push_back({"cat",
               "dim -1, transposed + strided inputs",
               {real({3, 2}, 56).transposed(), real({3, 4}, 57).strided()},
               [](const TensorList& in) { return cat(in, -1); }});
  c.push_back({"cat", "3-D dim 1, same tensor twice", {real({2, 2, 3}, 58)}, [](const TensorList& in) {
                 return cat({in[0], in[0]}, 1);
               }});
  c.push_back({"cat",
               "legacy empty [0] input is skipped",
               {real({2, 3}, 59), real({0}, 60), real({1, 3}, 61)},
               [](const TensorList& in) { return cat(in, 0); }});
  c.push_back({"cat",
               "promotes an i64 constant to the floating dtype",
               {real({2, 3}, 62), ids({0, 1, 2, 3, 4, 5}, {2, 3})},
               [](const TensorList& in) {
                 return cat({in[0], in[1]}, 0);
               }});

  // stack
  c.push_back({"stack",
               "three [2,3] at dim 0",
               {real({2, 3}, 63), real({2, 3}, 64), real({2, 3}, 65)},
               [](const TensorList& in) { return stack(in, 0); }});
  c.push_back({"stack",
               "two [3,2] at dim -1, one transposed",
               {real({3, 2}, 66), real({3, 2}, 67).transposed()},
               [](const TensorList& in) { return stack(in, -1); }});
  c.push_back({"stack", "[4] at dim 1, strided", {real({4}, 68).strided(), real({4}, 69)}, [](const TensorList& in) {
                 return stack(in, 1);
               }});

  // split
  c.push_back({"split", "[5,3] size 2 dim 0 (last piece smaller)", {real({5, 3}, 70)}, [=](const TensorList& in) {
                 return rejoin(split(in[0], 2, 0), 0);
               }});
  c.push_back({"split", "[3,7] sizes {3,0,4} dim -1", {real({3, 7}, 71)}, [=](const TensorList& in) {
                 return rejoin(split(in[0], std::vector<int64_t>{3, 0, 4}, -1), -1);
               }});
  c.push_back({"split", "only the middle piece is used", {real({6, 2}, 72)}, [](const TensorList& in) {
                 return split(in[0], 2, 0)[1];
               }});
  c.push_back({"split", "transposed [4,3] size 3 dim 1", {real({4, 3}, 73).transposed()}, [=](const TensorList& in) {
                 return rejoin(split(in[0], 2, 1), 1);
               }});

  // chunk
  c.push_back({"chunk", "[7,2] into 3 along dim 0", {real({7, 2}, 74)}, [=](const TensorList& in) {
                 return rejoin(chunk(in[0], 3, 0), 0);
               }});
  c.push_back({"chunk", "[2,3,4] into 2 along dim -1, first piece", {real({2, 3, 4}, 75)}, [](const TensorList& in) {
                 return chunk(in[0], 2, -1)[0];
               }});
  c.push_back(
      {"chunk", "strided [3,6] into 4 along dim 1 (3 pieces)", {real({3, 6}, 76).strided()}, [=](const TensorList& in) {
         return rejoin(chunk(in[0], 4, 1), 1);
       }});

  // Larger [7,33] inputs (the former CUDA table's rows).
  const Shape m{7, 33};
  c.push_back({"cat", "[7,33] and [7,5] along dim 1", {real(m, 77), real({7, 5}, 78)}, [](const TensorList& in) {
                 return cat({in[0], in[1]}, 1);
               }});
  c.push_back({"stack", "two [7,33] along dim 1, one scaled", {real(m, 79), real(m, 80)}, [](const TensorList& in) {
                 return stack({in[0], mul(in[1], 2.0)}, 1);
               }});
  c.push_back({"split", "[7,33] into 10s along dim 1, reordered", {real(m, 81)}, [](const TensorList& in) {
                 const TensorList p = split(in[0], 10, 1);
                 return cat({mul(p[3], 3.0), p[0], mul(p[2], -1.0)}, 1);
               }});
  c.push_back({"chunk", "[7,33] in 3 along dim 0", {real(m, 82)}, [](const TensorList& in) {
                 const TensorList p = chunk(in[0], 3, 0);
                 return cat({p[2], mul(p[0], 2.0)}, 0);
               }});
  return c;
}

}  // namespace forge::testing
