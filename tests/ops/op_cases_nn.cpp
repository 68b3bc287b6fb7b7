// Op-table cases for the neural-network ops: embedding (repeated ids, i32/i64, any ids
// shape, non-contiguous weights), layer_norm / add_layer_norm / rms_norm / add_rms_norm (2-D and 3-D, with and
// without weight/bias, non-contiguous inputs, one feature), dropout (a fixed Generator seeded inside
// the function, so every evaluation draws the same mask, on either device: Note [RNG streams]) and cross_entropy
// (mean/sum/none, ignore_index present or custom, (N, V) and (B, T, V), non-contiguous and shifted logits).
#include <string>
#include <vector>

#include "testing/op_table.h"

namespace forge::testing {
namespace {

Input ids_i64(std::vector<int64_t> v, const Shape& s) { return ids(std::move(v), s, DType::i64); }
Input ids_i32(std::vector<int64_t> v, const Shape& s) { return ids(std::move(v), s, DType::i32); }

void embedding_cases(std::vector<OpCase>& c) {
  using ops::embedding;
  struct Row {
    const char* label;
    Input weight, ids;
  };
  const Row rows[] = {
      {"[5,3] weight, ids [6] with repeats (1 three times)", real({5, 3}, 41), ids_i64({1, 3, 1, 4, 0, 1}, {6})},
      {"[6,4] weight, ids [2,3] i32 with repeats", real({6, 4}, 42), ids_i32({5, 0, 5, 2, 2, 5}, {2, 3})},
      {"[4,2] weight, 0-d id", real({4, 2}, 43), ids_i64({3}, {})},
      {"[3,5] weight, every id the same, ids [2,2,2]", real({3, 5}, 44), ids_i64({2, 2, 2, 2, 2, 2, 2, 2}, {2, 2, 2})},
      {"transposed [7,3] weight", real({7, 3}, 45).transposed(), ids_i64({6, 0, 3, 6}, {4})},
      {"strided [5,4] weight, ids [2,3]", real({5, 4}, 46).strided(), ids_i32({4, 4, 1, 0, 3, 4}, {2, 3})},
  };
  for (const Row& r : rows)
    c.push_back(
        {"embedding", r.label, {r.weight, r.ids}, [](const TensorList& in) { return embedding(in[0], in[1]); }});
}

void norm_cases(std::vector<OpCase>& c) {
  using ops::layer_norm;
  using ops::rms_norm;
  auto xwb = [](Shape x, uint64_t seed) {
    const int64_t C = x.back();
    return std::vector<Input>{real(x, seed), real({C}, seed + 1), real({C}, seed + 2)};
  };
  // layer_norm: inputs (x, weight, bias); a missing one is passed as an undefined Tensor.
  auto ln = [](const TensorList& in) { return layer_norm(in[0], in[1], in[2]); };
  c.push_back({"layer_norm", "[4,6] with weight and bias", xwb({4, 6}, 51), ln});
  c.push_back({"layer_norm", "[2,3,5] (B, T, C) with weight and bias", xwb({2, 3, 5}, 52), ln});
  c.push_back({"layer_norm", "[7] 1-D with weight and bias", xwb({7}, 53), ln});
  c.push_back({"layer_norm", "[3,4] without weight and bias", {real({3, 4}, 54)}, [](const TensorList& in) {
                 return layer_norm(in[0]);
               }});
  c.push_back({"layer_norm", "[3,4] weight only", {real({3, 4}, 55), real({4}, 56)}, [](const TensorList& in) {
                 return layer_norm(in[0], in[1], Tensor());
               }});
  c.push_back({"layer_norm", "[2,2,3] bias only", {real({2, 2, 3}, 57), real({3}, 58)}, [](const TensorList& in) {
                 return layer_norm(in[0], Tensor(), in[1]);
               }});
  c.push_back({"layer_norm",
               "transposed [5,4] x with weight and bias",
               {real({5, 4}, 59).transposed(), real({4}, 60), real({4}, 61)},
               ln});
  c.push_back({"layer_norm",
               "strided [3,5] x, strided weight",
               {real({3, 5}, 62).strided(), real({5}, 63).strided(), real({5}, 64)},
               ln});
  c.push_back({"layer_norm", "[3,1] one feature (y = bias)", xwb({3, 1}, 65), ln});
  c.push_back({"layer_norm", "[4,6] eps 0.1", xwb({4, 6}, 66),
               [](const TensorList& in) { return layer_norm(in[0], in[1], in[2], 0.1); }});
  c.push_back({"layer_norm",
               "[3,4] x only requires grad (weight and bias constants)",
               {real({3, 4}, 67), real({4}, 68).constant(), real({4}, 69).constant()},
               ln});

  // add_layer_norm: inputs (x, residual, weight, bias); both outputs are checked at once by
  // stacking them, so every element of h and of y gets its own random weight in the check.
  auto aln = [](const TensorList& in) {
    const ops::AddLayerNorm r = ops::add_layer_norm(in[0], in[1], in[2], in[3]);
    return ops::stack({r.h, r.y});
  };
  auto xrwb = [](Shape x, uint64_t seed) {
    const int64_t C = x.back();
    return std::vector<Input>{real(x, seed), real(x, seed + 1), real({C}, seed + 2), real({C}, seed + 3)};
  };
  c.push_back({"add_layer_norm", "[4,6] h and y, with weight and bias", xrwb({4, 6}, 90), aln});
  c.push_back({"add_layer_norm", "[2,3,5] (B, T, C) h and y", xrwb({2, 3, 5}, 94), aln});
  c.push_back({"add_layer_norm",
               "transposed [5,4] x, strided residual",
               {real({5, 4}, 98).transposed(), real({5, 4}, 99).strided(), real({4}, 100), real({4}, 101)},
               aln});
  c.push_back({"add_layer_norm",
               "[3,4] y only, no weight or bias",
               {real({3, 4}, 102), real({3, 4}, 103)},
               [](const TensorList& in) { return ops::add_layer_norm(in[0], in[1]).y; }});
  c.push_back({"add_layer_norm", "[3,5] h used again: y + h * h (gradients into h summed)", xrwb({3, 5}, 104),
               [](const TensorList& in) {
                 const ops::AddLayerNorm r = ops::add_layer_norm(in[0], in[1], in[2], in[3], 0.1);
                 return ops::add(r.y, ops::mul(r.h, r.h));
               }});
  c.back().tolerance16(2e-2,
                       "the gradient into h sums the norm's dx and 2 h g over 15 elements: little averaging "
                       "(0.9% on the CPU's own bf16 path)");

  // rms_norm: inputs (x, weight).
  auto xw = [](Shape x, uint64_t seed) { return std::vector<Input>{real(x, seed), real({x.back()}, seed + 1)}; };
  auto rn = [](const TensorList& in) { return rms_norm(in[0], in[1]); };
  c.push_back({"rms_norm", "[4,6] with weight", xw({4, 6}, 71), rn});
  c.push_back({"rms_norm", "[2,3,5] (B, T, C) with weight", xw({2, 3, 5}, 72), rn});
  c.push_back({"rms_norm", "[6] 1-D with weight", xw({6}, 73), rn});
  c.push_back(
      {"rms_norm", "[3,4] without weight", {real({3, 4}, 74)}, [](const TensorList& in) { return rms_norm(in[0]); }});
  c.push_back({"rms_norm", "transposed [5,3] x with weight", {real({5, 3}, 75).transposed(), real({3}, 76)}, rn});
  c.push_back({"rms_norm", "strided [3,4] x and weight", {real({3, 4}, 77).strided(), real({4}, 78).strided()}, rn});
  // One feature: dx = w dy eps / (x^2 + eps)^(3/2), nearly all cancellation at the default eps
  // (1e-5), so the CUDA-vs-CPU comparison would measure rounding noise; eps 0.5 keeps it a value.
  c.push_back({"rms_norm", "[3,1] one feature, eps 0.5", xw({3, 1}, 79),
               [](const TensorList& in) { return rms_norm(in[0], in[1], 0.5); }});
  c.push_back(
      {"rms_norm", "[4,5] eps 0.5", xw({4, 5}, 80), [](const TensorList& in) { return rms_norm(in[0], in[1], 0.5); }});

  // add_rms_norm: inputs (x, residual, weight); h and y checked at once, as add_layer_norm.
  auto arn = [](const TensorList& in) {
    const ops::AddRmsNorm r = ops::add_rms_norm(in[0], in[1], in[2], 0.5);
    return ops::stack({r.h, r.y});
  };
  auto xrw = [](Shape x, uint64_t seed) {
    return std::vector<Input>{real(x, seed), real(x, seed + 1), real({x.back()}, seed + 2)};
  };
  c.push_back({"add_rms_norm", "[4,6] h and y, with weight, eps 0.5", xrw({4, 6}, 110), arn});
  c.push_back({"add_rms_norm", "[2,3,5] (B, T, C) h and y", xrw({2, 3, 5}, 113), arn});
  c.push_back({"add_rms_norm",
               "transposed [5,4] x, strided residual",
               {real({5, 4}, 116).transposed(), real({5, 4}, 117).strided(), real({4}, 118)},
               arn});
  c.push_back({"add_rms_norm",
               "[3,4] y only, no weight",
               {real({3, 4}, 119), real({3, 4}, 120)},
               [](const TensorList& in) { return ops::add_rms_norm(in[0], in[1], Tensor(), 0.5).y; }});
  c.push_back({"add_rms_norm", "[3,5] h used again: y + h * h (gradients into h summed)", xrw({3, 5}, 121),
               [](const TensorList& in) {
                 const ops::AddRmsNorm r = ops::add_rms_norm(in[0], in[1], in[2], 0.5);
                 return ops::add(r.y, ops::mul(r.h, r.h));
               }});
  c.back().tolerance16(2e-2, "as add_layer_norm's case: the gradient into h sums the norm's dx and 2 h g");
}

void dropout_cases(std::vector<OpCase>& c) {
  using ops::dropout;
  // The Generator is built inside the function: every evaluation (forward, +eps, -eps)
  // draws the same mask.
  auto drop = [](double p, uint64_t seed) {
    return [p, seed](const TensorList& in) {
      Generator gen(seed);
      return dropout(in[0], p, true, &gen);
    };
  };
  c.push_back({"dropout", "[4,5] p 0.3", {real({4, 5}, 81)}, drop(0.3, 7)});
  c.push_back({"dropout", "[2,3,4] p 0.5", {real({2, 3, 4}, 82)}, drop(0.5, 8)});
  c.push_back({"dropout", "[37] p 0.9 (length not a multiple of 4)", {real({37}, 83)}, drop(0.9, 9)});
  c.push_back({"dropout", "transposed [5,4] p 0.25", {real({5, 4}, 84).transposed()}, drop(0.25, 10)});
  c.push_back({"dropout", "strided [3,6] p 0.4", {real({3, 6}, 85).strided()}, drop(0.4, 11)});
  c.push_back({"dropout", "[3,4] p 0 (identity), times 2", {real({3, 4}, 86)}, [](const TensorList& in) {
                 return ops::mul(dropout(in[0], 0.0, true), 2.0);
               }});
  c.push_back({"dropout", "[3,4] eval mode (identity), times 2", {real({3, 4}, 87)}, [](const TensorList& in) {
                 return ops::mul(dropout(in[0], 0.5, false), 2.0);
               }});
}

void cross_entropy_cases(std::vector<OpCase>& c) {
  using ops::cross_entropy;
  using ops::Reduction;
  struct Row {
    const char* label;
    std::vector<Input> logits;
    Input targets;
    int64_t ignore_index;
    Reduction reduction;
  };
  auto one = [](Shape s, uint64_t seed) { return std::vector<Input>{real(s, seed)}; };
  const Row rows[] = {
      {"[4,5] mean", one({4, 5}, 91), ids_i64({1, 0, 4, 2}, {4}), -100, Reduction::mean},
      {"[4,5] sum", one({4, 5}, 92), ids_i64({3, 3, 0, 4}, {4}), -100, Reduction::sum},
      {"[4,5] none", one({4, 5}, 93), ids_i64({2, 1, 1, 0}, {4}), -100, Reduction::none},
      {"[2,3,5] (B, T, V) mean, ignore_index -100 present", one({2, 3, 5}, 94),
       ids_i64({4, -100, 0, 2, -100, 1}, {2, 3}), -100, Reduction::mean},
      {"[2,3,5] (B, T, V) none, ignore_index -100 present", one({2, 3, 5}, 95),
       ids_i64({-100, 3, 0, 2, 2, -100}, {2, 3}), -100, Reduction::none},
      {"[2,3,5] (B, T, V) sum, ignore_index -100 present", one({2, 3, 5}, 96), ids_i64({1, 1, -100, 4, 0, 3}, {2, 3}),
       -100, Reduction::sum},
      {"[5,4] mean, custom ignore_index 2 (a valid class)", one({5, 4}, 97), ids_i64({2, 0, 3, 2, 1}, {5}), 2,
       Reduction::mean},
      {"[3,6] mean, i32 targets", one({3, 6}, 98), ids_i32({5, 0, 2}, {3}), -100, Reduction::mean},
      {"transposed [5,4] mean", {real({5, 4}, 99).transposed()}, ids_i64({0, 3, 3, 1, 2}, {5}), -100, Reduction::mean},
      {"strided [3,6] none", {real({3, 6}, 100).strided()}, ids_i64({5, 1, 4}, {3}), -100, Reduction::none},
      {"[7] 1-D logits, 0-d target, mean", one({7}, 101), ids_i64({6}, {}), -100, Reduction::mean},
      {"[7] 1-D logits, 0-d target, none", one({7}, 102), ids_i64({0}, {}), -100, Reduction::none},
      {"[3,4] sum, every target ignored (zero gradient)", one({3, 4}, 103), ids_i64({-100, -100, -100}, {3}), -100,
       Reduction::sum},
  };
  for (const Row& r : rows) {
    const int64_t ii = r.ignore_index;
    const Reduction red = r.reduction;
    std::vector<Input> inputs = r.logits;
    inputs.push_back(r.targets);
    c.push_back({"cross_entropy", r.label, inputs,
                 [ii, red](const TensorList& in) { return cross_entropy(in[0], in[1], ii, red); }});
  }
  // Large logits: the row max keeps exp finite and the gradient correct.
  c.push_back(OpCase{"cross_entropy",
                     "[3,5] logits shifted by 500, mean",
                     {real({3, 5}, 104), ids_i64({4, 0, 2}, {3})},
                     [](const TensorList& in) { return cross_entropy(ops::add(in[0], 500.0), in[1]); }}
                  .gradcheck_tolerance(1e-6, 1e-6, 1e-5)
                  .dtypes({DType::f32}, "500 + x in 16 bits keeps 0-1 bits of x"));
}

}  // namespace

std::vector<OpCase> nn_cases() {
  std::vector<OpCase> c;
  embedding_cases(c);
  norm_cases(c);
  dropout_cases(c);
  cross_entropy_cases(c);
  return c;
}

}  // namespace forge::testing
