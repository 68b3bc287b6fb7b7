// FP8 blocks for the wire (Note [FP8 wire blocks] in fp8_wire.h).
#include "forge/ops/fp8_wire.h"

#include <cmath>
#include <vector>

#include "forge/autograd/grad_mode.h"
#include "forge/backends/cuda/fp8.h"
#include "forge/core/error.h"
#include "forge/ops/binary.h"
#include "forge/ops/copy.h"
#include "forge/ops/creation.h"
#include "forge/ops/dispatch_device.h"
#include "forge/ops/index.h"

namespace forge::fp8 {

namespace {

void check_blocks(const char* what, const Tensor& t, DType dtype, int dims) {
  FORGE_CHECK(t.defined(), "fp8 wire blocks: ", what, " is undefined");
  FORGE_CHECK(t.dtype() == dtype && t.dim() == dims && t.is_contiguous() && (dims == 1 || t.size(1) == kWireBlock),
              "fp8 wire blocks: ", what, " must be a contiguous ", dtype_name(dtype),
              dims == 1 ? " vector" : " (rows, 128) matrix", ", got ", dtype_name(t.dtype()), " ", t.shape(),
              t.is_contiguous() ? "" : " (not contiguous)");
}

}  // namespace

WireBlocks encode_blocks(const Tensor& x, Format format) {
  check_blocks("x", x, DType::f32, 2);
  NoGradGuard no_grad;
  const int64_t rows = x.size(0);
  if (!x.is_cpu()) {
    WireBlocks out;
    FORGE_ON_CUDA("fp8 wire encode", {
      const Tensor amax = cuda::fp8_group_amax(x, {1, kWireBlock});
      cuda::Fp8Operand op = cuda::fp8_cast(x, format, amax, {1, kWireBlock}, cuda::Fp8ScaleMode::outer, false);
      out.codes = op.codes;
      out.inv_scales = op.inv_scales;
    });
    return out;
  }
  WireBlocks out{empty({rows, kWireBlock}, {.dtype = DType::u8}), empty({rows}, {.dtype = DType::f32})};
  const float* src = x.data<float>();
  uint8_t* codes = out.codes.data<uint8_t>();
  float* inv = out.inv_scales.data<float>();
  const float fmax = static_cast<float>(info(format).max);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = src + r * kWireBlock;
    float amax = 0;
    bool nan = false;
    for (int64_t j = 0; j < kWireBlock; ++j) {
      const float a = std::fabs(row[j]);
      nan = nan || std::isnan(a);
      amax = std::max(amax, a);
    }
    const float s = nan || !std::isfinite(amax) ? std::nanf("") : amax == 0.0f ? 1.0f : fmax / amax;
    for (int64_t j = 0; j < kWireBlock; ++j)
      codes[r * kWireBlock + j] = encode_float(row[j] * s, format);
    inv[r] = 1.0f / s;
  }
  return out;
}

Tensor decode_blocks_by_lookup(const Tensor& codes, const Tensor& inv_scales, Format format) {
  check_blocks("codes", codes, DType::u8, 2);
  check_blocks("inv_scales", inv_scales, DType::f32, 1);
  FORGE_CHECK(inv_scales.numel() == codes.size(0) && inv_scales.device() == codes.device(),
              "fp8 wire blocks: ", codes.size(0), " rows of codes need as many factors on their device, got ",
              inv_scales.numel());
  NoGradGuard no_grad;
  std::vector<float> values(256);
  for (int c = 0; c < 256; ++c) values[static_cast<size_t>(c)] = static_cast<float>(decode(static_cast<uint8_t>(c), format));
  const Tensor table = from_vector(values, {256}, {.dtype = DType::f32, .device = codes.device()});
  const Tensor v = ops::index_select(table, 0, codes.reshape({-1}).to(DType::i64));
  return ops::mul(v.view({codes.size(0), kWireBlock}), inv_scales.view({codes.size(0), 1}));
}

Tensor decode_blocks(const Tensor& codes, const Tensor& inv_scales, Format format) {
  if (!codes.is_cpu()) return decode_blocks_by_lookup(codes, inv_scales, format);
  check_blocks("codes", codes, DType::u8, 2);
  check_blocks("inv_scales", inv_scales, DType::f32, 1);
  FORGE_CHECK(inv_scales.numel() == codes.size(0) && inv_scales.is_cpu(), "fp8 wire blocks: ", codes.size(0),
              " rows of codes need as many factors on the CPU, got ", inv_scales.numel());
  float table[256];
  for (int c = 0; c < 256; ++c) table[c] = static_cast<float>(decode(static_cast<uint8_t>(c), format));
  const int64_t rows = codes.size(0);
  Tensor out = empty({rows, kWireBlock}, {.dtype = DType::f32});
  const uint8_t* src = codes.data<uint8_t>();
  const float* inv = inv_scales.data<float>();
  float* dst = out.data<float>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < kWireBlock; ++j) dst[r * kWireBlock + j] = table[src[r * kWireBlock + j]] * inv[r];
  return out;
}

}  // namespace forge::fp8
