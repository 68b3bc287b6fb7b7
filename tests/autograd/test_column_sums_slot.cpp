// Note [column sums handed to the producer] (autograd/node.h): the slot hands its sums over only
// for the very gradient tensor they were computed from, at the same storage version, once.
#include <gtest/gtest.h>

#include "forge/autograd/node.h"
#include "forge/forge.h"

namespace forge {
namespace {

TEST(ColumnSumsSlot, HandsTheSumsOverOnlyForTheirOwnGradientOnce) {
  const Tensor g = ones({4, 3}), sums = full({3}, 4.0);
  autograd::ColumnSumsSlot slot;
  EXPECT_FALSE(slot.take_for(g).defined());  // nothing left yet

  const int64_t before = autograd::column_sums_handed_over();
  slot.leave(g, sums);
  const Tensor same_view = g;  // another handle on the same tensor: the same one
  const Tensor got = slot.take_for(same_view);
  ASSERT_TRUE(got.defined());
  EXPECT_EQ(got.impl_ptr(), sums.impl_ptr());
  EXPECT_EQ(autograd::column_sums_handed_over() - before, 1);
  EXPECT_FALSE(slot.take_for(g).defined());  // taken: the slot is empty again

  // Another tensor with the same values, or a view of g's memory, is not g.
  slot.leave(g, sums);
  EXPECT_FALSE(slot.take_for(g.clone()).defined());
  slot.leave(g, sums);
  EXPECT_FALSE(slot.take_for(g.reshape({12})).defined());

  // Written in place after the sums were taken: they are stale.
  Tensor h = ones({4, 3});
  slot.leave(h, sums);
  h.add_(ones({4, 3}));
  EXPECT_FALSE(slot.take_for(h).defined());

  // The gradient gone (its memory possibly reused): never matches.
  Tensor k = ones({4, 3});
  slot.leave(k, sums);
  k = Tensor();
  EXPECT_FALSE(slot.take_for(ones({4, 3})).defined());
  EXPECT_EQ(autograd::column_sums_handed_over() - before, 1);
}

// Only a CUDA linear with a bias that needs a gradient offers a slot; on the CPU there is none.
TEST(ColumnSumsSlot, CpuLinearOffersNoSlot) {
  const Tensor x = ones({2, 3}).requires_grad_(), w = ones({4, 3}).requires_grad_(), b = zeros({4}).requires_grad_();
  const Tensor y = ops::linear(x, w, b);
  ASSERT_TRUE(y.grad_fn());
  EXPECT_EQ(y.grad_fn()->output_column_sums, nullptr);
}

}  // namespace
}  // namespace forge
