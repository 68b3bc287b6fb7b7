#pragma once
// The rotary frequencies of RoPE, plain and with LLaMA-3's wavelength-band scaling: one
// __host__ __device__ function, so the CPU kernel (backends/cpu/rope.cpp) and the CUDA kernel
// (backends/cuda/rope.cu) compute the same f64 table.
//
//   freq_i = theta^(-2i / D),  i in [0, D/2)                      (RopeScaling::none())
//   freq_i = llama3(theta^(-2i / D))                              (Note [llama3 rope scaling])
//
// Note [llama3 rope scaling]: LLaMA-3.1 and later stretch the context of a model pretrained
// at `original_context` tokens by `factor` without changing its short-range behaviour: each
// frequency is scaled by where its wavelength 2 pi / freq falls (Meta's release, and
// transformers' modeling_rope_utils._compute_llama3_parameters):
//   low_wavelen  = original_context / low_freq_factor     (e.g. 8192 / 1)
//   high_wavelen = original_context / high_freq_factor    (e.g. 8192 / 4)
//   wavelen < high_wavelen            freq                      (high frequencies: unchanged)
//   wavelen > low_wavelen             freq / factor             (low frequencies: interpolated)
//   otherwise (the band between)      (1 - s) freq / factor + s freq,
//                                     s = (original_context / wavelen - low_freq_factor)
//                                         / (high_freq_factor - low_freq_factor)
// The cos/sin themselves are not rescaled (LLaMA-3's attention factor is 1). The config keys
// are model.rope_scaling = "llama3", rope_factor, rope_low_freq_factor, rope_high_freq_factor
// and rope_original_context (docs/train.md); a Hugging Face config.json's "rope_scaling"
// object sets them (io/hf_checkpoint.h).
#include <cstdint>

#include "forge/core/macros.h"

#include <math.h>  // ::pow, host and device

namespace forge::fn {

struct RopeScaling {
  double factor = 1.0;  // 1: no scaling (the other fields are then unused)
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_context = 8192.0;  // tokens the model was pretrained at
  FORGE_HD_INLINE bool enabled() const { return factor != 1.0; }
  static RopeScaling none() { return {}; }
  friend bool operator==(const RopeScaling&, const RopeScaling&) = default;
};

// freq_i of the table above (f64).
FORGE_HD_INLINE double rope_frequency(int64_t i, int64_t D, double theta, const RopeScaling& s) {
  const double freq = ::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(D));
  if (!s.enabled()) return freq;
  const double kTwoPi = 6.283185307179586476925286766559;
  const double wavelen = kTwoPi / freq;
  const double low_wavelen = s.original_context / s.low_freq_factor;
  const double high_wavelen = s.original_context / s.high_freq_factor;
  if (wavelen < high_wavelen) return freq;
  if (wavelen > low_wavelen) return freq / s.factor;
  const double smooth = (s.original_context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  return (1.0 - smooth) * freq / s.factor + smooth * freq;
}

}  // namespace forge::fn
