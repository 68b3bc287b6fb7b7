// CUDA graphs: cuda::CudaGraph and the allocator's graph pools (backends/cuda/graph.h, Note [graph
// memory pools]), the optimizer's device-held lr and step counts (Note [optimizer steps in a CUDA
// graph]) and the training step captured whole (train/graphed_step.h, Note [the step as a CUDA
// graph]): a run with run.cuda_graph = true must give the same bits as one without, on one GPU and
// (with two GPUs) under DDP.
//
// Without a GPU every test reports SKIPPED (never passed): CTest's label is `cuda`.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "backends/cuda/cuda_testing.h"
#include "forge/backends/cuda/graph.h"
#include "forge/backends/cuda/memory.h"
#include "forge/backends/cuda/stream.h"
#include "forge/backends/cuda/tensor_kernels.h"
#include "forge/forge.h"
#include "forge/io/safetensors.h"
#include "forge/optim/adamw.h"
#include "forge/optim/sgd.h"
#include "forge/run/config.h"
#include "forge/train/trainer.h"
#include "testing/cli_testing.h"
#include "train/train_testing.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using cuda_testing::kGpu;

Tensor random_gpu(const Shape& s, uint64_t seed, DType dtype = DType::f32) {
  manual_seed(seed);
  return uniform(s, 0.5, 1.5).to(kGpu, dtype);  // never zero
}

// A stream of the test's own, current for the scope (the legacy stream cannot be captured).
struct OwnStream {
  cuda::Stream stream = cuda::Stream::create(0);
  cuda::StreamGuard guard{stream};
  OwnStream() { cuda::synchronize(0); }
  ~OwnStream() { stream.synchronize(); }
};

TEST(CudaGraph, ReplaysWithNewInputsAndAllocatesNothing) {
  FORGE_SKIP_WITHOUT_GPU();
  OwnStream s;
  Tensor x = random_gpu({4096}, 1);
  Tensor y = ops::exp(x * 2.0 + 1.0);  // warm-up, outside the capture
  cuda::CudaGraph g;
  g.capture_begin(s.stream);
  EXPECT_TRUE(cuda::is_capturing(0));
  y = ops::exp(ops::mul(x, 2.0) + 1.0).sum();  // temporaries in the graph's pool
  g.capture_end();
  EXPECT_FALSE(cuda::is_capturing(0));
  EXPECT_GT(g.num_nodes(), 2u);
  for (uint64_t seed : {2, 3, 4}) {
    const Tensor fresh = random_gpu({4096}, seed);
    ops::copy_(x, fresh);
    const int64_t allocs = cuda::memory_stats(0).num_allocs;
    g.replay();
    EXPECT_EQ(cuda::memory_stats(0).num_allocs, allocs) << "a replay allocates nothing";
    const double want = ops::exp(fresh.to(Device::cpu(), DType::f64) * 2.0 + 1.0).sum().item<double>();
    EXPECT_NEAR(y.item<double>(), want, 1e-5 * want) << "seed " << seed;
  }
}

TEST(CudaGraph, AMainPoolBlockFreedDuringTheCaptureIsHeldForTheGraph) {
  FORGE_SKIP_WITHOUT_GPU();
  OwnStream s;
  Tensor a = random_gpu({1 << 16}, 5);
  Tensor out;
  (void)ops::mul(a, 3.0);
  void* old = a.data_ptr();
  {
    cuda::CudaGraph g;
    g.capture_begin(s.stream);
    out = ops::mul(a, 3.0);
    a = Tensor();  // the graph still reads this block at every replay
    g.capture_end();
    // A new tensor of the same size must not get the block the graph reads.
    Tensor b = random_gpu({1 << 16}, 6);
    EXPECT_NE(b.data_ptr(), old);
    g.replay();
    s.stream.synchronize();
  }
  // The graph is gone: its pool's blocks still held by `out` stay valid.
  EXPECT_EQ(out.numel(), 1 << 16);
  EXPECT_GT(out.sum().item<double>(), 0.0);
}

