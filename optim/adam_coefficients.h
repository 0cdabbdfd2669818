// SPDX-License-Identifier: Apache-2.0
// AdamCoefficients: the fp32 per-element constants of one Adam step, shared
// by every implementation (the CPU Adam's SIMD paths and the GPU kernel). They
// are not filled by hand: MakeAdamCoefficients (optim/cpu_adam.h) derives them
// from the hyperparameters.
#pragma once

namespace strata::optim {

// The per-element constants of one Adam step, each a double rounded once to
// fp32. With them, every implementation (CPU scalar, AVX2, AVX-512, GPU)
// computes, per element and in fp32 with one IEEE rounding per operation:
//
//   g  = grad * grad_scale
//   g  = fma(p, l2_decay, g)                      only if l2_decay != 0
//   m  = fma(g, one_minus_beta1, m * beta1)
//   v  = fma(g * g, one_minus_beta2, v * beta2)
//   d  = fma(sqrt(v), inv_sqrt_bc2, eps)
//   u  = m / d
//   p  = fma(p, neg_lr_decay, p)                  only if neg_lr_decay != 0
//   p  = fma(u, neg_step_size, p)
//   out = round_to_nearest_even(p)                in the output dtype
//
// which is also the operation order of DeepSpeed's AVX cpu_adam.
struct AdamCoefficients {
  float beta1 = 0.9f;
  float one_minus_beta1 = 0.1f;
  float beta2 = 0.999f;
  float one_minus_beta2 = 0.001f;
  float eps = 1e-8f;
  float neg_step_size = 0.f;  // -lr / (1 - beta1^t); -lr without bias correction
  float inv_sqrt_bc2 = 1.f;   // 1 / sqrt(1 - beta2^t); 1 without bias correction
  float neg_lr_decay = 0.f;   // -lr * weight_decay in decoupled (AdamW) mode, else 0
  float l2_decay = 0.f;       // weight_decay in L2 (classic Adam) mode, else 0
  float grad_scale = 1.f;     // 1/loss_scale x clip coefficient
};
static_assert(sizeof(AdamCoefficients) == 10 * sizeof(float), "AdamCoefficients is passed by value to kernels");

}  // namespace strata::optim
