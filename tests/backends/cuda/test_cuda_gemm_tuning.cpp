// GEMM algorithm tuning (Note [GEMM algorithm tuning] in backends/cuda/blaslt.h) on the GPU:
// tuned GEMMs (plain, batched, bias, GELU-aux and bias-gradient epilogues, beta = 1) match the
// CPU on fresh random inputs; timing an accumulating GEMM writes a scratch C, never the real
// one; the tuning cache file is written, read back after a reset (the shape is not timed
// again), and its stale or corrupt entries are dropped; an unwritable file is not fatal;
// nothing is timed inside a stream capture; candidates timed as CUDA graphs
// (FORGE_GEMM_TUNE_IN_GRAPH) give correct results and a cache section of their own; a shape
// without a cuBLASLt algorithm is reported and counted. The file's format and failure modes without a GPU:
// tests/backends/test_gemm_tuning_cache.cpp.
//
// Each test gets its own cache file (FORGE_GEMM_TUNE_CACHE through env::Override), tuning on,
// and freshly reset plans, so shapes seen by earlier tests are planned and timed again.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>

#include "backends/cuda/cuda_testing.h"
#include "forge/backends/cuda/blaslt.h"
#include "forge/backends/cuda/matmul.h"
#include "forge/backends/cuda/stream.h"
#include "forge/backends/gemm_tuning_cache.h"
#include "forge/core/env.h"
#include "forge/forge.h"
#include "io/io_testing.h"

namespace forge {
namespace {

using namespace cuda_testing;
namespace fs = std::filesystem;

DType ref_dtype(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }
Tensor ref_of(const Tensor& cpu) { return cpu.to(ref_dtype(cpu.dtype())); }
void expect_matches(const Tensor& gpu, const Tensor& ref, double tol, const std::string& what) {
  expect_close(gpu.to(ref.dtype()), ref, tol, what);
}

void expect_has(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "'" << part << "' not in: " << text;
}

class CudaGemmTuning : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    gpu_ = true;
    dir_ = std::make_unique<testing::ScratchDir>();
    use_cache_file(cache_file());
    was_on_ = cuda::gemm_tuning();
    cuda::set_gemm_tuning(true);
    cuda::reset_gemm_plans(0);
  }
  void TearDown() override {
    if (!gpu_) return;
    cuda::reset_gemm_plans(0);  // later tests must not keep plans that read this test's file
    cuda::set_gemm_tuning(was_on_);
  }

  fs::path cache_file() const { return dir_->path() / "gemm_tuning.json"; }
  void use_cache_file(const std::string& value) {
    override_.reset();
    override_.emplace("FORGE_GEMM_TUNE_CACHE", value);
  }

  bool gpu_ = false;
  bool was_on_ = true;
  std::unique_ptr<testing::ScratchDir> dir_;
  std::optional<env::Override> override_;
};

// C = A B (+ beta C) through blas::gemm, A (m, k), B (k, n), C (batch, m, n) contiguous.
void run_gemm(const Tensor& a, const Tensor& b, Tensor& c, double beta) {
  const int64_t batch = c.dim() == 3 ? c.size(0) : 1;
  const int64_t m = c.size(c.dim() - 2), n = c.size(c.dim() - 1), k = a.size(a.dim() - 1);
  cuda::blas::Gemm g;
  g.dtype = c.dtype();
  g.m = m;
  g.n = n;
  g.k = k;
  g.batch = batch;
  g.a = {a.data_ptr(), k, false, batch > 1 ? m * k : 0};
  g.b = {b.data_ptr(), n, false, batch > 1 ? k * n : 0};
  g.c = c.data_ptr();
  g.ldc = n;
  g.c_batch_stride = batch > 1 ? m * n : 0;
  g.beta = beta;
  ASSERT_TRUE(cuda::blas::gemm(0, g));
}

