#include <string>

#include "testing/gradcheck.h"

namespace forge::testing {

std::vector<GradCase> matmul_grad_cases() {
  using namespace forge::ops;
  std::vector<GradCase> c;
  auto two = [](Shape a, Shape b) { return [a, b] { return TensorList{arg(a, 31), arg(b, 32)}; }; };
  const OpFn mat = [](const TensorList& in) { return matmul(in[0], in[1]); };
  const OpFn mmf = [](const TensorList& in) { return mm(in[0], in[1]); };
  const OpFn bmmf = [](const TensorList& in) { return bmm(in[0], in[1]); };

  // matmul: every rank combination of torch.matmul.
  c.push_back({"matmul", "[3,4]x[4,5]", two({3, 4}, {4, 5}), mat});
  c.push_back({"matmul", "1-D dot [4]x[4] -> 0-d", two({4}, {4}), mat});
  c.push_back({"matmul", "1-D lhs [4]x[4,3]", two({4}, {4, 3}), mat});
  c.push_back({"matmul", "1-D rhs [3,4]x[4]", two({3, 4}, {4}), mat});
  c.push_back({"matmul", "batched x vector [2,3,4]x[4]", two({2, 3, 4}, {4}), mat});
  c.push_back({"matmul", "vector x batched [4]x[2,4,3]", two({4}, {2, 4, 3}), mat});
  c.push_back({"matmul", "batched x matrix [2,3,4]x[4,5] (folded)", two({2, 3, 4}, {4, 5}), mat});
  c.push_back({"matmul", "matrix x batched [3,4]x[2,4,5]", two({3, 4}, {2, 4, 5}), mat});
  c.push_back({"matmul", "broadcast batch [2,1,3,4]x[5,4,2]", two({2, 1, 3, 4}, {5, 4, 2}), mat});
  c.push_back({"matmul", "broadcast batch [1,3,2]x[3,1,2,4]", two({1, 3, 2}, {3, 1, 2, 4}), mat});
  c.push_back({"matmul", "transposed lhs [3,4]^T-stored x [4,2]",
               [] { return TensorList{arg_transposed({3, 4}, 33), arg({4, 2}, 34)}; }, mat});
  c.push_back({"matmul", "[3,4] x transposed rhs [4,5]",
               [] { return TensorList{arg({3, 4}, 35), arg_transposed({4, 5}, 36)}; }, mat});
  c.push_back({"matmul", "strided rhs [3,4]x[4,5] (packed)",
               [] { return TensorList{arg({3, 4}, 37), arg_strided({4, 5}, 38)}; }, mat});
  c.push_back({"matmul", "batched, transposed last two dims of lhs",
               two({2, 4, 3}, {2, 4, 5}),
               [](const TensorList& in) { return matmul(transpose(in[0], 1, 2), in[1]); }});
  c.push_back({"matmul", "batched x transposed-view matrix, strided batch",
               [] { return TensorList{arg_strided({2, 3, 4}, 39), arg({5, 4}, 40)}; },
               [](const TensorList& in) { return matmul(in[0], transpose(in[1], 0, 1)); }});
  c.push_back({"matmul", "same tensor twice x @ x", [] { return TensorList{arg({3, 3}, 41)}; },
               [](const TensorList& in) { return matmul(in[0], in[0]); }});
  c.push_back({"matmul", "only rhs requires grad", [] { return TensorList{arg({3, 4}, 42).detach(), arg({4, 2}, 43)}; },
               mat});

  // mm
  c.push_back({"mm", "[3,4]x[4,5]", two({3, 4}, {4, 5}), mmf});
  c.push_back({"mm", "outer [3,1]x[1,4]", two({3, 1}, {1, 4}), mmf});
  c.push_back({"mm", "transposed lhs x strided rhs",
               [] { return TensorList{arg_transposed({2, 3}, 44), arg_strided({3, 4}, 45)}; }, mmf});
  c.push_back({"mm", "[1,4]x[4,1]", two({1, 4}, {4, 1}), mmf});

  // bmm
  c.push_back({"bmm", "[2,3,4]x[2,4,5]", two({2, 3, 4}, {2, 4, 5}), bmmf});
  c.push_back({"bmm", "both transposed in the last two dims", two({3, 4, 2}, {3, 5, 4}),
               [](const TensorList& in) { return bmm(transpose(in[0], 1, 2), transpose(in[1], 1, 2)); }});
  c.push_back({"bmm", "expanded (stride-0) batch of rhs", two({3, 2, 4}, {1, 4, 2}),
               [](const TensorList& in) { return bmm(in[0], expand(in[1], {3, 4, 2})); }});

  // linear / linear_gelu: x (*, in), weight (out, in), bias (out) or none.
  auto three = [](Shape x, Shape w, Shape b) {
    return [x, w, b] { return TensorList{arg(x, 51), arg(w, 52), arg(b, 53)}; };
  };
  for (const char* op : {"linear", "linear_gelu"}) {
    const bool gelu = std::string(op) == "linear_gelu";
    const OpFn f = [gelu](const TensorList& in) {
      const Tensor b = in.size() > 2 ? in[2] : Tensor();
      return gelu ? linear_gelu(in[0], in[1], b) : linear(in[0], in[1], b);
    };
    c.push_back({op, "[3,4] x W[5,4] + b[5]", three({3, 4}, {5, 4}, {5}), f});
    c.push_back({op, "batched [2,3,4], no bias", two({2, 3, 4}, {5, 4}), f});
    c.push_back({op, "1-D input [4]", three({4}, {3, 4}, {3}), f});
    c.push_back({op, "transposed input view, strided weight",
                 [] { return TensorList{arg_transposed({3, 4}, 54), arg_strided({2, 4}, 55), arg({2}, 56)}; }, f});
    c.push_back({op, "only the bias requires grad",
                 [] { return TensorList{arg({2, 3}, 57).detach(), arg({4, 3}, 58).detach(), arg({4}, 59)}; }, f});
    c.push_back({op, "only the input requires grad",
                 [] { return TensorList{arg({2, 2, 3}, 60), arg({4, 3}, 61).detach(), arg({4}, 62).detach()}; }, f});
  }
  // gelu_mlp: x (*, in), w_fc (hidden, in), b_fc (hidden), w_proj (out, hidden), b_proj (out).
  const OpFn mlp = [](const TensorList& in) { return gelu_mlp(in[0], in[1], in[2], in[3], in[4]); };
  c.push_back({"gelu_mlp", "[2,3,4] -> 6 -> 5, biases",
               [] { return TensorList{arg({2, 3, 4}, 71), arg({6, 4}, 72), arg({6}, 73), arg({5, 6}, 74), arg({5}, 75)}; },
               mlp});
  c.push_back({"gelu_mlp", "no biases, transposed input",
               [] { return TensorList{arg_transposed({4, 3}, 76), arg({5, 3}, 77), Tensor(), arg({2, 5}, 78), Tensor()}; },
               mlp});
  c.push_back({"gelu_mlp", "only x and the up projection's bias need grad",
               [] {
                 return TensorList{arg({3, 4}, 79), arg({6, 4}, 80).detach(), arg({6}, 81), arg({5, 6}, 82).detach(),
                                   arg({5}, 83).detach()};
               },
               mlp});
  return c;
}

}  // namespace forge::testing
