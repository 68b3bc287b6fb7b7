// Tensor::to_string() / operator<< against PyTorch's repr. Every expected string below is
// what torch 1.13 prints for the same values (`repr(torch.tensor(...))`), with torch's
// dtype names replaced by forge's (torch.float64 -> f64, ...) and MulBackward0 -> MulBackward.
#include <gtest/gtest.h>

#include <cmath>
#include <iomanip>
#include <limits>
#include <sstream>
#include <string>

#include "forge/forge.h"

namespace forge {
namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

Tensor f32(const std::vector<float>& v, const Shape& shape) { return from_vector(v, shape); }
Tensor f32(const std::vector<float>& v) { return from_vector(v, {static_cast<int64_t>(v.size())}); }
Tensor typed(const std::vector<double>& v, const Shape& shape, DType dt) { return from_vector(v, shape, {.dtype = dt}); }
Tensor typed(const std::vector<double>& v, DType dt) { return typed(v, {static_cast<int64_t>(v.size())}, dt); }

TEST(Print, Matrix) {
  EXPECT_EQ(f32({1, 2, 3, 4}, {2, 2}).to_string(), "tensor([[1., 2.],\n        [3., 4.]])");
  EXPECT_EQ(f32({-1.5f, 2.25f, 100.125f, -0.5f}, {2, 2}).to_string(),
            "tensor([[ -1.5000,   2.2500],\n"
            "        [100.1250,  -0.5000]])");
}

TEST(Print, Scalars) {
  EXPECT_EQ(scalar_tensor(3.5).to_string(), "tensor(3.5000)");
  EXPECT_EQ(scalar_tensor(0.0).to_string(), "tensor(0.)");
  EXPECT_EQ(scalar_tensor(std::nan("")).to_string(), "tensor(nan)");
  EXPECT_EQ(scalar_tensor(5, {.dtype = DType::i64}).to_string(), "tensor(5)");
  EXPECT_EQ(scalar_tensor(1, {.dtype = DType::boolean}).to_string(), "tensor(True)");
  EXPECT_EQ(scalar_tensor(-2, {.dtype = DType::i32}).to_string(), "tensor(-2, dtype=i32)");
}

TEST(Print, Empty) {
  EXPECT_EQ(empty({0}).to_string(), "tensor([])");
  EXPECT_EQ(zeros({0, 3}).to_string(), "tensor([], size=(0, 3))");
  EXPECT_EQ(zeros({2, 0}, {.dtype = DType::i32}).to_string(), "tensor([], size=(2, 0), dtype=i32)");
  // torch shows every non-default-float dtype on an empty tensor, i64 included.
  EXPECT_EQ(zeros({0}, {.dtype = DType::i64}).to_string(), "tensor([], dtype=i64)");
  EXPECT_EQ(zeros({3, 0, 2}, {.dtype = DType::f64}).to_string(), "tensor([], size=(3, 0, 2), dtype=f64)");
  EXPECT_EQ(zeros({0, 3}, {.requires_grad = true}).to_string(), "tensor([], size=(0, 3), requires_grad=True)");
}

TEST(Print, IntegersAndBools) {
  EXPECT_EQ(typed({1, 0}, DType::boolean).to_string(), "tensor([ True, False])");
  EXPECT_EQ(typed({1, 0, 1, 0, 0, 1}, {2, 3}, DType::boolean).to_string(),
            "tensor([[ True, False,  True],\n"
            "        [False, False,  True]])");
  EXPECT_EQ(typed({1, 2, -300}, DType::i64).to_string(), "tensor([   1,    2, -300])");
  EXPECT_EQ(typed({-7, 12, 3, 0}, {2, 2}, DType::i32).to_string(),
            "tensor([[-7, 12],\n"
            "        [ 3,  0]], dtype=i32)");
  EXPECT_EQ(typed({1, 2, 255}, DType::u8).to_string(), "tensor([  1,   2, 255], dtype=u8)");
  // i64 beyond 2^53 prints exactly (not through double).
  EXPECT_EQ(from_vector(std::vector<int64_t>{(int64_t{1} << 62) + 1}, {1}).to_string(),
            "tensor([4611686018427387905])");
}

TEST(Print, OtherFloatDTypes) {
  EXPECT_EQ(typed({1.5, 2}, DType::bf16).to_string(), "tensor([1.5000, 2.0000], dtype=bf16)");
  EXPECT_EQ(typed({65504, kInf, -2.5}, DType::f16).to_string(),
            "tensor([ 6.5504e+04,         inf, -2.5000e+00], dtype=f16)");
  EXPECT_EQ(typed({0.1, 1e-5}, DType::f64).to_string(), "tensor([1.0000e-01, 1.0000e-05], dtype=f64)");
  EXPECT_EQ(typed({0.12345, 2.71828, -3.14159}, DType::f64).to_string(), "tensor([ 0.1235,  2.7183, -3.1416], dtype=f64)");
  EXPECT_EQ((arange(0, 8, 1, {.dtype = DType::f64}).reshape({2, 2, 2}) * 0.25).to_string(),
            "tensor([[[0.0000, 0.2500],\n"
            "         [0.5000, 0.7500]],\n"
            "\n"
            "        [[1.0000, 1.2500],\n"
            "         [1.5000, 1.7500]]], dtype=f64)");
}

TEST(Print, FloatModes) {
  EXPECT_EQ(f32({1, 1e10f}).to_string(), "tensor([1.0000e+00, 1.0000e+10])");
  EXPECT_EQ(f32({123456789.f}).to_string(), "tensor([1.2346e+08])");
  EXPECT_EQ(f32({1, 1000.5f}).to_string(), "tensor([1.0000e+00, 1.0005e+03])");
  EXPECT_EQ(f32({kNan, 1.5f}).to_string(), "tensor([   nan, 1.5000])");
  EXPECT_EQ(f32({1, kInf, -kInf}).to_string(), "tensor([1., inf, -inf])");
  EXPECT_EQ(f32({-0.f, 1}).to_string(), "tensor([-0., 1.])");
  EXPECT_EQ(f32({0, 0}).to_string(), "tensor([0., 0.])");
  EXPECT_EQ(f32({kNan, 1e-5f, 1}).to_string(), "tensor([       nan, 1.0000e-05, 1.0000e+00])");
}

TEST(Print, LineWrapping) {
  EXPECT_EQ((arange(0, 30, 1, {.dtype = DType::f32}) / 7.0).to_string(),
            "tensor([0.0000, 0.1429, 0.2857, 0.4286, 0.5714, 0.7143, 0.8571, 1.0000, 1.1429,\n"
            "        1.2857, 1.4286, 1.5714, 1.7143, 1.8571, 2.0000, 2.1429, 2.2857, 2.4286,\n"
            "        2.5714, 2.7143, 2.8571, 3.0000, 3.1429, 3.2857, 3.4286, 3.5714, 3.7143,\n"
            "        3.8571, 4.0000, 4.1429])");
  // The suffixes move to a new line when they would pass 80 columns.
  Tensor t = (arange(0, 9, 1, {.dtype = DType::f64}) / 7.0).detach().requires_grad_();
  EXPECT_EQ(t.to_string(),
            "tensor([0.0000, 0.1429, 0.2857, 0.4286, 0.5714, 0.7143, 0.8571, 1.0000, 1.1429],\n"
            "       dtype=f64, requires_grad=True)");
}

TEST(Print, Views) {
  EXPECT_EQ(zeros({1, 2, 1, 2}).to_string(),
            "tensor([[[[0., 0.]],\n"
            "\n"
            "         [[0., 0.]]]])");
  EXPECT_EQ(f32({1, 2, 3, 4, 5, 6}, {2, 3}).t().to_string(),
            "tensor([[1., 4.],\n"
            "        [2., 5.],\n"
            "        [3., 6.]])");
}

TEST(Print, Summarized) {
  const std::string rows =
      "tensor([[0.0000e+00, 1.0000e+00, 2.0000e+00,  ..., 9.9700e+02, 9.9800e+02,\n"
      "         9.9900e+02],\n"
      "        [1.0000e+03, 1.0010e+03, 1.0020e+03,  ..., 1.9970e+03, 1.9980e+03,\n"
      "         1.9990e+03]])";
  EXPECT_EQ(arange(0, 2000, 1, {.dtype = DType::f32}).reshape({2, 1000}).to_string(), rows);
  EXPECT_EQ(arange(0, 1001, 1, {.dtype = DType::f32}).to_string(),
            "tensor([   0.,    1.,    2.,  ...,  998.,  999., 1000.])");
  EXPECT_EQ((arange(0, 1200, 1, {.dtype = DType::f32}).reshape({3, 400}) / 3.0).to_string(),
            "tensor([[0.0000e+00, 3.3333e-01, 6.6667e-01,  ..., 1.3233e+02, 1.3267e+02,\n"
            "         1.3300e+02],\n"
            "        [1.3333e+02, 1.3367e+02, 1.3400e+02,  ..., 2.6567e+02, 2.6600e+02,\n"
            "         2.6633e+02],\n"
            "        [2.6667e+02, 2.6700e+02, 2.6733e+02,  ..., 3.9900e+02, 3.9933e+02,\n"
            "         3.9967e+02]])");
  // A non-contiguous view is summarised from its own elements.
  EXPECT_EQ(arange(0, 2000, 1, {.dtype = DType::f32}).reshape({1000, 2}).t().to_string(),
            "tensor([[0.0000e+00, 2.0000e+00, 4.0000e+00,  ..., 1.9940e+03, 1.9960e+03,\n"
            "         1.9980e+03],\n"
            "        [1.0000e+00, 3.0000e+00, 5.0000e+00,  ..., 1.9950e+03, 1.9970e+03,\n"
            "         1.9990e+03]])");
}

TEST(Print, Summarized3d) {
  std::string expected = "tensor([";
  const int64_t blocks[] = {0, 1, 2, -1, 7, 8, 9};
  bool first_block = true;
  for (int64_t b : blocks) {
    if (!first_block) expected += ",\n\n        ";
    first_block = false;
    if (b < 0) {
      expected += "...";
      continue;
    }
    expected += "[";
    const int64_t rows[] = {0, 1, 2, -1, 7, 8, 9};
    bool first_row = true;
    for (int64_t r : rows) {
      if (!first_row) expected += ",\n         ";
      first_row = false;
      if (r < 0) {
        expected += "...";
        continue;
      }
      const int64_t base = b * 1000 + r * 100;
      std::ostringstream line;
      line << "[" << std::setw(4) << base << ", " << std::setw(4) << base + 1 << ", " << std::setw(4) << base + 2
           << ",  ..., " << std::setw(4) << base + 97 << ", " << std::setw(4) << base + 98 << ", " << std::setw(4)
           << base + 99 << "]";
      expected += line.str();
    }
    expected += "]";
  }
  expected += "])";
  EXPECT_EQ(arange(10000).reshape({10, 10, 100}).to_string(), expected);
  // The first lines, written out, as torch prints them.
  const std::string head =
      "tensor([[[   0,    1,    2,  ...,   97,   98,   99],\n"
      "         [ 100,  101,  102,  ...,  197,  198,  199],\n"
      "         [ 200,  201,  202,  ...,  297,  298,  299],\n"
      "         ...,\n"
      "         [ 700,  701,  702,  ...,  797,  798,  799],\n";
  EXPECT_EQ(expected.substr(0, head.size()), head);
  const std::string tail =
      "         [9900, 9901, 9902,  ..., 9997, 9998, 9999]]])";
  EXPECT_EQ(expected.substr(expected.size() - tail.size()), tail);
}

TEST(Print, Autograd) {
  EXPECT_EQ(f32({1, 2}).requires_grad_().to_string(), "tensor([1., 2.], requires_grad=True)");
  Tensor x = f32({1, 2, 3, 4}, {2, 2}).requires_grad_();
  EXPECT_EQ((x * 2.0).to_string(),
            "tensor([[2., 4.],\n"
            "        [6., 8.]], grad_fn=<MulBackward>)");
  EXPECT_EQ(x.sum().to_string(), "tensor(10., grad_fn=<SumBackward>)");
  // detach() drops the history; NoGradGuard records none.
  EXPECT_EQ((x * 2.0).detach().to_string(), "tensor([[2., 4.],\n        [6., 8.]])");
  NoGradGuard no_grad;
  EXPECT_EQ((x + 1.0).to_string(), "tensor([[2., 3.],\n        [4., 5.]])");
}

TEST(Print, StreamAndUndefined) {
  std::ostringstream os;
  Tensor t = f32({0.5f, 1});
  os << t;
  EXPECT_EQ(os.str(), t.to_string());
  EXPECT_EQ(Tensor().to_string(), "tensor(undefined)");
}

TEST(Print, CudaDevice) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  EXPECT_EQ(f32({1, 2}).to(Device::cuda(0)).to_string(), "tensor([1., 2.], device='cuda:0')");
  EXPECT_EQ(typed({1, 2}, DType::bf16).to(Device::cuda(0)).to_string(),
            "tensor([1., 2.], device='cuda:0', dtype=bf16)");
}

}  // namespace
}  // namespace forge
