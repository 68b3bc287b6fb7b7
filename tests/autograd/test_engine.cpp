// The backward engine: accumulation, grad mode, detach, retain_graph, hooks, release of
// saved tensors, deep graphs, error messages.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "forge/autograd/node.h"
#include "forge/forge.h"
#include "testing/tensor_testing.h"

namespace forge {
namespace {

using forge::testing::error_of;
using forge::testing::seq;
using forge::testing::vals;

using namespace forge::ops;

TEST(Autograd, SimpleChainRule) {
  Tensor x = from_vector<double>({1, 2, 3}, {3}).requires_grad_();
  Tensor y = sum(mul(mul(x, x), 3.0));  // d/dx = 6x
  y.backward();
  EXPECT_EQ(vals(x.grad()), (std::vector<double>{6, 12, 18}));
  EXPECT_TRUE(x.is_leaf());
  EXPECT_FALSE(y.is_leaf());
  EXPECT_EQ(y.grad_fn()->name(), "sumBackward");
}

TEST(Autograd, GradientsAccumulateAcrossBackwardCalls) {
  Tensor x = from_vector<double>({1, -2}, {2}).requires_grad_();
  for (int i = 0; i < 3; ++i) sum(mul(x, 2.0)).backward();
  EXPECT_EQ(vals(x.grad()), (std::vector<double>{6, 6}));
  x.zero_grad();
  EXPECT_FALSE(x.grad().defined());
  sum(x).backward();
  EXPECT_EQ(vals(x.grad()), (std::vector<double>{1, 1}));
}

// Note [pending input gradient]: a node that asks for its input's pending gradient gets what
// the input's other consumers have accumulated when it runs, and returns the sum; one that
// does not take it leaves the addition to the engine. Either way the gradient is the same.
TEST(Autograd, PendingInputGradientIsHandedOverOnce) {
  for (bool take : {true, false}) {
    Tensor x = from_vector<double>({1, 2}, {2}).requires_grad_();
    Tensor h = mul(x, 1.0);  // a non-leaf with two consumers
    int taken = 0;
    // c = 2h, recorded first (an earlier node runs later), so the other consumer has run by then.
    Tensor c = mul(h.detach(), 2.0);
    autograd::record("fusing_double", c, {h}, [&taken, take](const Tensor& g, const autograd::GradMask&) {
      Tensor mine = mul(g, 2.0);
      if (!take) return TensorList{mine};
      Tensor pending = autograd::take_pending_input_grad();
      EXPECT_FALSE(autograd::take_pending_input_grad().defined()) << "handed over once";
      if (pending.defined()) ++taken;
      return TensorList{pending.defined() ? add(mine, pending) : mine};
    });
    c.grad_fn()->fuse_input_grad = 0;
    Tensor a = mul(h, 3.0);
    sum(add(a, c)).backward();
    EXPECT_EQ(vals(x.grad()), (std::vector<double>{5, 5})) << "take = " << take;
    EXPECT_EQ(taken, take ? 1 : 0);
  }
}

// A node that throws while holding a pending gradient leaves nothing behind for later nodes.
TEST(Autograd, PendingInputGradientIsClearedWhenABackwardThrows) {
  Tensor x = from_vector<double>({1, 2}, {2}).requires_grad_();
  Tensor h = mul(x, 1.0);
  Tensor c = mul(h.detach(), 2.0);
  autograd::record("throwing", c, {h}, [](const Tensor&, const autograd::GradMask&) -> TensorList {
    throw Error("boom");
  });
  c.grad_fn()->fuse_input_grad = 0;
  Tensor a = mul(h, 3.0);  // runs first and leaves a pending gradient for h
  EXPECT_THROW(sum(add(a, c)).backward(), Error);
  EXPECT_FALSE(autograd::take_pending_input_grad().defined());
}

TEST(Autograd, DiamondGraphSumsBothPaths) {
  Tensor x = from_vector<double>({2}, {1}).requires_grad_();
  Tensor a = mul(x, 3.0), b = exp(x);
  Tensor y = sum(mul(a, b));  // 3x e^x -> 3e^x (1 + x)
  y.backward();
  EXPECT_NEAR(vals(x.grad())[0], 3 * std::exp(2.0) * 3, 1e-12);
}

TEST(Autograd, NoGradGuardRecordsNothing) {
  Tensor x = ones({2}, {.requires_grad = true});
  {
    NoGradGuard ng;
    Tensor y = mul(x, 2.0);
    EXPECT_FALSE(y.requires_grad());
    EXPECT_EQ(y.grad_fn(), nullptr);
    EXPECT_FALSE(grad_enabled());
    {
      EnableGradGuard eg;
      EXPECT_TRUE(mul(x, 2.0).requires_grad());
    }
    EXPECT_FALSE(grad_enabled());
  }
  EXPECT_TRUE(grad_enabled());
  EXPECT_TRUE(mul(x, 2.0).requires_grad());
}

TEST(Autograd, DetachCutsHistoryAndSharesStorage) {
  Tensor x = ones({3}, {.requires_grad = true});
  Tensor y = mul(x, 2.0);
  Tensor d = y.detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_TRUE(d.is_leaf());
  EXPECT_EQ(d.storage(), y.storage());
  Tensor z = sum(mul(y, d));  // gradient flows only through y: d/dx = 2 * d = 4
  z.backward();
  EXPECT_EQ(vals(x.grad()), (std::vector<double>{4, 4, 4}));
}

TEST(Autograd, SecondBackwardWithoutRetainGraphIsAClearError) {
  Tensor x = ones({2}, {.requires_grad = true});
  Tensor y = sum(exp(x));
  y.backward();
  try {
    y.backward();
    FAIL() << "expected forge::Error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("retain_graph"), std::string::npos) << m;
    EXPECT_NE(m.find("second time"), std::string::npos) << m;
  }
}

TEST(Autograd, RetainGraphAllowsASecondBackward) {
  Tensor x = from_vector<double>({0.5}, {1}).requires_grad_();
  Tensor y = sum(exp(x));
  y.backward(Tensor(), /*retain_graph=*/true);
  y.backward();
  EXPECT_NEAR(vals(x.grad())[0], 2 * std::exp(0.5), 1e-12);
}

TEST(Autograd, SavedTensorsAreReleasedAfterTheirNodeRuns) {
  Tensor x = randn({1000}, {.requires_grad = true});
  std::weak_ptr<Storage> saved;
  Tensor loss;
  {
    Tensor e = exp(x);  // ExpBackward saves its output
    saved = e.storage();
    loss = sum(mul(e, 2.0));  // mul saves e too (as the other operand)
  }
  EXPECT_FALSE(saved.expired());  // only the graph holds it now
  loss.backward();
  EXPECT_TRUE(saved.expired()) << "saved tensors still alive after backward";
}

TEST(Autograd, RetainGraphKeepsSavedTensors) {
  Tensor x = randn({100}, {.requires_grad = true});
  std::weak_ptr<Storage> saved;
  Tensor loss;
  {
    Tensor e = exp(x);
    saved = e.storage();
    loss = sum(e);
  }
  loss.backward(Tensor(), true);
  EXPECT_FALSE(saved.expired());
}

TEST(Autograd, LeafHookRunsOnceWithTheFinalGradient) {
  Tensor w = ones({2}, {.dtype = DType::f64, .requires_grad = true});
  int calls = 0;
  std::vector<double> seen;
  w.register_grad_hook([&](Tensor& leaf) {
    ++calls;
    seen = leaf.grad().to_vector<double>();
  });
  // w is used three times; the hook must fire once, after all three contributions.
  Tensor y = sum(add(add(mul(w, 2.0), mul(w, 3.0)), w));
  y.backward();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(seen, (std::vector<double>{6, 6}));
  EXPECT_THROW(mul(w, 2.0).register_grad_hook([](Tensor&) {}), Error);  // non-leaf
}

TEST(Autograd, HooksFireInReverseOrderOfUse) {
  // DDP bucketing relies on late-layer gradients being ready first.
  Tensor w1 = ones({2}, {.requires_grad = true}), w2 = ones({2}, {.requires_grad = true});
  std::vector<int> order;
  w1.register_grad_hook([&](Tensor&) { order.push_back(1); });
  w2.register_grad_hook([&](Tensor&) { order.push_back(2); });
  Tensor h = tanh(mul(w1, 0.5));
  Tensor y = sum(tanh(mul(h, w2)));
  y.backward();
  EXPECT_EQ(order, (std::vector<int>{2, 1}));
}

TEST(Autograd, DeepGraphDoesNotRecurse) {
  // 100k nodes: a recursive engine would overflow the stack.
  Tensor x = from_vector<double>({1.0}, {1}).requires_grad_();
  Tensor y = x;
  for (int i = 0; i < 100000; ++i) y = add(y, 0.0);
  sum(y).backward();
  EXPECT_EQ(vals(x.grad())[0], 1.0);
}

TEST(Autograd, BackwardErrorsNameTheProblem) {
  Tensor x = ones({2, 2});
  try {
    sum(x).backward();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not require grad"), std::string::npos) << e.what();
  }
  Tensor w = ones({2, 2}, {.requires_grad = true});
  try {
    mul(w, 2.0).backward();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 2]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(mul(w, 2.0).backward(ones({3})), Error);
  EXPECT_THROW(ones({2}, {.dtype = DType::i64}).requires_grad_(), Error);
}

TEST(Autograd, InPlaceOnATensorThatRequiresGradIsRefused) {
  Tensor w = ones({2}, {.requires_grad = true});
  try {
    w.add_(ones({2}));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("add_"), std::string::npos) << e.what();
  }
  {
    NoGradGuard ng;  // an optimizer step
    w.add_(ones({2}), -0.5);
  }
  EXPECT_EQ(vals(w), (std::vector<double>{0.5, 0.5}));
}

TEST(Autograd, GradientOfAnUnusedInputIsUndefined) {
  Tensor a = ones({2}, {.requires_grad = true}), b = ones({2}, {.requires_grad = true});
  Tensor y = sum(mul(a, 3.0));
  y.backward();
  EXPECT_TRUE(a.grad().defined());
  EXPECT_FALSE(b.grad().defined());
}

TEST(Autograd, GradientsKeepTheLeafDtype) {
  Tensor w = ones({3}, {.dtype = DType::bf16, .requires_grad = true});
  Tensor y = sum(mul(to(w, DType::f32), 2.0));
  y.backward();
  EXPECT_EQ(w.grad().dtype(), DType::bf16);
  EXPECT_EQ(vals(w.grad()), (std::vector<double>{2, 2, 2}));
}

TEST(Autograd, NonScalarBackwardWithExplicitGradient) {
  Tensor x = from_vector<double>({1, 2}, {2}).requires_grad_();
  Tensor y = mul(x, x);
  y.backward(from_vector<double>({1, 10}, {2}));
  EXPECT_EQ(vals(x.grad()), (std::vector<double>{2, 40}));
}

TEST(Autograd, MultipleRoots) {
  Tensor x = from_vector<double>({1, 2}, {2}).requires_grad_();
  Tensor a = sum(mul(x, 2.0)), b = sum(mul(x, x));
  autograd::backward({a, b});
  EXPECT_EQ(vals(x.grad()), (std::vector<double>{4, 6}));
}

}  // namespace
}  // namespace forge

