#include <string>

#include "testing/op_table.h"

namespace forge::testing {

std::vector<OpCase> matmul_cases() {
  using namespace forge::ops;
  std::vector<OpCase> c;
  auto two = [](Shape a, Shape b) { return std::vector<Input>{real(a, 31), real(b, 32)}; };
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
  c.push_back(
      {"matmul", "transposed lhs [3,4]^T-stored x [4,2]", {real({3, 4}, 33).transposed(), real({4, 2}, 34)}, mat});
  c.push_back({"matmul", "[3,4] x transposed rhs [4,5]", {real({3, 4}, 35), real({4, 5}, 36).transposed()}, mat});
  c.push_back({"matmul", "strided rhs [3,4]x[4,5] (packed)", {real({3, 4}, 37), real({4, 5}, 38).strided()}, mat});
  c.push_back({"matmul", "batched, transposed last two dims of lhs", two({2, 4, 3}, {2, 4, 5}),
               [](const TensorList& in) { return matmul(transpose(in[0], 1, 2), in[1]); }});
  c.push_back({"matmul",
               "batched x transposed-view matrix, strided batch",
               {real({2, 3, 4}, 39).strided(), real({5, 4}, 40)},
               [](const TensorList& in) { return matmul(in[0], transpose(in[1], 0, 1)); }});
  c.push_back({"matmul", "same tensor twice x @ x", {real({3, 3}, 41)}, [](const TensorList& in) {
                 return matmul(in[0], in[0]);
               }});
  c.push_back({"matmul", "only rhs requires grad", {real({3, 4}, 42).constant(), real({4, 2}, 43)}, mat});

  // mm
  c.push_back({"mm", "[3,4]x[4,5]", two({3, 4}, {4, 5}), mmf});
  c.push_back({"mm", "outer [3,1]x[1,4]", two({3, 1}, {1, 4}), mmf});
  c.push_back({"mm", "transposed lhs x strided rhs", {real({2, 3}, 44).transposed(), real({3, 4}, 45).strided()}, mmf});
  c.push_back({"mm", "[1,4]x[4,1]", two({1, 4}, {4, 1}), mmf});

  // bmm
  c.push_back({"bmm", "[2,3,4]x[2,4,5]", two({2, 3, 4}, {2, 4, 5}), bmmf});
  c.push_back({"bmm", "both transposed in the last two dims", two({3, 4, 2}, {3, 5, 4}),
               [](const TensorList& in) { return bmm(transpose(in[0], 1, 2), transpose(in[1], 1, 2)); }});
  c.push_back({"bmm", "expanded (stride-0) batch of rhs", two({3, 2, 4}, {1, 4, 2}), [](const TensorList& in) {
                 return bmm(in[0], expand(in[1], {3, 4, 2}));
               }});

  // linear / linear_gelu: x (*, in), weight (out, in), bias (out) or none.
  auto three = [](Shape x, Shape w, Shape b) { return std::vector<Input>{real(x, 51), real(w, 52), real(b, 53)}; };
  for (const char* op : {"linear", "linear_gelu"}) {
    const bool gelu = std::string(op) == "linear_gelu";
    const OpFn f = [gelu](const TensorList& in) {
      const Tensor b = in.size() > 2 ? in[2] : Tensor();
      return gelu ? linear_gelu(in[0], in[1], b) : linear(in[0], in[1], b);
    };
    c.push_back({op, "[3,4] x W[5,4] + b[5]", three({3, 4}, {5, 4}, {5}), f});
    c.push_back({op, "batched [2,3,4], no bias", two({2, 3, 4}, {5, 4}), f});
    c.push_back({op, "1-D input [4]", three({4}, {3, 4}, {3}), f});
    c.push_back({op,
                 "transposed input view, strided weight",
                 {real({3, 4}, 54).transposed(), real({2, 4}, 55).strided(), real({2}, 56)},
                 f});
    if (gelu)
      c.back().tolerance16(3e-2,
                           "six outputs of x W^T + b (K = 4) through the GELU's tail: nothing averages a "
                           "rounding out (1.6% on the CPU's own bf16 path, which rounds x W^T + b first)");
    c.push_back({op,
                 "only the bias requires grad",
                 {real({2, 3}, 57).constant(), real({4, 3}, 58).constant(), real({4}, 59)},
                 f});
    c.push_back({op,
                 "only the input requires grad",
                 {real({2, 2, 3}, 60), real({4, 3}, 61).constant(), real({4}, 62).constant()},
                 f});
  }
  // gelu_mlp: x (*, in), w_fc (hidden, in), b_fc (hidden), w_proj (out, hidden), b_proj (out).
  c.push_back({"gelu_mlp", "[2,3,4] -> 6 -> 5, biases",
               {real({2, 3, 4}, 71), real({6, 4}, 72), real({6}, 73), real({5, 6}, 74), real({5}, 75)},
               [](const TensorList& in) { return gelu_mlp(in[0], in[1], in[2], in[3], in[4]); }});
  c.push_back({"gelu_mlp", "no biases, transposed input",
               {real({4, 3}, 76).transposed(), real({5, 3}, 77), real({2, 5}, 78)},
               [](const TensorList& in) { return gelu_mlp(in[0], in[1], Tensor(), in[2], Tensor()); }});
  c.push_back({"gelu_mlp", "only x and the up projection's bias need grad",
               {real({3, 4}, 79), real({6, 4}, 80).constant(), real({6}, 81), real({5, 6}, 82).constant(),
                real({5}, 83).constant()},
               [](const TensorList& in) { return gelu_mlp(in[0], in[1], in[2], in[3], in[4]); }});
  // lora_linear: x (*, in), weight (out, in), bias (out) or none, A (r, in), B (out, r), scale.
  const OpFn lora = [](const TensorList& in) { return lora_linear(in[0], in[1], in[2], in[3], in[4], 1.75); };
  c.push_back({"lora_linear", "[2,3,6] x W[5,6] + b, rank 2, everything trains",
               {real({2, 3, 6}, 91), real({5, 6}, 92), real({5}, 93), real({2, 6}, 94), real({5, 2}, 95)}, lora});
  c.push_back({"lora_linear", "frozen base (no bias), transposed input: x, A and B train",
               {real({4, 6}, 96).transposed(), real({3, 6}, 97).constant(), real({2, 6}, 98), real({3, 2}, 99)},
               [](const TensorList& in) { return lora_linear(in[0], in[1], Tensor(), in[2], in[3], 0.5); }});
  c.push_back({"lora_linear", "frozen input and base: the adapters' gradients alone",
               {real({4, 6}, 100).constant(), real({3, 6}, 101).constant(), real({3}, 102).constant(),
                real({4, 6}, 103), real({3, 4}, 104)},
               lora});
  for (OpCase& k : c)
    if (k.op == "lora_linear")
      k.tolerance16(3e-2,
                    "two chained products over six or fewer terms and a scaled rank-r sum added to the first: "
                    "the 16-bit rounding of h = s x A^T is not averaged out");
  for (OpCase& k : c)
    if (k.op == "gelu_mlp")
      k.tolerance16(3e-2,
                    "two GEMMs and a GELU over a few elements each: the 16-bit rounding of the hidden "
                    "activation is not averaged out (as linear_gelu's transposed case)");
  return c;
}

}  // namespace forge::testing
