// The FP8 wire codec on the GPU (ops/fp8_wire.h, Note [FP8 wire blocks]; the codec of
// dist.grad_compression = "fp8"): the training casts' kernel coding rows of 128 with one factor
// each, and the table-lookup decode, against the CPU's loops code for code and bit for bit, on
// fresh random rows of very different magnitudes, with a row of zeros and rows holding a NaN and
// an infinity.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "backends/cuda/cuda_testing.h"
#include "forge/forge.h"
#include "forge/ops/fp8_wire.h"

namespace forge {
namespace {

using cuda_testing::kGpu;

Tensor random_rows(int64_t rows, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1, 1), e(-40, 40);
  std::vector<float> v(static_cast<size_t>(rows * 128));
  for (int64_t r = 0; r < rows; ++r) {
    const float mag = std::exp2(e(gen));
    for (int64_t j = 0; j < 128; ++j) v[static_cast<size_t>(r * 128 + j)] = u(gen) * mag;
  }
  for (int64_t j = 0; j < 128; ++j) v[static_cast<size_t>(128 + j)] = 0.0f;
  v[static_cast<size_t>(2 * 128 + 7)] = std::numeric_limits<float>::quiet_NaN();
  v[static_cast<size_t>(3 * 128 + 100)] = std::numeric_limits<float>::infinity();
  return from_vector(v, {rows, 128});
}

TEST(CudaFp8Wire, EncodeAndDecodeAreTheCpusBitForBit) {
  FORGE_SKIP_WITHOUT_GPU();
  for (fp8::Format f : {fp8::Format::e4m3, fp8::Format::e5m2}) {
    for (int64_t rows : {5, 333, 4096}) {
      const Tensor x = random_rows(rows, static_cast<uint32_t>(rows) + 3u * static_cast<uint32_t>(f));
      const fp8::WireBlocks cpu = fp8::encode_blocks(x, f), gpu = fp8::encode_blocks(x.to(kGpu), f);
      ASSERT_TRUE(gpu.codes.is_cuda());
      const std::vector<uint8_t> cc = cpu.codes.to_vector<uint8_t>(), gc = gpu.codes.to(Device::cpu()).to_vector<uint8_t>();
      ASSERT_EQ(cc.size(), gc.size());
      const std::vector<float> ci = cpu.inv_scales.to_vector<float>(), gi = gpu.inv_scales.to(Device::cpu()).to_vector<float>();
      for (size_t i = 0; i < cc.size(); ++i) {
        if (std::isnan(ci[i / 128])) {  // a row with a NaN or an infinity: NaN codes (e5m2 has several)
          EXPECT_TRUE(std::isnan(fp8::decode(gc[i], f))) << fp8::format_name(f) << " rows " << rows << " at " << i;
          continue;
        }
        ASSERT_EQ(cc[i], gc[i]) << fp8::format_name(f) << " rows " << rows << " at " << i;
      }
      for (size_t r = 0; r < ci.size(); ++r) {
        if (std::isnan(ci[r])) EXPECT_TRUE(std::isnan(gi[r])) << "row " << r;
        else EXPECT_EQ(ci[r], gi[r]) << "row " << r;
      }
      const std::vector<float> cd = fp8::decode_blocks(cpu.codes, cpu.inv_scales, f).to_vector<float>(),
                               gd = fp8::decode_blocks(gpu.codes, gpu.inv_scales, f).to(Device::cpu()).to_vector<float>();
      for (size_t i = 0; i < cd.size(); ++i) {
        if (std::isnan(cd[i])) ASSERT_TRUE(std::isnan(gd[i])) << i;
        else ASSERT_EQ(cd[i], gd[i]) << i;
      }
    }
  }
}

}  // namespace
}  // namespace forge