TEST(CudaGraph, WorkForkedToAnotherStreamJoinsTheCapture) {
  FORGE_SKIP_WITHOUT_GPU();
  OwnStream s;
  cuda::Stream side = cuda::Stream::create(0);
  Tensor x = random_gpu({8192}, 7);
  Tensor y;
  cuda::CudaGraph g;
  g.capture_begin(s.stream);
  {
    Tensor t = ops::mul(x, 2.0);  // graph pool
    cuda::Event ready;
    ready.record(s.stream);
    ready.wait(side);
    cuda::record_stream(t, side);
    {
      cuda::StreamGuard on_side(side);
      y = ops::add(t, 1.0);
    }
    cuda::Event done;
    done.record(side);
    done.wait(s.stream);
  }  // t freed during the capture, used on `side`: not reused before the capture ends
  Tensor z = ops::mul(x, 5.0);  // must not land on t's block
  g.capture_end();
  for (uint64_t seed : {8, 9}) {
    const Tensor fresh = random_gpu({8192}, seed);
    ops::copy_(x, fresh);
    g.replay();
    const Tensor f64 = fresh.to(Device::cpu(), DType::f64);
    EXPECT_NEAR(y.to(Device::cpu(), DType::f64).sum().item<double>(), (f64 * 2.0 + 1.0).sum().item<double>(), 1e-2);
    EXPECT_NEAR(z.to(Device::cpu(), DType::f64).sum().item<double>(), (f64 * 5.0).sum().item<double>(), 1e-2);
  }
}

TEST(CudaGraph, RandomNumbersInACaptureAreRefusedWithAReason) {
  FORGE_SKIP_WITHOUT_GPU();
  OwnStream s;
  Tensor x = random_gpu({64}, 10);
  cuda::CudaGraph g;
  g.capture_begin(s.stream);
  std::string msg;
  try {
    (void)ops::dropout(x, 0.5, /*training=*/true);
  } catch (const Error& e) {
    msg = e.what();
  }
  g.capture_abort();
  EXPECT_NE(msg.find("cannot run inside a CUDA graph capture"), std::string::npos) << msg;
  EXPECT_NE(msg.find("random seed"), std::string::npos) << msg;
}

// The optimizer's captured update, replayed with a changing lr and step count, against the same
// updates run kernel by kernel: the same bits.
template <class Opt, class Options>
void expect_replayed_updates_match(const Options& options, DType dtype) {
  OwnStream s;
  auto make = [&](uint64_t seed) { return std::vector<Tensor>{random_gpu({300}, seed, dtype), random_gpu({17, 9}, seed + 1, dtype)}; };
  std::vector<Tensor> pa = make(20), pb = make(20);
  for (auto& p : pa) p.requires_grad_(true);
  for (auto& p : pb) p.requires_grad_(true);
  Opt eager(pa, options), graphed(pb, options);
  auto set_grads = [&](std::vector<Tensor>& ps, uint64_t seed) {
    for (size_t i = 0; i < ps.size(); ++i) ps[i].set_grad(random_gpu(ps[i].shape(), seed * 10 + i, dtype) - 1.0);
  };
  const Tensor no_skip = zeros({}, {.dtype = DType::f32, .device = kGpu});
  const double lrs[] = {1e-2, 5e-3, 2e-3, 1e-3, 5e-4};
  // Step 1 (state made) in both, kernel by kernel.
  for (auto* o : {&eager, &graphed}) {
    for (auto& g : o->param_groups()) g.lr = lrs[0];
  }
  set_grads(pa, 1);
  set_grads(pb, 1);
  eager.step(no_skip);
  graphed.step(no_skip);
  // Step 2 captured; later steps replayed with new gradients written into the captured ones.
  for (auto& g : graphed.param_groups()) g.lr = lrs[1];
  set_grads(pb, 2);
  std::vector<Tensor> captured_grads;
  for (auto& p : pb) captured_grads.push_back(p.grad());
  cuda::CudaGraph graph;
  graphed.begin_graph_capture(kGpu);
  graph.capture_begin(s.stream);
  graphed.step(no_skip);
  graph.capture_end();
  graphed.end_graph_capture();
  graphed.stage_graph_inputs();
  graph.replay();
  for (auto& g : eager.param_groups()) g.lr = lrs[1];
  set_grads(pa, 2);
  eager.step(no_skip);
  for (int k = 3; k <= 5; ++k) {
    for (auto& g : eager.param_groups()) g.lr = lrs[k - 1];
    for (auto& g : graphed.param_groups()) g.lr = lrs[k - 1];
    set_grads(pa, static_cast<uint64_t>(k));
    for (size_t i = 0; i < pb.size(); ++i) ops::copy_(captured_grads[i], random_gpu(pb[i].shape(), static_cast<uint64_t>(k) * 10 + i, dtype) - 1.0);
    eager.step(no_skip);
    graphed.count_replayed_step();
    graphed.stage_graph_inputs();
    graph.replay();
  }
  for (size_t i = 0; i < pa.size(); ++i) {
    const auto a = pa[i].detach().to_vector<double>(), b = pb[i].detach().to_vector<double>();
    ASSERT_EQ(a, b) << "parameter " << i << " after 5 updates";
  }
  EXPECT_EQ(eager.step_count(), graphed.step_count());
  EXPECT_EQ(eager.state(pa[0])->step, graphed.state(pb[0])->step);
}

