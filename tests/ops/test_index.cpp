// index_select / gather / scatter_add: exact examples, index dtypes, strided inputs,
// accumulation of repeated indices (also under OpenMP), gradients and errors.
#include <gtest/gtest.h>

#include <functional>

#include "forge/forge.h"
#include "testing/tensor_testing.h"

namespace forge {
namespace {

using forge::testing::error_of;
using forge::testing::seq;
using forge::testing::vals;

using namespace forge::ops;

Tensor idx(std::vector<int64_t> v, Shape s, DType dt = DType::i64) { return from_vector<int64_t>(v, s, {.dtype = dt}); }

void expect_contains(const std::string& m, std::initializer_list<const char*> parts) {
  for (const char* p : parts) EXPECT_NE(m.find(p), std::string::npos) << "missing '" << p << "' in: " << m;
}

TEST(IndexSelect, RowsAndColumns) {
  Tensor x = seq(0, {4, 3});
  Tensor r = index_select(x, 0, idx({3, 0, 3}, {3}));
  EXPECT_EQ(r.shape(), (Shape{3, 3}));
  EXPECT_EQ(vals(r), (std::vector<double>{9, 10, 11, 0, 1, 2, 9, 10, 11}));
  Tensor c = index_select(x, -1, idx({2, 0}, {2}, DType::i32));
  EXPECT_EQ(c.shape(), (Shape{4, 2}));
  EXPECT_EQ(vals(c), (std::vector<double>{2, 0, 5, 3, 8, 6, 11, 9}));
  // Transposed input (non-contiguous inner block) and a strided index.
  Tensor t = x.t();  // (3, 4)
  EXPECT_EQ(vals(index_select(t, 0, idx({1, 1}, {2}))), (std::vector<double>{1, 4, 7, 10, 1, 4, 7, 10}));
  Tensor sparse_index = idx({2, -1, 0, -1}, {4}).slice(0, 0, 4, 2);  // {2, 0}, stride 2
  EXPECT_EQ(vals(index_select(x, 1, sparse_index)), vals(c));
  // 0-d index keeps the dim with size 1; integer inputs work too.
  EXPECT_EQ(index_select(x, 0, scalar_tensor(1, {.dtype = DType::i64})).shape(), (Shape{1, 3}));
  Tensor xi = x.to(DType::i64);
  EXPECT_EQ(index_select(xi, 0, idx({1}, {1})).to_vector<int64_t>(), (std::vector<int64_t>{3, 4, 5}));
  EXPECT_EQ(index_select(x, 0, idx({}, {0})).shape(), (Shape{0, 3}));
}

TEST(IndexSelect, LargeMatchesReference) {
  // An embedding-sized lookup: the parallel path with memcpy'd rows.
  Generator g(3);
  Tensor table = randn({100, 64}, {.dtype = DType::f32}, &g);
  Tensor ids = randint(0, 100, {3000}, {.dtype = DType::i64}, &g);
  Tensor out = index_select(table, 0, ids);
  const std::vector<float> tv = table.to_vector<float>(), ov = out.to_vector<float>();
  const std::vector<int64_t> iv = ids.to_vector<int64_t>();
  bool same = true;
  for (size_t r = 0; r < iv.size(); ++r)
    for (size_t c = 0; c < 64; ++c) same &= ov[r * 64 + c] == tv[static_cast<size_t>(iv[r]) * 64 + c];
  EXPECT_TRUE(same);
}

TEST(IndexSelect, GradientAccumulatesRepeatedIndices) {
  Tensor x = seq(0, {3, 2}).requires_grad_();
  index_select(x, 0, idx({0, 0, 2, 0}, {4})).sum().backward();
  EXPECT_EQ(vals(x.grad()), (std::vector<double>{3, 3, 0, 0, 1, 1}));
}

TEST(IndexSelect, Errors) {
  Tensor x = seq(0, {5, 3});
  expect_contains(error_of([&] { index_select(x, 0, idx({1, 5}, {2})); }),
                  {"index_select", "index 5", "dim 0", "size 5"});
  expect_contains(error_of([&] { index_select(x, 1, idx({-1}, {1})); }),
                  {"index_select", "index -1", "dim 1", "size 3"});
  expect_contains(error_of([&] { index_select(x, 0, from_vector<float>({0.f}, {1})); }),
                  {"index_select", "i64", "f32", "[5, 3]"});
  expect_contains(error_of([&] { index_select(x, 0, idx({0, 1}, {1, 2})); }), {"index_select", "[1, 2]"});
  EXPECT_THROW(index_select(x, 2, idx({0}, {1})), Error);
}

TEST(IndexGather, TorchDocExample) {
  Tensor t = from_vector<double>({1, 2, 3, 4}, {2, 2});
  Tensor r = gather(t, 1, idx({0, 0, 1, 0}, {2, 2}));
  EXPECT_EQ(vals(r), (std::vector<double>{1, 1, 4, 3}));
  // Along dim 0 with an index longer on dim 0 and narrower on dim 1, i32.
  Tensor x = seq(0, {3, 4});
  Tensor g0 = gather(x, 0, idx({2, 0, 1, 1, 0, 2}, {3, 2}, DType::i32));
  EXPECT_EQ(g0.shape(), (Shape{3, 2}));
  EXPECT_EQ(vals(g0), (std::vector<double>{8, 1, 4, 5, 0, 9}));
  // Transposed input.
  Tensor t2 = x.t();  // (4, 3): t2[i][j] = x[j][i]
  EXPECT_EQ(vals(gather(t2, 1, idx({2, 0, 1, 1}, {4, 1}))), (std::vector<double>{8, 1, 6, 7}));
}

TEST(IndexGather, GradientAccumulates) {
  Tensor x = seq(0, {2, 3}).requires_grad_();
  gather(x, 1, idx({2, 2, 0, 1, 1, 1}, {2, 3})).sum().backward();
  EXPECT_EQ(vals(x.grad()), (std::vector<double>{1, 0, 2, 0, 3, 0}));
}

TEST(IndexGather, Errors) {
  Tensor x = seq(0, {3, 4});
  expect_contains(error_of([&] { gather(x, 1, idx({0, 4}, {1, 2})); }), {"gather", "index 4", "dim 1", "size 4"});
  expect_contains(error_of([&] { gather(x, 1, idx({0, 1}, {2})); }), {"gather", "[2]", "[3, 4]"});
  expect_contains(error_of([&] { gather(x, 1, idx({0, 0, 0, 0}, {4, 1})); }), {"gather", "[4, 1]", "[3, 4]"});
  expect_contains(error_of([&] { gather(x, 0, from_vector<uint8_t>({0}, {1, 1}).to(DType::u8)); }),
                  {"gather", "u8"});
}

TEST(IndexScatterAdd, TorchDocExample) {
  Tensor src = ones({2, 5}, {.dtype = DType::f64});
  Tensor index = idx({0, 1, 2, 0, 0, 0, 1, 2, 2, 2}, {2, 5});
  Tensor r = scatter_add(zeros({3, 5}, {.dtype = DType::f64}), 0, index, src);
  EXPECT_EQ(vals(r), (std::vector<double>{2, 0, 0, 1, 1, 0, 2, 0, 0, 0, 0, 0, 2, 1, 1}));
  // Only index's extent of src is read; x is not modified.
  Tensor x = seq(0, {2, 3});
  Tensor s = seq(100, {2, 4});
  Tensor r1 = scatter_add(x, 1, idx({2, 2, 0}, {1, 3}, DType::i32), s);
  EXPECT_EQ(vals(r1), (std::vector<double>{102, 1, 203, 3, 4, 5}));
  EXPECT_EQ(vals(x), (std::vector<double>{0, 1, 2, 3, 4, 5}));
  // bf16 accumulates.
  Tensor h = scatter_add(zeros({2}, {.dtype = DType::bf16}), 0, idx({1, 1, 1}, {3}), ones({3}, {.dtype = DType::bf16}));
  EXPECT_EQ(vals(h), (std::vector<double>{0, 3}));
}

// Many collisions on a problem big enough for the parallel path, along either dim.
TEST(IndexScatterAdd, ParallelAccumulationMatchesSerial) {
  Generator g(7);
  for (int64_t dim : {0, 1}) {
    const Shape is = dim == 0 ? Shape{4096, 32} : Shape{32, 4096};
    const Shape xs = dim == 0 ? Shape{5, 32} : Shape{32, 5};
    Tensor index = randint(0, 5, is, {.dtype = DType::i64}, &g);
    Tensor src = randint(-3, 4, is, {.dtype = DType::i64}, &g);
    Tensor r = scatter_add(zeros(xs, {.dtype = DType::i64}), dim, index, src);
    std::vector<int64_t> ref(static_cast<size_t>(shape_numel(xs)), 0);
    const std::vector<int64_t> iv = index.to_vector<int64_t>(), sv = src.to_vector<int64_t>();
    for (int64_t a = 0; a < is[0]; ++a)
      for (int64_t b = 0; b < is[1]; ++b) {
        const size_t p = static_cast<size_t>(a * is[1] + b);
        const int64_t row = dim == 0 ? iv[p] : a, col = dim == 0 ? b : iv[p];
        ref[static_cast<size_t>(row * xs[1] + col)] += sv[p];
      }
    EXPECT_EQ(r.to_vector<int64_t>(), ref) << "dim " << dim;
    // Floating point: the same sums (small integers are exact in f64).
    Tensor rf = scatter_add(zeros(xs, {.dtype = DType::f64}), dim, index, src.to(DType::f64));
    std::vector<double> reff(ref.begin(), ref.end());
    EXPECT_EQ(vals(rf), reff) << "dim " << dim;
  }
}

TEST(IndexScatterAdd, Gradients) {
  Tensor x = seq(0, {2, 3}).requires_grad_();
  Tensor src = seq(0, {2, 2}).requires_grad_();
  Tensor w = seq(1, {2, 3});
  mul(scatter_add(x, 1, idx({1, 1, 2, 0}, {2, 2}), src), w).sum().backward();
  EXPECT_EQ(vals(x.grad()), vals(w));
  // grad_src[i][j] = w[i][index[i][j]]
  EXPECT_EQ(vals(src.grad()), (std::vector<double>{2, 2, 6, 4}));
}

TEST(IndexScatterAdd, Errors) {
  Tensor x = zeros({3, 4}, {.dtype = DType::f64});
  Tensor s = ones({2, 4}, {.dtype = DType::f64});
  expect_contains(error_of([&] { scatter_add(x, 0, idx({0, 3}, {1, 2}), s); }),
                  {"scatter_add", "index 3", "dim 0", "size 3"});
  expect_contains(error_of([&] { scatter_add(x, 0, idx({0, 1}, {1, 2}), ones({1, 2})); }),
                  {"scatter_add", "f32", "f64"});
  expect_contains(error_of([&] { scatter_add(x, 0, idx({0, 0, 0, 0, 0, 0}, {3, 2}), s); }),
                  {"scatter_add", "[3, 2]", "[2, 4]"});
  Tensor s5 = ones({1, 5}, {.dtype = DType::f64});
  expect_contains(error_of([&] { scatter_add(x, 0, idx({0, 0, 0, 0, 0}, {1, 5}), s5); }),
                  {"scatter_add", "[1, 5]", "[3, 4]"});
  expect_contains(error_of([&] { scatter_add(x, 0, idx({0}, {1}), s); }), {"scatter_add", "[1]", "[3, 4]"});
}

}  // namespace
}  // namespace forge
