// Optimizer::seed_state (optim/optimizer.h): a parameter's state started from given values
// before its first update - AdamW's f32 master of a 16-bit parameter from the f32 weights it was
// rounded from (Note [masters from the f32 initial weights], train/strategy.h).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "forge/forge.h"
#include "optim_testing.h"
#include "testing/tensor_testing.h"

namespace forge {
namespace {

using optim_testing::param;
using optim_testing::set_grad;

using forge::testing::error_of;
using forge::testing::vals;
using optim::AdamW;
using optim::SGD;

// Optimizer::seed_state (Note [masters from the f32 initial weights], train/strategy.h): a bf16
// parameter's master starts from the given f32 values, off the bf16 grid; the first update
// lands there, and p is the rounding of the updated master - which moves the weights whose
// master sits within the update of a rounding boundary, where a master made from p moves none.
TEST(AdamW, SeededMasterStartsFromTheGivenF32Weights) {
  const size_t n = 256;
  std::vector<double> w(n);  // f32 weights just above bf16 numbers near 1 (spacing 2^-7 = 7.8e-3)
  for (size_t i = 0; i < n; ++i) w[i] = 1.0 + std::ldexp(static_cast<double>(i % 128), -7) + 3.9e-3 - 1e-5 * static_cast<double>(i % 7);
  Tensor p = param(w, DType::bf16);  // rounded: each w is just under half a spacing above its bf16 number
  const std::vector<double> p0 = vals(p);
  AdamW seeded({p}, {.lr = 1e-4, .weight_decay = 0.0});
  EXPECT_TRUE(seeded.seed_state(p, "master", from_vector(std::vector<float>(w.begin(), w.end()), {static_cast<int64_t>(n)})));
  set_grad(p, std::vector<double>(n, -1.0));  // every update is about +lr: towards the boundary above
  seeded.step();
  const std::vector<double> master = vals(seeded.state(p)->tensors.at("master"));
  size_t moved = 0;
  for (size_t i = 0; i < n; ++i) {
    EXPECT_NEAR(master[i], static_cast<double>(static_cast<float>(w[i])) + 1e-4, 2e-7) << i;
    moved += vals(p)[i] != p0[i];
  }
  EXPECT_EQ(vals(p), vals(seeded.state(p)->tensors.at("master").to(DType::bf16)));
  EXPECT_EQ(moved, n);  // every master crossed its rounding boundary
  // The same step from a master made from p: none moves.
  Tensor q = param(w, DType::bf16);
  AdamW plain({q}, {.lr = 1e-4, .weight_decay = 0.0});
  set_grad(q, std::vector<double>(n, -1.0));
  plain.step();
  EXPECT_EQ(vals(q), p0);
  // Errors: after an update, and a wrong size; SGD keeps no master (false, nothing done).
  EXPECT_THAT(error_of([&] { seeded.seed_state(p, "master", from_vector(std::vector<float>(n, 1.f), {static_cast<int64_t>(n)})); }),
              ::testing::HasSubstr("the parameter was updated already (1 step(s))"));
  Tensor r = param(w, DType::bf16);
  AdamW fresh({r}, {.lr = 1e-4});
  EXPECT_THAT(error_of([&] { fresh.seed_state(r, "master", from_vector(std::vector<float>(3, 1.f), {3})); }),
              ::testing::HasSubstr("'master' needs 256 floating-point elements, got 3"));
  EXPECT_THAT(error_of([&] { fresh.seed_state(p, "master", from_vector(std::vector<float>(n, 1.f), {static_cast<int64_t>(n)})); }),
              ::testing::HasSubstr("is not a parameter of this optimizer"));
  SGD sgd({r}, {.lr = 1e-4});
  EXPECT_FALSE(sgd.seed_state(r, "master", from_vector(std::vector<float>(w.begin(), w.end()), {static_cast<int64_t>(n)})));
  // A seeded state alone is no state to save.
  EXPECT_EQ(fresh.state_dict().tensors.size(), 0u);
  EXPECT_TRUE(fresh.seed_state(r, "master", from_vector(std::vector<float>(w.begin(), w.end()), {static_cast<int64_t>(n)})));
  EXPECT_EQ(fresh.state_dict().tensors.size(), 0u);
}

}  // namespace
}  // namespace forge
