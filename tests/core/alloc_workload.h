#pragma once
// A deterministic, training-step-like sequence of allocations and frees, replayed by the
// caching-allocator tests on the CPU (tests/core/test_block_pool.cpp, on a BlockPool with a
// fake device) and on the GPU (tests/backends/cuda/test_cuda_allocator.cpp, through
// forge::empty), so the steady-state property checked on the GPU is first checked here.
//
// One step of a 12-layer transformer-like model: the forward pass saves four activations
// per layer (LayerNorm statistics 32 KiB, 6 MiB, 24 MiB, 6 MiB) and makes three temporaries
// freed at once (1 KiB .. 24 MiB); a 100 MiB logits buffer and a 1 KiB loss; the backward
// pass runs the layers in reverse, allocating gradient temporaries, the layer's parameter
// gradients (3.4 MiB, 4.5 MiB x 2, 3 KiB biases: kept until the end of the step, as
// zero_grad drops them then) and freeing the layer's activations. 184 allocations from
// 1 KiB to 100 MiB; every block is freed by the end of the step.
#include <cstddef>
#include <vector>

namespace forge::testing {

struct AllocOp {
  bool alloc;    // allocate `bytes` as handle `id`, or free handle `id`
  size_t bytes;  // for allocations
  int id;
};

inline std::vector<AllocOp> training_step_workload() {
  constexpr size_t KiB = 1024, MiB = 1024 * 1024;
  constexpr int kLayers = 12;
  std::vector<AllocOp> ops;
  int next = 0;
  auto alloc = [&](size_t bytes) {
    ops.push_back({true, bytes, next});
    return next++;
  };
  auto release = [&](int id) { ops.push_back({false, 0, id}); };

  const size_t act_sizes[4] = {32 * KiB, 6 * MiB, 24 * MiB, 6 * MiB};
  std::vector<std::vector<int>> acts(kLayers);
  for (int l = 0; l < kLayers; ++l) {
    const int t0 = alloc(1 * KiB + 8 * static_cast<size_t>(l));  // odd sizes round up to 512
    acts[l].push_back(alloc(act_sizes[0]));
    const int t1 = alloc(24 * MiB);
    acts[l].push_back(alloc(act_sizes[1]));
    release(t1);
    const int t2 = alloc(6 * MiB + 4 * KiB);
    acts[l].push_back(alloc(act_sizes[2]));
    acts[l].push_back(alloc(act_sizes[3]));
    release(t2);
    release(t0);
  }
  const int logits = alloc(100 * MiB);
  const int loss = alloc(1 * KiB);
  const int dlogits = alloc(100 * MiB);
  release(logits);
  release(loss);
  int grad = alloc(6 * MiB);
  release(dlogits);

  std::vector<int> param_grads;
  for (int l = kLayers - 1; l >= 0; --l) {
    const int g_mlp = alloc(24 * MiB);
    param_grads.push_back(alloc(4608 * KiB));  // 4.5 MiB
    param_grads.push_back(alloc(3 * KiB));
    release(acts[l][2]);
    const int g_attn = alloc(6 * MiB);
    param_grads.push_back(alloc(4608 * KiB));
    release(g_mlp);
    param_grads.push_back(alloc(3456 * KiB));  // 3.4 MiB
    param_grads.push_back(alloc(9 * KiB));
    release(acts[l][3]);
    release(acts[l][1]);
    const int g_in = alloc(6 * MiB);
    release(g_attn);
    release(acts[l][0]);
    release(grad);
    grad = g_in;
  }
  release(grad);
  for (int id : param_grads) release(id);
  return ops;
}

}  // namespace forge::testing
