// Tensor core: creation, storage sharing, views, contiguity, allocator, RNG, devices.
#include <gtest/gtest.h>

#include <cstdint>

#include "forge/forge.h"
#include "testing/tensor_testing.h"

namespace forge {
namespace {

using forge::testing::error_of;
using forge::testing::seq;
using forge::testing::vals;

using namespace forge::ops;

TEST(Device, ParseAndPrint) {
  EXPECT_EQ(Device::parse("cpu"), Device::cpu());
  EXPECT_EQ(Device::parse("cuda"), Device::cuda(0));
  EXPECT_EQ(Device::parse("cuda:3"), Device::cuda(3));
  EXPECT_EQ(Device::cuda(2).str(), "cuda:2");
  EXPECT_THROW(Device::parse("gpu"), Error);
  EXPECT_THROW(Device::parse("cuda:x"), Error);
}

TEST(Creation, FillsAndShapes) {
  Tensor z = zeros({2, 3});
  EXPECT_EQ(z.shape(), (Shape{2, 3}));
  EXPECT_EQ(z.strides(), (Strides{3, 1}));
  EXPECT_EQ(z.dtype(), DType::f32);
  EXPECT_EQ(vals(z), std::vector<double>(6, 0.0));
  EXPECT_EQ(vals(ones({2}, {.dtype = DType::bf16})), (std::vector<double>{1, 1}));
  EXPECT_EQ(vals(full({3}, 2.5, {.dtype = DType::f64})), (std::vector<double>{2.5, 2.5, 2.5}));
  Tensor a = arange(5);
  EXPECT_EQ(a.dtype(), DType::i64);
  EXPECT_EQ(vals(a), (std::vector<double>{0, 1, 2, 3, 4}));
  EXPECT_EQ(vals(arange(1.0, 2.0, 0.25, {.dtype = DType::f64})), (std::vector<double>{1, 1.25, 1.5, 1.75}));
  EXPECT_EQ(arange(0.0, 1.0, 0.3, {.dtype = DType::f32}).numel(), 4);  // ceil(1/0.3)
  EXPECT_EQ(scalar_tensor(4.0).dim(), 0);
  EXPECT_EQ(scalar_tensor(4.0).item(), 4.0);
  EXPECT_THROW(zeros({2, -1}), Error);
  EXPECT_THROW(arange(0.0, 1.0, -1.0), Error);
}

TEST(Creation, FromVectorConvertsAndChecksSize) {
  Tensor t = from_vector<int32_t>({1, 2, 3, 4}, {2, 2}, {.dtype = DType::f64});
  EXPECT_EQ(t.dtype(), DType::f64);
  EXPECT_EQ(vals(t), (std::vector<double>{1, 2, 3, 4}));
  try {
    from_vector<float>({1, 2, 3}, {2, 2});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 2]"), std::string::npos) << e.what();
  }
}

TEST(Creation, EmptyInTheMemoryOrderOfAnotherTensor) {
  const Tensor like = empty({2, 5, 3, 4}).transpose(1, 2);  // (2, 3, 5, 4) over (2, 5, 3, 4) memory
  const Tensor t = empty_in_order_of(like, {2, 3, 5, 8});
  EXPECT_EQ(t.shape(), (Shape{2, 3, 5, 8}));
  EXPECT_TRUE(t.transpose(1, 2).is_contiguous());
  EXPECT_TRUE(empty_in_order_of(empty({3, 4}), {3, 4}).is_contiguous());
  EXPECT_THROW(empty_in_order_of(like, {2, 3}), Error);
}

TEST(Allocator, CpuAlignsTo64BytesAndCounts) {
  const auto before = cpu_memory_stats().allocated;
  {
    Tensor a = empty({3}, {.dtype = DType::u8});
    Tensor b = empty({1000});
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data_ptr()) % 64, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data_ptr()) % 64, 0u);
    EXPECT_GE(cpu_memory_stats().allocated - before, 4003);
  }
  EXPECT_EQ(cpu_memory_stats().allocated, before);
}

