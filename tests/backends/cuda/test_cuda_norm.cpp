// The CUDA norm kernels (backends/cuda/norm.cu) against the CPU backend: layer_norm,
// rms_norm and add_layer_norm, forward and backward through autograd, in f32, bf16, f16 and
// f64. Widths 768 (GPT-2), 1000 and 999 (999: not a multiple of any vector width, so the
// scalar path runs; 1000 is a multiple of 8 and takes the vector path), 3 and 4096 (wider than
// the 1024 columns a warp keeps in registers: the block-per-row backward of norm_wide.cu for
// f32/bf16/f16, the re-reading path and the separate weight/bias-gradient kernel for f64); 1
// and 513 rows, and 70001 rows (more rows than the backward's 1024 partial sums: warps walk
// several rows). WideRowsBackwardMatchesTheCpu covers the block-per-row backward's widths and
// row counts. Non-contiguous, unaligned and parameter-less inputs, and every combination of
// needed gradients.
//
// Every comparison is ||gpu - cpu|| / ||cpu|| with the tolerances of cuda_testing.h (f32 1e-5,
// bf16/f16 1e-2, f64 1e-12), on random inputs (never zeros).
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "backends/cuda/cuda_testing.h"
#include "forge/backends/cpu/norm.h"
#include "forge/backends/cuda/norm.h"
#include "forge/core/env.h"
#include "forge/forge.h"

