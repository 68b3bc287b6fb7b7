#include "testing/gradcheck.h"

namespace forge::testing {

std::vector<GradCase> join_grad_cases() {
  using namespace forge::ops;
  std::vector<GradCase> c;
  // Pieces scaled by 1, 2, 3, ... and joined again, so every piece's gradient differs.
  auto rejoin = [](const TensorList& pieces, int64_t dim) {
    TensorList scaled;
    for (size_t i = 0; i < pieces.size(); ++i) scaled.push_back(mul(pieces[i], double(i + 1)));
    return cat(scaled, dim);
  };

  // cat
  c.push_back({"cat", "dim 0 [2,3]+[4,3]", [] { return TensorList{arg({2, 3}, 51), arg({4, 3}, 52)}; },
               [](const TensorList& in) { return cat({in[0], in[1]}, 0); }});
  c.push_back({"cat", "dim 1 of three [2,1]+[2,3]+[2,2]",
               [] { return TensorList{arg({2, 1}, 53), arg({2, 3}, 54), arg({2, 2}, 55)}; },
               [](const TensorList& in) { return cat(in, 1); }});
  c.push_back({"cat", "dim -1, transposed + strided inputs",
               [] { return TensorList{arg_transposed({3, 2}, 56), arg_strided({3, 4}, 57)}; },
               [](const TensorList& in) { return cat(in, -1); }});
  c.push_back({"cat", "3-D dim 1, same tensor twice", [] { return TensorList{arg({2, 2, 3}, 58)}; },
               [](const TensorList& in) { return cat({in[0], in[0]}, 1); }});
  c.push_back({"cat", "legacy empty [0] input is skipped",
               [] { return TensorList{arg({2, 3}, 59), arg({0}, 60), arg({1, 3}, 61)}; },
               [](const TensorList& in) { return cat(in, 0); }});
  c.push_back({"cat", "promotes an i64 constant to f64", [] { return TensorList{arg({2, 3}, 62)}; },
               [](const TensorList& in) { return cat({in[0], arange(0, 6).reshape({2, 3})}, 0); }});

  // stack
  c.push_back({"stack", "three [2,3] at dim 0",
               [] { return TensorList{arg({2, 3}, 63), arg({2, 3}, 64), arg({2, 3}, 65)}; },
               [](const TensorList& in) { return stack(in, 0); }});
  c.push_back({"stack", "two [3,2] at dim -1, one transposed",
               [] { return TensorList{arg({3, 2}, 66), arg_transposed({3, 2}, 67)}; },
               [](const TensorList& in) { return stack(in, -1); }});
  c.push_back({"stack", "[4] at dim 1, strided", [] { return TensorList{arg_strided({4}, 68), arg({4}, 69)}; },
               [](const TensorList& in) { return stack(in, 1); }});

  // split
  c.push_back({"split", "[5,3] size 2 dim 0 (last piece smaller)", [] { return TensorList{arg({5, 3}, 70)}; },
               [=](const TensorList& in) { return rejoin(split(in[0], 2, 0), 0); }});
  c.push_back({"split", "[3,7] sizes {3,0,4} dim -1", [] { return TensorList{arg({3, 7}, 71)}; },
               [=](const TensorList& in) { return rejoin(split(in[0], std::vector<int64_t>{3, 0, 4}, -1), -1); }});
  c.push_back({"split", "only the middle piece is used", [] { return TensorList{arg({6, 2}, 72)}; },
               [](const TensorList& in) { return split(in[0], 2, 0)[1]; }});
  c.push_back({"split", "transposed [4,3] size 3 dim 1", [] { return TensorList{arg_transposed({4, 3}, 73)}; },
               [=](const TensorList& in) { return rejoin(split(in[0], 2, 1), 1); }});

  // chunk
  c.push_back({"chunk", "[7,2] into 3 along dim 0", [] { return TensorList{arg({7, 2}, 74)}; },
               [=](const TensorList& in) { return rejoin(chunk(in[0], 3, 0), 0); }});
  c.push_back({"chunk", "[2,3,4] into 2 along dim -1, first piece", [] { return TensorList{arg({2, 3, 4}, 75)}; },
               [](const TensorList& in) { return chunk(in[0], 2, -1)[0]; }});
  c.push_back({"chunk", "strided [3,6] into 4 along dim 1 (3 pieces)",
               [] { return TensorList{arg_strided({3, 6}, 76)}; },
               [=](const TensorList& in) { return rejoin(chunk(in[0], 4, 1), 1); }});
  return c;
}

}  // namespace forge::testing
