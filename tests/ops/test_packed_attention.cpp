// Packed documents on the CPU (Note [document masks] in ops/attention.h, Note [packed positions]
// in ops/rope.h): attention with document ids equals each document attended alone, values and
// gradients; rope at per-token positions equals rope of each token at its own offset; attention
// blocks (ring attention's pieces) take the ids too; bad ids and positions are refused by name.
// The op table adds f64 finite-difference checks of both (tests/ops/op_cases_attention.cpp).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "forge/autograd/grad_mode.h"
#include "forge/forge.h"
#include "forge/ops/attention.h"
#include "forge/ops/rope.h"
#include "testing/attention_blocks.h"
#include "testing/tensor_testing.h"

namespace forge {
namespace {

using attention_blocks_testing::max_rel;
using testing::error_of;

struct Span {
  int64_t start, length;
};

// (B, T) i32 ids of documents of the given lengths, row by row.
Tensor ids_of(const std::vector<std::vector<int64_t>>& lengths) {
  std::vector<int64_t> ids;
  int64_t T = -1;
  for (const auto& row : lengths) {
    int64_t n = 0, d = 0;
    for (int64_t len : row) {
      for (int64_t i = 0; i < len; ++i) ids.push_back(d);
      n += len;
      ++d;
    }
    if (T < 0) T = n;
    EXPECT_EQ(n, T) << "every row must hold T tokens";
  }
  return from_vector(ids, {static_cast<int64_t>(lengths.size()), T}).to(DType::i32);
}

TEST(PackedAttention, EachDocumentAttendsAsIfAlone) {
  const int64_t B = 2, H = 4, Hkv = 2, T = 13, D = 8;
  const std::vector<std::vector<int64_t>> lengths{{5, 1, 7}, {13}};
  Generator gen(11);
  const TensorOptions f64{.dtype = DType::f64};
  Tensor q = uniform({B, H, T, D}, -1, 1, f64, &gen).requires_grad_();
  Tensor k = uniform({B, Hkv, T, D}, -1, 1, f64, &gen).requires_grad_();
  Tensor v = uniform({B, Hkv, T, D}, -1, 1, f64, &gen).requires_grad_();
  const Tensor dout = uniform({B, H, T, D}, -1, 1, f64, &gen);
  const Tensor out = ops::scaled_dot_product_attention(q, k, v, true, 0.0, {}, ids_of(lengths));
  ops::sum(ops::mul(out, dout)).backward();
  for (int64_t b = 0; b < B; ++b) {
    int64_t start = 0;
    for (int64_t len : lengths[static_cast<size_t>(b)]) {
      auto cut = [&](const Tensor& t) { return ops::narrow(ops::narrow(t, 0, b, 1), 2, start, len).detach(); };
      Tensor qa = cut(q).contiguous().requires_grad_(), ka = cut(k).contiguous().requires_grad_();
      Tensor va = cut(v).contiguous().requires_grad_();
      const Tensor alone = ops::scaled_dot_product_attention(qa, ka, va, true);
      ops::sum(ops::mul(alone, cut(dout))).backward();
      const std::string what = "row " + std::to_string(b) + ", document at " + std::to_string(start);
      EXPECT_LE(max_rel(cut(out), alone.detach()), 1e-13) << what;
      EXPECT_LE(max_rel(cut(q.grad()), qa.grad()), 1e-13) << what << ": dq";
      EXPECT_LE(max_rel(cut(k.grad()), ka.grad()), 1e-13) << what << ": dk";
      EXPECT_LE(max_rel(cut(v.grad()), va.grad()), 1e-13) << what << ": dv";
      start += len;
    }
  }
}

TEST(PackedAttention, IdsEqualTheirDenseMask) {
  // f32 and bf16, grouped heads, T < S (the queries are the last T), causal and not.
  for (DType dtype : {DType::f32, DType::bf16})
    for (bool causal : {true, false}) {
      const int64_t B = 2, H = 4, Hkv = 1, T = 5, S = 9, D = 16;
      Generator gen(21);
      auto make = [&](const Shape& s) { return uniform(s, -1, 1, {.dtype = DType::f32}, &gen).to(dtype); };
      const Tensor q = make({B, H, T, D}), k = make({B, Hkv, S, D}), v = make({B, Hkv, S, D});
      const Tensor ids = from_vector(std::vector<int64_t>{7, 7, 2, 2, 2, 2, 9, 9, 9, /**/ 0, 1, 1, 1, 1, 1, 1, 4, 4},
                                     {B, S})
                             .to(DType::i32);
      const Tensor q_ids = ops::narrow(ids, 1, S - T, T);
      const Tensor mask = ops::eq(ops::reshape(q_ids, {B, 1, T, 1}), ops::reshape(ids, {B, 1, 1, S}));
      const Tensor a = ops::scaled_dot_product_attention(q, k, v, causal, 0.0, {}, ids);
      const Tensor m = ops::scaled_dot_product_attention(q, k, v, causal, 0.0, mask);
      EXPECT_EQ(max_rel(a, m), 0.0) << dtype_name(dtype) << (causal ? " causal" : "");
    }
}

TEST(PackedAttention, BlocksTakeDocumentIds) {
  // Documents across the two chunks of ring attention's pieces, and one inside each.
  attention_blocks_testing::check_blocks(Device::cpu(), DType::f64, 2, 4, 2, 6, 8, 1e-12, 31,
                                         {0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 3, 3});
  attention_blocks_testing::check_blocks(Device::cpu(), DType::f32, 1, 2, 1, 70, 16, 1e-5, 32,
                                         [] {
                                           std::vector<int64_t> d(140);
                                           for (int64_t t = 0; t < 140; ++t) d[static_cast<size_t>(t)] = t < 50 ? 0 : t < 100 ? 1 : 2;
                                           return d;
                                         }());
}

TEST(PackedAttention, BadIdsAreRefusedByName) {
  const Tensor q = ones({1, 2, 4, 8}), k = ones({1, 2, 4, 8}), v = ones({1, 2, 4, 8});
  const Tensor ids = zeros({1, 4}, {.dtype = DType::i32});
  EXPECT_NE(error_of([&] { ops::scaled_dot_product_attention(q, k, v, true, 0.0, {}, ids.to(DType::i64)); })
                .find("must be i32 of shape (1, 4)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ops::scaled_dot_product_attention(q, k, v, true, 0.0, {}, zeros({1, 3}, {.dtype = DType::i32})); })
                .find("documents (the keys' document ids) must be i32 of shape (1, 4)"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              ops::scaled_dot_product_attention(q, k, v, true, 0.0, ops::ne(zeros({4, 4}), 1.0), ids);
            }).find("a mask or document ids, not both"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ops::attention_block_forward(q, k, v, true, 0.0, ids, Tensor()); })
                .find("or neither"),
            std::string::npos);
}

TEST(PackedPositions, RopeAtPositionsEqualsRopeAtEachOffset) {
  const int64_t B = 2, H = 3, T = 6, D = 8;
  Generator gen(41);
  const Tensor x = uniform({B, H, T, D}, -1, 1, {.dtype = DType::f64}, &gen);
  const std::vector<int64_t> pos{0, 1, 2, 0, 1, 2, /**/ 4, 5, 0, 1, 2, 3};
  const ops::RopeScaling llama3{.factor = 8.0, .low_freq_factor = 1.0, .high_freq_factor = 4.0, .original_context = 4.0};
  for (const ops::RopeScaling& scaling : {ops::RopeScaling::none(), llama3}) {
    const Tensor y = ops::rope(x, from_vector(pos, {B, T}), 6, 500.0, scaling);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        auto cell = [&](const Tensor& a) { return ops::narrow(ops::narrow(a, 0, b, 1), 2, t, 1); };
        const Tensor want = ops::rope(cell(x), pos[static_cast<size_t>(b * T + t)], 500.0, scaling);
        EXPECT_EQ(max_rel(cell(y), want), 0.0) << "b " << b << " t " << t;
      }
  }
}

TEST(PackedPositions, PositionsOutsideTheLimitAreRefused) {
  const Tensor x = ones({1, 1, 3, 4});
  const std::string e = error_of([&] { ops::rope(x, from_vector(std::vector<int64_t>{0, 1, 3}, {1, 3}), 3); });
  EXPECT_NE(e.find("position 3 (index 2 of positions "), std::string::npos) << e;
  EXPECT_NE(e.find(") is outside [0, 3)"), std::string::npos) << e;
  EXPECT_NE(error_of([&] { ops::rope(x, from_vector(std::vector<int64_t>{0, -1, 0}, {1, 3}), 3); })
                .find("outside [0, 3)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ops::rope(x, from_vector(std::vector<int64_t>{0, 1}, {1, 2}), 3); })
                .find("positions must be i64 of shape (B, T) = (1, 3)"),
            std::string::npos);
}

}  // namespace
}  // namespace forge