TEST_F(CudaGemmTuning, TunedGemmsMatchTheCpu) {
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    const auto before = cuda::gemm_tuning_stats();
    uint64_t seed = 1000 + 100 * static_cast<uint64_t>(dt);
    // Plain, with a transposed operand, and batched.
    const Pair a = on_both(host_input({256, 192}, Domain::real, dt, seed++));
    const Pair b = on_both(host_input({192, 320}, Domain::real, dt, seed++));
    expect_matches(ops::matmul(a.gpu, b.gpu), ops::matmul(ref_of(a.cpu), ref_of(b.cpu)), tolerance(dt), "plain");
    expect_matches(ops::matmul(b.gpu.t(), a.gpu.t()), ops::matmul(ref_of(b.cpu).t(), ref_of(a.cpu).t()),
                   tolerance(dt), "transposed operands");
    const Pair ab = on_both(host_input({4, 96, 64}, Domain::real, dt, seed++));
    const Pair bb = on_both(host_input({4, 64, 136}, Domain::real, dt, seed++));
    expect_matches(ops::bmm(ab.gpu, bb.gpu), ops::bmm(ref_of(ab.cpu), ref_of(bb.cpu)), tolerance(dt), "batched");

    // Linear with bias (bias epilogue) and linear_gelu (gelu_aux), forward and backward (the
    // weight gradient with the bias gradient: bgrad_a), against the CPU.
    for (bool gelu : {false, true}) {
      SCOPED_TRACE(gelu ? "linear_gelu" : "linear");
      const Pair x = on_both(host_input({128, 96}, Domain::real, dt, seed++));
      const Pair w = on_both(ops::mul(host_input({256, 96}, Domain::real, DType::f32, seed++), 0.2).to(dt));
      const Pair bias = on_both(host_input({256}, Domain::real, dt, seed++));
      Tensor xg = x.gpu.detach().requires_grad_(), wg = w.gpu.detach().requires_grad_();
      Tensor bg = bias.gpu.detach().requires_grad_();
      Tensor xc = ref_of(x.cpu).requires_grad_(), wc = ref_of(w.cpu).requires_grad_();
      Tensor bc = ref_of(bias.cpu).requires_grad_();
      Tensor yg = gelu ? ops::linear_gelu(xg, wg, bg) : ops::linear(xg, wg, bg);
      Tensor yc = gelu ? ops::linear_gelu(xc, wc, bc) : ops::linear(xc, wc, bc);
      // cuBLASLt's GELU differs from forge's gelu_tanh in the last f32 bits (test_cuda_matmul).
      expect_matches(yg, yc, dt == DType::f32 && gelu ? 1e-4 : tolerance(dt), "forward");
      const Pair g = on_both(host_input(yc.shape(), Domain::real, dt, seed++));
      yg.backward(g.gpu);
      yc.backward(ref_of(g.cpu));
      expect_matches(xg.grad(), xc.grad(), tolerance(dt), "dx");
      expect_matches(wg.grad(), wc.grad(), tolerance(dt), "dw");
      expect_matches(bg.grad(), bc.grad(), tolerance(dt), "dbias");
    }
    const auto after = cuda::gemm_tuning_stats();
    EXPECT_GE(after.tuned - before.tuned, 5) << "each new shape is tuned at its first use";
    EXPECT_GE(after.timed - before.timed, 1) << "cuBLASLt offered one candidate for every shape";
    EXPECT_EQ(after.failed, before.failed);
  }
}

TEST_F(CudaGemmTuning, AccumulatingGemmsAreTimedIntoScratch) {
  // With beta = 1 the GEMM reads C: had the timing runs written the real C, it would hold
  // C0 + (1 + runs) A B. It must hold C0 + A B, as with tuning off (up to the algorithms'
  // rounding), plain and batched.
  for (int64_t batch : {1, 3}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    const Shape cs = batch > 1 ? Shape{batch, 256, 384} : Shape{256, 384};
    const Shape as = batch > 1 ? Shape{batch, 256, 320} : Shape{256, 320};
    const Shape bs = batch > 1 ? Shape{batch, 320, 384} : Shape{320, 384};
    const Pair a = on_both(host_input(as, Domain::real, DType::f32, 1));
    const Pair b = on_both(host_input(bs, Domain::real, DType::f32, 2));
    const Pair c0 = on_both(host_input(cs, Domain::real, DType::f32, 3));
    const Tensor ref = ops::add(c0.cpu, ops::matmul(a.cpu, b.cpu));

    cuda::reset_gemm_plans(0);
    const auto before = cuda::gemm_tuning_stats();
    Tensor tuned = c0.gpu.clone();
    run_gemm(a.gpu, b.gpu, tuned, 1.0);
    const auto after = cuda::gemm_tuning_stats();
    ASSERT_EQ(after.timed - before.timed, 1) << "the shape was not timed: nothing checked";
    expect_matches(tuned, ref, 1e-5, "beta = 1, tuned");

    cuda::set_gemm_tuning(false);
    cuda::reset_gemm_plans(0);
    Tensor heuristic = c0.gpu.clone();
    run_gemm(a.gpu, b.gpu, heuristic, 1.0);
    cuda::set_gemm_tuning(true);
    expect_matches(heuristic, ref, 1e-5, "beta = 1, tuning off");
    expect_close(tuned, heuristic, 1e-5, "tuning on vs off");
  }
}

