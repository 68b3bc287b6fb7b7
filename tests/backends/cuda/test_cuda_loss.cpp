// The CUDA cross-entropy, embedding and indexing kernels against the CPU backend:
// cross-entropy over GPT-2's vocabulary (V = 50304, 64 rows) with ignored targets, every
// reduction, i32 and i64 targets, forward loss and backward dlogits (through autograd);
// embedding forward and backward with repeated ids (aligned and unaligned rows, one long
// run); index_select / gather / scatter_add forward and backward on strided inputs, both
// scatter paths; and a small autograd chain embedding -> softmax -> cross-entropy.
//
// Comparisons are ||out - ref|| / ||ref|| with tolerances by dtype (f32 1e-5, bf16/f16
// 1e-2, f64 1e-12); copies (embedding forward, gathers) are compared exactly. Inputs are
// random, never zeros. Without a GPU every test reports SKIPPED.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "forge/core/env.h"
#include "forge/forge.h"
#include "backends/cuda/cuda_testing.h"

namespace forge {
namespace {

using namespace cuda_testing;

std::string param_name(const ::testing::TestParamInfo<DType>& i) { return dtype_name(i.param); }

// Class ids in [0, classes), with every `ignore_every`-th position set to -100.
Tensor targets_with_ignored(const Shape& shape, int64_t classes, int64_t ignore_every, DType dt, uint64_t seed) {
  Generator gen(seed);
  Tensor t = randint(0, classes, shape, {.dtype = DType::i64}, &gen);
  if (ignore_every > 0) {
    int64_t* p = t.data<int64_t>();
    for (int64_t i = 0; i < t.numel(); i += ignore_every) p[i] = -100;
  }
  return t.to(dt);
}

// ---- cross-entropy -------------------------------------------------------------------------

class CudaCrossEntropy : public ::testing::TestWithParam<DType> {};

void check_cross_entropy(const Tensor& logits_h, const Tensor& targets_h, ops::Reduction reduction,
                         const std::string& what) {
  const DType dt = logits_h.dtype();
  const std::string name = what + " reduction " + ops::reduction_name(reduction);
  // The upstream gradient: a scalar for mean/sum (not 1, to exercise the scaling), one per row for none.
  // It has the loss's dtype: f32 for 16-bit logits (Note [loss dtype] in ops/loss.cpp).
  const DType lt = dt == DType::bf16 || dt == DType::f16 ? DType::f32 : dt;
  const Tensor gh = reduction == ops::Reduction::none ? host_input(targets_h.shape(), Domain::real, lt, 41)
                                                      : full({}, 0.75, {.dtype = lt});
  struct Result {
    Tensor loss, dlogits;
  };
  auto run = [&](Device d) {
    Tensor logits = logits_h.to(d).detach();
    logits.requires_grad_();
    Tensor loss = ops::cross_entropy(logits, targets_h.to(d), -100, reduction);
    loss.backward(gh.to(d));
    return Result{loss, logits.grad()};
  };
  const Result g = run(kGpu), c = run(Device::cpu());
  EXPECT_TRUE(g.loss.is_cuda()) << name;
  expect_close(g.loss, c.loss, tolerance(dt), name + " loss");
  expect_close(g.dlogits, c.dlogits, tolerance(dt), name + " dlogits");
}

TEST_P(CudaCrossEntropy, VocabularyRowsWithIgnoredTargets) {
  FORGE_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  // GPT-2's padded vocabulary, 64 rows, every 7th target ignored; logits spread like a
  // trained model's (scale 3).
  const Tensor logits = (host_input({64, 50304}, Domain::real, DType::f32, 42) * 3.0).to(dt);
  for (DType td : {DType::i64, DType::i32}) {
    const Tensor targets = targets_with_ignored({64}, 50304, 7, td, 43);
    for (ops::Reduction r : {ops::Reduction::mean, ops::Reduction::sum, ops::Reduction::none})
      check_cross_entropy(logits, targets, r, std::string("V=50304 targets ") + dtype_name(td));
  }
  // Note [wide cross-entropy rows]: a 1024-thread block a row for GPT-2's and LLaMA's
  // vocabularies, in every dtype (their rows are 4000 16-byte vectors and more).
  env::Override wide("FORGE_CE_WIDE_ROWS", "1");
  const Tensor llama = (host_input({40, 32000}, Domain::real, DType::f32, 48) * 3.0).to(dt);
  const Tensor llama_targets = targets_with_ignored({40}, 32000, 9, DType::i64, 49);
  for (ops::Reduction r : {ops::Reduction::mean, ops::Reduction::none}) {
    check_cross_entropy(logits, targets_with_ignored({64}, 50304, 7, DType::i64, 43), r,
                        "V=50304 FORGE_CE_WIDE_ROWS=1");
    check_cross_entropy(llama, llama_targets, r, "V=32000 FORGE_CE_WIDE_ROWS=1");
  }
}

TEST_P(CudaCrossEntropy, ThreeDimLogitsAndAnUnalignedVocabulary) {
  FORGE_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  // (B, T, V) with V = 1001: not a multiple of any vector width (the scalar path).
  const Tensor logits = host_input({2, 5, 1001}, Domain::real, dt, 44);
  const Tensor targets = targets_with_ignored({2, 5}, 1001, 4, DType::i64, 45);
  for (ops::Reduction r : {ops::Reduction::mean, ops::Reduction::sum, ops::Reduction::none})
    check_cross_entropy(logits, targets, r, "(2, 5, 1001)");
  // Few classes, many rows.
  const Tensor small = host_input({3000, 10}, Domain::real, dt, 46);
  for (ops::Reduction r : {ops::Reduction::mean, ops::Reduction::none})
    check_cross_entropy(small, targets_with_ignored({3000}, 10, 5, DType::i32, 47), r, "(3000, 10)");
}

// The pieces of the vocabulary-parallel loss (Note [fused vocabulary-parallel cross-entropy] in
// parallel/tensor_parallel.cpp): the per-row forward, and the backward over one slice of the classes
// (class_start), targets of other slices getting the softmax term only, ignored rows zero.
TEST_P(CudaCrossEntropy, RowsAndTheBackwardOfASliceOfTheClasses) {
  FORGE_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const DType lt = dt == DType::bf16 || dt == DType::f16 ? DType::f32 : dt;
  const int64_t N = 96, V = 1024, start = 2048;  // this slice: classes [2048, 3072) of 4096
  const Tensor logits = (host_input({N, V}, Domain::real, DType::f32, 50) * 3.0).to(dt);
  // cross_entropy_rows: lse and lse - x[target] per row, targets in [0, V).
  const Tensor local = targets_with_ignored({N}, V, 0, DType::i64, 51);
  const auto rg = ops::cross_entropy_rows(logits.to(kGpu), local.to(kGpu));
  const auto rc = ops::cross_entropy_rows(logits, local);
  expect_close(rg.lse, rc.lse, tolerance(dt), "rows lse");
  expect_close(rg.loss, rc.loss, tolerance(dt), "rows loss");
  // The slice's backward: whole-vocabulary targets, a third of them in this slice, some ignored.
  Tensor whole_t = targets_with_ignored({N}, 4096, 9, DType::i64, 52);
  {
    int64_t* p = whole_t.data<int64_t>();
    for (int64_t i = 1; i < N; i += 3) p[i] = start + (p[i] < 0 ? 0 : p[i] % V);
  }
  const Tensor lse = (host_input({N}, Domain::real, lt, 53) + 8.0).to(lt);  // any lse >= the slice's
  const Tensor g = full({}, 0.5, {.dtype = lt});
  const Tensor scale = full({}, 1.0 / 80.0, {.dtype = lt});
  const Tensor dg = ops::cross_entropy_backward(logits.to(kGpu).contiguous(), whole_t.to(kGpu), lse.to(kGpu), g.to(kGpu),
                                                scale.to(kGpu), -100, start, /*in_place=*/false);
  const Tensor dc = ops::cross_entropy_backward(logits, whole_t, lse, g, scale, -100, start, false);
  EXPECT_TRUE(dg.is_cuda());
  expect_close(dg, dc, tolerance(dt), "slice backward");
  // In place over a copy of the logits: the same values.
  Tensor copy = logits.to(kGpu).clone();
  const Tensor di = ops::cross_entropy_backward(copy, whole_t.to(kGpu), lse.to(kGpu), g.to(kGpu), scale.to(kGpu), -100,
                                                start, /*in_place=*/true);
  EXPECT_EQ(di.data_ptr(), copy.data_ptr());
  expect_close(di, dc, tolerance(dt), "slice backward in place");
}

INSTANTIATE_TEST_SUITE_P(FloatDTypes, CudaCrossEntropy, ::testing::ValuesIn(kFloatDTypes), param_name);

TEST(CudaCrossEntropyEdges, EveryTargetIgnored) {
  FORGE_SKIP_WITHOUT_GPU();
  const Pair logits = on_both(host_input({4, 50}, Domain::real, DType::f32, 48));
  const Tensor targets = full({4}, -100, {.dtype = DType::i64});
  // mean over nothing is NaN (as torch), with a zero gradient; sum is 0.
  Tensor x = logits.gpu.detach();
  x.requires_grad_();
  Tensor loss = ops::cross_entropy(x, targets.to(kGpu));
  EXPECT_TRUE(std::isnan(loss.item<double>()));
  loss.backward();
  EXPECT_EQ(ops::abs(x.grad()).sum().item<double>(), 0.0);
  EXPECT_EQ(ops::cross_entropy(logits.gpu, targets.to(kGpu), -100, ops::Reduction::sum).item<double>(), 0.0);
  // A non-default ignore_index.
  const Tensor t2 = from_vector<int64_t>({3, 7, 7, 0}, {4});
  expect_close(ops::cross_entropy(logits.gpu, t2.to(kGpu), 7), ops::cross_entropy(logits.cpu, t2, 7), 1e-5,
               "ignore_index 7");
}

// ---- embedding -------------------------------------------------------------------------------

class CudaEmbedding : public ::testing::TestWithParam<DType> {};

void check_embedding(const Tensor& weight_h, const Tensor& ids_h, const std::string& what) {
  const DType dt = weight_h.dtype();
  Shape out_shape = ids_h.shape();
  out_shape.push_back(weight_h.shape()[1]);
  const Tensor gh = host_input(out_shape, Domain::real, dt, 51);
  struct Result {
    Tensor out, dweight;
  };
  auto run = [&](Device d) {
    Tensor w = weight_h.to(d).detach();
    w.requires_grad_();
    Tensor out = ops::embedding(w, ids_h.to(d));
    out.backward(gh.to(d));
    return Result{out, w.grad()};
  };
  const Result g = run(kGpu), c = run(Device::cpu());
  expect_equal(g.out, c.out, what + " forward");
  expect_close(g.dweight, c.dweight, tolerance(dt), what + " backward");
}

TEST_P(CudaEmbedding, RepeatedIds) {
  FORGE_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  Generator gen(52);
  for (DType id_dtype : {DType::i64, DType::i32}) {
    // (B, T) = (8, 64) ids drawn from 50 of 1000 rows: every id repeats, most rows get none.
    const Tensor ids = randint(0, 50, {8, 64}, {.dtype = DType::i64}, &gen).to(id_dtype);
    const std::string ids_name = std::string(" ids ") + dtype_name(id_dtype);
    // C = 768: 16-byte rows; C = 37: odd rows (the scalar paths); C = 1000: more columns than threads.
    for (int64_t C : {768, 37, 1000})
      check_embedding(host_input({1000, C}, Domain::real, dt, 53), ids, "C=" + std::to_string(C) + ids_name);
  }
  // One long run: 4096 positions of the same id, next to single ones.
  Tensor ids = full({4096}, 3, {.dtype = DType::i64});
  int64_t* p = ids.data<int64_t>();
  for (int64_t i = 0; i < 4096; i += 97) p[i] = i % 1000;
  check_embedding(host_input({1000, 64}, Domain::real, dt, 54), ids, "one long run");
  // A weight that is not contiguous (made contiguous by the op), and a 0-d id.
  const Tensor wt = host_input({64, 1000}, Domain::real, dt, 55).t();
  check_embedding(wt, from_vector<int64_t>({17, 3, 17}, {3}), "transposed weight");
  check_embedding(host_input({10, 8}, Domain::real, dt, 56), full({}, 4, {.dtype = DType::i64}), "0-d id");
}

INSTANTIATE_TEST_SUITE_P(FloatDTypes, CudaEmbedding, ::testing::ValuesIn(kFloatDTypes), param_name);

// ---- index_select, gather, scatter_add ------------------------------------------------------

class CudaIndex : public ::testing::TestWithParam<DType> {};

// Forward exactly (index_select and gather copy), backward (a scatter_add) by tolerance.
void check_take(const Tensor& x_h, bool transpose, const std::function<Tensor(const Tensor&, Device)>& f,
                const std::string& what) {
  const DType dt = x_h.dtype();
  auto run = [&](Device d, Tensor* grad) {
    Tensor x = x_h.to(d).detach();
    x.requires_grad_();
    const Tensor v = transpose ? x.transpose(0, 1) : x;
    Tensor out = f(v, d);
    out.backward(host_input(out.shape(), Domain::real, dt, 61).to(d));
    *grad = x.grad();
    return out;
  };
  Tensor gg, gc;
  const Tensor og = run(kGpu, &gg), oc = run(Device::cpu(), &gc);
  expect_equal(og, oc, what + " forward");
  expect_close(gg, gc, tolerance(dt), what + " backward");
}

TEST_P(CudaIndex, IndexSelectAlongEveryDim) {
  FORGE_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  Generator gen(62);
  const Tensor x = host_input({20, 33, 17}, Domain::real, dt, 63);
  for (bool transpose : {false, true}) {
    const Shape shape = transpose ? Shape{33, 20, 17} : Shape{20, 33, 17};
    for (int64_t dim : {0, 1, 2}) {
      // 25 indices with repeats (accumulated by the backward).
      const Tensor idx = randint(0, shape[dim], {25}, {.dtype = DType::i64}, &gen);
      check_take(x, transpose, [&](const Tensor& v, Device d) { return ops::index_select(v, dim, idx.to(d)); },
                 "index_select dim " + std::to_string(dim) + (transpose ? " transposed" : ""));
    }
  }
  // A long index over a narrow table: the backward takes the atomic scatter path (about 5
  // updates per row, so 16-bit rounding per update stays within the tolerance).
  const Tensor table = host_input({200, 16}, Domain::real, dt, 64);
  const Tensor long_idx = randint(0, 200, {1000}, {.dtype = DType::i32}, &gen);
  check_take(table, false, [&](const Tensor& v, Device d) { return ops::index_select(v, 0, long_idx.to(d)); },
             "index_select 1000 of 200 rows");
  check_take(table, false, [&](const Tensor& v, Device d) { return ops::index_select(v, 1, full({}, 5, {.dtype = DType::i64, .device = d})); },
             "index_select with a 0-d index");
}

TEST_P(CudaIndex, GatherAndScatterAdd) {
  FORGE_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  Generator gen(65);
  const Tensor x = host_input({20, 33}, Domain::real, dt, 66);
  for (bool transpose : {false, true}) {
    const int64_t rows = transpose ? 33 : 20, cols = transpose ? 20 : 33;
    // Along dim 1 (the cross-entropy pattern) and dim 0; index smaller than x on the other dim.
    const Tensor i1 = randint(0, cols, {rows - 3, 40}, {.dtype = DType::i64}, &gen);
    const Tensor i0 = randint(0, rows, {30, cols - 2}, {.dtype = DType::i32}, &gen);
    const std::string tr = transpose ? " transposed" : "";
    check_take(x, transpose, [&](const Tensor& v, Device d) { return ops::gather(v, 1, i1.to(d)); }, "gather dim 1" + tr);
    check_take(x, transpose, [&](const Tensor& v, Device d) { return ops::gather(v, 0, i0.to(d)); }, "gather dim 0" + tr);
  }
  // scatter_add forward and backward (into x and from src), src larger than index.
  for (int64_t dim : {0, 1}) {
    const Tensor idx = dim == 0 ? randint(0, 20, {30, 33}, {.dtype = DType::i64}, &gen)
                                : randint(0, 33, {20, 50}, {.dtype = DType::i64}, &gen);
    const Tensor src_h = host_input(dim == 0 ? Shape{31, 35} : Shape{21, 50}, Domain::real, dt, 67);
    const Tensor gh = host_input({20, 33}, Domain::real, dt, 68);
    auto run = [&](Device d) {
      Tensor a = x.to(d).detach(), s = src_h.to(d).detach();
      a.requires_grad_();
      s.requires_grad_();
      Tensor out = ops::scatter_add(a, dim, idx.to(d), s);
      out.backward(gh.to(d));
      return std::vector<Tensor>{out, a.grad(), s.grad()};
    };
    const auto g = run(kGpu), c = run(Device::cpu());
    const std::string what = "scatter_add dim " + std::to_string(dim);
    expect_close(g[0], c[0], tolerance(dt), what + " forward");
    expect_close(g[1], c[1], tolerance(dt), what + " d/dx");
    expect_close(g[2], c[2], tolerance(dt), what + " d/dsrc");
  }
  // Walks of 1000 over 16 columns: the atomic path (a few updates per element).
  const Tensor big_idx = randint(0, 300, {1000, 16}, {.dtype = DType::i64}, &gen);
  const Pair base = on_both(host_input({300, 16}, Domain::real, dt, 69));
  const Pair src = on_both(host_input({1000, 16}, Domain::real, dt, 70));
  expect_close(ops::scatter_add(base.gpu, 0, big_idx.to(kGpu), src.gpu), ops::scatter_add(base.cpu, 0, big_idx, src.cpu),
               tolerance(dt), "scatter_add atomic path");
}

INSTANTIATE_TEST_SUITE_P(FloatDTypes, CudaIndex, ::testing::ValuesIn(kFloatDTypes), param_name);

TEST(CudaIndexIntegers, ExactForIntegerTensors) {
  FORGE_SKIP_WITHOUT_GPU();
  Generator gen(71);
  for (DType dt : {DType::i32, DType::i64, DType::u8}) {
    const Tensor x = randint(0, 100, {40, 24}, {.dtype = DType::i64}, &gen).to(dt);
    const Tensor idx = randint(0, 40, {15}, {.dtype = DType::i64}, &gen);
    const std::string name = dtype_name(dt);
    expect_equal(ops::index_select(x.to(kGpu), 0, idx.to(kGpu)), ops::index_select(x, 0, idx), "index_select " + name);
    const Tensor gi = randint(0, 24, {40, 30}, {.dtype = DType::i64}, &gen);
    expect_equal(ops::gather(x.to(kGpu), 1, gi.to(kGpu)), ops::gather(x, 1, gi), "gather " + name);
    // Both scatter paths: short walks (columns) and long walks over few columns (atomics,
    // except for u8, which always walks columns); small values so u8 does not wrap.
    const Tensor small = randint(0, 2, {500, 24}, {.dtype = DType::i64}, &gen).to(dt);
    const Tensor si = randint(0, 40, {500, 24}, {.dtype = DType::i64}, &gen);
    expect_equal(ops::scatter_add(x.to(kGpu), 0, si.to(kGpu), small.to(kGpu)), ops::scatter_add(x, 0, si, small),
                 "scatter_add long walks " + name);
    const Tensor si1 = randint(0, 24, {40, 10}, {.dtype = DType::i64}, &gen);
    expect_equal(ops::scatter_add(x.to(kGpu), 1, si1.to(kGpu), small.to(kGpu)), ops::scatter_add(x, 1, si1, small),
                 "scatter_add short walks " + name);
  }
}

// ---- a small model's chain -----------------------------------------------------------------

TEST(CudaAutogradChain, EmbeddingSoftmaxCrossEntropy) {
  FORGE_SKIP_WITHOUT_GPU();
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    const Tensor wh = host_input({97, 64}, Domain::real, dt, 81);
    Generator gen(82);
    const Tensor ids = randint(0, 97, {4, 16}, {.dtype = DType::i64}, &gen);
    const Tensor targets = targets_with_ignored({4, 16}, 64, 9, DType::i64, 83);
    struct Result {
      Tensor loss, grad;
    };
    auto run = [&](Device d) {
      Tensor w = wh.to(d).detach();
      w.requires_grad_();
      const Tensor h = ops::embedding(w, ids.to(d));                   // (4, 16, 64)
      const Tensor logits = ops::mul(ops::softmax(h, -1), 8.0);        // (4, 16, 64)
      const Tensor lp = ops::log_softmax(ops::mul(h, 0.5), 1);         // along T: a non-last dim
      Tensor loss = ops::add(ops::cross_entropy(logits, targets.to(d)), ops::mean(ops::mul(lp, lp)));
      loss.backward();
      return Result{loss, w.grad()};
    };
    const Result g = run(kGpu), c = run(Device::cpu());
    expect_close(g.loss, c.loss, tolerance(dt), std::string("loss ") + dtype_name(dt));
    expect_close(g.grad, c.grad, tolerance(dt), std::string("d loss / d weight ") + dtype_name(dt));
  }
}

}  // namespace
}  // namespace forge
