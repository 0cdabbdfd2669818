// SPDX-License-Identifier: Apache-2.0
// Rotary position embedding parameters and their frequencies, shared by the
// backends (host and device code): Hugging Face's rope_theta and
// rope_scaling / rope_parameters ("default", "linear", "llama3"), as
// transformers' modeling_rope_utils computes inv_freq.
//
//   inv_freq[i] = 1 / theta^(2i / D)            i < D/2, in fp32 as HF does
//   linear:  inv_freq[i] / factor
//   llama3:  wavelength w = 2 pi / inv_freq[i]; w > L / low_freq_factor:
//            inv_freq / factor; w < L / high_freq_factor: unchanged; between:
//            (1 - s) inv_freq / factor + s inv_freq with
//            s = (L / w - low_freq_factor) / (high_freq_factor - low_freq_factor),
//            L = original_max_position_embeddings.
// The angle of position t and pair i is fp32(t * inv_freq[i]); cos and sin
// of that angle rotate the pair (x[i], x[i + D/2]) (HF's rotate_half).
//
// Thread-safety: values and pure functions.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define STRATA_HOST_DEVICE __host__ __device__
#else
#define STRATA_HOST_DEVICE
#endif

namespace strata::kernels {

struct RopeParams {
  enum Type : uint8_t { kDefault, kLinear, kLlama3 } type = kDefault;
  float theta = 10000.f;
  float factor = 1.f;             // linear, llama3
  float low_freq_factor = 1.f;    // llama3
  float high_freq_factor = 4.f;   // llama3
  int64_t original_max_positions = 8192;  // llama3
  bool operator==(const RopeParams&) const = default;
};

// inv_freq[i] of a head of `head_dim` columns (i < head_dim / 2).
STRATA_HOST_DEVICE inline float RopeInvFreq(const RopeParams& p, int64_t head_dim, int64_t i) {
  const float expo = static_cast<float>(2 * i) / static_cast<float>(head_dim);
  const float inv = 1.f / powf(p.theta, expo);
  if (p.type == RopeParams::kLinear) return inv / p.factor;
  if (p.type == RopeParams::kLlama3) {
    const float two_pi = 6.283185307179586f;
    const float L = static_cast<float>(p.original_max_positions);
    const float wavelen = two_pi / inv;
    const float low_wavelen = L / p.low_freq_factor, high_wavelen = L / p.high_freq_factor;
    if (wavelen > low_wavelen) return inv / p.factor;
    if (wavelen < high_wavelen) return inv;
    const float s = (L / wavelen - p.low_freq_factor) / (p.high_freq_factor - p.low_freq_factor);
    return (1.f - s) * inv / p.factor + s * inv;
  }
  return inv;
}

}  // namespace strata::kernels