TEST(Rng, SameSeedSameNumbersAndStreamsAdvance) {
  Generator g1(42), g2(42);
  Tensor a = randn({1000}, {}, &g1);
  Tensor b = randn({1000}, {}, &g2);
  EXPECT_EQ(vals(a), vals(b));
  Tensor c = randn({1000}, {}, &g1);
  EXPECT_NE(vals(a), vals(c));
  // mean ~ 0, var ~ 1 for normals; uniform in [0, 1)
  double s = 0, s2 = 0;
  for (double v : vals(randn({100000}, {.dtype = DType::f64}, &g1))) {
    s += v;
    s2 += v * v;
  }
  EXPECT_NEAR(s / 100000, 0.0, 0.02);
  EXPECT_NEAR(s2 / 100000, 1.0, 0.02);
  for (double v : vals(rand({10000}, {}, &g1))) {
    EXPECT_GE(v, 0.0);
    EXPECT_LT(v, 1.0);
  }
}

TEST(Rng, StreamDoesNotDependOnDtypeOrSplitting) {
  // Note [RNG streams]: element i depends only on (seed, offset + i / 4).
  Generator g1(7), g2(7);
  Tensor whole = rand({12}, {.dtype = DType::f64}, &g1);
  Tensor first = rand({8}, {.dtype = DType::f32}, &g2);  // 8 elements = 2 blocks
  Tensor rest = rand({4}, {.dtype = DType::f64}, &g2);
  std::vector<double> w = vals(whole), f = vals(first), r = vals(rest);
  for (int i = 0; i < 8; ++i) EXPECT_FLOAT_EQ(static_cast<float>(w[i]), static_cast<float>(f[i]));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(w[8 + i], r[i]);
}

TEST(Rng, RandintInRange) {
  Generator g(3);
  Tensor t = randint(-5, 5, {10000}, {.dtype = DType::i64}, &g);
  std::vector<int64_t> v = t.to_vector<int64_t>();
  int64_t lo = 100, hi = -100;
  for (auto x : v) {
    lo = std::min(lo, x);
    hi = std::max(hi, x);
  }
  EXPECT_EQ(lo, -5);
  EXPECT_EQ(hi, 4);
}

TEST(Views, ShareStorageAndWriteThrough) {
  Tensor base = arange(0.0, 12.0, 1.0, {.dtype = DType::f32});
  Tensor m = base.view({3, 4});
  Tensor t = m.transpose(0, 1);
  EXPECT_EQ(t.storage(), base.storage());
  EXPECT_EQ(t.shape(), (Shape{4, 3}));
  EXPECT_EQ(t.strides(), (Strides{1, 4}));
  EXPECT_FALSE(t.is_contiguous());
  Tensor row = m.select(0, 1);  // [4, 5, 6, 7]
  row.fill_(-1.0);
  EXPECT_EQ(vals(base)[4], -1.0);
  EXPECT_EQ(vals(base)[7], -1.0);
  EXPECT_EQ(vals(base)[8], 8.0);
  Tensor col = m.narrow(1, 2, 1);  // column 2
  EXPECT_EQ(col.shape(), (Shape{3, 1}));
  EXPECT_EQ(vals(col), (std::vector<double>{2, -1, 10}));
}