namespace forge {
namespace {

TEST(Autograd, ModifyingASavedTensorInPlaceIsDetected) {
  // Note [saved tensor versions]: the gradient would silently be wrong otherwise.
  Tensor a = from_vector<double>({1, 2, 3}, {3}).requires_grad_();
  Tensor b = ops::exp(a);
  Tensor c = ops::sum(ops::mul(b, b));
  b.detach().fill_(0.0);
  try {
    c.backward();
    FAIL() << "expected forge::Error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("modified by an in-place operation"), std::string::npos) << m;
    EXPECT_NE(m.find("mulBackward"), std::string::npos) << m;
  }
}

// Note [claimed grad buffer]: with pre-allocated gradient buffers (DDP's bucket views) a
// linear's weight and bias gradients, and an embedding's, are written straight into them;
// a weight used twice (a tied embedding and head) gets its sum there too. The gradients are
// exactly those of a run without buffers; a second backward adds.
TEST(Autograd, ClaimedGradBuffersTakeTheGradientsInPlace) {
  Generator gen(11);
  const Tensor x = randn({4, 5}, {}, &gen), r1 = randn({4, 6}, {}, &gen), r2 = randn({3, 5}, {}, &gen),
               r3 = randn({4, 6}, {}, &gen);
  const Tensor ids = from_vector<int64_t>({2, 0, 2}, {3});
  Tensor w = randn({6, 5}, {}, &gen).requires_grad_(), b = randn({6}, {}, &gen).requires_grad_();
  // The head and a second linear on w (two linear backwards: one claims, one allocates) and
  // the embedding (it finds the buffer claimed).
  auto backward = [&] {
    (sum(mul(linear(x, w, b), r1)) + sum(mul(embedding(w, ids), r2)) + sum(mul(linear(x, w), r3))).backward();
  };
  backward();
  const std::vector<float> want_w = w.grad().to_vector<float>(), want_b = b.grad().to_vector<float>();
  w.zero_grad();
  b.zero_grad();
  Tensor flat = full({40}, 7.0);  // stale values: the first gradient overwrites them
  w.set_grad_buffer(flat.narrow(0, 0, 30).view({6, 5}));
  b.set_grad_buffer(flat.narrow(0, 32, 6));
  backward();
  EXPECT_TRUE(w.grad().storage() == flat.storage() && b.grad().storage() == flat.storage());
  EXPECT_EQ(w.grad().to_vector<float>(), want_w);
  EXPECT_EQ(b.grad().to_vector<float>(), want_b);
  EXPECT_FALSE(w.grad_buffer_pending());
  backward();  // accumulates
  const std::vector<float> got = flat.narrow(0, 0, 30).to_vector<float>();
  for (size_t i = 0; i < got.size(); ++i) EXPECT_FLOAT_EQ(got[i], 2 * want_w[i]) << i;
  EXPECT_EQ(flat.narrow(0, 30, 2).to_vector<float>(), std::vector<float>(2, 7.0f)) << "outside the views";

  // claim_grad_buffer hands the pending buffer out once, and only with its shape and dtype.
  Tensor v = zeros({2, 3}).requires_grad_();
  Tensor buf = zeros({2, 3});
  EXPECT_FALSE(v.claim_grad_buffer({2, 3}, DType::f32).defined()) << "no buffer set";
  v.set_grad_buffer(buf);
  EXPECT_FALSE(v.claim_grad_buffer({3, 2}, DType::f32).defined());
  EXPECT_FALSE(v.claim_grad_buffer({2, 3}, DType::f64).defined());
  EXPECT_TRUE(v.claim_grad_buffer({2, 3}, DType::f32).storage() == buf.storage());
  EXPECT_FALSE(v.claim_grad_buffer({2, 3}, DType::f32).defined()) << "claimed once";
  v.set_grad_buffer(buf);
  EXPECT_TRUE(v.claim_grad_buffer({2, 3}, DType::f32).defined()) << "set_grad_buffer re-arms it";
}

// The norms' weight and bias gradients land in claimed buffers too, exactly as without them.
TEST(Autograd, NormGradientsLandInClaimedBuffers) {
  Generator gen(12);
  const Tensor x = randn({6, 8}, {}, &gen), r = randn({6, 8}, {}, &gen);
  Tensor w = randn({8}, {}, &gen).requires_grad_(), b = randn({8}, {}, &gen).requires_grad_();
  auto backward = [&] { (sum(mul(layer_norm(x, w, b, 1e-5), r)) + sum(mul(rms_norm(x, w, 1e-6), r))).backward(); };
  backward();
  const std::vector<float> want_w = w.grad().to_vector<float>(), want_b = b.grad().to_vector<float>();
  w.zero_grad();
  b.zero_grad();
  Tensor flat = full({16}, -3.0);
  w.set_grad_buffer(flat.narrow(0, 0, 8));
  b.set_grad_buffer(flat.narrow(0, 8, 8));
  backward();
  EXPECT_TRUE(w.grad().storage() == flat.storage() && b.grad().storage() == flat.storage());
  EXPECT_EQ(w.grad().to_vector<float>(), want_w);
  EXPECT_EQ(b.grad().to_vector<float>(), want_b);
}

TEST(Autograd, InPlaceOnAnUnsavedInputIsFine) {
  // add saves nothing, so changing its input afterwards does not affect its backward.
  Tensor w = ones({2}, {.requires_grad = true});
  Tensor x = ones({2});
  Tensor y = ops::sum(ops::add(w, x));
  x.fill_(5.0);
  y.backward();
  EXPECT_EQ(w.grad().to_vector<double>(), (std::vector<double>{1, 1}));
}

}  // namespace
}  // namespace forge

