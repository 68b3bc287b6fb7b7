// Packed documents on the GPU (Note [document masks] in ops/attention.h, Note [flash documents] in
// backends/cuda/flash_attention.cu): attention with document ids against the CPU kernels, the whole
// attention and ring attention's blocks, on every back-end.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "backends/cuda/cuda_testing.h"
#include "forge/backends/cuda/flash_attention.h"
#include "forge/forge.h"
#include "forge/ops/attention.h"
#include "testing/attention_blocks.h"

namespace forge {
namespace {

using namespace cuda_testing;

// The attention switches these tests depend on, whatever an earlier test of the process left
// (forge train's run.deterministic is process-wide): not deterministic (the flash kernels apply),
// restored at the end.
struct FlashAllowed {
  const bool was = ops::deterministic();
  FlashAllowed() { ops::set_deterministic(false); }
  ~FlashAllowed() { ops::set_deterministic(was); }
};

// Note [document masks] on the GPU: packed documents (ids) against the CPU, whole attention and
// ring attention's blocks, with documents across the two chunks; on every back-end: the flash
// kernels with the ids (Note [flash documents]; bf16, head size 64), the composed path with their
// dense mask (f32, and run.attention = "composed").
TEST(CudaPackedAttention, DocumentIdsMatchTheCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  const FlashAllowed flash_allowed;
  std::vector<int64_t> docs(256);
  for (int64_t t = 0; t < 256; ++t) docs[static_cast<size_t>(t)] = t < 40 ? 0 : t < 41 ? 1 : t < 170 ? 2 : 3;
  const std::string before = ops::attention_backend();
  for (const char* backend : {"auto", "flash", "composed"})
  for (DType dt : {DType::bf16, DType::f32}) {
    ops::set_attention_backend(backend);
    SCOPED_TRACE(std::string(backend) + " " + dtype_name(dt));
    attention_blocks_testing::check_blocks(kGpu, dt, 2, 8, 2, 128, 64, dt == DType::bf16 ? 3e-2 : 2e-3, 21, docs);
    const int64_t flash_before = cuda::flash_attention_calls();
    Generator gen(23);
    auto make = [&](const Shape& s) { return uniform(s, -1, 1, {.dtype = DType::f32}, &gen).to(dt); };
    const Tensor q = make({2, 8, 256, 64}), k = make({2, 2, 256, 64}), v = make({2, 2, 256, 64}), g = make({2, 8, 256, 64});
    std::vector<int64_t> both(docs);
    both.insert(both.end(), docs.rbegin(), docs.rend());  // row 1: the same documents in another order
    const Tensor ids = from_vector(both, {2, 256}).to(DType::i32);
    auto run = [&](Device d) {
      Tensor qd = q.to(d).detach().requires_grad_(), kd = k.to(d).detach().requires_grad_();
      Tensor vd = v.to(d).detach().requires_grad_();
      const Tensor y = ops::scaled_dot_product_attention(qd, kd, vd, true, 0.0, {}, ids.to(d));
      y.backward(g.to(d));
      return std::vector<Tensor>{y.detach().to(Device::cpu()), qd.grad().to(Device::cpu()), kd.grad().to(Device::cpu()),
                                 vd.grad().to(Device::cpu())};
    };
    const auto cpu = run(Device::cpu()), gpu = run(kGpu);
    const double tol = dt == DType::bf16 ? 3e-2 : 2e-3;
    const char* names[] = {"out", "dq", "dk", "dv"};
    for (size_t i = 0; i < 4; ++i)
      EXPECT_LE(attention_blocks_testing::max_rel(gpu[i], cpu[i]), tol) << names[i];
    // bf16 at head size 64 takes the flash kernels with the ids, except on the composed back-end.
    const bool flash = dt == DType::bf16 && std::string(backend) != "composed";
    EXPECT_EQ(cuda::flash_attention_calls() > flash_before, flash);
  }
  ops::set_attention_backend(before);
}

// Note [flash document ranges]: rows of many short documents, where the flash kernels visit only
// the key (forward) and query (backward) blocks of a block's own documents, against the CPU. Row 0
// numbers its documents in order; row 1 numbers the same documents in a shuffled order and gives
// its last document the first one's id (one id in two places: the ranges must still hold every
// allowed pair). Head sizes 64 and 128 (different backward block heights), T not a multiple of a
// block.
TEST(CudaPackedAttention, ShortDocumentsSkipBlocksAndMatchTheCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  const FlashAllowed flash_allowed;
  const int64_t B = 2, H = 4, Hkv = 2, T = 500;
  Generator gen(41);
  std::vector<int64_t> lengths;
  for (int64_t n = 0; n < T;) {
    const int64_t len = std::min<int64_t>(T - n, 1 + static_cast<int64_t>(uniform({1}, 0, 90, {}, &gen).item<double>()));
    lengths.push_back(len);
    n += len;
  }
  const auto nd = static_cast<int64_t>(lengths.size());
  ASSERT_GE(nd, 8) << "many documents per row";
  std::vector<int64_t> order(static_cast<size_t>(nd));
  for (int64_t i = 0; i < nd; ++i) order[static_cast<size_t>(i)] = (i * 7 + 3) % nd;  // a permutation when gcd(7, nd) = 1
  if (nd % 7 == 0) std::reverse(order.begin(), order.end());
  order.back() = order.front();
  std::vector<int64_t> ids;
  for (int64_t row = 0; row < B; ++row)
    for (int64_t d = 0; d < nd; ++d)
      for (int64_t t = 0; t < lengths[static_cast<size_t>(d)]; ++t) ids.push_back(row == 0 ? d : order[static_cast<size_t>(d)]);
  const Tensor doc = from_vector(ids, {B, T}).to(DType::i32);
  for (int64_t D : {64, 128}) {
    SCOPED_TRACE("head size " + std::to_string(D));
    auto make = [&](const Shape& s) { return uniform(s, -1, 1, {.dtype = DType::f32}, &gen).to(DType::bf16); };
    const Tensor q = make({B, H, T, D}), k = make({B, Hkv, T, D}), v = make({B, Hkv, T, D}), g = make({B, H, T, D});
    auto run = [&](Device d) {
      Tensor qd = q.to(d).detach().requires_grad_(), kd = k.to(d).detach().requires_grad_();
      Tensor vd = v.to(d).detach().requires_grad_();
      const Tensor y = ops::scaled_dot_product_attention(qd, kd, vd, true, 0.0, {}, doc.to(d));
      y.backward(g.to(d));
      return std::vector<Tensor>{y.detach().to(Device::cpu()), qd.grad().to(Device::cpu()), kd.grad().to(Device::cpu()),
                                 vd.grad().to(Device::cpu())};
    };
    const int64_t flash_before = cuda::flash_attention_calls();
    const auto gpu = run(kGpu);
    EXPECT_GT(cuda::flash_attention_calls(), flash_before) << "the flash kernels ran";
    const auto cpu = run(Device::cpu());
    const char* names[] = {"out", "dq", "dk", "dv"};
    for (size_t i = 0; i < 4; ++i) EXPECT_LE(attention_blocks_testing::max_rel(gpu[i], cpu[i]), 3e-2) << names[i];
  }
}

}  // namespace
}  // namespace forge
