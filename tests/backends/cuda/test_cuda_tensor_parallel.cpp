// Tensor parallelism on GPUs through NCCL (parallel/tensor_parallel.h): GPT and LLaMA split over two
// GPUs with tp::layer_spec against the whole model on each GPU, as the MPI test does on the CPU
// (tests/parallel/mpi/test_tensor_parallel_mpi.cpp): the same loss, and each rank's gradients equal to
// its shards of the whole model's gradients, with and without sequence parallelism, key-value heads
// split and replicated. One thread per rank and GPU (as NcclGroup.TwoRanksTwoGpus). f32 on the GPU:
// the split model sums in another order, so the comparison is relative (1e-4 of the norm).
//
// Without two GPUs every test reports SKIPPED (never passed): CTest's label is `cuda`.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>

#include "backends/cuda/cuda_testing.h"
#include "forge/forge.h"
#include "forge/nn/gpt.h"
#include "forge/nn/llama.h"
#include "forge/parallel/nccl_group.h"
#include "forge/parallel/tensor_parallel.h"
#include "testing/tiny_models.h"

namespace forge {
namespace {

double rel(const Tensor& got, const Tensor& want) {
  const auto a = got.to(Device::cpu(), DType::f64).to_vector<double>(), b = want.to(Device::cpu(), DType::f64).to_vector<double>();
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

template <class Model, class Config>
void check_model(const Config& cfg, const parallel::ProcessGroupPtr& g, int r, bool sp, int64_t head_dim,
                 const std::string& what) {
  const Device dev = Device::cuda(r);
  Model whole(cfg, 7);
  whole.to(dev, DType::f32);
  Model split(cfg, 7, parallel::tp::layer_spec(g, sp, head_dim));
  split.to(dev, DType::f32);
  std::map<std::string, Tensor> state;
  for (const auto& [n, t] : whole.state_dict()) state[n] = t;
  parallel::tp::load_whole_state(split, state);
  Generator gen(60);
  const Tensor idx = ops::mul(uniform({2, 8}, 0.0, 1.0, {}, &gen), static_cast<double>(cfg.vocab_size)).to(DType::i64).to(dev);
  const Tensor targets = ops::mul(uniform({2, 8}, 0.0, 1.0, {}, &gen), static_cast<double>(cfg.vocab_size)).to(DType::i64).to(dev);
  Tensor lw = whole.loss(idx, targets);
  lw.backward();
  Tensor ls = split.loss(idx, targets);
  EXPECT_LE(rel(ls, lw.detach()), 1e-5) << what << ": loss (rank " << r << ")";
  ls.backward();
  parallel::tp::reduce_grads(split, g, sp);
  std::map<std::string, Tensor> grads;
  for (const auto& [n, p] : whole.named_parameters()) grads[n] = p.grad();
  Model expected(cfg, 7, parallel::tp::layer_spec(g, sp, head_dim));
  expected.to(dev, DType::f32);
  parallel::tp::load_whole_state(expected, grads);
  const auto want = expected.named_parameters(), got = split.named_parameters();
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_LE(rel(got[i].second.grad(), want[i].second.detach()), 1e-4)
        << what << ": gradient of " << got[i].first << " (rank " << r << ")";
}

TEST(CudaTensorParallel, GptAndLlamaSplitOverTwoGpusMatchTheWholeModel) {
  FORGE_SKIP_WITHOUT_GPU();
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs 2 GPUs, " << cuda_device_count() << " visible";
  cuda_testing::on_two_gpus([](int r, const parallel::ProcessGroupPtr& g) {
    const int64_t head_dim = 8;  // tiny_llama_config: 64 wide, 8 heads
    check_model<nn::GPT>(testing::tiny_gpt_config(), g, r, false, 0, "GPT");
    check_model<nn::GPT>(testing::tiny_gpt_config(), g, r, true, 0, "GPT, sequence parallel");
    check_model<nn::Llama>(testing::tiny_llama_config(2), g, r, false, head_dim, "LLaMA, kv heads split");
    check_model<nn::Llama>(testing::tiny_llama_config(1), g, r, true, head_dim,
                           "LLaMA, one kv head replicated, sequence parallel");
  });
}

}  // namespace
}  // namespace forge