TEST_F(CudaGemmTuning, CacheFileIsWrittenAndReadBack) {
  const Pair a = on_both(host_input({384, 256}, Domain::real, DType::bf16, 11));
  const Pair b = on_both(host_input({256, 512}, Domain::real, DType::bf16, 12));
  const Tensor ref = ops::matmul(ref_of(a.cpu), ref_of(b.cpu));
  const auto s0 = cuda::gemm_tuning_stats();
  expect_matches(ops::matmul(a.gpu, b.gpu), ref, 1e-2, "first run (timed)");
  const auto s1 = cuda::gemm_tuning_stats();
  EXPECT_EQ(s1.tuned - s0.tuned, 1);
  EXPECT_EQ(s1.loaded, s0.loaded);
  EXPECT_GE(s1.file_writes - s0.file_writes, 1);
  ASSERT_TRUE(fs::exists(cache_file()));
  const nlohmann::json j = nlohmann::json::parse(testing::slurp(cache_file()));
  ASSERT_EQ(j["devices"].size(), 1u);
  const nlohmann::json entries = j["devices"].begin().value()["entries"];
  ASSERT_EQ(entries.size(), 1u);
  expect_has(entries.begin().key(), "bf16 acc32f m=384 n=512 k=256 batch=1");
  EXPECT_EQ(entries.begin().value()["algo"].get<std::string>().size(), 128u);

  // Repeated calls use the plan: nothing more is tuned or written.
  (void)ops::matmul(a.gpu, b.gpu);
  EXPECT_EQ(cuda::gemm_tuning_stats().tuned, s1.tuned);

  // "A new process": the plan is rebuilt and its algorithm read from the file, not timed.
  cuda::reset_gemm_plans(0);
  expect_matches(ops::matmul(a.gpu, b.gpu), ref, 1e-2, "after the reset (from the file)");
  const auto s2 = cuda::gemm_tuning_stats();
  EXPECT_EQ(s2.tuned, s1.tuned);
  EXPECT_EQ(s2.loaded - s1.loaded, 1);
  EXPECT_EQ(s2.stale, s1.stale);

  // Tuning off neither reads nor times.
  cuda::set_gemm_tuning(false);
  cuda::reset_gemm_plans(0);
  expect_matches(ops::matmul(a.gpu, b.gpu), ref, 1e-2, "tuning off");
  const auto s3 = cuda::gemm_tuning_stats();
  EXPECT_EQ(s3.tuned, s2.tuned);
  EXPECT_EQ(s3.loaded, s2.loaded);
}

TEST_F(CudaGemmTuning, StaleAndCorruptCachesAreReplaced) {
  const Pair a = on_both(host_input({320, 256}, Domain::real, DType::bf16, 21));
  const Pair b = on_both(host_input({256, 448}, Domain::real, DType::bf16, 22));
  const Tensor ref = ops::matmul(ref_of(a.cpu), ref_of(b.cpu));
  (void)ops::matmul(a.gpu, b.gpu);
  // An algorithm cuBLASLt refuses (as after a cuBLASLt upgrade that kept its version number):
  // dropped at the check, timed again, and overwritten in the file.
  nlohmann::json j = nlohmann::json::parse(testing::slurp(cache_file()));
  for (auto& section : j["devices"])
    for (auto& e : section["entries"]) e["algo"] = std::string(128, 'f');
  testing::spit(cache_file(), j.dump());
  cuda::reset_gemm_plans(0);
  const auto s0 = cuda::gemm_tuning_stats();
  expect_matches(ops::matmul(a.gpu, b.gpu), ref, 1e-2, "after a stale entry");
  const auto s1 = cuda::gemm_tuning_stats();
  EXPECT_EQ(s1.stale - s0.stale, 1);
  EXPECT_EQ(s1.tuned - s0.tuned, 1);
  EXPECT_EQ(s1.loaded, s0.loaded);
  const std::string rewritten = testing::slurp(cache_file());
  EXPECT_EQ(rewritten.find(std::string(128, 'f')), std::string::npos);

  // A corrupt file: one warning naming it, the shapes timed, the file rewritten whole.
  testing::spit(cache_file(), "{\"format\": \"forge-gemm-tuning\", \"vers");
  cuda::reset_gemm_plans(0);
  ::testing::internal::CaptureStderr();
  expect_matches(ops::matmul(a.gpu, b.gpu), ref, 1e-2, "after a corrupt file");
  const std::string err = ::testing::internal::GetCapturedStderr();
  expect_has(err, "forge: the GEMM tuning cache '" + cache_file().string() + "' is ignored: it is not valid JSON");
  const auto s2 = cuda::gemm_tuning_stats();
  EXPECT_EQ(s2.tuned - s1.tuned, 1);
  EXPECT_FALSE(nlohmann::json::parse(testing::slurp(cache_file()), nullptr, false).is_discarded());
}