TEST(CudaGraph, AdamWReplaysMatchEagerUpdatesBitForBit) {
  FORGE_SKIP_WITHOUT_GPU();
  expect_replayed_updates_match<optim::AdamW>(optim::AdamWOptions{.lr = 1e-2, .weight_decay = 0.1}, DType::bf16);
  expect_replayed_updates_match<optim::AdamW>(optim::AdamWOptions{.lr = 1e-2, .weight_decay = 0.1}, DType::f32);
}

TEST(CudaGraph, SgdReplaysMatchEagerUpdatesBitForBit) {
  FORGE_SKIP_WITHOUT_GPU();
  expect_replayed_updates_match<optim::SGD>(optim::SGDOptions{.lr = 1e-2, .momentum = 0.9, .weight_decay = 1e-3}, DType::f32);
}

// ---- the training step ------------------------------------------------------------------------

class GraphedTraining : public ::testing::Test {
 protected:
  void SetUp() override {
    FORGE_SKIP_WITHOUT_GPU();
    train_testing::write_corpus(scratch.path() / "corpus");
  }
  struct Run {
    train::TrainResult result;
    std::string log;
    std::vector<double> weights;  // every tensor of the final checkpoint's model, in name order
  };
  Run train(const std::string& name, std::vector<std::string> overrides) {
    overrides.insert(overrides.begin(), {"run.device=cuda", "run.deterministic=true", "run.gemm_tuning=off",
                                         "train.log_every=1", "checkpoint.at_end=true"});
    const train::RunConfig c =
        train::parse_config(train_testing::tiny_toml(scratch.path(), name, 14), name + ".toml", overrides);
    std::ostringstream log;
    Run r;
    r.result = train::run_training(c, {}, log);
    r.log = log.str();
    r.weights = train_testing::checkpoint_weights(r.result.last_checkpoint);
    return r;
  }
  // The same run with and without the graph: the same losses and weights, bit for bit.
  void expect_same_bits(const std::string& name, const std::vector<std::string>& overrides) {
    std::vector<std::string> on = overrides, off = overrides;
    on.push_back("run.cuda_graph=true");
    off.push_back("run.cuda_graph=false");
    const Run g = train(name + "_graph", on), e = train(name + "_eager", off);
    EXPECT_NE(g.log.find("cuda graph: step 2 captured"), std::string::npos) << g.log;
    EXPECT_NE(g.log.find("step(s) replayed"), std::string::npos) << g.log;
    EXPECT_NE(e.log.find("cuda graph: off (run.cuda_graph = false)"), std::string::npos) << e.log;
    ASSERT_EQ(g.result.losses.size(), e.result.losses.size());
    for (size_t i = 0; i < e.result.losses.size(); ++i)
      EXPECT_EQ(g.result.losses[i], e.result.losses[i]) << "step " << i + 1 << "\n" << g.log;
    ASSERT_EQ(g.result.evals.size(), e.result.evals.size());
    for (size_t i = 0; i < e.result.evals.size(); ++i) EXPECT_EQ(g.result.evals[i].val_loss, e.result.evals[i].val_loss);
    ASSERT_EQ(g.weights.size(), e.weights.size());
    EXPECT_TRUE(g.weights == e.weights) << "the final weights differ";
  }
  train_testing::Scratch scratch;
};

// Head size 64 and 64 positions: attention runs on cuDNN (Note [cuDNN attention]).
TEST_F(GraphedTraining, GptAdamWBf16GivesTheSameBitsAsWithoutTheGraph) {
  expect_same_bits("gpt_adamw", {"run.dtype=bf16", "model.n_embd=128", "model.block_size=64", "train.seq_len=64"});
}

TEST_F(GraphedTraining, GptGradientAccumulationAndSgdGiveTheSameBits) {
  expect_same_bits("gpt_sgd_accum", {"run.dtype=f32", "optim.name=sgd", "train.grad_accum=2"});
}