TEST(Views, ReshapeViewsWhenPossibleCopiesOtherwise) {
  Tensor a = arange(0.0, 24.0, 1.0, {.dtype = DType::f32}).view({2, 3, 4});
  Tensor r = a.reshape({6, 4});
  EXPECT_EQ(r.storage(), a.storage());
  Tensor p = a.permute({0, 2, 1});  // (2, 4, 3), non-contiguous
  Tensor merged = p.reshape({2, 12});
  EXPECT_NE(merged.storage(), a.storage());  // had to copy
  EXPECT_EQ(vals(merged)[1], 4.0);           // p[0][0][1] = a[0][1][0]
  // splitting a dim of a transposed tensor is still a view
  Tensor t = a.transpose(1, 2);  // (2, 4, 3)
  Tensor split = t.reshape({2, 2, 2, 3});
  EXPECT_EQ(split.storage(), a.storage());
  EXPECT_EQ(vals(split), vals(t.contiguous()));
  EXPECT_THROW(p.view({2, 12}), Error);
  EXPECT_EQ(a.reshape({-1}).shape(), (Shape{24}));
  EXPECT_EQ(a.reshape({4, -1}).shape(), (Shape{4, 6}));
  EXPECT_THROW(a.reshape({5, -1}), Error);
  EXPECT_THROW(a.reshape({-1, -1}), Error);
}

TEST(Views, SliceWithStepAndNegativeBounds) {
  Tensor a = arange(0.0, 10.0, 1.0, {.dtype = DType::f64});
  EXPECT_EQ(vals(a.slice(0, 1, 8, 3)), (std::vector<double>{1, 4, 7}));
  EXPECT_EQ(vals(a.slice(0, -3, 100)), (std::vector<double>{7, 8, 9}));
  EXPECT_EQ(a.slice(0, 5, 2).numel(), 0);
  EXPECT_THROW(a.narrow(0, 8, 3), Error);
  EXPECT_THROW(a.select(0, 10), Error);
  EXPECT_EQ(a.select(0, -1).item(), 9.0);
}

TEST(Views, ExpandSqueezeUnsqueezeFollowPyTorch) {
  Tensor a = from_vector<float>({1, 2, 3}, {3, 1});
  Tensor e = a.expand({2, 3, 4});
  EXPECT_EQ(e.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(e.strides(), (Strides{0, 1, 0}));
  EXPECT_EQ(vals(e)[4], 2.0);
  EXPECT_EQ(a.expand({-1, 5}).shape(), (Shape{3, 5}));
  EXPECT_THROW(a.expand({2, 4}), Error);
  EXPECT_EQ(a.unsqueeze(0).shape(), (Shape{1, 3, 1}));
  EXPECT_EQ(a.unsqueeze(-1).shape(), (Shape{3, 1, 1}));
  EXPECT_EQ(a.squeeze().shape(), (Shape{3}));
  EXPECT_EQ(a.squeeze(0).shape(), (Shape{3, 1}));  // size 3: unchanged, as PyTorch
  EXPECT_EQ(a.flatten().shape(), (Shape{3}));
  EXPECT_EQ(zeros({2, 3, 4}).flatten(1).shape(), (Shape{2, 12}));
}

TEST(Copies, ContiguousCloneAndCrossDtypeCopy) {
  Tensor a = arange(0.0, 6.0, 1.0, {.dtype = DType::f32}).view({2, 3});
  EXPECT_TRUE(a.contiguous().is_same(a));
  Tensor t = a.t();
  Tensor c = t.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(vals(c), (std::vector<double>{0, 3, 1, 4, 2, 5}));
  Tensor d = zeros({3, 2}, {.dtype = DType::f64});
  d.copy_(t);
  EXPECT_EQ(vals(d), vals(c));
  Tensor bcast = zeros({2, 3}, {.dtype = DType::i32});
  bcast.copy_(from_vector<float>({1.9f, 2.0f, -3.5f}, {3}));
  EXPECT_EQ(bcast.to_vector<int32_t>(), (std::vector<int32_t>{1, 2, -3, 1, 2, -3}));
  Tensor cl = a.clone();
  cl.fill_(7.0);
  EXPECT_EQ(vals(a)[0], 0.0);
}

TEST(Devices, CudaWithoutSupportOrGpuIsAClearError) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a GPU is present";
  try {
    zeros({2}, {.device = Device::cuda(0)});
    FAIL() << "expected forge::Error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_TRUE(m.find("CUDA") != std::string::npos || m.find("cuda") != std::string::npos) << m;
  }
}