TEST_F(CudaGemmTuning, AnUnwritableCacheIsNotFatal) {
  testing::spit(dir_->path() / "a_file", "x");
  use_cache_file((dir_->path() / "a_file" / "gemm_tuning.json").string());  // its parent is a file
  cuda::reset_gemm_plans(0);
  const Pair a = on_both(host_input({192, 128}, Domain::real, DType::f16, 31));
  const Pair b = on_both(host_input({128, 160}, Domain::real, DType::f16, 32));
  const auto s0 = cuda::gemm_tuning_stats();
  expect_matches(ops::matmul(a.gpu, b.gpu), ops::matmul(ref_of(a.cpu), ref_of(b.cpu)), 1e-2, "unwritable cache");
  const auto s1 = cuda::gemm_tuning_stats();
  EXPECT_EQ(s1.tuned - s0.tuned, 1);
  EXPECT_EQ(s1.file_writes, s0.file_writes);
  // No file at all.
  use_cache_file("none");
  cuda::reset_gemm_plans(0);
  expect_matches(ops::matmul(a.gpu, b.gpu), ops::matmul(ref_of(a.cpu), ref_of(b.cpu)), 1e-2, "no cache file");
  EXPECT_EQ(cuda::gemm_tuning_stats().tuned - s1.tuned, 1);
  EXPECT_FALSE(fs::exists(cache_file()));
}

TEST_F(CudaGemmTuning, NothingIsTimedInsideAStreamCapture) {
  cuda::Stream side = cuda::Stream::create(0);
  cuda::StreamGuard guard(side);
  // Everything the captured GEMM needs exists before the capture: its tensors, and the side
  // stream's workspace and the cache file's entries (read by a GEMM of another shape).
  const Pair a = on_both(host_input({288, 224}, Domain::real, DType::bf16, 41));
  const Pair b = on_both(host_input({224, 352}, Domain::real, DType::bf16, 42));
  const Tensor ref = ops::matmul(ref_of(a.cpu), ref_of(b.cpu));
  Tensor out = empty({288, 352}, {.dtype = DType::bf16, .device = kGpu});
  (void)ops::matmul(b.gpu.t(), a.gpu.t());
  side.synchronize();

  const auto s0 = cuda::gemm_tuning_stats();
  ASSERT_EQ(cudaStreamBeginCapture(side.handle(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
  cuda::matmul(a.gpu, b.gpu, out);  // the shape's first use: the heuristic's choice, captured
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(side.handle(), &graph), cudaSuccess);
  const auto s1 = cuda::gemm_tuning_stats();
  EXPECT_EQ(s1.capture_skips - s0.capture_skips, 1);
  EXPECT_EQ(s1.tuned, s0.tuned);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, side.handle()), cudaSuccess);
  side.synchronize();
  expect_matches(out, ref, 1e-2, "captured GEMM, replayed");
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);

  // Outside the capture the shape is tuned at its next use.
  Tensor again = empty({288, 352}, {.dtype = DType::bf16, .device = kGpu});
  cuda::matmul(a.gpu, b.gpu, again);
  expect_matches(again, ref, 1e-2, "after the capture (tuned)");
  EXPECT_EQ(cuda::gemm_tuning_stats().tuned - s1.tuned, 1);
}