TEST_F(GraphedTraining, GptF16WithLossScalingGivesTheSameBits) {
  expect_same_bits("gpt_f16", {"run.dtype=f16"});
}

TEST_F(GraphedTraining, LlamaWithGroupedQueryAttentionGivesTheSameBits) {
  expect_same_bits("llama", {"run.dtype=bf16", "model.type=llama", "model.dim=256", "model.n_head=4",
                             "model.n_kv_head=2", "model.ffn_hidden=320", "model.n_layer=2", "model.block_size=64",
                             "train.seq_len=64"});
}

// Note [token weights on the device]: packed documents weigh each micro-batch by its counted
// targets (Note [token-weighted loss]); a replay takes those weights from the static batches on
// the GPU and gives the eager run's bits. Two micro-batches per step (different counts), head size
// 64 in bf16: the flash kernels with document ids.
TEST_F(GraphedTraining, PackedDocumentsWeighTheirTokensOnTheDeviceAndGiveTheSameBits) {
  const fs::path docs = scratch.path() / "docs" / "docs.jsonl";
  fs::create_directories(docs.parent_path());
  {
    std::ofstream out(docs);
    for (int i = 0; i < 300; ++i) {
      std::string text = train_testing::synthetic_text(20 + static_cast<size_t>((i * 37) % 140), 5 + static_cast<uint64_t>(i));
      for (char& ch : text)
        if (ch == '\n') ch = ' ';
      out << "{\"text\": \"" << text << "\"}\n";
    }
  }
  expect_same_bits("packed", {"run.dtype=bf16", "data.files=[\"" + docs.string() + "\"]", "data.packing=documents",
                              "train.grad_accum=2", "model.n_embd=128", "model.block_size=64", "train.seq_len=64"});
}

TEST_F(GraphedTraining, DropoutAndZeroRunWithoutTheGraphAndSaySo) {
  {
    const Run r = train("dropout", {"run.dtype=bf16", "model.dropout=0.1"});
    EXPECT_NE(r.log.find("cuda graph: off (model.dropout > 0"), std::string::npos) << r.log;
  }
  {
    const Run r = train("zero1", {"run.dtype=bf16", "dist.zero_stage=1"});
    EXPECT_NE(r.log.find("cuda graph: off (ZeRO-1"), std::string::npos) << r.log;
  }
}

// DDP on two GPUs (forge launch): the NCCL all-reduces are captured with the step.
TEST_F(GraphedTraining, DdpOnTwoGpusGivesTheSameBitsAsWithoutTheGraph) {
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs 2 GPUs, " << cuda_device_count() << " visible";
  const fs::path cfg = scratch.path() / "ddp.toml";
  std::ofstream(cfg) << train_testing::tiny_toml(scratch.path(), "ddp", 14);
  auto run = [&](const std::string& name, bool graph) {
    std::string cmd = "NCCL_NVLS_ENABLE=0 " + testing::shell_quote(testing::forge_binary().string()) +
                      " launch --nproc-per-node 2 -- " + testing::shell_quote(testing::forge_binary().string()) + " train " +
                      testing::shell_quote(cfg.string()) + " --run.device=cuda --run.dtype=bf16 --run.deterministic=true" +
                      " --run.gemm_tuning=off --run.name=" + name + " --eval.every=0 --train.batch_size=8" +
                      " --dist.bucket_mb=0.01 --run.cuda_graph=" + (graph ? "true" : "false") + " 2>&1";
    std::string out;
    FILE* p = ::popen(cmd.c_str(), "r");
    char buf[4096];
    size_t n = 0;
    while (p != nullptr && (n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
    const int st = p != nullptr ? ::pclose(p) : -1;
    EXPECT_EQ(st, 0) << out;
    return out;
  };
  const std::string g = run("ddp_graph", true), e = run("ddp_eager", false);
  EXPECT_NE(g.find("cuda graph: step 2 captured"), std::string::npos) << g;
  const auto lg = train_testing::metrics_losses(scratch.path() / "runs" / "ddp_graph"),
             le = train_testing::metrics_losses(scratch.path() / "runs" / "ddp_eager");
  ASSERT_EQ(lg.size(), 14u) << g;
  EXPECT_EQ(lg, le) << g << "\n" << e;
}

}  // namespace
}  // namespace forge