#include "forge/autograd/checkpoint.h"

namespace forge {
namespace {

// A small "block" with its own parameters: tanh(x W1) W2 + x.
struct Block {
  Tensor w1 = ops::mul(randn({16, 64}, {.dtype = DType::f64}), 0.2).requires_grad_();
  Tensor w2 = ops::mul(randn({64, 16}, {.dtype = DType::f64}), 0.2).requires_grad_();
  Tensor forward(const Tensor& x) const {
    return ops::add(ops::matmul(ops::tanh(ops::matmul(x, w1)), w2), x);
  }
};

TEST(Checkpoint, GradientsEqualThePlainRunAndPeakMemoryIsLower) {
  manual_seed(5);
  std::vector<Block> blocks(6);
  Tensor x0 = randn({256, 16}, {.dtype = DType::f64, .requires_grad = true});
  auto run = [&](bool ckpt) {
    for (auto& b : blocks) {
      b.w1.zero_grad();
      b.w2.zero_grad();
    }
    x0.zero_grad();
    reset_cpu_peak_memory();
    const int64_t base = cpu_memory_stats().allocated;
    Tensor h = x0;
    for (auto& b : blocks) {
      if (ckpt) h = autograd::checkpoint([&b](const TensorList& in) { return b.forward(in[0]); }, {h});
      else h = b.forward(h);
    }
    Tensor loss = ops::sum(ops::mul(h, h));
    loss.backward();
    std::vector<std::vector<double>> grads;
    for (auto& b : blocks) {
      grads.push_back(b.w1.grad().to_vector<double>());
      grads.push_back(b.w2.grad().to_vector<double>());
    }
    grads.push_back(x0.grad().to_vector<double>());
    return std::make_pair(grads, cpu_memory_stats().peak_allocated - base);
  };
  auto [plain, plain_peak] = run(false);
  auto [ckpt, ckpt_peak] = run(true);
  ASSERT_EQ(plain.size(), ckpt.size());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_EQ(plain[i], ckpt[i]) << "gradient " << i;
  EXPECT_LT(ckpt_peak, plain_peak) << "checkpointing did not lower peak memory";
  std::cout << "peak memory: plain " << plain_peak << " B, checkpointed " << ckpt_peak << " B\n";
}

TEST(Checkpoint, RegionWithoutGradInputsStillTrainsItsParameters) {
  Block b;
  Tensor x = randn({4, 16}, {.dtype = DType::f64});  // data: no grad
  Tensor y = autograd::checkpoint([&b](const TensorList& in) { return b.forward(in[0]); }, {x});
  ops::sum(y).backward();
  ASSERT_TRUE(b.w1.grad().defined());
  Block c;
  c.w1 = b.w1.detach().clone().requires_grad_();
  c.w2 = b.w2.detach().clone().requires_grad_();
  ops::sum(c.forward(x)).backward();
  EXPECT_EQ(b.w1.grad().to_vector<double>(), c.w1.grad().to_vector<double>());
}

}  // namespace
}  // namespace forge