// Note [GEMM timing in CUDA graphs] (FORGE_GEMM_TUNE_IN_GRAPH=1): the candidates are timed as
// graphs of their runs; the results still match the CPU, an accumulating GEMM still gets C0 + A B
// (the graphs' runs write the scratch C), and the choices go to a section of their own in the file.
TEST_F(CudaGemmTuning, GraphTimedChoicesMatchTheCpuAndKeepTheirOwnSection) {
  env::Override graphs("FORGE_GEMM_TUNE_IN_GRAPH", "1");
  cuda::reset_gemm_plans(0);  // the identity (and so the mode) is read with the file
  const auto s0 = cuda::gemm_tuning_stats();
  const Pair a = on_both(host_input({512, 384}, Domain::real, DType::bf16, 61));
  const Pair b = on_both(host_input({384, 640}, Domain::real, DType::bf16, 62));
  expect_matches(ops::matmul(a.gpu, b.gpu), ops::matmul(ref_of(a.cpu), ref_of(b.cpu)), 1e-2, "graph-timed");
  const Pair c0 = on_both(host_input({256, 384}, Domain::real, DType::f32, 63));
  const Pair x = on_both(host_input({256, 320}, Domain::real, DType::f32, 64));
  const Pair y = on_both(host_input({320, 384}, Domain::real, DType::f32, 65));
  Tensor acc = c0.gpu.clone();
  run_gemm(x.gpu, y.gpu, acc, 1.0);
  expect_matches(acc, ops::add(c0.cpu, ops::matmul(x.cpu, y.cpu)), 1e-5, "beta = 1, graph-timed");
  const auto s1 = cuda::gemm_tuning_stats();
  EXPECT_EQ(s1.tuned - s0.tuned, 2);
  EXPECT_EQ((s1.graph_timed - s0.graph_timed) + (s1.graph_refused - s0.graph_refused), s1.timed - s0.timed);
  EXPECT_GE(s1.graph_timed - s0.graph_timed, 1) << "no candidate list could be captured";
  EXPECT_LE(s1.memset_first - s0.memset_first, s1.graph_timed - s0.graph_timed);
  EXPECT_LE(s1.memset_chosen - s0.memset_chosen, s1.graph_timed - s0.graph_timed);
  EXPECT_EQ(s1.failed, s0.failed);
  const nlohmann::json j = nlohmann::json::parse(testing::slurp(cache_file()));
  ASSERT_EQ(j["devices"].size(), 1u);
  expect_has(j["devices"].begin().key(), ", timed as CUDA graphs");
  EXPECT_EQ(j["devices"].begin().value()["entries"].size(), 2u);
}

TEST_F(CudaGemmTuning, FallbacksAreReportedOnceAndCounted) {
  // f64 bias epilogues: cuBLASLt has no algorithm for them on the GPUs forge runs on (the
  // unfused sequence runs instead). Where it does, there is no fallback to observe.
  const Pair x = on_both(host_input({37, 61}, Domain::real, DType::f64, 51));
  const Pair w = on_both(host_input({129, 61}, Domain::real, DType::f64, 52));
  const Pair bias = on_both(host_input({129}, Domain::real, DType::f64, 53));
  const Tensor ref = ops::linear(x.cpu, w.cpu, bias.cpu);
  const auto s0 = cuda::gemm_tuning_stats();
  ::testing::internal::CaptureStderr();
  expect_matches(ops::linear(x.gpu, w.gpu, bias.gpu), ref, 1e-12, "first call");
  expect_matches(ops::linear(x.gpu, w.gpu, bias.gpu), ref, 1e-12, "second call");
  const std::string err = ::testing::internal::GetCapturedStderr();
  const auto s1 = cuda::gemm_tuning_stats();
  if (s1.fallback_shapes == s0.fallback_shapes) GTEST_SKIP() << "cuBLASLt has an f64 bias epilogue here";
  EXPECT_EQ(s1.fallback_shapes - s0.fallback_shapes, 1);
  EXPECT_EQ(s1.fallback_calls - s0.fallback_calls, 2);
  expect_has(err, "forge: GEMM fallback: cuBLASLt has no algorithm for f64 acc64f m=37 n=129 k=61");
  expect_has(err, "epilogue=bias");
  expect_has(err, "the caller runs the unfused sequence instead");
  EXPECT_EQ(err.find("GEMM fallback"), err.rfind("GEMM fallback")) << "reported once: " << err;
}

}  // namespace
}  // namespace forge