TEST(Errors, UndefinedTensorAndDataTypeMismatch) {
  Tensor u;
  EXPECT_FALSE(u.defined());
  EXPECT_THROW(u.shape(), Error);
  Tensor f = zeros({2});
  EXPECT_THROW(f.data<double>(), Error);
  EXPECT_THROW(zeros({2, 2}).item(), Error);
}

}  // namespace
}  // namespace forge

namespace forge {
namespace {

TEST(Copies, TransposingCopiesMatchElementwiseReference) {
  // Exercises the tiled transpose path (unit stride on a non-last dim) for several
  // element sizes, ragged tile edges and batch dims.
  Generator g(11);
  for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::u8}) {
    Tensor base = ops::to(ops::mul(randn({3, 45, 70}, {.dtype = DType::f64}, &g), 50.0), dt);
    for (auto perm : std::vector<std::vector<int64_t>>{{0, 2, 1}, {2, 1, 0}, {1, 2, 0}}) {
      Tensor p = base.permute(perm);
      Tensor c = p.contiguous();
      ASSERT_TRUE(c.is_contiguous());
      // reference: element-by-element through to_vector of the strided view in f64
      std::vector<double> want = p.to(DType::f64).to_vector<double>();
      EXPECT_EQ(c.to_vector<double>(), want) << dtype_name(dt);
    }
  }
}

}  // namespace
}  // namespace forge

namespace forge {
namespace {

// Tensor::set_grad_buffer: the first accumulation overwrites the (stale) buffer in place, later
// ones add; a plain set_grad clears the mode.
TEST(GradBuffer, FirstAccumulationOverwritesTheBufferLaterOnesAdd) {
  Generator g(3);
  Tensor x = randn({5}, {}, &g).requires_grad_();
  Tensor buffer = full({5}, 7.0);
  x.set_grad_buffer(buffer);
  EXPECT_TRUE(x.grad_buffer_pending());
  (x * 2.0).sum().backward();
  EXPECT_FALSE(x.grad_buffer_pending());
  EXPECT_TRUE(x.grad().storage() == buffer.storage()) << "accumulated into the buffer itself";
  EXPECT_EQ(buffer.to_vector<float>(), std::vector<float>(5, 2.0f));
  (x * 3.0).sum().backward();
  EXPECT_EQ(buffer.to_vector<float>(), std::vector<float>(5, 5.0f));
  x.set_grad_buffer(buffer);
  x.set_grad(Tensor());
  EXPECT_FALSE(x.grad_buffer_pending());
}

// Note [released storage]: the memory goes, the object and every view over it stay; reading
// is refused with a message naming the cause until reallocate().
TEST(ReleasedStorage, ViewsSurviveReadsAreRefusedUntilReallocated) {
  Generator g(5);
  Tensor base = randn({4, 3}, {}, &g);
  Tensor view = base.narrow(0, 1, 2);
  const int64_t live = cpu_memory_stats().allocated;
  const uint64_t version = base.storage()->version();
  base.storage()->release();
  EXPECT_TRUE(view.storage()->is_released());
  EXPECT_EQ(cpu_memory_stats().allocated, live - static_cast<int64_t>(base.nbytes()));
  EXPECT_EQ(view.shape(), (Shape{2, 3}));  // metadata still there
  const std::string msg = forge::testing::error_of([&] { (void)view.to_vector<float>(); });
  EXPECT_NE(msg.find("is read while its memory is released"), std::string::npos) << msg;
  base.storage()->release();  // idempotent
  base.storage()->reallocate();
  EXPECT_FALSE(base.storage()->is_released());
  Tensor src = randn({4, 3}, {}, &g);
  base.copy_(src);
  EXPECT_EQ(view.to_vector<float>(), src.narrow(0, 1, 2).to_vector<float>());
  EXPECT_EQ(base.storage()->version(), version + 1) << "only the copy_ bumps the version";
}

}  // namespace
}  // namespace forge
