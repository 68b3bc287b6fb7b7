// Op-table cases for attention, rope, conv2d and max_pool2d.
#include "testing/op_table.h"

namespace forge::testing {
namespace {

using namespace forge::ops;

// q (B, H, T, D), k and v (B, Hkv, S, D or Dv), then the mask (0/1 values, made bool) if any.
std::vector<Input> qkv(int64_t B, int64_t H, int64_t Hkv, int64_t T, int64_t S, int64_t D, uint64_t seed,
                       int64_t Dv = -1, std::vector<int64_t> attend = {}, Shape mask_shape = {}) {
  std::vector<Input> in{real({B, H, T, D}, seed), real({B, Hkv, S, D}, seed + 1),
                        real({B, Hkv, S, Dv < 0 ? D : Dv}, seed + 2)};
  if (!attend.empty()) in.push_back(mask(std::move(attend), mask_shape));
  return in;
}

OpFn sdpa(bool causal, double scale = 0.0) {
  return [=](const TensorList& in) {
    return scaled_dot_product_attention(in[0], in[1], in[2], causal, scale, in.size() > 3 ? in[3] : Tensor());
  };
}

void sdpa_cases(std::vector<OpCase>& c) {
  const char* op = "scaled_dot_product_attention";
  c.push_back({op, "causal, B=1 H=2 T=S=5 D=4", qkv(1, 2, 2, 5, 5, 4, 101), sdpa(true)});
  c.push_back({op, "non-causal, B=2 H=2, T=3 != S=4", qkv(2, 2, 2, 3, 4, 3, 104), sdpa(false)});
  c.push_back({op, "GQA H=4 Hkv=2, causal", qkv(2, 4, 2, 4, 4, 3, 107), sdpa(true)});
  c.push_back({op, "MQA H=4 Hkv=1, non-causal, T=3 S=5", qkv(1, 4, 1, 3, 5, 2, 110), sdpa(false)});
  c.push_back({op, "GQA H=4 Hkv=1, causal", qkv(1, 4, 1, 4, 4, 2, 113), sdpa(true)});
  c.push_back({op, "causal bottom-right, T=3 < S=5", qkv(1, 2, 2, 3, 5, 3, 116), sdpa(true)});
  c.push_back(
      {op, "causal bottom-right, T=5 > S=3 (rows 0-1 see no key: zeros)", qkv(1, 2, 1, 5, 3, 3, 119), sdpa(true)});
  // Row 1 attends to no key (zero output); row 0 only to key 2.
  const std::vector<int64_t> mask_ts{0, 0, 1, 0, /**/ 0, 0, 0, 0, /**/ 1, 1, 0, 1, /**/ 1, 0, 1, 1};
  c.push_back({op, "(T, S) mask incl. a fully masked row, non-causal", qkv(2, 2, 2, 4, 4, 3, 122, -1, mask_ts, {4, 4}),
               sdpa(false)});
  c.push_back(
      {op, "(T, S) mask combined with causal, GQA", qkv(1, 4, 2, 4, 4, 3, 125, -1, mask_ts, {4, 4}), sdpa(true)});
  // Key padding: batch 0 sees keys 0-4, batch 1 keys 0-2.
  c.push_back({op, "(B, 1, 1, S) padding mask, T=3 S=5",
               qkv(2, 2, 1, 3, 5, 3, 128, -1, {1, 1, 1, 1, 1, /**/ 1, 1, 1, 0, 0}, {2, 1, 1, 5}), sdpa(false)});
  c.push_back({op, "custom scale 0.7, causal", qkv(1, 2, 2, 4, 4, 3, 131), sdpa(true, 0.7)});
  c.push_back({op, "value dim Dv=5 != D=3", qkv(1, 2, 1, 3, 4, 3, 134, 5), sdpa(false)});
  c.push_back({op,
               "non-contiguous q: (B, T, H, D) leaf permuted to (B, H, T, D)",
               {real({2, 4, 2, 3}, 137), real({2, 2, 4, 3}, 138), real({2, 2, 4, 3}, 139)},
               [](const TensorList& in) {
                 return scaled_dot_product_attention(permute(in[0], {0, 2, 1, 3}), in[1], in[2], true);
               }});
  c.push_back(
      {op,
       "non-contiguous k (transposed last dims: packed copy), GQA",
       {real({1, 2, 3, 4}, 140), real({1, 1, 4, 5}, 141), real({1, 1, 5, 4}, 142)},
       [](const TensorList& in) { return scaled_dot_product_attention(in[0], transpose(in[1], 2, 3), in[2], false); }});
  c.push_back({op,
               "only q and v require grad",
               {real({1, 2, 3, 2}, 143), real({1, 2, 3, 2}, 144).constant(), real({1, 2, 3, 2}, 145)},
               sdpa(true)});
  c.push_back({op, "T=S=70 spans two query blocks, causal", qkv(1, 1, 1, 70, 70, 2, 146), sdpa(true)});
  // bf16/f16 on CUDA take the fused flash kernels here (D = Dv = 64, no mask: Note [flash attention]).
  c.push_back(
      {op, "D=Dv=64 (CUDA's flash path in 16 bits), GQA H=2 Hkv=1, causal", qkv(1, 2, 1, 5, 5, 64, 149), sdpa(true)});
  // Note [document masks]: (B, S) i32 document ids of the keys; the queries are the last T.
  auto packed = [](bool causal) {
    return [=](const TensorList& in) { return scaled_dot_product_attention(in[0], in[1], in[2], causal, 0.0, {}, in[3]); };
  };
  auto with_docs = [&](std::vector<Input> in, std::vector<int64_t> docs, Shape shape) {
    in.push_back(ids(std::move(docs), shape, DType::i32));
    return in;
  };
  c.push_back({op, "documents: 3 and 2 packed per row, causal, GQA H=4 Hkv=2",
               with_docs(qkv(2, 4, 2, 7, 7, 3, 170), {0, 0, 0, 1, 1, 2, 2, /**/ 0, 1, 1, 1, 1, 1, 1}, {2, 7}),
               packed(true)});
  c.push_back({op, "documents, not causal, ids unordered (5 3 5 ...)",
               with_docs(qkv(1, 2, 1, 6, 6, 4, 173), {5, 3, 5, 3, 7, 7}, {1, 6}), packed(false)});
  c.push_back({op, "documents, causal bottom-right T=3 < S=6",
               with_docs(qkv(1, 2, 2, 3, 6, 3, 176), {0, 0, 1, 1, 1, 2}, {1, 6}), packed(true)});
  {
    std::vector<int64_t> docs(70);  // documents of 30, 35 and 5 tokens across the two query blocks
    for (int64_t t = 0; t < 70; ++t) docs[static_cast<size_t>(t)] = t < 30 ? 0 : t < 65 ? 1 : 2;
    c.push_back({op, "documents, T=S=70 across two query blocks, causal",
                 with_docs(qkv(1, 1, 1, 70, 70, 2, 179), docs, {1, 70}), packed(true)});
  }
  for (OpCase& k : c)
    if (k.op == op)
      k.tolerance16(3e-2,
                    "the CUDA path rounds S, P, dP and dS to the dtype between its GEMMs (Note [attention as "
                    "GEMMs]), and with D <= 5 and S <= 5 few terms average a rounding out (the CPU's own bf16 "
                    "path, rounding only its outputs, is up to 1.1% off); CudaAttention compares at larger "
                    "shapes with 1e-2");
}

void qkv_attention_cases(std::vector<OpCase>& c) {
  // qkv_attention: the packed (B, T, 3C) projection in, merged heads out.
  const char* op = "qkv_attention";
  c.push_back({op, "causal, B=2 T=5 H=2 D=3", {real({2, 5, 18}, 161)},
               [](const TensorList& in) { return qkv_attention(in[0], 2, true); }});
  c.push_back({op, "non-causal, scale 0.6, H=3 D=2", {real({1, 4, 18}, 162)},
               [](const TensorList& in) { return qkv_attention(in[0], 3, false, 0.6); }});
  c.push_back({op, "strided qkv (every other column of a wider leaf), causal", {real({2, 3, 12}, 163).strided()},
               [](const TensorList& in) { return qkv_attention(in[0], 2, true); }});
  for (OpCase& k : c)
    if (k.op == op)
      k.tolerance16(3e-2, "as scaled_dot_product_attention's cases: tiny heads average no rounding out");
}

void rope_cases(std::vector<OpCase>& c) {
  c.push_back(
      {"rope", "(2,2,3,4), offset 0", {real({2, 2, 3, 4}, 151)}, [](const TensorList& in) { return rope(in[0]); }});
  c.push_back({"rope", "offset 5, theta 500, D=6", {real({1, 3, 4, 6}, 152)}, [](const TensorList& in) {
                 return rope(in[0], 5, 500.0);
               }});
  c.push_back({"rope",
               "non-contiguous (B, T, H, D) leaf permuted, offset 2",
               {real({2, 3, 2, 4}, 153)},
               [](const TensorList& in) {
                 return rope(permute(in[0], {0, 2, 1, 3}), 2);
               }});
  // LLaMA-3's scaling with every band present at D = 8 (tests/ops/test_rope_scaling.cpp).
  c.push_back({"rope", "llama3 scaling, theta 500000, D=8, offset 3000", {real({1, 2, 5, 8}, 154)},
               [](const TensorList& in) {
                 return rope(in[0], 3000, 500000.0, {.factor = 8.0, .low_freq_factor = 1.0, .high_freq_factor = 4.0,
                                                     .original_context = 8192.0});
               }});
  // Note [packed positions]: (B, T) i64 positions, restarting with each packed document.
  c.push_back({"rope", "positions (B, T) restarting per document, limit 5",
               {real({2, 2, 5, 4}, 155), ids({0, 1, 2, 0, 1, /**/ 0, 0, 1, 2, 3}, {2, 5})},
               [](const TensorList& in) { return rope(in[0], in[1], 5); }});
  c.push_back({"rope", "positions, non-contiguous (B, T, H, D) leaf permuted, llama3 scaling",
               {real({1, 4, 3, 8}, 156), ids({3, 0, 1, 7}, {1, 4})}, [](const TensorList& in) {
                 return rope(permute(in[0], {0, 2, 1, 3}), in[1], 8, 500000.0,
                             {.factor = 8.0, .low_freq_factor = 1.0, .high_freq_factor = 4.0, .original_context = 4.0});
               }});
}

// LLaMA's packed attention (Note [packed LLaMA attention]): qkv (B, T, (H + 2 Hkv) D).
void qkv_rope_attention_cases(std::vector<OpCase>& c) {
  const char* op = "qkv_rope_attention";
  auto f = [](int64_t H, int64_t Hk, int64_t offset, double theta, RopeScaling s, bool causal) {
    return OpFn([=](const TensorList& in) { return qkv_rope_attention(in[0], H, Hk, offset, theta, s, causal); });
  };
  c.push_back({op, "GQA H=4 Hkv=2 D=4, causal", {real({2, 5, 32}, 161)}, f(4, 2, 0, 10000.0, {}, true)});
  c.push_back({op, "H=Hkv=2 D=6, offset 3, not causal", {real({1, 4, 36}, 162)}, f(2, 2, 3, 500.0, {}, false)});
  c.push_back({op, "MQA H=4 Hkv=1 D=8, llama3 scaling, offset 3000", {real({1, 3, 48}, 163)},
               f(4, 1, 3000, 500000.0,
                 {.factor = 8.0, .low_freq_factor = 1.0, .high_freq_factor = 4.0, .original_context = 8192.0}, true)});
}

void conv_cases(std::vector<OpCase>& c) {
  auto xwb = [](Shape x, Shape w, bool bias, uint64_t seed) {
    std::vector<Input> in{real(x, seed), real(w, seed + 1)};
    if (bias) in.push_back(real({w[0]}, seed + 2));
    return in;
  };
  auto conv = [](Size2 stride, Size2 padding) {
    return
        [=](const TensorList& in) { return conv2d(in[0], in[1], in.size() > 2 ? in[2] : Tensor(), stride, padding); };
  };
  c.push_back({"conv2d", "Cin=3 Cout=4 3x3, stride 2, padding 1, bias", xwb({2, 3, 5, 5}, {4, 3, 3, 3}, true, 161),
               conv({2, 2}, {1, 1})});
  c.push_back({"conv2d", "no bias, Cin=2, 2x3 kernel, stride (1,2)", xwb({2, 2, 4, 6}, {3, 2, 2, 3}, false, 164),
               conv({1, 2}, {0, 0})});
  c.push_back({"conv2d", "padding (1,0), stride (2,1), bias", xwb({1, 2, 5, 4}, {2, 2, 3, 2}, true, 167),
               conv({2, 1}, {1, 0})});
  c.push_back(
      {"conv2d", "1x1 kernel, stride 1, bias", xwb({2, 3, 3, 3}, {2, 3, 1, 1}, true, 170), conv({1, 1}, {0, 0})});
  c.push_back({"conv2d",
               "non-contiguous x (NHWC leaf permuted), stride 2, padding 1",
               {real({2, 5, 5, 2}, 173), real({3, 2, 3, 3}, 174), real({3}, 175)},
               [](const TensorList& in) {
                 return conv2d(permute(in[0], {0, 3, 1, 2}), in[1], in[2], {2, 2}, {1, 1});
               }});
  c.push_back({"conv2d",
               "only the weight requires grad",
               {real({1, 2, 4, 4}, 176).constant(), real({2, 2, 3, 3}, 177)},
               conv({1, 1}, {1, 1})});
}

void pool_cases(std::vector<OpCase>& c) {
  c.push_back({"max_pool2d", "2x2, default stride", {real({2, 2, 6, 6}, 181)}, [](const TensorList& in) {
                 return max_pool2d(in[0], {2, 2});
               }});
  c.push_back({"max_pool2d",
               "3x3 stride 2 padding 1 (overlapping windows)",
               {real({1, 3, 7, 6}, 182)},
               [](const TensorList& in) {
                 return max_pool2d(in[0], {3, 3}, {2, 2}, {1, 1});
               }});
  c.push_back(
      {"max_pool2d", "2x3 stride (1,2), non-contiguous input", {real({2, 5, 6, 2}, 183)}, [](const TensorList& in) {
         return max_pool2d(permute(in[0], {0, 3, 1, 2}), {2, 3}, {1, 2});
       }});
}

}  // namespace

std::vector<OpCase> attention_cases() {
  std::vector<OpCase> c;
  sdpa_cases(c);
  qkv_attention_cases(c);
  rope_cases(c);
  qkv_rope_attention_cases(c);
  conv_cases(c);
  pool_cases(c);
  return c;
}

}  // namespace forge::testing
