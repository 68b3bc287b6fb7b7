// Note [attention blocks] on the CPU: causal attention assembled from blocks and their backward
// against the whole attention (tests/testing/attention_blocks.h), in f64, f32 and bf16, with
// multi-head, grouped-query and multi-query heads and chunks that are not a multiple of the CPU
// kernel's row block.
#include <gtest/gtest.h>

#include "testing/attention_blocks.h"

namespace forge {
namespace {

using attention_blocks_testing::check_blocks;

TEST(AttentionBlocks, AssembleTheWholeAttentionAndItsGradients) {
  check_blocks(Device::cpu(), DType::f64, 2, 4, 4, 9, 8, 1e-12, 1);
  check_blocks(Device::cpu(), DType::f64, 1, 4, 2, 70, 16, 1e-12, 2);  // chunks across the kernel's 64-row blocks
  check_blocks(Device::cpu(), DType::f64, 2, 3, 1, 5, 8, 1e-12, 3);
  check_blocks(Device::cpu(), DType::f32, 2, 4, 2, 33, 16, 1e-5, 4);
  check_blocks(Device::cpu(), DType::bf16, 2, 4, 2, 16, 16, 2e-2, 5);
}

}  // namespace
}  // namespace forge