namespace forge {
namespace {

using namespace cuda_testing;

using Fn = std::function<Tensor(const TensorList&)>;

// Runs fn on device d over fresh leaves made from `hosts` (an undefined host stays undefined;
// leaves listed in `grads_of` require grad), back-propagates `g` (a host tensor of the output's
// shape), and returns the output followed by the leaves' gradients.
TensorList run_on(Device d, const TensorList& hosts, const std::vector<bool>& grads_of, const Tensor& g, const Fn& fn) {
  TensorList leaves;
  for (size_t i = 0; i < hosts.size(); ++i) {
    Tensor t = hosts[i].defined() ? hosts[i].to(d).detach() : Tensor();
    if (t.defined() && grads_of[i]) t.requires_grad_();
    leaves.push_back(t);
  }
  Tensor y = fn(leaves);
  TensorList out{y.detach()};
  if (y.requires_grad()) y.backward(g.to(d));
  for (size_t i = 0; i < leaves.size(); ++i)
    out.push_back(leaves[i].defined() && grads_of[i] ? leaves[i].grad() : Tensor());
  return out;
}

// fn on both devices: output and every requested gradient within `tol`.
void expect_same_on_gpu(const std::string& what, const TensorList& hosts, const std::vector<bool>& grads_of,
                        const Fn& fn, DType dt, double tol, uint64_t seed) {
  SCOPED_TRACE(what);
  Tensor y_host;
  {
    NoGradGuard no_grad;
    TensorList plain;
    for (const Tensor& h : hosts) plain.push_back(h);
    y_host = fn(plain);
  }
  const Tensor g = host_input(y_host.shape(), Domain::real, dt, seed);
  const TensorList cpu = run_on(Device::cpu(), hosts, grads_of, g, fn);
  const TensorList gpu = run_on(kGpu, hosts, grads_of, g, fn);
  const char* names[] = {"y", "d input 0", "d input 1", "d input 2", "d input 3"};
  for (size_t i = 0; i < cpu.size(); ++i) {
    ASSERT_EQ(cpu[i].defined(), gpu[i].defined()) << names[i];
    if (cpu[i].defined()) expect_close(gpu[i], cpu[i], tol, what + ": " + names[i]);
  }
}

class CudaNorm : public ::testing::TestWithParam<DType> {};

const Fn kLayerNorm = [](const TensorList& in) { return ops::layer_norm(in[0], in[1], in[2]); };
const Fn kRmsNorm = [](const TensorList& in) { return ops::rms_norm(in[0], in[1]); };

TEST_P(CudaNorm, LayerNormWidthsAndRows) {
  FORGE_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  uint64_t seed = 100;
  for (int64_t C : {768, 1000, 999, 3, 4096})
    for (int64_t R : {1, 513}) {
      const TensorList hosts{host_input({R, C}, Domain::real, dt, seed),
                             host_input({C}, Domain::positive, dt, seed + 1),
                             host_input({C}, Domain::real, dt, seed + 2)};
      expect_same_on_gpu("layer_norm [" + std::to_string(R) + ", " + std::to_string(C) + "]", hosts,
                         {true, true, true}, kLayerNorm, dt, tolerance(dt), seed + 3);
      seed += 4;
    }
}

TEST_P(CudaNorm, RmsNormWidthsAndRows) {
  FORGE_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  uint64_t seed = 200;
  for (int64_t C : {768, 1000, 999, 3, 4096})
    for (int64_t R : {1, 513}) {
      const TensorList hosts{host_input({R, C}, Domain::real, dt, seed),
                             host_input({C}, Domain::positive, dt, seed + 1)};
      expect_same_on_gpu("rms_norm [" + std::to_string(R) + ", " + std::to_string(C) + "]", hosts, {true, true},
                         kRmsNorm, dt, tolerance(dt), seed + 2);
      seed += 3;
    }
}

TEST_P(CudaNorm, LayerNormManyRowsWalkedByEachWarp) {
  FORGE_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  // 70001 rows > 64 x 1024: the backward's 1024 blocks each walk several rows per warp. The
  // weight/bias gradients sum 70001 rows; f32 partials keep ||err|| / ||ref|| near 1e-6.
  const int64_t R = 70001;
  for (int64_t C : {40, 37}) {
    const TensorList hosts{host_input({R, C}, Domain::real, dt, 300 + C), host_input({C}, Domain::positive, dt, 301),
                           host_input({C}, Domain::real, dt, 302)};
    expect_same_on_gpu("layer_norm [70001, " + std::to_string(C) + "]", hosts, {true, true, true}, kLayerNorm, dt,
                       tolerance(dt), 303);
    expect_same_on_gpu("rms_norm [70001, " + std::to_string(C) + "]", {hosts[0], hosts[1]}, {true, true}, kRmsNorm,
                       dt, tolerance(dt), 304);
  }
}

TEST_P(CudaNorm, LayerNormParameterAndGradientVariants) {
  FORGE_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  for (int64_t C : {768, 999, 4096}) {
    const std::string w = " C=" + std::to_string(C);
    const Tensor x = host_input({2, 37, C}, Domain::real, dt, 400 + C);
    const Tensor wt = host_input({C}, Domain::positive, dt, 401), b = host_input({C}, Domain::real, dt, 402);
    const double tol = tolerance(dt);
    expect_same_on_gpu("no weight, no bias" + w, {x}, {true},
                       [](const TensorList& in) { return ops::layer_norm(in[0]); }, dt, tol, 403);
    expect_same_on_gpu("weight only" + w, {x, wt}, {true, true},
                       [](const TensorList& in) { return ops::layer_norm(in[0], in[1]); }, dt, tol, 404);
    expect_same_on_gpu("bias only" + w, {x, b}, {true, true},
                       [](const TensorList& in) { return ops::layer_norm(in[0], Tensor(), in[1]); }, dt, tol, 405);
    expect_same_on_gpu("dx only (weight and bias constants)" + w, {x, wt, b}, {true, false, false}, kLayerNorm, dt,
                       tol, 406);
    expect_same_on_gpu("dweight and dbias only (x constant)" + w, {x, wt, b}, {false, true, true}, kLayerNorm, dt,
                       tol, 407);
    expect_same_on_gpu("dbias only" + w, {x, wt, b}, {false, false, true}, kLayerNorm, dt, tol, 408);
    expect_same_on_gpu("rms dweight only" + w, {x, wt}, {false, true}, kRmsNorm, dt, tol, 409);
    expect_same_on_gpu("rms without weight" + w, {x}, {true},
                       [](const TensorList& in) { return ops::rms_norm(in[0]); }, dt, tol, 410);
  }
}

TEST_P(CudaNorm, NonContiguousAndUnalignedInputs) {
  FORGE_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const double tol = tolerance(dt);
  for (int64_t C : {768, 999}) {
    const std::string w = " C=" + std::to_string(C);
    const Tensor wt = host_input({C}, Domain::positive, dt, 501), b = host_input({C}, Domain::real, dt, 502);
    // x = the transpose of a (C, 65) tensor: made contiguous by the op, gradient through the view.
    const Tensor xt = host_input({C, 65}, Domain::real, dt, 503);
    expect_same_on_gpu("transposed x" + w, {xt, wt, b}, {true, true, true},
                       [](const TensorList& in) { return ops::layer_norm(in[0].t(), in[1], in[2]); }, dt, tol, 504);
    expect_same_on_gpu("rms transposed x" + w, {xt, wt}, {true, true},
                       [](const TensorList& in) { return ops::rms_norm(in[0].t(), in[1]); }, dt, tol, 505);
    // x contiguous but starting one element into its storage: no 16-byte alignment, scalar path.
    const Tensor flat = host_input({65 * C + 1}, Domain::real, dt, 506);
    auto unaligned = [C](const Tensor& t) { return t.narrow(0, 1, 65 * C).view({65, C}); };
    expect_same_on_gpu("unaligned x" + w, {flat, wt, b}, {true, true, true},
                       [unaligned](const TensorList& in) { return ops::layer_norm(unaligned(in[0]), in[1], in[2]); },
                       dt, tol, 507);
    // weight every other element of a wider tensor (made contiguous by the op).
    const Tensor w2 = host_input({2 * C}, Domain::positive, dt, 508);
    expect_same_on_gpu("strided weight" + w, {host_input({9, C}, Domain::real, dt, 509), w2}, {true, true},
                       [C](const TensorList& in) { return ops::layer_norm(in[0], in[1].slice(0, 0, 2 * C, 2)); }, dt,
                       tol, 510);
  }
}

TEST_P(CudaNorm, AddLayerNormMatchesTheCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  uint64_t seed = 600;
  for (int64_t C : {768, 999, 3, 4096})
    for (int64_t R : {1, 513}) {
      const std::string w = " [" + std::to_string(R) + ", " + std::to_string(C) + "]";
      const TensorList hosts{host_input({R, C}, Domain::real, dt, seed), host_input({R, C}, Domain::real, dt, seed + 1),
                             host_input({C}, Domain::positive, dt, seed + 2),
                             host_input({C}, Domain::real, dt, seed + 3)};
      // Both outputs at once (stacked), so h's own gradient is added to the norm's in backward.
      expect_same_on_gpu("add_layer_norm h and y" + w, hosts, {true, true, true, true},
                         [](const TensorList& in) {
                           const ops::AddLayerNorm r = ops::add_layer_norm(in[0], in[1], in[2], in[3]);
                           return ops::stack({r.h, r.y});
                         },
                         dt, tolerance(dt), seed + 4);
      expect_same_on_gpu("add_layer_norm y only, no parameters" + w, {hosts[0], hosts[1]}, {true, true},
                         [](const TensorList& in) { return ops::add_layer_norm(in[0], in[1]).y; }, dt, tolerance(dt),
                         seed + 5);
      seed += 6;
    }
}

// add_rms_norm (LLaMA's residual add + RMSNorm, Note [fused residual + RMS norm in LLaMA]): both
// outputs and every gradient against the CPU, at LLaMA's 2048 (wider than the warp kernel's
// register columns: pass 3 re-reads h), 768 and 999 (scalar path); and on the GPU the bits of
// add followed by rms_norm.
TEST_P(CudaNorm, AddRmsNormMatchesTheCpuAndTheUnfusedPair) {
  FORGE_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  uint64_t seed = 3000;
  for (int64_t C : {2048, 768, 999}) {
    const std::string w = " [2, 37, " + std::to_string(C) + "]";
    const Tensor x = host_input({2, 37, C}, Domain::real, dt, seed), r = host_input({2, 37, C}, Domain::real, dt, seed + 1);
    const Tensor wt = host_input({C}, Domain::positive, dt, seed + 2);
    expect_same_on_gpu("add_rms_norm h and y" + w, {x, r, wt}, {true, true, true},
                       [](const TensorList& in) {
                         const ops::AddRmsNorm o = ops::add_rms_norm(in[0], in[1], in[2]);
                         return ops::stack({o.h, o.y});
                       },
                       dt, tolerance(dt), seed + 3);
    NoGradGuard no_grad;
    const Tensor xg = x.to(kGpu), rg = r.to(kGpu), wg = wt.to(kGpu);
    const ops::AddRmsNorm o = ops::add_rms_norm(xg, rg, wg);
    const Tensor h = ops::add(xg, rg);
    expect_equal(o.h, h, "add_rms_norm h = add" + w);
    expect_equal(o.y, ops::rms_norm(h, wg), "add_rms_norm y = rms_norm(add)" + w);
    seed += 4;
  }
}

TEST_P(CudaNorm, AddLayerNormIsAddThenLayerNormOnTheGpu) {
  FORGE_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  for (int64_t C : {768, 999}) {
    const Tensor x = host_input({3, 41, C}, Domain::real, dt, 700).to(kGpu);
    const Tensor r = host_input({3, 41, C}, Domain::real, dt, 701).to(kGpu);
    const Tensor w = host_input({C}, Domain::positive, dt, 702).to(kGpu);
    const Tensor b = host_input({C}, Domain::real, dt, 703).to(kGpu);
    const ops::AddLayerNorm fused = ops::add_layer_norm(x, r, w, b);
    const Tensor h = ops::add(x, r);
    expect_equal(fused.h, h, "h is exactly x + residual (C=" + std::to_string(C) + ")");
    // The same arithmetic as the plain kernel; allow for the compiler contracting differently
    // (which could flip the last bit of a few 16-bit results).
    const double tol = dt == DType::f64 ? 1e-14 : (dt == DType::f32 ? 1e-6 : 1e-3);
    expect_close(fused.y, ops::layer_norm(h, w, b), tol, "y = layer_norm(h) (C=" + std::to_string(C) + ")");
  }
}

// Note [residual gradient in the norm backward]: the kernel adds dx_add into dx (also in place,
// dx_add == dx), matching dx + dx_add from the plain kernel; and a residual stream whose norm
// node takes its pending gradient matches the CPU (the GPT and LLaMA patterns).
TEST_P(CudaNorm, BackwardAddsTheResidualGradient) {
  FORGE_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const double tol = dt == DType::f64 ? 1e-13 : (dt == DType::f32 ? 1e-6 : 1e-2);
  for (int64_t C : {768, 2048, 999, 4096}) {
    for (bool rms : {false, true}) {
      const std::string what = std::string(rms ? "rms_norm" : "layer_norm") + " C=" + std::to_string(C);
      const int64_t R = 300;
      const Tensor x = host_input({R, C}, Domain::real, dt, 900).to(kGpu);
      const Tensor w = host_input({C}, Domain::positive, dt, 901).to(kGpu);
      const Tensor dy = host_input({R, C}, Domain::real, dt, 902).to(kGpu);
      const Tensor extra = host_input({R, C}, Domain::real, dt, 903).to(kGpu);
      const DType sd = dt == DType::f64 ? DType::f64 : DType::f32;
      Tensor y = empty({R, C}, {.dtype = dt, .device = kGpu});
      Tensor mean = empty({R}, {.dtype = sd, .device = kGpu}), rstd = empty({R}, {.dtype = sd, .device = kGpu});
      if (rms) cuda::rms_norm_forward(x, w, 1e-5, y, rstd);
      else cuda::layer_norm_forward(x, w, Tensor(), 1e-5, y, mean, rstd);
      auto run = [&](const Tensor& add, bool in_place) {
        cpu::NormGrads g;
        g.dx = in_place ? add.clone() : empty({R, C}, {.dtype = dt, .device = kGpu});
        g.dx_add = in_place ? g.dx : add;
        g.dweight = empty({C}, {.dtype = dt, .device = kGpu});
        if (rms) cuda::rms_norm_backward(dy, x, w, rstd, g);
        else cuda::layer_norm_backward(dy, x, w, mean, rstd, g);
        return g;
      };
      cpu::NormGrads plain;
      plain.dx = empty({R, C}, {.dtype = dt, .device = kGpu});
      plain.dweight = empty({C}, {.dtype = dt, .device = kGpu});
      if (rms) cuda::rms_norm_backward(dy, x, w, rstd, plain);
      else cuda::layer_norm_backward(dy, x, w, mean, rstd, plain);
      const Tensor want = ops::add(plain.dx.to(sd), extra.to(sd));
      for (bool in_place : {false, true}) {
        const cpu::NormGrads got = run(extra, in_place);
        expect_close(got.dx.to(sd), want, tol, what + (in_place ? " dx_add in place" : " dx_add"));
        expect_equal(got.dweight, plain.dweight, what + " dweight unchanged by dx_add");
      }
    }
  }
  // Through autograd: the residual stream x feeds a norm and, by the residual path, the output.
  for (bool rms : {false, true}) {
    const Fn block = [rms](const TensorList& in) {
      Tensor n = rms ? ops::rms_norm(in[0], in[1]) : ops::layer_norm(in[0], in[1], Tensor());
      return ops::add(ops::mul(ops::tanh(n), 0.5), in[0]);  // x + f(norm(x))
    };
    expect_same_on_gpu(rms ? "residual stream through rms_norm" : "residual stream through layer_norm",
                       {host_input({4, 33, 768}, Domain::real, dt, 910), host_input({768}, Domain::positive, dt, 911)},
                       {true, true}, block, dt, tolerance(dt), 912);
  }
}

// Rows wider than the 1024 columns a warp keeps in registers, in whole 16-byte vectors: the
// block-per-row backward (norm_wide.cu: dx and the weight/bias gradients in one pass, for f32,
// bf16 and f16; f64 and f32 at 8192 take the older path). LLaMA's 2048 and 4096; 8192 (the
// widest bf16/f16 row it takes: 1024-thread blocks); 3000 and 1032 (threads of the block past
// the row's end). 37 rows (one a block) and 1100 (more rows than blocks: each walks several).
// Every gradient; the weight and bias gradients alone (no dx: the kernel's sums-only mode); and
// a residual stream, so the norm's pending input gradient reaches the kernel as dx_add.
TEST_P(CudaNorm, WideRowsBackwardMatchesTheCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const double tol = tolerance(dt);
  uint64_t seed = 1000;
  for (int64_t C : {2048, 4096, 8192, 3000, 1032})
    for (int64_t R : {37, 1100}) {
      const std::string w = " [" + std::to_string(R) + ", " + std::to_string(C) + "]";
      const Tensor x = host_input({R, C}, Domain::real, dt, seed);
      const Tensor wt = host_input({C}, Domain::positive, dt, seed + 1), b = host_input({C}, Domain::real, dt, seed + 2);
      expect_same_on_gpu("layer_norm" + w, {x, wt, b}, {true, true, true}, kLayerNorm, dt, tol, seed + 3);
      expect_same_on_gpu("rms_norm" + w, {x, wt}, {true, true}, kRmsNorm, dt, tol, seed + 4);
      expect_same_on_gpu("layer_norm dweight and dbias only" + w, {x, wt, b}, {false, true, true}, kLayerNorm, dt, tol,
                         seed + 5);
      expect_same_on_gpu("rms_norm dweight only" + w, {x, wt}, {false, true}, kRmsNorm, dt, tol, seed + 6);
      for (bool rms : {false, true}) {
        const Fn block = [rms](const TensorList& in) {
          Tensor n = rms ? ops::rms_norm(in[0], in[1]) : ops::layer_norm(in[0], in[1], in[2]);
          return ops::add(ops::mul(ops::tanh(n), 0.5), in[0]);  // x + f(norm(x))
        };
        expect_same_on_gpu(std::string(rms ? "residual stream through rms_norm" : "residual stream through layer_norm") +
                               w,
                           rms ? TensorList{x, wt} : TensorList{x, wt, b},
                           rms ? std::vector<bool>{true, true} : std::vector<bool>{true, true, true}, block, dt, tol,
                           seed + 7);
      }
      seed += 10;
    }
}

// Rows of 64 to 128 vectors (bf16/f16: 512 to 1024 columns, GPT-2's 768 among them; f32: 256
// to 512) run the block-per-row backward in 128-thread blocks, wider ones up to 1024 columns in
// 256-thread blocks; FORGE_NORM_BLOCK_ROWS=0 sends them all back to the warp-per-row kernel.
// Both paths against the CPU: 520 and 1000 (threads of the block past the row's end), 512, 768,
// 1024; 37 rows, and 2100 (more rows than the 1024 blocks: each walks several); every gradient,
// the parameter gradients alone, and dx_add through a residual stream.
TEST_P(CudaNorm, NarrowRowsBackwardOnBothKernels) {
  FORGE_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const double tol = tolerance(dt);
  for (const char* block_rows : {"1", "0"}) {
    env::Override o("FORGE_NORM_BLOCK_ROWS", std::string(block_rows));
    uint64_t seed = 2000;
    for (int64_t C : {768, 512, 520, 1000, 1024})
      for (int64_t R : {37, 2100}) {
        const std::string w = std::string(" FORGE_NORM_BLOCK_ROWS=") + block_rows + " [" + std::to_string(R) + ", " +
                              std::to_string(C) + "]";
        const Tensor x = host_input({R, C}, Domain::real, dt, seed);
        const Tensor wt = host_input({C}, Domain::positive, dt, seed + 1), b = host_input({C}, Domain::real, dt, seed + 2);
        expect_same_on_gpu("layer_norm" + w, {x, wt, b}, {true, true, true}, kLayerNorm, dt, tol, seed + 3);
        expect_same_on_gpu("rms_norm" + w, {x, wt}, {true, true}, kRmsNorm, dt, tol, seed + 4);
        expect_same_on_gpu("layer_norm dweight and dbias only" + w, {x, wt, b}, {false, true, true}, kLayerNorm, dt,
                           tol, seed + 5);
        const Fn block = [](const TensorList& in) {
          return ops::add(ops::mul(ops::tanh(ops::layer_norm(in[0], in[1], in[2])), 0.5), in[0]);
        };
        expect_same_on_gpu("residual stream through layer_norm" + w, {x, wt, b}, {true, true, true}, block, dt, tol,
                           seed + 6);
        seed += 10;
      }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaNorm, ::testing::Values(DType::f32, DType::bf16, DType::f16, DType::f64),
                         [](const ::testing::TestParamInfo<DType>& i) { return std::string(dtype_name(i.param)); });

TEST(CudaNormErrors, MixedDevicesAreRefused) {
  FORGE_SKIP_WITHOUT_GPU();
  const Tensor x = host_input({4, 8}, Domain::real, DType::f32, 800).to(kGpu);
  const Tensor w_cpu = host_input({8}, Domain::real, DType::f32, 801);
  EXPECT_THROW(ops::layer_norm(x, w_cpu), Error);
  EXPECT_THROW(ops::add_layer_norm(x, x.to(Device::cpu())), Error);
}

}  // namespace
}  // namespace forge
